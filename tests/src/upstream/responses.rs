//! The scripted upstream's Responses side (`POST /v1/responses`, as Codex
//! calls it): a turn as a response, whole or as its stream of events (each
//! named by an `event:` line, numbered by `sequence_number`, the usage in
//! the last: `response.completed`, or `response.incomplete` for a turn cut
//! at its output bound).

use serde_json::{Value, json};

use super::{Block, Turn, Usage};

/// OpenAI's names for a turn's usage: the input counts its cached tokens.
fn usage(usage: &Usage) -> Value {
    let input = usage.input_tokens + usage.cache_read_input_tokens;
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + usage.output_tokens,
    })
}

/// The turn's blocks as output items: a message per text, a function call
/// per tool use. A tool named `mcp__SERVER__TOOL` is called as Codex offers
/// an MCP server's tools: `TOOL` in the namespace `mcp__SERVER`.
fn items(turn: &Turn) -> Vec<Value> {
    turn.blocks
        .iter()
        .enumerate()
        .map(|(i, block)| match block {
            Block::Text(text) => message(i, text),
            Block::Deltas(pieces) => message(i, &pieces.concat()),
            Block::ToolUse { id, name, input } => {
                let mut call = json!({
                    "type": "function_call", "id": format!("fc_{i}"), "call_id": id,
                    "name": name, "arguments": input.to_string(), "status": "completed",
                });
                if let Some((server, tool)) = name
                    .strip_prefix("mcp__")
                    .and_then(|rest| rest.split_once("__"))
                {
                    call["namespace"] = json!(format!("mcp__{server}"));
                    call["name"] = json!(tool);
                }
                call
            }
        })
        .collect()
}

fn message(i: usize, text: &str) -> Value {
    json!({
        "type": "message", "id": format!("msg_{i}"), "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// The whole response.
pub(super) fn response(turn: &Turn, model: &str) -> Value {
    let incomplete = turn.stop_reason == "max_tokens";
    json!({
        "id": format!("resp_{}", uuid::Uuid::now_v7().simple()),
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "output": items(turn),
        "usage": usage(&turn.usage),
    })
}

/// The response's stream of events, as one body.
pub(super) fn response_events(turn: &Turn, model: &str) -> String {
    let whole = response(turn, model);
    let mut out = String::new();
    let mut seq = 0u64;
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    };
    let mut started = whole.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    started["usage"] = Value::Null;
    event("response.created", json!({"response": started}));
    for (index, item) in items(turn).into_iter().enumerate() {
        event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        if item["type"] == "message" {
            let text = item["content"][0]["text"].clone();
            event(
                "response.output_text.delta",
                json!({"output_index": index, "content_index": 0, "item_id": item["id"], "delta": text}),
            );
            event(
                "response.output_text.done",
                json!({"output_index": index, "content_index": 0, "item_id": item["id"], "text": text}),
            );
        } else {
            event(
                "response.function_call_arguments.delta",
                json!({"output_index": index, "item_id": item["id"], "delta": item["arguments"]}),
            );
        }
        event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }
    let last = if whole["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    event(last, json!({"response": whole}));
    out
}
