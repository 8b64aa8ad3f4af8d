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
//! - `POST /v1/responses` (OpenAI Responses, as Codex calls it) answers the
//!   next turn as a response (texts as messages, tool uses as function
//!   calls), or its stream of named events with the usage in the last; a
//!   [`Fault::Status`] or [`Fault::Usage`] turn answers as on the others, a
//!   [`Fault::Truncated`] one with its stream cut before its first delta.
//! - `POST /v1beta/models/{model}:generateContent` (Gemini) answers the
//!   next turn as Gemini does, `:streamGenerateContent` as its chunks (the
//!   usage so far in each), `:countTokens` `{"totalTokens": N}`; a
//!   [`Fault::Status`] or [`Fault::Usage`] turn answers as on the others.
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
mod gemini;
mod openai;
mod responses;
mod script;
pub mod tls;

pub use script::{Block, Fault, Recorded, Turn, Usage};

use anthropic::{error, faulty, message, sse};
use gemini::{gemini_error, generated, generated_chunks};
use openai::{chat_chunks, chat_completion, openai_error};
use responses::{response, response_events};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

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
        bytes: body.len() as u64,
    };
    let stream = recorded.streams();
    let key = recorded.api_key().unwrap_or_default().to_owned();
    let first_message = recorded.body["messages"][0].to_string();
    let include_usage = recorded.body["stream_options"]["include_usage"].as_bool() == Some(true);
    let gemini = uri
        .path()
        .strip_prefix("/v1beta/models/")
        .and_then(|target| target.rsplit_once(':'))
        .map(|(model, method)| (model.to_owned(), method.to_owned()));
    let model = match &gemini {
        Some((model, _)) => model.clone(),
        None => recorded
            .body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("scripted")
            .to_owned(),
    };
    shared.requests.lock().unwrap().push(recorded);
    shared.arrived.notify_waiters();

    let post = method == axum::http::Method::POST;
    if let Some((_, method)) = gemini.filter(|_| post) {
        if method == "countTokens" {
            return json_response(
                StatusCode::OK,
                &json!({"totalTokens": body.len() as u64 / 4}),
            );
        }
        return match next_turn(&shared, gemini_error) {
            Err(refusal) => *refusal,
            Ok((Some(Fault::Usage(usage)), turn)) => {
                let mut answer = generated(&turn, &model);
                answer["usageMetadata"] = usage;
                json_response(StatusCode::OK, &answer)
            }
            Ok((fault, turn)) if method == "streamGenerateContent" => {
                late_stream(generated_chunks(&turn, &model), fault)
            }
            Ok((_, turn)) => json_response(StatusCode::OK, &generated(&turn, &model)),
        };
    }
    match uri.path() {
        "/v1/messages/count_tokens" if post => json_response(
            StatusCode::OK,
            &json!({"input_tokens": body.len() as u64 / 4}),
        ),
        "/v1/chat/completions" if post => match next_turn(&shared, openai_error) {
            Err(refusal) => *refusal,
            Ok((fault, turn)) if stream => {
                late_stream(chat_chunks(&turn, &model, include_usage), fault)
            }
            Ok((_, turn)) => json_response(StatusCode::OK, &chat_completion(&turn, &model)),
        },
        "/v1/responses" if post => match next_turn(&shared, openai_error) {
            Err(refusal) => *refusal,
            Ok((Some(Fault::Truncated), turn)) => {
                let events = response_events(&turn, &model);
                // Up to the first item's start: no end, no usage.
                let cut = events
                    .find("event: response.output_text.delta")
                    .unwrap_or(0);
                event_stream(events[..cut].to_owned())
            }
            Ok((Some(Fault::Usage(usage)), turn)) => {
                let mut answer = response(&turn, &model);
                answer["usage"] = usage;
                json_response(StatusCode::OK, &answer)
            }
            Ok((fault, turn)) if stream => late_stream(response_events(&turn, &model), fault),
            Ok((_, turn)) => json_response(StatusCode::OK, &response(&turn, &model)),
        },
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

/// The next common turn and its fault, or the answer in the API's shape
/// (`error`) to no turn left (400) or to a turn that is a status.
fn next_turn(
    shared: &Shared,
    error: fn(StatusCode, &str) -> Response,
) -> Result<(Option<Fault>, Turn), Box<Response>> {
    let turn = shared.turns.lock().unwrap().pop_front();
    match turn.map(Turn::split) {
        None => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "the scripted upstream has no turn left",
        ))),
        Some((Some(Fault::Status(code)), _)) => Err(Box::new(error(
            StatusCode::from_u16(code).expect("a status"),
            "the scripted upstream failed",
        ))),
        Some(split) => Ok(split),
    }
}

/// `200` with `body` as server-sent events, sent after the delay of a
/// [`Fault::Late`] turn.
fn late_stream(body: String, fault: Option<Fault>) -> Response {
    let Some(Fault::Late(delay)) = fault else {
        return event_stream(body);
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(late(body, delay))
        .expect("a response")
}

/// `body`, sent `delay` after the answer's head.
fn late(body: String, delay: Duration) -> Body {
    Body::from_stream(futures::stream::once(async move {
        tokio::time::sleep(delay).await;
        Ok::<_, std::io::Error>(body)
    }))
}

/// `200` with `body` as server-sent events.
fn event_stream(body: String) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(body))
        .expect("a response")
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .expect("a response")
}
