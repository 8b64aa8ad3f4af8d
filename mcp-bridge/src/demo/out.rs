//! The events: one JSON object per line on stdout, `"event"` first, flushed
//! at once so that whoever reads the agent's output sees each step as it
//! happens.

use std::io::Write;

use serde_json::{Value, json};

/// Prints `{"event": name, ...fields}`. `fields` is an object (anything
/// else is ignored). Output that cannot be written is dropped: there is no
/// one left to tell.
pub fn emit(name: &str, fields: Value) {
    let mut line = format!("{{\"event\":{}", json!(name));
    if let Value::Object(fields) = fields {
        for (key, value) in fields {
            line.push(',');
            line.push_str(&json!(key).to_string());
            line.push(':');
            line.push_str(&value.to_string());
        }
    }
    line.push_str("}\n");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(line.as_bytes());
    let _ = stdout.flush();
}

/// The last `max` characters of `text`.
pub fn tail(text: &str, max: usize) -> &str {
    let count = text.chars().count();
    if count <= max {
        return text;
    }
    let start = text
        .char_indices()
        .nth(count - max)
        .map_or(0, |(index, _)| index);
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_characters() {
        assert_eq!(tail("abc", 5), "abc");
        assert_eq!(tail("abcdef", 2), "ef");
        assert_eq!(tail("ééé", 2), "éé");
        assert_eq!(tail("", 2), "");
    }
}
