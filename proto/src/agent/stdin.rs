//! The lines of an agent's stdin: one [`MessageLine`] per message, in
//! order, and the notices Troupe sends as the `message` of one of them:
//! [`SessionEnded`] to a callback-mode parent, [`ParentEnded`] to a
//! `notify` child whose parent ended.
//!
//! Fields are declared in the order they are written (by name), so a line
//! is the same bytes whoever writes it.

use serde::{Deserialize, Serialize};

/// The sender of Troupe's own notices (such as [`SessionEnded`]).
pub const TROUPE_SENDER: &str = "troupe";

/// The `type` of a [`MessageLine`]: always `message`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageType {
    #[default]
    #[serde(rename = "message")]
    Message,
}

/// One message on an agent's stdin, one JSON line:
/// `{"message":..,"message_id":..,"sender":..,"sequence":N,"type":"message"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageLine {
    /// The text sent.
    pub message: String,
    /// The message's id: a message written again (after a restart) has the
    /// same one. Read as empty when a line (typed by hand) has none.
    #[serde(default)]
    pub message_id: String,
    /// `operator`, `session:<id>`, `session` (a sender the agent may not
    /// know) or `troupe` ([`TROUPE_SENDER`]).
    pub sender: String,
    /// The message's number in the session's inbox, from 1.
    pub sequence: u64,
    #[serde(rename = "type")]
    pub kind: MessageType,
}

impl MessageLine {
    pub fn new(sequence: u64, message_id: &str, sender: &str, message: &str) -> MessageLine {
        MessageLine {
            message: message.to_owned(),
            message_id: message_id.to_owned(),
            sender: sender.to_owned(),
            sequence,
            kind: MessageType::Message,
        }
    }

    /// Reads one line (without its newline); `None` if it is not a message line.
    pub fn parse(line: &str) -> Option<MessageLine> {
        serde_json::from_str(line).ok()
    }

    /// The line, with its newline, as written to stdin.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a message line serializes");
        line.push(b'\n');
        line
    }

    /// The [`SessionEnded`] notice this message carries, if it is one from Troupe.
    pub fn ended(&self) -> Option<SessionEnded> {
        if self.sender != TROUPE_SENDER {
            return None;
        }
        SessionEnded::parse(&self.message)
    }
}

/// The `type` of a [`SessionEnded`] notice: always `session_ended`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionEndedType {
    #[default]
    #[serde(rename = "session_ended")]
    SessionEnded,
}

/// A child session's end, told to its callback-mode parent as the text of a
/// message from [`TROUPE_SENDER`]: `{"exit_code":N,"output_tail":..,
/// "reason":..,"session_id":..,"status":..,"type":"session_ended"}`, with
/// `outcome` and `result` after its `exit_code` and `reason` when the child
/// finished its task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnded {
    /// The agent's exit code (-1 when it had none: lost, not started, or
    /// still exiting after it finished its task).
    pub exit_code: i32,
    /// `success` or `failure`, as the session said when it finished its
    /// task (`finish`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The end of the agent's output (at most 2,000 characters).
    pub output_tail: String,
    /// Why it ended: `finished` (it finished its task), the runner's exit
    /// reason, `lost` or `not_started`.
    pub reason: String,
    /// Its own result, as it finished its task; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    pub session_id: String,
    /// The session's status, as text (`completed`, `failed`, ...).
    pub status: String,
    #[serde(rename = "type")]
    pub kind: SessionEndedType,
}

impl SessionEnded {
    /// Reads a notice from a message's text; `None` if it is not one.
    pub fn parse(text: &str) -> Option<SessionEnded> {
        serde_json::from_str(text).ok()
    }

    /// The notice as the text of a message.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a notice serializes")
    }
}

/// The `type` of a [`ParentEnded`] notice: always `parent_ended`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParentEndedType {
    #[default]
    #[serde(rename = "parent_ended")]
    ParentEnded,
}

/// The end of a session's parent, told to a child whose policy is `notify`
/// as the text of a message from [`TROUPE_SENDER`]:
/// `{"reason":..,"status":..,"type":"parent_ended"}`. It names no session:
/// a child that may see its parent has its id in its environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentEnded {
    /// Why the parent ended, in Troupe's words: `finished` (it finished
    /// its task), an exit reason (`exited`, `runner_lost`, `lost`, ...),
    /// `cascade` (its own parent ended) or `manual` (it was terminated).
    pub reason: String,
    /// The parent's status, as text: `completed`, `failed` or `terminated`.
    pub status: String,
    #[serde(rename = "type")]
    pub kind: ParentEndedType,
}

