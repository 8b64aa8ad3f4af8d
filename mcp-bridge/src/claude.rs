//! `troupe-mcp claude-input`: Troupe's stdin message lines, turned into the
//! user messages Claude Code reads with `--input-format stream-json`.
//!
//! Troupe writes `{"type":"message","sequence":N,"message_id":..,"sender":..,
//! "message":..}`; Claude Code reads `{"type":"user","message":{"role":"user",
//! "content":..},"parent_tool_use_id":null,"session_id":"default"}`. The
//! content starts with a line saying who sent the message and how to answer,
//! since the model sees nothing else of the envelope.

use std::io::{BufRead, Write};

use troupe_proto::agent::{MessageLine, stdin::TROUPE_SENDER};

/// Prefix of the sender of a message from another session.
const SESSION_PREFIX: &str = "session:";

/// Returns the Claude Code stream-json user message (one JSON line, without
/// its newline) for one line of Troupe's stdin. A line that is not a Troupe
/// message line is passed on as it is, as the content.
pub fn user_message(line: &str) -> String {
    serde_json::json!({
        "type": "user",
        "message": { "role": "user", "content": content(line) },
        "parent_tool_use_id": null,
        "session_id": "default",
    })
    .to_string()
}

/// The text a model is given for one line of Troupe's stdin: a first line
/// saying who sent the message and how to answer, then the message.
pub fn content(line: &str) -> String {
    let Some(MessageLine {
        sequence,
        sender,
        message,
        ..
    }) = MessageLine::parse(line)
    else {
        return line.to_owned();
    };
    let header = match sender.as_str() {
        "operator" => format!(
            "Message {sequence} from the operator (not a session: answer in your output, \
             which the operator reads)"
        ),
        TROUPE_SENDER => format!(
            "Message {sequence} from troupe (a notice from Troupe itself, such as a child \
             session's end: nothing to reply to)"
        ),
        _ => match sender.strip_prefix(SESSION_PREFIX) {
            Some(id) if !id.is_empty() => format!(
                "Message {sequence} from {sender} (reply with send_message to session_id \"{id}\")"
            ),
            _ => format!("Message {sequence} from {sender}"),
        },
    };
    format!("{header}:\n{message}")
}

/// Reads Troupe's lines from `input` until it ends and writes one user
/// message per line to `output`, flushed at once: the agent is waiting for it.
/// Blank lines carry nothing and are skipped; bytes that are not UTF-8 are
/// replaced, not dropped with their line.
pub fn forward(mut input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if input.read_until(b'\n', &mut raw)? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&raw);
        let line = text.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let mut out = user_message(line);
        out.push('\n');
        output.write_all(out.as_bytes())?;
        output.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn troupe_line(sequence: u64, sender: &str, message: &str) -> String {
        json!({"type": "message", "sequence": sequence, "message_id": "msg_1",
               "sender": sender, "message": message})
        .to_string()
    }

    /// Translates `line` and returns the content, checking the envelope.
    fn check(line: &str) -> String {
        let out = user_message(line);
        assert!(!out.contains('\n'), "one line: {out}");
        let value: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(value["type"], "user");
        assert_eq!(value["message"]["role"], "user");
        assert_eq!(value["parent_tool_use_id"], Value::Null);
        assert_eq!(value["session_id"], "default");
        value["message"]["content"]
            .as_str()
            .expect("text content")
            .to_owned()
    }

    #[test]
    fn a_session_message_says_how_to_reply() {
        assert_eq!(
            check(&troupe_line(3, "session:sess_abc", "use axum")),
            "Message 3 from session:sess_abc (reply with send_message to session_id \"sess_abc\"):\nuse axum"
        );
    }

    #[test]
    fn operator_and_troupe_messages_have_no_reply_hint() {
        let operator = check(&troupe_line(1, "operator", "write the handlers"));
        assert!(
            operator.starts_with("Message 1 from the operator ("),
            "{operator}"
        );
        assert!(operator.ends_with("):\nwrite the handlers"), "{operator}");
        assert!(!operator.contains("send_message"), "{operator}");

        let notice = json!({"type": "session_ended", "session_id": "sess_c",
                            "status": "completed", "exit_code": 0, "reason": "exited",
                            "output_tail": "bye"})
        .to_string();
        let ended = check(&troupe_line(4, "troupe", &notice));
        assert!(ended.starts_with("Message 4 from troupe ("), "{ended}");
        assert!(ended.ends_with(&format!("):\n{notice}")), "{ended}");
        assert!(!ended.contains("send_message"), "{ended}");
    }

    #[test]
    fn an_unknown_sender_is_named_without_a_hint() {
        assert_eq!(
            check(&troupe_line(2, "session:", "x")),
            "Message 2 from session::\nx"
        );
        assert_eq!(
            check(&troupe_line(2, "someone", "x")),
            "Message 2 from someone:\nx"
        );
    }

    #[test]
    fn other_lines_are_passed_on_as_they_are() {
        for line in [
            "just words, typed by hand",
            "{not json",
            r#"{"type":"message","sender":"operator","message":"no sequence"}"#,
            r#"{"type":"session_ended","sequence":1,"sender":"troupe","message":"x"}"#,
            r#"["message"]"#,
        ] {
            assert_eq!(check(line), line);
        }
    }

    #[test]
    fn unicode_newlines_and_quotes_survive() {
        let text = "héllo 世界 🎭\nline \"two\" with \\ and \t tab\n\u{2028}end";
        let content = check(&troupe_line(5, "session:sess_x", text));
        assert!(content.ends_with(&format!(":\n{text}")), "{content}");
    }

    #[test]
    fn forward_writes_a_line_per_message_and_skips_blank_lines() {
        let input = format!(
            "{}\r\n\n   \nplain\n{}",
            troupe_line(1, "operator", "a"),
            troupe_line(2, "session:sess_b", "b")
        );
        let mut out = Vec::new();
        forward(input.as_bytes(), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let contents: Vec<String> = out
            .lines()
            .map(|line| {
                let value: Value = serde_json::from_str(line).unwrap();
                value["message"]["content"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(contents.len(), 3, "{out}");
        assert!(contents[0].ends_with(":\na"), "{}", contents[0]);
        assert_eq!(contents[1], "plain");
        assert!(contents[2].ends_with(":\nb"), "{}", contents[2]);
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn forward_keeps_a_line_that_is_not_utf8() {
        let mut out = Vec::new();
        forward(&b"caf\xe9\n"[..], &mut out).unwrap();
        let value: Value = serde_json::from_slice(out.trim_ascii_end()).unwrap();
        assert_eq!(value["message"]["content"], "caf\u{fffd}");
    }
}
