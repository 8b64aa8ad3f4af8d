//! Usage as the provider reports it, and nothing the agent says: the
//! `usage` of a JSON answer; in an Anthropic stream, `message_start`'s usage
//! then `message_delta`'s (cumulative, it replaces what it carries); in an
//! OpenAI stream, the chunk with `usage` (asked for with
//! `stream_options.include_usage`); in a Responses stream, the response of
//! its last event (`response.completed`, `response.incomplete`,
//! `response.failed`). [`super::meter::Meter`] reads a stream as it
//! passes, and hands each event to [`read_event`].
//!
//! A count that is not a whole number from 0 to [`MAX_REPORTED_TOKENS`]
//! (negative, fractional, absurd, a usage that is not an object) makes the
//! call's usage unreadable ([`Reported::unreadable`]): it is then charged
//! its reservation, never less.

use serde_json::Value;

use super::shape::Api;
use troupe_domain::model::TokenUsage;

/// Most tokens of one kind one call may report: far past any model's
/// context and output (with every completion asked for), short of what
/// could overflow a price.
pub const MAX_REPORTED_TOKENS: u64 = 100_000_000;

/// What the provider has said so far of a call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub tokens: TokenUsage,
    /// Stop reasons (`end_turn`, `tool_use`, `stop`...), in order.
    pub finish_reasons: Vec<String>,
    /// The answer is whole: `message_stop`, `[DONE]`, or a JSON answer read.
    pub complete: bool,
    /// The provider sent an error event in the stream.
    pub error: Option<String>,
    /// The answer's final usage was read (a JSON answer's, Anthropic's
    /// `message_delta`'s, OpenAI's usage chunk).
    pub final_usage: bool,
    /// A usage the provider sent could not be read as counts.
    pub unreadable: bool,
}

impl Reported {
    /// Nothing usable: the call is charged its worst case.
    pub fn unknown() -> Reported {
        Reported {
            unreadable: true,
            ..Reported::default()
        }
    }
}

/// Reads the usage of a whole JSON answer (`None`: it has none).
pub fn from_json(api: Api, body: &[u8]) -> Option<Reported> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let usage = match api {
        Api::Gemini => value.get("usageMetadata")?,
        _ => value.get("usage")?,
    };
    let mut reported = Reported {
        complete: true,
        final_usage: true,
        ..Reported::default()
    };
    match api {
        Api::Anthropic => {
            reported.unreadable = anthropic_usage(usage, &mut reported.tokens).is_none();
            if let Some(reason) = value.get("stop_reason").and_then(Value::as_str) {
                reported.finish_reasons.push(reason.to_owned());
            }
        }
        Api::Openai => {
            match openai_usage(usage) {
                Some(tokens) => reported.tokens = tokens,
                None => reported.unreadable = true,
            }
            openai_reasons(&value, &mut reported.finish_reasons);
        }
        Api::Responses => {
            match responses_usage(usage) {
                Some(tokens) => reported.tokens = tokens,
                None => reported.unreadable = true,
            }
            responses_reasons(&value, &mut reported.finish_reasons);
        }
        Api::Gemini => {
            match gemini_usage(usage) {
                Some(tokens) => reported.tokens = tokens,
                None => reported.unreadable = true,
            }
            gemini_reasons(&value, &mut reported.finish_reasons);
        }
    }
    Some(reported)
}

/// A count of `usage`: absent or null is `Ok(None)`; anything but a whole
/// number up to [`MAX_REPORTED_TOKENS`] is `Err`.
fn count(usage: &Value, name: &str) -> Result<Option<u64>, Unreadable> {
    match usage.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_REPORTED_TOKENS => Ok(Some(n)),
            _ => Err(Unreadable),
        },
    }
}

/// A usage that cannot be read as counts.
#[derive(Debug)]
struct Unreadable;

