//! The scripted upstream's Gemini side (`POST /v1beta/models/{model}:...`,
//! as Gemini CLI calls it): a turn as a `generateContent` answer (texts as
//! text parts, tool uses as function calls), or as server-sent chunks, each
//! with the usage so far, the last with the finish reason and the whole
//! usage; `countTokens` as `{"totalTokens": N}` (the body's bytes / 4).

use axum::{http::StatusCode, response::Response};
use serde_json::{Value, json};

use super::{Block, Turn, Usage, json_response};

pub(super) fn gemini_error(status: StatusCode, message: &str) -> Response {
    json_response(
        status,
        &json!({"error": {"code": status.as_u16(), "message": message, "status": "INTERNAL"}}),
    )
}

/// Google's names for a turn's usage: the prompt counts its cached tokens.
fn usage(usage: &Usage, whole: bool) -> Value {
    let prompt = usage.input_tokens + usage.cache_read_input_tokens;
    let mut meta = json!({
        "promptTokenCount": prompt,
        "cachedContentTokenCount": usage.cache_read_input_tokens,
    });
    if whole {
        meta["candidatesTokenCount"] = json!(usage.output_tokens);
        meta["totalTokenCount"] = json!(prompt + usage.output_tokens);
    }
    meta
}

fn parts(turn: &Turn) -> Vec<Value> {
    turn.blocks
        .iter()
        .map(|block| match block {
            Block::Text(text) => json!({"text": text}),
            Block::Deltas(pieces) => json!({"text": pieces.concat()}),
            Block::ToolUse { name, input, .. } => {
                json!({"functionCall": {"name": name, "args": input}})
            }
        })
        .collect()
}

fn finish_reason(turn: &Turn) -> &'static str {
    match turn.stop_reason.as_str() {
        "max_tokens" => "MAX_TOKENS",
        _ => "STOP",
    }
}

/// The whole answer.
pub(super) fn generated(turn: &Turn, model: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts(turn)},
                        "finishReason": finish_reason(turn), "index": 0}],
        "usageMetadata": usage(&turn.usage, true),
        "modelVersion": model,
    })
}

/// The answer as server-sent chunks: its parts, each in a chunk with the
/// prompt's usage, then the finish reason with the whole usage.
pub(super) fn generated_chunks(turn: &Turn, model: &str) -> String {
    let mut out = String::new();
    for part in parts(turn) {
        let chunk = json!({
            "candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}],
            "usageMetadata": usage(&turn.usage, false),
            "modelVersion": model,
        });
        out.push_str(&format!("data: {chunk}\r\n\r\n"));
    }
    let last = json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                        "finishReason": finish_reason(turn), "index": 0}],
        "usageMetadata": usage(&turn.usage, true),
        "modelVersion": model,
    });
    out.push_str(&format!("data: {last}\r\n\r\n"));
    out
}
