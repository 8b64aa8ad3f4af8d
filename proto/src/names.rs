//! The rule for names that end up in paths, container names and labels:
//! workspace ids and agent names.

/// Longest accepted name.
pub const MAX_SLUG_LEN: usize = 64;

/// True for 1 to [`MAX_SLUG_LEN`] ASCII letters, digits, `-` or `_`,
/// starting with a letter or digit: safe as a path component and in a
/// container name.
pub fn is_slug(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_SLUG_LEN
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        for ok in ["a", "ws-1", "A_b-9", &"x".repeat(MAX_SLUG_LEN)] {
            assert!(is_slug(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "a/b",
            "..",
            "a.b",
            "a b",
            "é",
            &"x".repeat(MAX_SLUG_LEN + 1),
        ] {
            assert!(!is_slug(bad), "{bad}");
        }
    }
}
