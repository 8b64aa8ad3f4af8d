//! Writing results to stdout. Writes return their error (rather than
//! panicking like `println!`) so a closed pipe ends the command quietly.
//! Text and JSON are made terminal-safe here ([`crate::safe`]), whatever
//! they hold; only [`raw`] writes bytes as they are.

use std::io::Write;

use serde::Serialize;
use serde_json::{
    Value,
    ser::{CompactFormatter, Formatter, PrettyFormatter},
};

use crate::safe;

/// Writes `text` with its unsafe characters escaped ([`safe::block`]),
/// adding a final newline when it has none.
pub fn text(text: &str) -> anyhow::Result<()> {
    let text = safe::block(text);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        stdout.write_all(b"\n")?;
    }
    stdout.flush()?;
    Ok(())
}

/// Writes bytes exactly as they are: for what the operator asked to get
/// raw, and for the terminal's own control sequences.
pub fn raw(bytes: &[u8]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()?;
    Ok(())
}

/// Writes one JSON value, indented.
pub fn json(value: &Value) -> anyhow::Result<()> {
    write_json(value, safe::Json(PrettyFormatter::new()))
}

/// Writes one JSON value on one line (JSON lines, for streams).
pub fn json_line(value: &Value) -> anyhow::Result<()> {
    write_json(value, safe::Json(CompactFormatter))
}

fn write_json(value: &Value, formatter: safe::Json<impl Formatter>) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut bytes, formatter,
    ))?;
    bytes.push(b'\n');
    raw(&bytes)
}
