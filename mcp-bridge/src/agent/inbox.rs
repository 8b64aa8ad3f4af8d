//! Troupe's messages as a launcher receives them: each line of its stdin,
//! in order, as the text its model is given (who sent it, then the message:
//! [`crate::claude::content`]). At most [`WAITING`] messages wait in the
//! launcher; past that it stops reading, so a flood waits in Troupe's own
//! bounded inbox, not in the launcher's memory. A CLI that takes one message
//! per run takes every message that waits as one turn ([`Inbox::next_turn`]),
//! so a flood makes a few turns, not one run each.

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader},
    sync::mpsc,
};

use crate::claude;

/// Messages read ahead of the CLI.
pub(super) const WAITING: usize = 16;

/// A turn takes the messages that wait until it holds this many bytes.
pub(super) const TURN_BYTES: usize = 256 << 10;

/// What separates two messages joined into one turn.
const BETWEEN: &str = "\n\n";

pub(super) struct Inbox {
    rx: mpsc::Receiver<String>,
}

impl Inbox {
    /// Reads the launcher's stdin until it ends.
    pub fn stdin() -> Inbox {
        Inbox::reading(tokio::io::stdin())
    }

    /// Reads `input` until it ends. Blank lines carry nothing and are
    /// skipped; bytes that are not UTF-8 are replaced, not dropped with
    /// their line.
    pub fn reading(input: impl AsyncRead + Unpin + Send + 'static) -> Inbox {
        let message = |line: &str| (!line.trim().is_empty()).then(|| claude::content(line));
        Inbox {
            rx: lines(input, WAITING, message),
        }
    }

    /// The next message; `None` once stdin ended and none waits.
    pub async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await
    }

    /// The next message and those that wait behind it, joined by a blank
    /// line, until the turn holds [`TURN_BYTES`]; `None` once stdin ended
    /// and none waits.
    pub async fn next_turn(&mut self) -> Option<String> {
        let mut text = self.rx.recv().await?;
        while text.len() < TURN_BYTES {
            let Ok(next) = self.rx.try_recv() else { break };
            text.push_str(BETWEEN);
            text.push_str(&next);
        }
        Some(text)
    }

    /// Whether no message waits now.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// Most bytes of one line a launcher reads; a longer one (a tool's output
/// of gigabytes, say) is skipped, not held.
pub(super) const MAX_LINE: usize = 16 << 20;

/// The lines of `input`, without their ends, each as `keep` makes it (or
/// dropped when it says `None`), read by a task of their own at most
/// `ahead` lines ahead of the reader; bytes that are not UTF-8 are
/// replaced, not dropped with their line.
pub(super) fn lines(
    input: impl AsyncRead + Unpin + Send + 'static,
    ahead: usize,
    keep: impl Fn(&str) -> Option<String> + Send + 'static,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(ahead);
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut raw = Vec::new();
        let mut skipping = false;
        loop {
            raw.clear();
            let mut limited = (&mut input).take(MAX_LINE as u64);
            match limited.read_until(b'\n', &mut raw).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            // A line past the bound: its first part here, the rest after.
            let whole = raw.ends_with(b"\n");
            if std::mem::replace(&mut skipping, !whole) || !whole {
                continue;
            }
            let text = String::from_utf8_lossy(&raw);
            let Some(line) = keep(text.trim_end_matches(['\n', '\r'])) else {
                continue;
            };
            if tx.send(line).await.is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn line(sequence: u64, message: &str) -> String {
        format!(
            "{}\n",
            serde_json::json!({"type": "message", "sequence": sequence, "message_id": "m",
                               "sender": "operator", "message": message})
        )
    }

    #[tokio::test]
    async fn messages_that_wait_make_one_turn() {
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        let mut inbox = Inbox::reading(reader);
        writer.write_all(line(1, "first").as_bytes()).await.unwrap();
        let first = inbox.next_turn().await.unwrap();
        assert!(first.ends_with(":\nfirst"), "{first}");
        for n in 2..=4 {
            writer
                .write_all(format!("\n{}", line(n, &format!("m{n}"))).as_bytes())
                .await
                .unwrap();
        }
        drop(writer);
        // Read ahead: the three wait behind each other.
        while inbox.rx.len() < 3 {
            tokio::task::yield_now().await;
        }
        let joined = inbox.next_turn().await.unwrap();
        assert_eq!(joined.matches("from the operator").count(), 3, "{joined}");
        assert!(
            joined.find("m2").unwrap() < joined.find("m3").unwrap()
                && joined.find("m3").unwrap() < joined.find("m4").unwrap(),
            "{joined}"
        );
        assert_eq!(inbox.next_turn().await, None);
    }

    #[tokio::test]
    async fn a_flood_waits_outside_and_turns_stay_bounded() {
        let (mut writer, reader) = tokio::io::duplex(64 << 10);
        let mut inbox = Inbox::reading(reader);
        let big = "x".repeat(60 << 10);
        let writing = tokio::spawn(async move {
            for n in 0..40 {
                writer.write_all(line(n, &big).as_bytes()).await.unwrap();
            }
        });
        // The reader stops at WAITING messages: the writer is held back.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!writing.is_finished());
        assert!(inbox.rx.len() <= WAITING);
        let mut turns = 0;
        let mut messages = 0;
        while let Some(turn) = inbox.next_turn().await {
            assert!(turn.len() < TURN_BYTES + (61 << 10), "{}", turn.len());
            messages += turn.matches("from the operator").count();
            turns += 1;
        }
        assert_eq!(messages, 40);
        assert!(turns < 40, "{turns} turns for 40 messages");
        writing.await.unwrap();
    }

    #[tokio::test]
    async fn a_line_past_the_bound_is_skipped() {
        let (mut writer, reader) = tokio::io::duplex(1 << 16);
        let mut read = lines(reader, 4, |l| Some(l.to_owned()));
        tokio::spawn(async move {
            writer.write_all(b"first\n").await.unwrap();
            writer.write_all(&vec![b'x'; MAX_LINE + 10]).await.unwrap();
            writer.write_all(b"\nnext\n").await.unwrap();
        });
        assert_eq!(read.recv().await.as_deref(), Some("first"));
        assert_eq!(read.recv().await.as_deref(), Some("next"));
        assert_eq!(read.recv().await, None);
    }
}
