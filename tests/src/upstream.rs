//! A scripted model provider: an HTTP server speaking the Anthropic Messages
//! API as Claude Code calls it, answering each `POST /v1/messages` with the
//! next of its scripted [`Turn`]s, in order, and recording every request it
//! gets ([`Recorded`]: path, headers, the key it carried, the body).
//!
//! - A request with `"stream": true` gets server-sent events: `message_start`
//!   (with the turn's input usage), for each block `content_block_start`,
//!   its deltas (`text_delta`, or `input_json_delta` for a `tool_use`) and
//!   `content_block_stop`, then `message_delta` (stop reason, output usage)
//!   and `message_stop`. Otherwise the whole message as JSON.
//! - `POST /v1/chat/completions` (OpenAI) answers the next turn as a chat
//!   completion (its text blocks as the message), streaming chunks when
//!   asked (and a last chunk with the usage if `stream_options.include_usage`)
//!   ending in `data: [DONE]`; input tokens are the prompt's, cache reads
//!   its `cached_tokens`.
//! - `POST /v1/messages/count_tokens` answers `{"input_tokens": N}` (N: the
//!   body's bytes / 4) and takes no turn.
//! - With no turn left, a `400` in the API's error shape
//!   (`invalid_request_error`), so a call nobody scripted shows in the test.
//!   Any other path is a `404` in the same shape. Both are recorded.
//!
//! - A turn may be a [`Fault`] instead: an error status, a malformed
//!   answer, a stream that ends early or stalls after its first event.
//!
//! - Several agents can share it, each with a script of its own
//!   ([`Upstream::script`]): a request takes the next turn of the first
//!   script whose marker is in its first message (the agent's task), else
//!   of the common turns.
//!
//! It listens on `127.0.0.1:0` ([`Upstream::tcp`]), there over TLS with a
//! certificate of a CA made for it ([`Upstream::tls`], [`tls`]), or on a
//! Unix socket ([`Upstream::unix`]), and stops when dropped.
//!
//! ```ignore
//! let upstream = Upstream::tcp(vec![Turn::text("hello")]).await;
//! // ... point a client at upstream.base_url() ...
//! let seen = upstream.wait_for_requests(1, MINUTE).await;
//! assert_eq!(seen[0].api_key(), Some("the key"));
//! ```

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, StatusCode, Uri, header},
    response::Response,
};
mod anthropic;
mod openai;
pub mod tls;

use anthropic::{error, faulty, message, sse};
use openai::{chat_chunks, chat_completion, openai_error};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

/// Tokens a turn reports, as the API names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
}

/// One content block of a scripted answer.
#[derive(Clone, Debug)]
pub enum Block {
    Text(String),
    /// A text streamed as these `text_delta`s, one event each, as a model
    /// streams its words (whole, their concatenation). Anthropic's only.
    Deltas(Vec<String>),
    /// A call of tool `name` (`mcp__troupe__create_session`, ...) with `input`.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// A scripted misbehaviour, given in place of a turn's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// This HTTP status, with an `api_error` in the API's shape.
    Status(u16),
    /// `200` with a body that is not JSON.
    Malformed,
    /// A stream cut after `message_start` (with the turn's input usage)
    /// and its first block's start: no `message_stop`.
    Truncated,
    /// A stream that sends `message_start`, then nothing, and never ends.
    Stall,
    /// A stream cut like `Truncated`, but by a broken connection (no
    /// chunked end): the client reads an error.
    BreakOff,
    /// The whole answer, each event this long after the one before: a slow
    /// provider that never stalls.
    Drip(Duration),
    /// Not a misbehaviour: the turn's own answer, streamed at this many
    /// bytes per second, as a provider streams at its model's pace.
    /// Anthropic's only.
    Pace(u64),
    /// A `401` that echoes the key it was sent, whole and masked as
    /// providers print it, in its body and in a header, among headers a
    /// client should never see (`set-cookie`, the provider's organisation)
    /// and those it should (`request-id`, `retry-after`).
    EchoKey,
    /// A `500` whose error body is this many bytes long.
    HugeError(usize),
    /// The turn's answer as JSON with this as its usage: usage that is
    /// no count.
    Usage(Value),
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Turn {
    pub blocks: Vec<Block>,
    /// `end_turn`, `tool_use`, `max_tokens`...
    pub stop_reason: String,
    pub usage: Usage,
    /// Misbehave instead of answering.
    pub fault: Option<Fault>,
}

impl Turn {
    /// A text answer that ends the turn, with a little usage.
    pub fn text(text: &str) -> Turn {
        Turn {
            blocks: vec![Block::Text(text.to_owned())],
            stop_reason: "end_turn".to_owned(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            fault: None,
        }
    }

    /// A text answer streamed in `count` deltas of `piece` each.
    pub fn deltas(piece: &str, count: usize) -> Turn {
        Turn {
            blocks: vec![Block::Deltas(vec![piece.to_owned(); count])],
            ..Turn::text("")
        }
    }

    /// A text turn that misbehaves as `fault` says.
    pub fn fault(fault: Fault) -> Turn {
        Turn {
            fault: Some(fault),
            ..Turn::text("never whole")
        }
    }

    /// A call of one tool, stopping for its result.
    pub fn tool_use(id: &str, name: &str, input: Value) -> Turn {
        Turn {
            blocks: vec![Block::ToolUse {
                id: id.to_owned(),
                name: name.to_owned(),
                input,
            }],
            stop_reason: "tool_use".to_owned(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            fault: None,
        }
    }

    /// The same turn with `usage`.
    pub fn with_usage(mut self, usage: Usage) -> Turn {
        self.usage = usage;
        self
    }
}

/// A request the upstream got.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// The path and query: `/v1/messages?beta=true`.
    pub uri: String,
    /// Header names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
}

impl Recorded {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The key the client sent: `x-api-key`, else `Authorization: Bearer`.
    pub fn api_key(&self) -> Option<&str> {
        self.header("x-api-key").or_else(|| {
            self.header("authorization")
                .and_then(|v| v.strip_prefix("Bearer "))
        })
    }

