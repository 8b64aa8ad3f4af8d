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
    if api == Api::Gemini {
        gemini_spelling(body)?;
        // countTokens may carry a whole request: checked as one.
        if let Some(request) = body.get("generateContentRequest").filter(|r| !r.is_null()) {
            check(api, request, allow)?;
        }
    }
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
                    && RESPONSES_CLIENT_TOOL_TYPES.contains(&kind.as_str()) =>
            {
                hosted(&path, tool)?;
            }
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

/// A Responses client tool that would run at the provider all the same: a
/// `shell` in an `environment` other than the client's own (a container the
/// provider hosts, or one it kept), or with `skills` the provider stored.
fn hosted(path: &str, tool: &Value) -> Result<(), ApiError> {
    let environment = tool.get("environment").filter(|e| !e.is_null());
    if environment.is_some_and(|e| e.get("type").and_then(Value::as_str) != Some("local")) {
        return Err(refused(
            &format!("{path}.environment: a container the provider hosts"),
            "server_tools",
        ));
    }
    if tool.get("skills").is_some_and(|v| !v.is_null()) {
        return Err(refused(
            &format!("{path}.skills: skills the provider stored"),
            "server_tools",
        ));
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
        let kind = item.get("type").and_then(Value::as_str);
        // An item named by its id alone is one the provider stored.
        let by_id = kind.is_none() && item.get("role").is_none() && item.get("id").is_some();
        if kind == Some("item_reference") || by_id {
            return Err(refused(
                &format!("{path}: an item the provider stored"),
                "remote_content",
            ));
        }
        fetched(&path, item)?;
    }
    Ok(())
}

