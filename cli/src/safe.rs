//! Terminal-safe forms of text that agents wrote (titles, output, reasons,
//! progress, exit details, audit details). An agent's bytes must not reach
//! the operator's terminal as control sequences: an escape (`ESC ]0;...`)
//! retitles the window, `ESC [2J` clears it, a carriage return or a bidi
//! override hides what is printed before it. Every such character is shown
//! as a Rust-style escape (`\u{1b}`, `\r`) instead.
//!
//! - [`block`]: multi-line text (an agent's output); keeps newlines and tabs.
//! - [`quoted`]: one field as a quoted word (free text inside `key=value`).
//! - [`line`]: one field of a line (a table cell, a `key value` line); also
//!   escapes newlines and tabs, so no field can forge another line.
//! - [`Json`]: a `serde_json` formatter that also writes the characters JSON
//!   leaves raw (DEL, C1 controls, bidi controls) as `\uXXXX` escapes.
//!
//! [`crate::out::text`] passes everything through [`block`], so text output
//! is safe whatever a command forgets; the raw bytes go out only through
//! [`crate::out::raw`], when the operator asks for them (`session get --raw`).

use std::{borrow::Cow, io};

use serde_json::ser::Formatter;

/// Whether `c` must not reach a terminal as it is: C0 and C1 controls and
/// DEL (escape sequences, bell, carriage return, backspace), Unicode's
/// bidirectional controls (they reorder what a line shows) and its line and
/// paragraph separators.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// Returns multi-line text with every unsafe character but newline and tab
/// escaped.
pub fn block(text: &str) -> Cow<'_, str> {
    escape(text, |c| c != '\n' && c != '\t' && is_unsafe(c))
}

/// Returns one field of a line with every unsafe character escaped,
/// newlines and tabs included.
pub fn line(text: &str) -> Cow<'_, str> {
    escape(text, is_unsafe)
}

/// Returns text as one quoted, terminal-safe word: `"..."` with quotes and
/// backslashes escaped as well, so what it shows reads back unambiguously.
pub fn quoted(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{}\"", line(&escaped))
}

fn escape(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A JSON formatter (indented or compact, as `F` lays it out) whose
/// strings carry no unsafe character raw: `serde_json` escapes the C0
/// controls itself, this escapes the rest ([`is_unsafe`]) as `\uXXXX`, which
/// any JSON reader decodes to the same string.
pub struct Json<F>(pub F);

/// Delegates `Formatter` methods to the inner formatter (the ones
/// `PrettyFormatter` overrides: the layout of arrays and objects).
macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name<W: ?Sized + io::Write>(&mut self, writer: &mut W $(, $arg: $ty)*) -> io::Result<()> {
            self.0.$name(writer $(, $arg)*)
        })*
    };
}

impl<F: Formatter> Formatter for Json<F> {
    delegate! {
        begin_array();
        end_array();
        begin_array_value(first: bool);
        end_array_value();
        begin_object();
        end_object();
        begin_object_key(first: bool);
        begin_object_value();
        end_object_value();
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| is_unsafe(c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            // Every unsafe character is in the Basic Multilingual Plane.
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{
        Value, json,
        ser::{CompactFormatter, PrettyFormatter},
    };

    use super::*;

    const HOSTILE: &str = "a\x1b]0;owned\x07b\x1b[2J\rc\u{9b}31m\u{202e}d\u{7f}\ne\tf";

    #[test]
    fn lines_escape_every_control_character() {
        assert_eq!(
            line(HOSTILE),
            r"a\u{1b}]0;owned\u{7}b\u{1b}[2J\rc\u{9b}31m\u{202e}d\u{7f}\ne\tf"
        );
        assert!(matches!(line("plain title, é ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn blocks_keep_newlines_and_tabs() {
        assert_eq!(
            block(HOSTILE),
            "a\\u{1b}]0;owned\\u{7}b\\u{1b}[2J\\rc\\u{9b}31m\\u{202e}d\\u{7f}\ne\tf"
        );
    }

    #[test]
    fn json_escapes_what_serde_json_leaves_raw_and_reads_back_the_same() {
        let value = json!({ "title": HOSTILE, "list": [1, "\u{2067}"] });
        let mut pretty = Vec::new();
        let mut serializer =
            serde_json::Serializer::with_formatter(&mut pretty, Json(PrettyFormatter::new()));
        serde::Serialize::serialize(&value, &mut serializer).unwrap();
        let mut compact = Vec::new();
        let mut serializer =
            serde_json::Serializer::with_formatter(&mut compact, Json(CompactFormatter));
        serde::Serialize::serialize(&value, &mut serializer).unwrap();
        for text in [pretty, compact] {
            let text = String::from_utf8(text).unwrap();
            assert!(!text.chars().any(|c| is_unsafe(c) && c != '\n'), "{text}");
            assert!(
                text.contains(r"\u009b") && text.contains(r"\u2067"),
                "{text}"
            );
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
        }
    }
}
