//! Text forms of [`TrustLevel`]: `direct`/`sandboxed`, with the seeds' aliases
//! `trusted`/`untrusted`, accepted wherever text comes in.

use crate::session::TrustLevel;

/// Parses a trust level from text, case-insensitively.
///
/// Accepts `direct`, `trusted`, `sandboxed`, `untrusted` and the enum names
/// (`TRUST_LEVEL_DIRECT`, `TRUST_LEVEL_SANDBOXED`).
pub fn parse(text: &str) -> Option<TrustLevel> {
    match text.trim().to_ascii_lowercase().as_str() {
        "direct" | "trusted" | "trust_level_direct" => Some(TrustLevel::Direct),
        "sandboxed" | "untrusted" | "trust_level_sandboxed" => Some(TrustLevel::Sandboxed),
        _ => None,
    }
}

/// Returns the canonical text form (`direct`, `sandboxed`, or `unspecified`).
pub fn as_str(level: TrustLevel) -> &'static str {
    match level {
        TrustLevel::Direct => "direct",
        TrustLevel::Sandboxed => "sandboxed",
        TrustLevel::Unspecified => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_parse_to_the_same_levels() {
        for (text, level) in [
            ("direct", Some(TrustLevel::Direct)),
            ("Trusted", Some(TrustLevel::Direct)),
            ("TRUST_LEVEL_DIRECT", Some(TrustLevel::Direct)),
            ("sandboxed", Some(TrustLevel::Sandboxed)),
            (" untrusted ", Some(TrustLevel::Sandboxed)),
            ("TRUST_LEVEL_SANDBOXED", Some(TrustLevel::Sandboxed)),
            ("root", None),
            ("", None),
        ] {
            assert_eq!(parse(text), level, "{text:?}");
        }
    }
}