/// Content anywhere in `value` (at `path`) that the provider fetches or
/// holds: an image by a URL other than `data:`, a file by id or URL (in a
/// message, a tool's output, a screenshot).
fn fetched(path: &str, value: &Value) -> Result<(), ApiError> {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                fetched(&format!("{path}[{i}]"), item)?;
            }
        }
        Value::Object(map) => {
            for (key, v) in map {
                let here = format!("{path}.{key}");
                match key.as_str() {
                    "image_url" if !v.is_null() => {
                        // A URL, or an object that holds it (`{"url": ...}`).
                        let url = v.get("url").unwrap_or(v);
                        if !url.as_str().is_some_and(|u| u.starts_with("data:")) {
                            return Err(refused(
                                &format!(
                                    "{here}: an image the provider fetches (only data: URLs are sent)"
                                ),
                                "remote_content",
                            ));
                        }
                    }
                    "file_id" | "file_url" if !v.is_null() => {
                        return Err(refused(&here, "remote_content"));
                    }
                    _ => fetched(&here, v)?,
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Gemini's fields the gateway reads or guards, as the API also takes
/// them: in snake case. Each is refused, so the spelling checked is the
/// one sent.
const GEMINI_SNAKE: [&str; 8] = [
    "cached_content",
    "system_instruction",
    "generation_config",
    "generate_content_request",
    "tool_config",
    "candidate_count",
    "max_output_tokens",
    "file_data",
];

/// Refuses the snake-case spellings of [`GEMINI_SNAKE`] where they would
/// be read: the body's fields, its settings', its parts'.
fn gemini_spelling(body: &Value) -> Result<(), ApiError> {
    let mut places: Vec<(String, &Value)> = vec![("".to_owned(), body)];
    if let Some(config) = body.get("generationConfig") {
        places.push(("generationConfig".to_owned(), config));
    }
    places.extend(gemini_part_places(body));
    for (path, place) in places {
        if let Some(key) = GEMINI_SNAKE.iter().find(|k| place.get(**k).is_some()) {
            let at = if path.is_empty() {
                String::new()
            } else {
                format!("{path}.")
            };
            return Err(ApiError::new(
                Kind::Invalid,
                format!("{at}{key}: write it in camel case, as the gateway checks it"),
            ));
        }
    }
    Ok(())
}

/// Every part of a Gemini body's contents and system instruction, with
/// its path.
fn gemini_part_places(body: &Value) -> Vec<(String, &Value)> {
    let contents = body.get("contents").and_then(Value::as_array);
    let contents = contents.into_iter().flatten().enumerate();
    let mut blocks: Vec<(String, &Value)> = contents
        .map(|(c, v)| (format!("contents[{c}]"), v))
        .collect();
    blocks.extend(
        body.get("systemInstruction")
            .map(|v| ("systemInstruction".to_owned(), v)),
    );
    let mut places = Vec::new();
    for (path, content) in blocks {
        let parts = content.get("parts").and_then(Value::as_array);
        for (p, part) in parts.into_iter().flatten().enumerate() {
            places.push((format!("{path}.parts[{p}]"), part));
        }
    }
    places
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
    for (path, part) in gemini_part_places(body) {
        if part.get("fileData").is_some_and(|v| !v.is_null()) {
            return Err(refused(
                &format!("{path}.fileData: a file the provider fetches"),
                "remote_content",
            ));
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

    /// Gemini takes its fields in snake case too: the spellings of what the
    /// gateway reads or guards are refused wherever they would be read, so
    /// the spelling checked is the one the provider reads.
    #[test]
    fn geminis_snake_case_spellings_of_guarded_fields_are_refused() {
        let all = Reach {
            server_tools: true,
            mcp_servers: true,
            remote_content: true,
        };
        for (body, words) in [
            (json!({"cached_content": "c/1"}), "cached_content"),
            (
                json!({"generation_config": {"max_output_tokens": 9}}),
                "generation_config",
            ),
            (
                json!({"generationConfig": {"candidate_count": 8}}),
                "generationConfig.candidate_count",
            ),
            (
                json!({"contents": [{"parts": [{"file_data": {"file_uri": "https://x"}}]}]}),
                "contents[0].parts[0].file_data",
            ),
            (
                json!({"systemInstruction": {"parts": [{"file_data": {}}]}}),
                "systemInstruction.parts[0].file_data",
            ),
        ] {
            let e = check(Api::Gemini, &body, all).expect_err("refused");
            assert!(e.message.contains(words), "{body}: {}", e.message);
        }
        // A function's own schema may name its fields as it likes.
        let schema = json!({"tools": [{"functionDeclarations": [{"name": "f",
            "parametersJsonSchema": {"properties": {"file_data": {}, "max_output_tokens": {}}}}]}]});
        check(Api::Gemini, &schema, Reach::default()).unwrap();
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
                Api::Responses,
                json!({"tools": [{"type": "shell", "environment": {"type": "container_auto"}}]}),
                "tools[0].environment: a container the provider hosts",
            ),
            (
                Api::Responses,
                json!({"tools": [{"type": "shell", "skills": [{"type": "skill_reference", "skill_id": "s"}]}]}),
                "tools[0].skills",
            ),
            (
                Api::Responses,
                json!({"input": [{"id": "rs_1"}]}),
                "input[0]: an item the provider stored",
            ),
            (
                Api::Responses,
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [
                    {"type": "input_image", "image_url": "https://x.example/a.png"}]}]}),
                "input[0].output[0].image_url",
            ),
            (
                Api::Responses,
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": {"url": "https://x.example/a.png"}}]}]}),
                "input[0].content[0].image_url",
            ),
            (
                Api::Responses,
                json!({"input": [{"type": "computer_call_output", "output": {"type": "input_image", "file_id": "file-1"}}]}),
                "input[0].output.file_id",
            ),
            (
                Api::Gemini,
                json!({"tools": [{"functionDeclarations": []}, {"googleSearch": {}}]}),
                "tools[1].googleSearch: a server tool",
            ),
            (
                Api::Gemini,
                json!({"generateContentRequest": {"contents": [{"parts": [{"fileData": {"fileUri": "https://x"}}]}]}}),
                "fileData",
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
