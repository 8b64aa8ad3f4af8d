//! The stdio transport: rmcp's line transport, behind a [`Gate`] that
//! answers every line it will not pass on. rmcp drops a line over its length
//! limit with a log line only, and ignores one that is not JSON (or nests
//! deeper than `serde_json` parses) without a word, so a client that sent one
//! would wait forever for its answer. Here such a line gets a JSON-RPC error
//! (id null: no id can be read from it), and the session goes on:
//!
//! - longer than [`MAX_LINE_BYTES`]: `-32600` (invalid request), the line's
//!   bytes dropped as they come, never held;
//! - not UTF-8, not JSON, or nested deeper than [`MAX_DEPTH`]: `-32700`
//!   (parse error), saying why.
//!
//! JSON that is not a JSON-RPC message is rmcp's to answer (`-32600`).

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
};

use rmcp::{
    RoleServer,
    model::ErrorData,
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::{Transport, async_rw::AsyncRwTransport},
};
use tokio::{
    io::{AsyncBufRead, AsyncRead, AsyncWrite, BufReader, ReadBuf},
    sync::Notify,
};

/// The longest line (one JSON-RPC message) read, newline included: the
/// HTTP transport's body limit too. Tool arguments are far smaller (a
/// message is at most 256 KiB).
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// The deepest nesting of arrays and objects read (`serde_json`, which
/// parses the messages, stops at 128).
pub const MAX_DEPTH: usize = 100;

/// Why a line was not passed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Over [`MAX_LINE_BYTES`].
    TooLong,
    /// Not a JSON text the server can read, and why.
    Unreadable(String),
}

impl Rejection {
    /// The JSON-RPC error that answers it.
    pub fn error(&self) -> ErrorData {
        match self {
            Rejection::TooLong => ErrorData::invalid_request(
                format!("message too large: a line may hold at most {MAX_LINE_BYTES} bytes"),
                None,
            ),
            Rejection::Unreadable(why) => {
                ErrorData::parse_error(format!("parse error: {why}"), None)
            }
        }
    }
}

/// Lines the gate refused, waiting for their answer.
#[derive(Default)]
struct Refused {
    lines: Mutex<VecDeque<Rejection>>,
    added: Notify,
}

impl Refused {
    fn push(&self, rejection: Rejection) {
        tracing::warn!(
            ?rejection,
            "a line from the MCP client was not read; answering it"
        );
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(rejection);
        self.added.notify_one();
    }

    fn pop(&self) -> Option<Rejection> {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

/// Returns the stdio transport: stdin through a [`Gate`], stdout as rmcp writes it.
pub fn transport() -> Guarded<tokio::io::Stdin, tokio::io::Stdout> {
    Guarded::new(tokio::io::stdin(), tokio::io::stdout())
}

/// rmcp's line transport reading through a [`Gate`]; answers what the gate
/// refused, through rmcp's own writer, so answers never interleave.
pub struct Guarded<R, W>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite,
{
    inner: AsyncRwTransport<RoleServer, Gate<R>, W>,
    refused: Arc<Refused>,
}

impl<R, W> Guarded<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    pub fn new(read: R, write: W) -> Self {
        let refused = Arc::new(Refused::default());
        let gate = Gate {
            read: BufReader::new(read),
            line: Vec::new(),
            ready: Vec::new(),
            handed: 0,
            discarding: false,
            refused: refused.clone(),
        };
        Guarded {
            inner: AsyncRwTransport::new(gate, write),
            refused,
        }
    }

    async fn answer(&mut self, rejection: Rejection) -> Result<(), io::Error> {
        self.inner
            .send(TxJsonRpcMessage::<RoleServer>::error(
                rejection.error(),
                None,
            ))
            .await
    }
}

impl<R, W> Transport<RoleServer> for Guarded<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if let Some(rejection) = self.refused.pop() {
                if let Err(e) = self.answer(rejection).await {
                    tracing::warn!(error = %e, "cannot answer the MCP client");
                    return None;
                }
                continue;
            }
            let refused = self.refused.clone();
            // rmcp's receive keeps a partly read line when it is dropped.
            let message = tokio::select! {
                biased;
                _ = refused.added.notified() => continue,
                message = self.inner.receive() => message,
            };
            // A line refused just before the end of input is answered too.
            while let Some(rejection) = self.refused.pop() {
                if self.answer(rejection).await.is_err() {
                    break;
                }
            }
            return message;
        }
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.inner.close().await
    }
}

