//! The scripted upstream's Anthropic side: a turn as a message, whole or as
//! server-sent events, a [`Fault`]'s answer, and the API's error shape.

use std::time::Duration;

use axum::{
    body::Body,
    http::{StatusCode, header},
    response::Response,
};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Block, Fault, Turn, Usage, json_response};

/// Bytes a paced answer sends at a time.
const PACE_PIECE: usize = 16 << 10;

/// The answer of a [`Fault`] given in place of `turn`'s; `key` is the key
/// the request carried.
pub(super) fn faulty(fault: &Fault, turn: &Turn, model: &str, key: &str) -> Response {
    let start = || {
        let whole = sse(&Turn::text("cut"), model);
        // message_start, and the first block's start.
        whole.split_inclusive("\n\n").take(2).collect::<String>()
    };
    let events = |body: Body| {
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(body)
            .expect("a response")
    };
    match fault {
        Fault::Status(code) => error(
            StatusCode::from_u16(*code).expect("a status"),
            "api_error",
            "the scripted upstream failed",
        ),
        Fault::Malformed => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{\"id\": \"msg_"))
            .expect("a response"),
        Fault::Truncated => events(Body::from(start())),
        Fault::Stall => {
            let first = start();
            let first = futures::stream::once(async move { Ok::<_, std::io::Error>(first) });
            events(Body::from_stream(first.chain(futures::stream::pending())))
        }
        Fault::BreakOff => {
            // The break waits for the start to be flushed (the server
            // flushes when the body has nothing more ready).
            let first = futures::stream::once(std::future::ready(Ok(start())));
            let broken = futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(std::io::Error::other("broken off"))
            });
            events(Body::from_stream(first.chain(broken)))
        }
        Fault::Pace(rate) => {
            let whole = bytes::Bytes::from(sse(turn, model));
            let per_byte = Duration::from_secs(1).as_secs_f64() / *rate as f64;
            let start = tokio::time::Instant::now();
            let pieces = futures::stream::unfold(0, move |sent| {
                let whole = whole.clone();
                async move {
                    if sent >= whole.len() {
                        return None;
                    }
                    let due = start + Duration::from_secs_f64(sent as f64 * per_byte);
                    tokio::time::sleep_until(due).await;
                    let end = (sent + PACE_PIECE).min(whole.len());
                    Some((Ok::<_, std::io::Error>(whole.slice(sent..end)), end))
                }
            });
            events(Body::from_stream(pieces))
        }
        Fault::EchoKey => {
            let chars: Vec<char> = key.chars().collect();
            let head: String = chars.iter().take(8).collect();
            let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
            let message = format!(
                "invalid x-api-key {key}; Incorrect API key provided: {head}{}{tail}. Key {head}...{tail} \
                 is not valid (hint: ****{tail})",
                "*".repeat(24)
            );
            Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(header::CONTENT_TYPE, "application/json")
                .header("request-id", "req_echo_1")
                .header("retry-after", "7")
                .header("x-leak", format!("key={key}"))
                .header("anthropic-ratelimit-requests-remaining", format!("{head}...{tail}"))
                .header("set-cookie", "provider_session=abc; Path=/")
                .header("anthropic-organization-id", "org-operators-own")
                .header("x-forwarded-for", "10.1.2.3")
                .body(Body::from(
                    json!({"type": "error", "error": {"type": "authentication_error", "message": message}})
                        .to_string(),
                ))
                .expect("a response")
        }
        Fault::HugeError(size) => {
            let mut body = format!(
                "{{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"{key} "
            );
            body.extend(std::iter::repeat_n(
                'x',
                size.saturating_sub(body.len() + 4),
            ));
            body.push_str("\"}}");
            Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .expect("a response")
        }
        Fault::Usage(usage) => {
            let mut answer = message(turn, model);
            answer["usage"] = usage.clone();
            json_response(StatusCode::OK, &answer)
        }
        Fault::Late(delay) => events(super::late(sse(turn, model), *delay)),
        Fault::Drip(gap) => {
            let whole = sse(&Turn::text("slow"), model);
            let pieces: Vec<String> = whole.split_inclusive("\n\n").map(str::to_owned).collect();
            let gap = *gap;
            let pieces = futures::stream::iter(pieces).then(move |piece| async move {
                tokio::time::sleep(gap).await;
                Ok::<_, std::io::Error>(piece)
            });
            events(Body::from_stream(pieces))
        }
    }
}

pub(super) fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
    })
}

fn block_json(block: &Block) -> Value {
    match block {
        Block::Text(text) => json!({"type": "text", "text": text}),
        Block::Deltas(pieces) => json!({"type": "text", "text": pieces.concat()}),
        Block::ToolUse { id, name, input } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
    }
}

/// The whole message of a non-streaming answer.
pub(super) fn message(turn: &Turn, model: &str) -> Value {
    json!({
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": turn.blocks.iter().map(block_json).collect::<Vec<_>>(),
        "stop_reason": turn.stop_reason,
        "stop_sequence": null,
        "usage": usage_json(&turn.usage),
    })
}

/// The events of a streaming answer, as one body.
pub(super) fn sse(turn: &Turn, model: &str) -> String {
    let mut out = String::new();
    let mut event = |name: &str, data: Value| {
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    let start_usage = Usage {
        output_tokens: 1,
        ..turn.usage
    };
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage_json(&start_usage),
        }}),
    );
    for (index, block) in turn.blocks.iter().enumerate() {
        let text_start = || json!({"type": "text", "text": ""});
        let text_delta = |text: &str| json!({"type": "text_delta", "text": text});
        let (start, deltas) = match block {
            Block::Text(text) => (text_start(), vec![text_delta(text)]),
            Block::Deltas(pieces) => (text_start(), pieces.iter().map(|p| text_delta(p)).collect()),
            Block::ToolUse { id, name, input } => (
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                vec![json!({"type": "input_json_delta", "partial_json": input.to_string()})],
            ),
        };
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        for delta in deltas {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
    }
    event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": turn.stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": turn.usage.output_tokens}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out
}
