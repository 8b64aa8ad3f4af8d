//! The scripted upstream's OpenAI side: a turn as a chat completion, whole
//! or in chunks.

use axum::{http::StatusCode, response::Response};
use serde_json::{Value, json};

use super::{Block, Turn, Usage, json_response};

pub(super) fn openai_error(status: StatusCode, message: &str) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}}),
    )
}

fn finish_reason(turn: &Turn) -> &'static str {
    match turn.stop_reason.as_str() {
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        _ => "stop",
    }
}

fn turn_text(turn: &Turn) -> String {
    turn.blocks
        .iter()
        .filter_map(|b| match b {
            Block::Text(t) => Some(t.clone()),
            Block::Deltas(pieces) => Some(pieces.concat()),
            Block::ToolUse { .. } => None,
        })
        .collect()
}

fn openai_usage(usage: &Usage) -> Value {
    let prompt = usage.input_tokens + usage.cache_read_input_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
    })
}

/// A whole chat completion.
pub(super) fn chat_completion(turn: &Turn, model: &str) -> Value {
    json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::now_v7().simple()),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": turn_text(turn)},
                     "finish_reason": finish_reason(turn)}],
        "usage": openai_usage(&turn.usage),
    })
}

/// The chunks of a streamed chat completion, as one body.
pub(super) fn chat_chunks(turn: &Turn, model: &str, include_usage: bool) -> String {
    let id = format!("chatcmpl-{}", uuid::Uuid::now_v7().simple());
    let chunk = |choices: Value, usage: Value| {
        let data = json!({"id": id, "object": "chat.completion.chunk", "created": 0,
                          "model": model, "choices": choices, "usage": usage});
        format!("data: {data}\n\n")
    };
    let mut out = chunk(
        json!([{"index": 0, "delta": {"role": "assistant", "content": turn_text(turn)},
                "finish_reason": null}]),
        Value::Null,
    );
    out.push_str(&chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": finish_reason(turn)}]),
        Value::Null,
    ));
    if include_usage {
        out.push_str(&chunk(json!([]), openai_usage(&turn.usage)));
    }
    out.push_str("data: [DONE]\n\n");
    out
}
