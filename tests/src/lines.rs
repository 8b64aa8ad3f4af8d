//! The JSON lines a process prints, read as they come: for commands that
//! stream, such as `troupe session watch`.

use std::{
    io::{BufRead, BufReader},
    process::ChildStdout,
    time::Duration,
};

use serde_json::Value;
use tokio::sync::mpsc;

/// A process's stdout, one JSON value a line, read on a thread of its own.
pub struct JsonLines {
    lines: mpsc::UnboundedReceiver<Value>,
}

impl JsonLines {
    /// Reads `stdout` until it ends; panics (on its thread) at a line that
    /// is not JSON.
    pub fn read(stdout: ChildStdout) -> JsonLines {
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event: Value = serde_json::from_str(&line).expect("a JSON line");
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        JsonLines { lines }
    }

    /// The next line, within 30 seconds; panics if none comes or the
    /// output ended.
    pub async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(30), self.lines.recv())
            .await
            .expect("an event within 30 s")
            .expect("the watch goes on")
    }
}
