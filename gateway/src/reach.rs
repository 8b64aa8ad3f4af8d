//! What a request body may make the provider do besides answering from
//! the request itself, checked before the call goes out: run tools of its
//! own (web search and fetch, code execution, computer use), call MCP
//! servers, fetch images or documents by URL, read files by id, or (the
//! Responses API) read what it stored of earlier calls: a previous
//! response, a conversation, a stored prompt, an item by reference. Each is
//! the operator's to allow, per provider ([`Reach`]); otherwise the call is
//! refused `400 invalid_request_error`, naming the field. Reaching out with
//! the operator's key and account is not an agent's to decide: a sandboxed
//! agent with no network would have one through the provider, and what one
//! session stored at the provider is not another's to read.
//!
//! A Responses call in the `background` is refused whatever the operator
//! allows: its answer, and so its usage, would come later by a route the
//! gateway does not serve.

use serde_json::Value;

use super::{
    config::Reach,
    shape::{Api, ApiError, Kind},
};

/// Tool types that the client runs: only these are not server tools.
const CLIENT_TOOL_TYPES: [&str; 2] = ["custom", "function"];

/// The Responses API's client tools: functions, free-form tools, the shell
/// and patch tools the client runs, and `namespace`s of such tools (Codex
/// sends each MCP server's tools as one).
const RESPONSES_CLIENT_TOOL_TYPES: [&str; 5] =
    ["apply_patch", "custom", "function", "local_shell", "shell"];

/// Responses fields that read what the provider stored of earlier calls.
const RESPONSES_STORED: [&str; 3] = ["conversation", "previous_response_id", "prompt"];

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
    if api == Api::Responses
        && body
            .get("background")
            .is_some_and(|b| !b.is_null() && *b != Value::Bool(false))
    {
        return Err(ApiError::new(
            Kind::Invalid,
            "background: not served through this gateway (the answer and its usage would come later, by a route it does not serve)",
        ));
    }
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
            Api::Responses => responses_input(body)?,
            Api::Gemini => gemini_parts(body)?,
        }
    }
    Ok(())
}

fn server_tools(api: Api, body: &Value) -> Result<(), ApiError> {
    let fields: &[&str] = match api {
        Api::Anthropic => &["container"],
        Api::Openai => &["web_search_options"],
        Api::Responses | Api::Gemini => &[],
    };
    if api == Api::Gemini {
        return gemini_tools(body);
    }
    for field in fields {
        if body.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(refused(field, "server_tools"));
        }
    }
    client_tools(api, "tools", body.get("tools"))
}

