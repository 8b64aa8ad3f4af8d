//! What a request body may make the provider do besides answering from
//! the request itself, checked before the call goes out: run tools of its
//! own (web search and fetch, code execution, computer use), call MCP
//! servers, fetch images or documents by URL, read files by id. Each is
//! the operator's to allow, per provider ([`Reach`]); otherwise the call is
//! refused `400 invalid_request_error`, naming the field. Reaching out with
//! the operator's key and account is not an agent's to decide: a sandboxed
//! agent with no network would have one through the provider.

use serde_json::Value;

use super::{
    config::Reach,
    shape::{Api, ApiError, Kind},
};

/// Tool types that the client runs: only these are not server tools.
const CLIENT_TOOL_TYPES: [&str; 2] = ["custom", "function"];

fn refused(what: &str, allow: &str) -> ApiError {
    ApiError::new(
        Kind::Invalid,
        format!(
            "{what}: not allowed through this gateway (the operator allows it with `allow: [{allow}]` on the provider)"
        ),
    )
}

/// Checks `body` against what the provider allows.
pub fn check(api: Api, body: &Value, allow: Reach) -> Result<(), ApiError> {
    if !allow.server_tools {
        server_tools(api, body)?;
    }
    if !allow.mcp_servers && body.get("mcp_servers").is_some() {
        return Err(refused("mcp_servers", "mcp_servers"));
    }
    if !allow.remote_content {
        match api {
            Api::Anthropic => {
                for field in ["messages", "system"] {
                    if let Some(blocks) = body.get(field) {
                        anthropic_blocks(field, blocks)?;
                    }
                }
            }
            Api::Openai => openai_parts(body)?,
        }
    }
    Ok(())
}

fn server_tools(api: Api, body: &Value) -> Result<(), ApiError> {
    let fields: &[&str] = match api {
        Api::Anthropic => &["container"],
        Api::Openai => &["web_search_options"],
    };
    for field in fields {
        if body.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(refused(field, "server_tools"));
        }
    }
    let tools = body.get("tools").and_then(Value::as_array);
    for (i, tool) in tools.into_iter().flatten().enumerate() {
        match tool.get("type") {
            None | Some(Value::Null) if api == Api::Anthropic => {}
            Some(Value::String(kind)) if CLIENT_TOOL_TYPES.contains(&kind.as_str()) => {}
            Some(kind) => {
                return Err(refused(
                    &format!("tools[{i}]: a server tool (type {kind})"),
                    "server_tools",
                ));
            }
            None => {
                return Err(ApiError::new(
                    Kind::Invalid,
                    format!("tools[{i}].type: a string is required"),
                ));
            }
        }
    }
    Ok(())
}

