//! Where Troupe keeps its data by default, and the operator token: one
//! convention shared by the services and the CLI.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use rand::RngCore;

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

/// Returns the operator token: the configured one, else the one in
/// `<data-dir>/operator.token`, generated (mode 0600) on first start.
pub fn operator_token(configured: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(token) = configured {
        return configured_operator_token(token);
    }
    if let Some(token) = read_operator_token(data_dir)? {
        return Ok(token);
    }
    let token = generate_operator_token();
    write_operator_token(data_dir, &token)?;
    Ok(token)
}

/// Checks a configured operator token (trimmed): at least 16 characters.
pub fn configured_operator_token(token: &str) -> anyhow::Result<String> {
    let token = token.trim();
    anyhow::ensure!(
        token.len() >= 16,
        "the operator token must be at least 16 characters"
    );
    Ok(token.to_owned())
}

/// Returns the token in `<data-dir>/operator.token`, if there is one (an
/// empty file counts as none); refuses a file others may read or write.
pub fn read_operator_token(data_dir: &Path) -> anyhow::Result<Option<String>> {
    let path = operator_token_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => {
            check_private(&path)?;
            Ok(Some(token.trim().to_owned()))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Returns a new random operator token (`troupe-op-` and 64 hex digits).
pub fn generate_operator_token() -> String {
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    format!("troupe-op-{}", hex::encode(raw))
}

/// Writes `token` to `<data-dir>/operator.token`, mode 0600, replacing
/// what the file held.
pub fn write_operator_token(data_dir: &Path, token: &str) -> anyhow::Result<()> {
    write_private(&operator_token_path(data_dir), token)
}

/// Refuses a token file that users other than its owner may read or write:
/// whoever reads it is an operator.
fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
        .permissions()
        .mode()
        & 0o777;
    anyhow::ensure!(
        mode & 0o077 == 0,
        "{} is open to other users (mode {mode:o}) and holds the operator token: \
         run `chmod 600 {}`, or remove it to have a new token generated",
        path.display(),
        path.display()
    );
    Ok(())
}

/// Writes `contents` to `path`, readable and writable by its owner alone
/// (a file already there too).
pub fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    // A file that was there already (empty) keeps its mode unless told.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.write_all(b"\n")?;
    Ok(())
}

/// The session service's Unix socket in `data_dir`: in a directory of its
/// own, which the runner mounts into workspace containers.
pub fn session_socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("run").join("session.sock")
}