/// Checks that every tool of `tools` (at `path`) is one the client runs;
/// a Responses `namespace`'s tools are checked as tools.
fn client_tools(api: Api, path: &str, tools: Option<&Value>) -> Result<(), ApiError> {
    let tools = tools.and_then(Value::as_array);
    for (i, tool) in tools.into_iter().flatten().enumerate() {
        let path = format!("{path}[{i}]");
        match tool.get("type") {
            None | Some(Value::Null) if api == Api::Anthropic => {}
            Some(Value::String(kind)) if api == Api::Responses && kind == "namespace" => {
                client_tools(api, &format!("{path}.tools"), tool.get("tools"))?;
            }
            Some(Value::String(kind))
                if api == Api::Responses
                    && RESPONSES_CLIENT_TOOL_TYPES.contains(&kind.as_str()) => {}
            Some(Value::String(kind))
                if api != Api::Responses && CLIENT_TOOL_TYPES.contains(&kind.as_str()) => {}
            Some(kind) => {
                return Err(refused(
                    &format!("{path}: a server tool (type {kind})"),
                    "server_tools",
                ));
            }
            None => {
                return Err(ApiError::new(
                    Kind::Invalid,
                    format!("{path}.type: a string is required"),
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

/// Responses input: what the provider stored (a previous response, a
/// conversation, a prompt, an item by reference), an image by a URL other
/// than `data:`, a file by id or URL.
fn responses_input(body: &Value) -> Result<(), ApiError> {
    for field in RESPONSES_STORED {
        if body.get(field).is_some_and(|v| !v.is_null()) {
            return Err(refused(
                &format!("{field}: what the provider stored of earlier calls"),
                "remote_content",
            ));
        }
    }
    let items = body.get("input").and_then(Value::as_array);
    for (i, item) in items.into_iter().flatten().enumerate() {
        let path = format!("input[{i}]");
        if item.get("type").and_then(Value::as_str) == Some("item_reference") {
            return Err(refused(
                &format!("{path}: an item the provider stored"),
                "remote_content",
            ));
        }
        let parts = item.get("content").and_then(Value::as_array);
        for (p, part) in parts.into_iter().flatten().enumerate() {
            let path = format!("{path}.content[{p}]");
            if let Some(url) = part.get("image_url").filter(|u| !u.is_null())
                && !url.as_str().is_some_and(|u| u.starts_with("data:"))
            {
                return Err(refused(
                    &format!(
                        "{path}.image_url: an image the provider fetches (only data: URLs are sent)"
                    ),
                    "remote_content",
                ));
            }
            for field in ["file_id", "file_url"] {
                if part.get(field).is_some_and(|v| !v.is_null()) {
                    return Err(refused(&format!("{path}.{field}"), "remote_content"));
                }
            }
        }
    }
    Ok(())
}

/// Gemini's tools: each names its kind by its key, and only
/// `functionDeclarations` are the client's (Google Search, code execution,
/// URL context, computer use, file search, Maps are the provider's).
fn gemini_tools(body: &Value) -> Result<(), ApiError> {
    let tools = body.get("tools").and_then(Value::as_array);
    for (i, tool) in tools.into_iter().flatten().enumerate() {
        let Some(tool) = tool.as_object() else {
            return Err(ApiError::new(
                Kind::Invalid,
                format!("tools[{i}]: an object is required"),
            ));
        };
        if let Some(kind) = tool.keys().find(|k| *k != "functionDeclarations") {
            return Err(refused(
                &format!("tools[{i}].{kind}: a server tool"),
                "server_tools",
            ));
        }
    }
    Ok(())
}

/// Gemini content: a file the provider fetches or holds (`fileData`, by
/// URI), or a cache it stored (`cachedContent`).
fn gemini_parts(body: &Value) -> Result<(), ApiError> {
    if body.get("cachedContent").is_some_and(|v| !v.is_null()) {
        return Err(refused(
            "cachedContent: what the provider stored of earlier calls",
            "remote_content",
        ));
    }
    let contents = body.get("contents").and_then(Value::as_array);
    let contents = contents.into_iter().flatten().enumerate();
    let mut blocks: Vec<(String, &Value)> = contents
        .map(|(c, v)| (format!("contents[{c}]"), v))
        .collect();
    blocks.extend(
        body.get("systemInstruction")
            .map(|v| ("systemInstruction".to_owned(), v)),
    );
    for (path, content) in blocks {
        let parts = content.get("parts").and_then(Value::as_array);
        for (p, part) in parts.into_iter().flatten().enumerate() {
            if part.get("fileData").is_some_and(|v| !v.is_null()) {
                return Err(refused(
                    &format!("{path}.parts[{p}].fileData: a file the provider fetches"),
                    "remote_content",
                ));
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
        // Codex's tools: its own functions, free-form and shell tools, and
        // each MCP server as a namespace of functions.
        let responses = json!({"model": "m", "store": false, "tools": [
            {"type": "function", "name": "f", "parameters": {}},
            {"type": "custom", "name": "apply_patch"}, {"type": "local_shell"},
            {"type": "namespace", "name": "mcp__troupe", "tools": [{"type": "function", "name": "create_session"}]}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]});
        check(Api::Responses, &responses, Reach::default()).unwrap();
        // Gemini CLI's: function declarations with JSON schemas, inline data.
        let gemini = json!({"tools": [{"functionDeclarations": [{"name": "f", "parametersJsonSchema": {}}]}],
            "contents": [{"role": "user", "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}],
            "systemInstruction": {"parts": [{"text": "be brief"}]}});
        check(Api::Gemini, &gemini, Reach::default()).unwrap();
    }

    /// A background call's answer and usage would come by a route the
    /// gateway does not serve: refused whatever the operator allows.
    #[test]
    fn a_background_response_is_refused_even_when_everything_is_allowed() {
        let all = Reach {
            server_tools: true,
            mcp_servers: true,
            remote_content: true,
        };
        for background in [json!(true), json!("yes"), json!(1)] {
            let body = json!({"model": "m", "background": background});
            let e = check(Api::Responses, &body, all).expect_err("refused");
            assert!(e.message.starts_with("background:"), "{}", e.message);
        }
        for background in [json!(false), Value::Null] {
            check(Api::Responses, &json!({"background": background}), all).unwrap();
        }
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
            (
                Api::Responses,
                json!({"tools": [{"type": "web_search"}]}),
                "server tool",
            ),
            (
                Api::Responses,
                json!({"tools": [{"type": "mcp", "server_url": "https://mcp.example"}]}),
                "server tool",
            ),
            (
                Api::Responses,
                json!({"tools": [{"type": "namespace", "name": "n", "tools": [
                    {"type": "function", "name": "f"}, {"type": "code_interpreter"}]}]}),
                "tools[0].tools[1]: a server tool",
            ),
            (
                Api::Responses,
                json!({"previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                Api::Responses,
                json!({"conversation": "conv_1"}),
                "conversation",
            ),
            (
                Api::Responses,
                json!({"prompt": {"id": "pmpt_1"}}),
                "prompt",
            ),
            (
                Api::Responses,
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0]: an item the provider stored",
            ),
            (
                Api::Responses,
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x.example/a.png"}]}]}),
                "image_url",
            ),
            (
                Api::Responses,
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x.example/a.pdf"}]}]}),
                "file_url",
            ),
            (
                Api::Responses,
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}),
                "file_id",
            ),
            (
                Api::Gemini,
                json!({"tools": [{"functionDeclarations": []}, {"googleSearch": {}}]}),
                "tools[1].googleSearch: a server tool",
            ),
            (
                Api::Gemini,
                json!({"tools": [{"functionDeclarations": [], "codeExecution": {}}]}),
                "tools[0].codeExecution: a server tool",
            ),
            (
                Api::Gemini,
                json!({"cachedContent": "cachedContents/1"}),
                "cachedContent",
            ),
            (
                Api::Gemini,
                json!({"contents": [{"role": "user", "parts": [{"text": "x"}, {"fileData": {"fileUri": "https://x.example/a.pdf"}}]}]}),
                "contents[0].parts[1].fileData",
            ),
            (
                Api::Gemini,
                json!({"systemInstruction": {"parts": [{"fileData": {"fileUri": "gs://b/a"}}]}}),
                "systemInstruction.parts[0].fileData",
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