    /// Whether it asked for a stream.
    pub fn streams(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }
}

#[derive(Default)]
struct Shared {
    turns: Mutex<VecDeque<Turn>>,
    /// Per-agent scripts: (marker, turns).
    scripts: Mutex<Vec<(String, VecDeque<Turn>)>>,
    requests: Mutex<Vec<Recorded>>,
    arrived: Notify,
}

/// The running upstream; stops when dropped.
pub struct Upstream {
    shared: Arc<Shared>,
    addr: Option<std::net::SocketAddr>,
    socket: Option<PathBuf>,
    tls: Option<tls::Tls>,
    stop: Option<oneshot::Sender<()>>,
}

impl Upstream {
    /// Serves `turns` on `127.0.0.1:0`.
    pub async fn tcp(turns: Vec<Turn>) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("its address");
        let (shared, stop) = Upstream::serve(listener, turns);
        Upstream {
            shared,
            addr: Some(addr),
            socket: None,
            tls: None,
            stop: Some(stop),
        }
    }

    /// Serves `turns` over TLS on `127.0.0.1:0`, with a certificate for
    /// `names` (`["localhost", "127.0.0.1"]`, or another host's name to be
    /// refused) signed by a CA made for it ([`Upstream::tls_info`]).
    pub async fn tls(turns: Vec<Turn>, names: &[&str]) -> Upstream {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let (listener, tls) = tls::listen(tcp, names);
        let addr = axum::serve::Listener::local_addr(&listener).expect("its address");
        let (shared, stop) = Upstream::serve(listener, turns);
        Upstream {
            shared,
            addr: Some(addr),
            socket: None,
            tls: Some(tls),
            stop: Some(stop),
        }
    }