impl ParentEnded {
    /// Reads a notice from a message's text; `None` if it is not one.
    pub fn parse(text: &str) -> Option<ParentEnded> {
        serde_json::from_str(text).ok()
    }

    /// The notice as the text of a message.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a notice serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended() -> SessionEnded {
        SessionEnded {
            exit_code: 3,
            outcome: None,
            output_tail: "bye \"now\"\n".to_owned(),
            reason: "exited".to_owned(),
            result: None,
            session_id: "sess_c".to_owned(),
            status: "failed".to_owned(),
            kind: SessionEndedType::SessionEnded,
        }
    }

    #[test]
    fn a_message_line_has_the_documented_shape_and_round_trips() {
        let line = MessageLine::new(2, "msg_1", "session:sess_a", "hi \"there\"\n");
        assert_eq!(
            String::from_utf8(line.to_line()).unwrap(),
            "{\"message\":\"hi \\\"there\\\"\\n\",\"message_id\":\"msg_1\",\
             \"sender\":\"session:sess_a\",\"sequence\":2,\"type\":\"message\"}\n"
        );
        // The same bytes as the object written field by field.
        let by_hand = serde_json::json!({"type": "message", "sequence": 2, "message_id": "msg_1",
                                         "sender": "session:sess_a", "message": "hi \"there\"\n"});
        assert_eq!(line.to_line(), format!("{by_hand}\n").into_bytes());
        let text = String::from_utf8(line.to_line()).unwrap();
        assert_eq!(MessageLine::parse(text.trim_end()), Some(line));
    }

    #[test]
    fn only_message_lines_parse() {
        for text in [
            "just words",
            r#"{"type":"message","sender":"operator","message":"no sequence"}"#,
            r#"{"type":"session_ended","sequence":1,"sender":"troupe","message":"x"}"#,
            r#"["message"]"#,
        ] {
            assert_eq!(MessageLine::parse(text), None, "{text}");
        }
        let no_id = MessageLine::parse(
            r#"{"type":"message","sequence":1,"sender":"operator","message":"x"}"#,
        )
        .expect("a line without an id");
        assert_eq!(no_id.message_id, "");
    }

    #[test]
    fn a_session_ended_notice_has_the_documented_shape_and_round_trips() {
        let notice = ended();
        assert_eq!(
            notice.to_text(),
            "{\"exit_code\":3,\"output_tail\":\"bye \\\"now\\\"\\n\",\"reason\":\"exited\",\
             \"session_id\":\"sess_c\",\"status\":\"failed\",\"type\":\"session_ended\"}"
        );
        let by_hand = serde_json::json!({"type": "session_ended", "session_id": "sess_c",
            "status": "failed", "exit_code": 3, "reason": "exited", "output_tail": "bye \"now\"\n"});
        assert_eq!(notice.to_text(), by_hand.to_string());
        assert_eq!(SessionEnded::parse(&notice.to_text()), Some(notice));
    }

    #[test]
    fn only_troupe_s_notices_are_ends() {
        let text = ended().to_text();
        let from_troupe = MessageLine::new(4, "m", TROUPE_SENDER, &text);
        assert_eq!(from_troupe.ended(), Some(ended()));
        let from_session = MessageLine::new(4, "m", "session:sess_c", &text);
        assert_eq!(from_session.ended(), None);
        let not_a_notice = MessageLine::new(4, "m", TROUPE_SENDER, r#"{"type":"message"}"#);
        assert_eq!(not_a_notice.ended(), None);
    }

    #[test]
    fn a_parent_ended_notice_has_the_documented_shape_and_round_trips() {
        let notice = ParentEnded {
            reason: "exited".to_owned(),
            status: "failed".to_owned(),
            kind: ParentEndedType::ParentEnded,
        };
        assert_eq!(
            notice.to_text(),
            "{\"reason\":\"exited\",\"status\":\"failed\",\"type\":\"parent_ended\"}"
        );
        assert_eq!(ParentEnded::parse(&notice.to_text()), Some(notice));
        assert_eq!(ParentEnded::parse("{\"type\":\"session_ended\"}"), None);
    }
}