/// Passes on the lines of `R` that are readable JSON of at most
/// [`MAX_LINE_BYTES`], whole, and reports the others to [`Guarded`]. Holds
/// at most one line.
pub struct Gate<R> {
    read: BufReader<R>,
    /// The line being read.
    line: Vec<u8>,
    /// A line passed on, and how much of it was handed out.
    ready: Vec<u8>,
    handed: usize,
    /// Dropping the rest of a line that was too long.
    discarding: bool,
    refused: Arc<Refused>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Gate<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let gate = self.get_mut();
        loop {
            if gate.handed < gate.ready.len() {
                let n = out.remaining().min(gate.ready.len() - gate.handed);
                out.put_slice(&gate.ready[gate.handed..gate.handed + n]);
                gate.handed += n;
                return Poll::Ready(Ok(()));
            }
            let available = ready!(Pin::new(&mut gate.read).poll_fill_buf(cx))?;
            if available.is_empty() {
                // The end of input: a last line without its newline is
                // passed on as it is (rmcp drops it, as the client left).
                gate.ready = std::mem::take(&mut gate.line);
                gate.handed = 0;
                if gate.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            if gate.discarding {
                gate.discarding = newline.is_none();
            } else if gate.line.len() + take > MAX_LINE_BYTES {
                gate.line = Vec::new();
                gate.discarding = newline.is_none();
                gate.refused.push(Rejection::TooLong);
            } else {
                gate.line.extend_from_slice(&available[..take]);
                if newline.is_some() {
                    let line = std::mem::take(&mut gate.line);
                    match check(&line) {
                        Ok(()) => {
                            gate.ready = line;
                            gate.handed = 0;
                        }
                        Err(rejection) => gate.refused.push(rejection),
                    }
                }
            }
            Pin::new(&mut gate.read).consume(take);
        }
    }
}

/// Whether a line is one JSON text the server can parse: UTF-8, nested at
/// most [`MAX_DEPTH`] deep, well formed. A blank line passes (rmcp skips it).
pub fn check(line: &[u8]) -> Result<(), Rejection> {
    let text = std::str::from_utf8(line)
        .map_err(|e| Rejection::Unreadable(format!("the line is not UTF-8 ({e})")))?;
    let text = text.trim_start_matches('\u{feff}');
    if text.trim().is_empty() {
        return Ok(());
    }
    if depth(text.as_bytes()) > MAX_DEPTH {
        return Err(Rejection::Unreadable(format!(
            "arrays and objects nest deeper than {MAX_DEPTH}"
        )));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| Rejection::Unreadable(e.to_string()))
}

/// Returns the deepest nesting of arrays and objects in JSON text (strings
/// skipped), without parsing it.
fn depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_containers_outside_strings() {
        assert_eq!(depth(br#"{"a":[1,{"b":"[[[{"}]}"#), 3);
        assert_eq!(depth(br#""\"[[""#), 0);
        assert_eq!(depth(&b"[".repeat(100_000)), 100_000);
    }

    #[test]
    fn check_refuses_what_serde_json_would_not_read() {
        assert_eq!(
            check(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"),
            Ok(())
        );
        assert_eq!(check(b"\r\n"), Ok(()));
        let deep = format!(
            "{}{}\n",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(
            matches!(check(deep.as_bytes()), Err(Rejection::Unreadable(why)) if why.contains("deeper"))
        );
        let fine = format!("{}{}\n", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check(fine.as_bytes()), Ok(()));
        assert!(matches!(check(b"{\"a\":\n"), Err(Rejection::Unreadable(_))));
        assert!(
            matches!(check(b"\"\xff\"\n"), Err(Rejection::Unreadable(why)) if why.contains("UTF-8"))
        );
    }
}