/// Anthropic content blocks (and the blocks nested in them: a tool
/// result's, a document's content source): a `source` the provider
/// fetches (`url`) or looks up (`file`), or an upload to its container.
fn anthropic_blocks(path: &str, blocks: &Value) -> Result<(), ApiError> {
    match blocks {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                anthropic_blocks(&format!("{path}[{i}]"), item)?;
            }
        }
        Value::Object(block) => {
            if block.get("type").and_then(Value::as_str) == Some("container_upload") {
                return Err(refused(
                    &format!("{path}: a container upload"),
                    "remote_content",
                ));
            }
            // A search result's `source` is a string it cites, not fetched.
            if let Some(source) = block.get("source").filter(|s| s.is_object()) {
                let kind = source.get("type").and_then(Value::as_str);
                if !matches!(kind, Some("base64" | "text" | "content")) {
                    return Err(refused(
                        &format!(
                            "{path}.source: content the provider fetches (type {})",
                            source["type"]
                        ),
                        "remote_content",
                    ));
                }
                if let Some(content) = source.get("content") {
                    anthropic_blocks(&format!("{path}.source.content"), content)?;
                }
            }
            if block.contains_key("file_id") {
                return Err(refused(&format!("{path}.file_id"), "remote_content"));
            }
            if let Some(content) = block.get("content") {
                anthropic_blocks(&format!("{path}.content"), content)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// OpenAI message parts: an image by a URL other than `data:`, a file by
/// id.
fn openai_parts(body: &Value) -> Result<(), ApiError> {
    let messages = body.get("messages").and_then(Value::as_array);
    for (m, message) in messages.into_iter().flatten().enumerate() {
        let parts = message.get("content").and_then(Value::as_array);
        for (p, part) in parts.into_iter().flatten().enumerate() {
            let path = format!("messages[{m}].content[{p}]");
            if let Some(image) = part.get("image_url") {
                let url = image.get("url").or(Some(image)).and_then(Value::as_str);
                if !url.is_some_and(|u| u.starts_with("data:")) {
                    return Err(refused(
                        &format!(
                            "{path}.image_url: an image the provider fetches (only data: URLs are sent)"
                        ),
                        "remote_content",
                    ));
                }
            }
            if part.get("file").is_some_and(|f| f.get("file_id").is_some()) {
                return Err(refused(&format!("{path}.file.file_id"), "remote_content"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refusal(api: Api, body: Value) -> String {
        check(api, &body, Reach::default())
            .expect_err("refused")
            .message
    }

    #[test]
    fn client_tools_and_inline_content_pass() {
        let anthropic = json!({"model": "m", "tools": [{"name": "t", "input_schema": {}},
            {"type": "custom", "name": "u", "input_schema": {"properties": {"url": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "text", "text": "https://a.example"}]},
                {"type": "tool_use", "id": "y", "name": "WebFetch", "input": {"url": "https://a.example"}}]}]});
        check(Api::Anthropic, &anthropic, Reach::default()).unwrap();
        let openai = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]});
        check(Api::Openai, &openai, Reach::default()).unwrap();
    }

    #[test]
    fn what_makes_the_provider_reach_out_is_refused_unless_allowed() {
        let cases = [
            (
                Api::Anthropic,
                json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
                "server tool",
            ),
            (
                Api::Anthropic,
                json!({"tools": [{"type": "code_execution_20250825", "name": "c"}]}),
                "server tool",
            ),
            (
                Api::Anthropic,
                json!({"container": "container_1"}),
                "container",
            ),
            (
                Api::Anthropic,
                json!({"mcp_servers": [{"type": "url", "url": "https://mcp.example"}]}),
                "mcp_servers",
            ),
            (
                Api::Anthropic,
                json!({"messages": [{"content": [{"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/"}}]}]}),
                "fetches",
            ),
            (
                Api::Anthropic,
                json!({"messages": [{"content": [{"type": "tool_result", "content": [{"type": "document", "source": {"type": "file", "file_id": "file_1"}}]}]}]}),
                "fetches",
            ),
            (
                Api::Anthropic,
                json!({"system": [{"type": "document", "source": {"type": "content", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}}]}),
                "fetches",
            ),
            (
                Api::Anthropic,
                json!({"messages": [{"content": [{"type": "container_upload", "file_id": "file_1"}]}]}),
                "container upload",
            ),
            (
                Api::Openai,
                json!({"web_search_options": {}}),
                "web_search_options",
            ),
            (
                Api::Openai,
                json!({"tools": [{"type": "web_search_preview"}]}),
                "server tool",
            ),
            (
                Api::Openai,
                json!({"messages": [{"content": [{"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]}]}),
                "image_url",
            ),
            (
                Api::Openai,
                json!({"messages": [{"content": [{"type": "file", "file": {"file_id": "file-1"}}]}]}),
                "file_id",
            ),
        ];
        for (api, body, words) in cases {
            let message = refusal(api, body.clone());
            assert!(message.contains(words), "{body}: {message}");
            let all = Reach {
                server_tools: true,
                mcp_servers: true,
                remote_content: true,
            };
            check(api, &body, all).unwrap_or_else(|e| panic!("{body}: {}", e.message));
        }
    }
}
