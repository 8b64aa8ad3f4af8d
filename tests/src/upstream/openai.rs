//! The scripted upstream's OpenAI side: a turn as a chat completion, whole
//! or in chunks, its tool uses as `tool_calls`.

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

/// The turn's tool uses as chat `tool_calls`; none: `None`.
fn tool_calls(turn: &Turn) -> Option<Vec<Value>> {
    let calls: Vec<Value> = turn
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some((id, name, input)),
            _ => None,
        })
        .enumerate()
        .map(|(index, (id, name, input))| {
            json!({"index": index, "id": id, "type": "function",
                   "function": {"name": name, "arguments": input.to_string()}})
        })
        .collect();
    (!calls.is_empty()).then_some(calls)
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
    let mut message = json!({"role": "assistant", "content": turn_text(turn)});
    if let Some(calls) = tool_calls(turn) {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::now_v7().simple()),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(turn)}],
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
    let mut delta = json!({"role": "assistant", "content": turn_text(turn)});
    if let Some(calls) = tool_calls(turn) {
        delta["tool_calls"] = json!(calls);
    }
    let mut out = chunk(
        json!([{"index": 0, "delta": delta, "finish_reason": null}]),
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