/// Anthropic's usage: each field present replaces the one before. `None`
/// if it cannot be read (then `tokens` is left as it was).
fn anthropic_usage(usage: &Value, tokens: &mut TokenUsage) -> Option<()> {
    if !usage.is_object() {
        return None;
    }
    let read = |name| count(usage, name).ok();
    let (input, output) = (read("input_tokens")?, read("output_tokens")?);
    let (cache_read, cache_write) = (
        read("cache_read_input_tokens")?,
        read("cache_creation_input_tokens")?,
    );
    for (slot, n) in [
        (&mut tokens.input, input),
        (&mut tokens.output, output),
        (&mut tokens.cache_read, cache_read),
        (&mut tokens.cache_write, cache_write),
    ] {
        if let Some(n) = n {
            *slot = n;
        }
    }
    Some(())
}

/// OpenAI's usage: cached prompt tokens are read from the cache, the rest
/// of the prompt is input. `None` if it cannot be read, or says more of
/// the prompt was cached than there was.
fn openai_usage(usage: &Value) -> Option<TokenUsage> {
    if !usage.is_object() {
        return None;
    }
    let prompt = count(usage, "prompt_tokens").ok()?.unwrap_or(0);
    let cached = match usage.get("prompt_tokens_details") {
        None | Some(Value::Null) => 0,
        Some(details) if details.is_object() => count(details, "cached_tokens").ok()?.unwrap_or(0),
        Some(_) => return None,
    };
    Some(TokenUsage {
        input: prompt.checked_sub(cached)?,
        output: count(usage, "completion_tokens").ok()?.unwrap_or(0),
        cache_read: cached,
        cache_write: 0,
    })
}

/// The Responses API's usage: as OpenAI's, under its own names
/// (`input_tokens`, of them `input_tokens_details.cached_tokens` read from
/// the cache, `output_tokens`).
fn responses_usage(usage: &Value) -> Option<TokenUsage> {
    if !usage.is_object() {
        return None;
    }
    let input = count(usage, "input_tokens").ok()?.unwrap_or(0);
    let cached = match usage.get("input_tokens_details") {
        None | Some(Value::Null) => 0,
        Some(details) if details.is_object() => count(details, "cached_tokens").ok()?.unwrap_or(0),
        Some(_) => return None,
    };
    Some(TokenUsage {
        input: input.checked_sub(cached)?,
        output: count(usage, "output_tokens").ok()?.unwrap_or(0),
        cache_read: cached,
        cache_write: 0,
    })
}

/// Gemini's usage metadata: the prompt's tokens (of them
/// `cachedContentTokenCount` read from the cache) and a server tool's
/// prompt are input; the candidates' tokens and the model's thoughts are
/// output, as Google bills them.
fn gemini_usage(usage: &Value) -> Option<TokenUsage> {
    if !usage.is_object() {
        return None;
    }
    let read = |name| count(usage, name).ok().map(Option::unwrap_or_default);
    let prompt = read("promptTokenCount")?.checked_add(read("toolUsePromptTokenCount")?)?;
    let cached = read("cachedContentTokenCount")?;
    Some(TokenUsage {
        input: prompt.checked_sub(cached)?,
        output: read("candidatesTokenCount")?.checked_add(read("thoughtsTokenCount")?)?,
        cache_read: cached,
        cache_write: 0,
    })
}

/// Each candidate's `finishReason` (`STOP`, `MAX_TOKENS`...).
fn gemini_reasons(value: &Value, reasons: &mut Vec<String>) {
    let candidates = value.get("candidates").and_then(Value::as_array);
    for candidate in candidates.into_iter().flatten() {
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            reasons.push(reason.to_owned());
        }
    }
}

/// A response's end: its `status` (`completed`, `incomplete`, `failed`),
/// and why it is incomplete.
fn responses_reasons(response: &Value, reasons: &mut Vec<String>) {
    if let Some(status) = response.get("status").and_then(Value::as_str) {
        reasons.push(status.to_owned());
    }
    if let Some(reason) = response
        .get("incomplete_details")
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str)
    {
        reasons.push(reason.to_owned());
    }
}

fn openai_reasons(value: &Value, reasons: &mut Vec<String>) {
    for choice in value
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            reasons.push(reason.to_owned());
        }
    }
}

