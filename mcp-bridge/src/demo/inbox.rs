//! stdin: Troupe's message lines, `{"type":"message","sequence":N,
//! "message_id":..,"sender":..,"message":..}`, read on a thread of their own
//! (a blocked read must not keep the process from exiting), and Troupe's
//! `session_ended` notices among them.

use std::{collections::VecDeque, io::BufRead};

use serde::Deserialize;
use tokio::sync::mpsc;
pub use troupe_proto::agent::stdin::TROUPE_SENDER as TROUPE;
use troupe_proto::agent::{MessageLine, SessionEnded};

/// One message line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// `operator`, `session:<id>` or `troupe`.
    pub sender: String,
    pub message: String,
}

/// An object with a `message` (and perhaps a `sender`) but not a whole
/// [`MessageLine`]: typed by hand, and read as Troupe's would be.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    sender: Option<String>,
    message: String,
}

impl Line {
    /// Reads a line of stdin. Anything but a message object (someone typing
    /// at the agent by hand) is taken as text from the operator.
    pub fn parse(text: &str) -> Line {
        if let Some(line) = MessageLine::parse(text) {
            return Line {
                sender: line.sender,
                message: line.message,
            };
        }
        match serde_json::from_str::<Wire>(text) {
            Ok(wire) => Line {
                sender: wire.sender.unwrap_or_else(|| "operator".to_owned()),
                message: wire.message,
            },
            Err(_) => Line {
                sender: "operator".to_owned(),
                message: text.to_owned(),
            },
        }
    }

    /// The `session_ended` notice this line carries, if it is one.
    pub fn ended(&self) -> Option<SessionEnded> {
        if self.sender != TROUPE {
            return None;
        }
        SessionEnded::parse(&self.message)
    }
}

/// The lines of stdin, with Troupe's notices that arrived before anyone
/// asked for them held back for [`Inbox::next_any`].
pub struct Inbox {
    lines: mpsc::Receiver<String>,
    held: VecDeque<Line>,
}

impl Inbox {
    /// Starts reading stdin.
    pub fn stdin() -> Inbox {
        let (tx, rx) = mpsc::channel(64);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if line.trim().is_empty() {
                    continue;
                }
                if tx.blocking_send(line).is_err() {
                    break;
                }
            }
        });
        Inbox {
            lines: rx,
            held: VecDeque::new(),
        }
    }

    /// The next line from stdin, or `None` at its end.
    pub async fn next_line(&mut self) -> Option<Line> {
        self.lines.recv().await.map(|text| Line::parse(&text))
    }

    /// Keeps a line for a later [`Inbox::next_any`].
    pub fn hold(&mut self, line: Line) {
        self.held.push_back(line);
    }

    /// The oldest held line, else the next line from stdin.
    pub async fn next_any(&mut self) -> Option<Line> {
        match self.held.pop_front() {
            Some(line) => Some(line),
            None => self.next_line().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_lines_and_plain_text() {
        let line = Line::parse(
            r#"{"type":"message","sequence":2,"message_id":"msg_1","sender":"session:sess_a","message":"hi"}"#,
        );
        assert_eq!(line.sender, "session:sess_a");
        assert_eq!(line.message, "hi");
        assert_eq!(line.ended(), None);
        let typed = Line::parse("just words");
        assert_eq!(typed.sender, "operator");
        assert_eq!(typed.message, "just words");
    }

    #[test]
    fn session_ended_notice() {
        let notice = serde_json::json!({
            "type": "session_ended", "session_id": "sess_c", "status": "completed",
            "exit_code": 0, "reason": "", "output_tail": "bye"
        })
        .to_string();
        let line = Line::parse(
            &serde_json::json!({"type": "message", "sequence": 3, "message_id": "m",
                                "sender": "troupe", "message": notice})
            .to_string(),
        );
        let ended = line.ended().expect("a notice");
        assert_eq!(ended.session_id, "sess_c");
        assert_eq!(ended.status, "completed");
        assert_eq!(ended.exit_code, 0);
        assert_eq!(ended.output_tail, "bye");
        let from_session = Line {
            sender: "session:sess_c".to_owned(),
            message: notice,
        };
        assert_eq!(from_session.ended(), None, "only Troupe's notices count");
    }
}
