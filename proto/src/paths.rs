//! Where the session service keeps its data by default, and where the CLI
//! looks for the operator token: one convention shared by both binaries.

use std::path::{Path, PathBuf};

/// File name of the operator token inside the data directory.
pub const OPERATOR_TOKEN_FILE: &str = "operator.token";

/// Returns `$XDG_DATA_HOME/troupe`, else `$HOME/.local/share/troupe`, else `./troupe-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("troupe");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/troupe"),
        None => PathBuf::from("troupe-data"),
    }
}

/// Returns the operator token's path in `data_dir`.
pub fn operator_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join(OPERATOR_TOKEN_FILE)
}