fn error_message(value: &Value) -> String {
    value
        .get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the provider reported an error")
        .to_owned()
}

/// A stream's event (its data, parsed), read into `r`.
pub fn read_event(api: Api, r: &mut Reported, value: &Value) {
    match api {
        Api::Anthropic => anthropic_event(r, value),
        Api::Openai => openai_event(r, value),
        Api::Responses => responses_event(r, value),
        Api::Gemini => gemini_event(r, value),
    }
}

/// A Gemini stream's chunk, read into `r`: each carries the usage so far
/// (it replaces the one before); a candidate's `finishReason` ends it, and
/// its chunk's usage is the final one.
fn gemini_event(r: &mut Reported, value: &Value) {
    if value.get("error").is_some() {
        r.error = Some(error_message(value));
        return;
    }
    let before = r.finish_reasons.len();
    gemini_reasons(value, &mut r.finish_reasons);
    let finished = r.finish_reasons.len() > before;
    if let Some(usage) = value.get("usageMetadata").filter(|u| !u.is_null()) {
        match gemini_usage(usage) {
            Some(tokens) => r.tokens = tokens,
            None => r.unreadable = true,
        }
        // The usage is whole in the chunk that finishes the answer.
        r.final_usage = finished;
    }
    r.complete |= finished;
}

/// An Anthropic stream event, read into `r`.
fn anthropic_event(r: &mut Reported, value: &Value) {
    match value.get("type").and_then(Value::as_str) {
        Some("message_start") => {
            if let Some(usage) = value.get("message").and_then(|m| m.get("usage")) {
                r.unreadable |= anthropic_usage(usage, &mut r.tokens).is_none();
            }
        }
        Some("message_delta") => {
            if let Some(usage) = value.get("usage") {
                r.unreadable |= anthropic_usage(usage, &mut r.tokens).is_none();
                r.final_usage = true;
            }
            if let Some(reason) = value
                .get("delta")
                .and_then(|d| d.get("stop_reason"))
                .and_then(Value::as_str)
            {
                r.finish_reasons.push(reason.to_owned());
            }
        }
        Some("message_stop") => r.complete = true,
        Some("error") => {
            r.error = Some(error_message(value));
        }
        _ => {}
    }
}