    /// Serves `turns` on a Unix socket at `path` (made readable and
    /// writable by every uid, as an agent of any session must connect).
    pub async fn unix(path: &Path, turns: Vec<Turn>) -> Upstream {
        use std::os::unix::fs::PermissionsExt;
        let listener = tokio::net::UnixListener::bind(path).expect("bind the upstream's socket");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))
            .expect("socket mode");
        let (shared, stop) = Upstream::serve(listener, turns);
        Upstream {
            shared,
            addr: None,
            socket: Some(path.to_owned()),
            tls: None,
            stop: Some(stop),
        }
    }

    /// Serves `turns` on `listener` until the sender is used or dropped.
    fn serve<L>(listener: L, turns: Vec<Turn>) -> (Arc<Shared>, oneshot::Sender<()>)
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let shared = Arc::new(Shared {
            turns: Mutex::new(turns.into()),
            ..Shared::default()
        });
        let app = Router::new().fallback(answer).with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        (shared, stop)
    }

    /// `http://127.0.0.1:PORT` of a TCP upstream, `https://` over TLS.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr.expect("a TCP upstream"))
    }

    /// The port of a TCP upstream.
    pub fn port(&self) -> u16 {
        self.addr.expect("a TCP upstream").port()
    }

    /// The CA and the failed handshakes of a TLS upstream.
    pub fn tls_info(&self) -> &tls::Tls {
        self.tls.as_ref().expect("a TLS upstream")
    }

    /// The socket of a Unix upstream.
    pub fn socket(&self) -> &Path {
        self.socket.as_deref().expect("a Unix upstream")
    }

    /// Adds a turn after those left.
    pub fn push(&self, turn: Turn) {
        self.shared.turns.lock().unwrap().push_back(turn);
    }

    /// Adds `turns` to the script of the agent whose first message holds
    /// `marker` (a new script if there is none).
    pub fn script(&self, marker: &str, turns: Vec<Turn>) {
        let mut scripts = self.shared.scripts.lock().unwrap();
        match scripts.iter_mut().find(|(m, _)| m == marker) {
            Some((_, queue)) => queue.extend(turns),
            None => scripts.push((marker.to_owned(), turns.into())),
        }
    }

    /// How many scripted turns are still to be given, scripts included.
    pub fn turns_left(&self) -> usize {
        let scripts = self.shared.scripts.lock().unwrap();
        self.shared.turns.lock().unwrap().len()
            + scripts.iter().map(|(_, q)| q.len()).sum::<usize>()
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests have arrived (panics after `limit`).
    pub async fn wait_for_requests(&self, n: usize, limit: Duration) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let arrived = self.shared.arrived.notified();
            let seen = self.requests();
            if seen.len() >= n {
                return seen;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!(
                    "the upstream got {} requests, not {n}: {seen:#?}",
                    seen.len()
                );
            }
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let recorded = Recorded {
        method: method.to_string(),
        uri: uri.to_string(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let stream = recorded.streams();
    let key = recorded.api_key().unwrap_or_default().to_owned();
    let first_message = recorded.body["messages"][0].to_string();
    let include_usage = recorded.body["stream_options"]["include_usage"].as_bool() == Some(true);
    let model = recorded
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("scripted")
        .to_owned();
    shared.requests.lock().unwrap().push(recorded);
    shared.arrived.notify_waiters();

    let post = method == axum::http::Method::POST;
    match uri.path() {
        "/v1/messages/count_tokens" if post => json_response(
            StatusCode::OK,
            &json!({"input_tokens": body.len() as u64 / 4}),
        ),
        "/v1/chat/completions" if post => {
            let turn = shared.turns.lock().unwrap().pop_front();
            match turn {
                None => openai_error(
                    StatusCode::BAD_REQUEST,
                    "the scripted upstream has no turn left",
                ),
                Some(Turn {
                    fault: Some(Fault::Status(code)),
                    ..
                }) => openai_error(
                    StatusCode::from_u16(code).expect("a status"),
                    "the scripted upstream failed",
                ),
                Some(turn) if stream => Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .body(Body::from(chat_chunks(&turn, &model, include_usage)))
                    .expect("a response"),
                Some(turn) => json_response(StatusCode::OK, &chat_completion(&turn, &model)),
            }
        }
        "/v1/messages" if post => {
            let scripted = {
                let mut scripts = shared.scripts.lock().unwrap();
                scripts
                    .iter_mut()
                    .find(|(marker, _)| first_message.contains(marker.as_str()))
                    .map(|(_, queue)| queue.pop_front())
            };
            let turn = match scripted {
                Some(turn) => turn,
                None => shared.turns.lock().unwrap().pop_front(),
            };
            match turn {
                None => error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the scripted upstream has no turn left",
                ),
                Some(Turn {
                    fault: Some(fault),
                    blocks,
                    stop_reason,
                    usage,
                }) => {
                    let turn = Turn {
                        blocks,
                        stop_reason,
                        usage,
                        fault: None,
                    };
                    faulty(&fault, &turn, &model, &key)
                }
                Some(turn) if stream => Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .header(header::CACHE_CONTROL, "no-cache")
                    .body(Body::from(sse(&turn, &model)))
                    .expect("a response"),
                Some(turn) => json_response(StatusCode::OK, &message(&turn, &model)),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("no route {method} {}", uri.path()),
        ),
    }
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .expect("a response")
}
