//! Writing results to stdout. Writes return their error (rather than
//! panicking like `println!`) so a closed pipe ends the command quietly.

use std::io::Write;

use serde_json::Value;

/// Writes `text`, adding a final newline when it has none.
pub fn text(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        stdout.write_all(b"\n")?;
    }
    stdout.flush()?;
    Ok(())
}

/// Writes one JSON value, indented.
pub fn json(value: &Value) -> anyhow::Result<()> {
    text(&serde_json::to_string_pretty(value)?)
}

/// Writes one JSON value on one line (JSON lines, for streams).
pub fn json_line(value: &Value) -> anyhow::Result<()> {
    text(&value.to_string())
}