/// A Chat Completions chunk, read into `r`.
fn openai_event(r: &mut Reported, value: &Value) {
    if value.get("error").is_some() {
        r.error = Some(error_message(value));
        return;
    }
    if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
        match openai_usage(usage) {
            Some(tokens) => r.tokens = tokens,
            None => r.unreadable = true,
        }
        r.final_usage = true;
    }
    openai_reasons(value, &mut r.finish_reasons);
}
/// A Responses stream event, read into `r`.
fn responses_event(r: &mut Reported, value: &Value) {
    let kind = value.get("type").and_then(Value::as_str);
    match kind {
        Some("response.completed" | "response.incomplete" | "response.failed") => {
            let Some(response) = value.get("response") else {
                return;
            };
            if let Some(usage) = response.get("usage").filter(|u| !u.is_null()) {
                match responses_usage(usage) {
                    Some(tokens) => r.tokens = tokens,
                    None => r.unreadable = true,
                }
                r.final_usage = true;
            }
            responses_reasons(response, &mut r.finish_reasons);
            if kind == Some("response.failed") {
                r.error = Some(error_message(response));
            }
            r.complete = true;
        }
        Some("error") => {
            let message = value.get("message").and_then(Value::as_str);
            r.error = Some(
                message
                    .unwrap_or("the provider reported an error")
                    .to_owned(),
            );
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::Meter;

    #[test]
    fn an_anthropic_stream_reports_start_then_delta_usage_across_chunks() {
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
            "{\"input_tokens\":120,\"output_tokens\":1,\"cache_read_input_tokens\":7,",
            "\"cache_creation_input_tokens\":3}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":",
            "{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":42}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        // Cut at every third byte: events span chunks.
        let mut meter = Meter::new(Api::Anthropic);
        for chunk in stream.as_bytes().chunks(3) {
            meter.feed(chunk);
        }
        let r = meter.reported;
        assert_eq!(
            r.tokens,
            TokenUsage {
                input: 120,
                output: 42,
                cache_read: 7,
                cache_write: 3
            }
        );
        assert_eq!(r.finish_reasons, ["tool_use"]);
        assert!(r.complete);
    }

    /// A Responses stream, as OpenAI and Codex speak it: its deltas pass
    /// unread by their names (even one that claims a usage); its last
    /// event's response carries the usage, cached input read from the
    /// cache.
    #[test]
    fn a_responses_stream_is_metered_from_its_last_event_however_cut() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":",
            "{\"status\":\"in_progress\",\"usage\":null}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.completed\",",
            "\"response\":{\"usage\":{\"input_tokens\":99999,\"output_tokens\":99999}}}\n\n",
            "event: response.completed\r\ndata: {\"type\":\"response.completed\",\"response\":",
            "{\"status\":\"completed\",\"usage\":{\"input_tokens\":120,\"input_tokens_details\":",
            "{\"cached_tokens\":20},\"output_tokens\":42,\"output_tokens_details\":",
            "{\"reasoning_tokens\":30},\"total_tokens\":162}}}\r\n\r\n",
        );
        let expected = TokenUsage {
            input: 100,
            output: 42,
            cache_read: 20,
            cache_write: 0,
        };
        for cut in 0..=stream.len() {
            let mut meter = Meter::new(Api::Responses);
            meter.feed(&stream.as_bytes()[..cut]);
            meter.feed(&stream.as_bytes()[cut..]);
            let r = &meter.reported;
            assert_eq!(r.tokens, expected, "cut at {cut}");
            assert_eq!(r.finish_reasons, ["completed"], "cut at {cut}");
            assert!(r.complete && r.final_usage && !r.unreadable, "cut at {cut}");
        }
        // The same response whole, as JSON.
        let json = br#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":20},"output_tokens":42}}"#;
        let r = from_json(Api::Responses, json).expect("a usage");
        assert_eq!(r.tokens, expected);
        assert_eq!(r.finish_reasons, ["incomplete", "max_output_tokens"]);
    }

    /// A Gemini stream: each chunk's usage replaces the one before (input
    /// less its cached part, output with the thoughts), a candidate's
    /// finish reason ends it; the same as one JSON answer.
    #[test]
    fn a_gemini_stream_is_metered_from_its_last_chunks_usage() {
        let stream = concat!(
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}],",
            "\"usageMetadata\":{\"promptTokenCount\":120}}\r\n\r\n",
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]},",
            "\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":120,",
            "\"cachedContentTokenCount\":20,\"candidatesTokenCount\":12,\"thoughtsTokenCount\":30,",
            "\"totalTokenCount\":162}}\r\n\r\n",
        );
        let expected = TokenUsage {
            input: 100,
            output: 42,
            cache_read: 20,
            cache_write: 0,
        };
        let mut meter = Meter::new(Api::Gemini);
        for chunk in stream.as_bytes().chunks(7) {
            meter.feed(chunk);
        }
        let r = &meter.reported;
        assert_eq!(r.tokens, expected);
        assert_eq!(r.finish_reasons, ["STOP"]);
        assert!(r.complete && r.final_usage && !r.unreadable);
        let json = br#"{"candidates":[{"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":120,"cachedContentTokenCount":20,"candidatesTokenCount":12,"thoughtsTokenCount":30}}"#;
        let r = from_json(Api::Gemini, json).expect("a usage");
        assert_eq!(
            (r.tokens, r.finish_reasons),
            (expected, vec!["MAX_TOKENS".to_owned()])
        );
        for usage in [
            r#"{"promptTokenCount":-1}"#,
            r#"{"promptTokenCount":5,"cachedContentTokenCount":6}"#,
            r#"{"candidatesTokenCount":"7"}"#,
        ] {
            let body = format!(r#"{{"usageMetadata":{usage}}}"#);
            assert!(
                from_json(Api::Gemini, body.as_bytes()).unwrap().unreadable,
                "{usage}"
            );
        }
    }

    /// A failed response and an error event are errors; a usage that is
    /// no count, or more cached than there was input, is unreadable.
    #[test]
    fn a_responses_failure_and_unreadable_usage_are_reported() {
        let mut meter = Meter::new(Api::Responses);
        meter.feed(b"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"overloaded\"}\n\n");
        assert_eq!(meter.reported.error.as_deref(), Some("overloaded"));
        let mut meter = Meter::new(Api::Responses);
        meter.feed(b"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"message\":\"boom\"},\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n");
        let r = &meter.reported;
        assert_eq!(
            (r.error.as_deref(), r.tokens.input, r.complete),
            (Some("boom"), 3, true)
        );
        for usage in [
            r#"{"input_tokens":-1}"#,
            r#"{"input_tokens":1.5}"#,
            r#"{"input_tokens":5,"input_tokens_details":{"cached_tokens":6}}"#,
            r#"{"input_tokens":5,"input_tokens_details":7}"#,
            r#""lots""#,
        ] {
            let body = format!(r#"{{"status":"completed","usage":{usage}}}"#);
            let r = from_json(Api::Responses, body.as_bytes()).expect("a usage");
            assert!(r.unreadable, "{usage}");
        }
    }

    #[test]
    fn a_truncated_stream_is_not_complete() {
        let mut meter = Meter::new(Api::Anthropic);
        meter.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"mess");
        assert_eq!(meter.reported.tokens.input, 9);
        assert_eq!(meter.reported.tokens.output, 1);
        assert!(!meter.reported.complete);
    }

    #[test]
    fn an_openai_stream_takes_the_final_chunks_usage() {
        let mut meter = Meter::new(Api::Openai);
        meter.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}],\"usage\":null}\r\n\r\n");
        meter.feed(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
        meter.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":20}}}\n\ndata: [DONE]\n\n");
        let r = meter.reported;
        assert_eq!(
            r.tokens,
            TokenUsage {
                input: 30,
                output: 8,
                cache_read: 20,
                cache_write: 0
            }
        );
        assert_eq!(r.finish_reasons, ["stop"]);
        assert!(r.complete);
    }

    #[test]
    fn usage_that_cannot_be_read_as_counts_is_unreadable() {
        for usage in [
            r#"{"input_tokens": 9223372036854775807, "output_tokens": 1}"#,
            r#"{"input_tokens": -5, "output_tokens": 1}"#,
            r#"{"input_tokens": 5, "output_tokens": 1.5}"#,
            r#"{"input_tokens": 5, "output_tokens": "7"}"#,
            r#""lots""#,
        ] {
            let body = format!(r#"{{"usage": {usage}}}"#);
            let r = from_json(Api::Anthropic, body.as_bytes()).unwrap();
            assert!(r.unreadable, "{usage}");
            let mut meter = Meter::new(Api::Anthropic);
            let delta = format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{usage}}}\n\n"
            );
            meter.feed(delta.as_bytes());
            assert!(meter.reported.unreadable, "{usage}");
        }
        for usage in [
            r#"{"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 6}}"#,
            r#"{"prompt_tokens": 18446744073709551615}"#,
        ] {
            let body = format!(r#"{{"usage": {usage}}}"#);
            assert!(
                from_json(Api::Openai, body.as_bytes()).unwrap().unreadable,
                "{usage}"
            );
        }
        let fine = from_json(Api::Openai, br#"{"usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": null}}"#).unwrap();
        assert!(!fine.unreadable && fine.final_usage);
    }

    #[test]
    fn json_answers_report_their_usage() {
        let a = from_json(
            Api::Anthropic,
            br#"{"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":6,"cache_read_input_tokens":0,"cache_creation_input_tokens":2}}"#,
        )
        .unwrap();
        assert_eq!(
            (a.tokens.input, a.tokens.output, a.tokens.cache_write),
            (5, 6, 2)
        );
        assert_eq!(a.finish_reasons, ["end_turn"]);
        assert!(from_json(Api::Anthropic, b"{\"no\":1}").is_none());
        assert!(from_json(Api::Anthropic, b"garbage").is_none());
    }
}
