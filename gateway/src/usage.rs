//! Usage as the provider reports it, and nothing the agent says: the
//! `usage` of a JSON answer; in an Anthropic stream, `message_start`'s usage
//! then `message_delta`'s (cumulative, it replaces what it carries); in an
//! OpenAI stream, the chunk with `usage` (asked for with
//! `stream_options.include_usage`). [`Meter`] reads a stream as it passes.
//!
//! A count that is not a whole number from 0 to [`MAX_REPORTED_TOKENS`]
//! (negative, fractional, absurd, a usage that is not an object) makes the
//! call's usage unreadable ([`Reported::unreadable`]): it is then charged
//! its reservation, never less.
//!
//! The [`Meter`] finds each event's end with `memchr`, searching each byte
//! once, and keeps only an unfinished event's start, up to
//! `MAX_EVENT_BYTES`. Anthropic's content deltas, block starts and stops
//! and pings carry no usage: they pass unparsed, by the name of their
//! `event:` line; any other event is parsed. An OpenAI stream is parsed
//! chunk by chunk (its chunks have no event names).

use serde_json::Value;

use super::shape::Api;
use troupe_domain::model::TokenUsage;

/// Most tokens of one kind one call may report: far past any model's
/// context and output (with every completion asked for), short of what
/// could overflow a price.
pub const MAX_REPORTED_TOKENS: u64 = 100_000_000;

/// Longest server-sent event the meter keeps whole; a longer one is
/// passed on unread (no usage is that long).
const MAX_EVENT_BYTES: usize = 4 << 20;

/// The Anthropic events that carry no usage, stop reason, end or error, by
/// the name their `event:` line gives them: passed on unparsed. The bulk of
/// a long answer is `content_block_delta`s. An event with any other name, or
/// none, is parsed.
const UNMETERED_EVENTS: [&[u8]; 4] = [
    b"content_block_delta",
    b"content_block_start",
    b"content_block_stop",
    b"ping",
];

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
    let usage = value.get("usage")?;
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

/// Reads a stream of server-sent events as it passes through: each byte
/// is searched once, in place; only the start of an event that a piece of
/// the stream leaves unfinished is kept, up to [`MAX_EVENT_BYTES`].
#[derive(Debug)]
pub struct Meter {
    api: Api,
    /// The unfinished event's bytes so far (none of them ends it); while
    /// `skipping`, only its last bytes, that a separator may straddle.
    buffer: Vec<u8>,
    /// The current event outgrew [`MAX_EVENT_BYTES`]: skip to its end.
    skipping: bool,
    pub reported: Reported,
}

/// Longest separator (`\r\n\r\n`) but one: the bytes of an event's end
/// that the piece before may hold.
const STRADDLE: usize = 3;

impl Meter {
    pub fn new(api: Api) -> Meter {
        Meter {
            api,
            buffer: Vec::new(),
            skipping: false,
            reported: Reported::default(),
        }
    }

    /// Reads `chunk`, the next bytes of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        if self.skipping || !self.buffer.is_empty() {
            match self.pending_end(rest) {
                Some((end, next)) => {
                    // The unfinished event ends in this piece.
                    if !std::mem::take(&mut self.skipping) {
                        let mut event = std::mem::take(&mut self.buffer);
                        match end {
                            End::Before(n) => event.truncate(event.len() - n),
                            End::In(n) => event.extend_from_slice(&rest[..n]),
                        }
                        self.event(&event);
                        // Its allocation serves the next unfinished event.
                        event.clear();
                        self.buffer = event;
                    }
                    self.buffer.clear();
                    rest = &rest[next..];
                }
                None => {
                    self.keep(rest);
                    return;
                }
            }
        }
        while let Some((end, sep)) = event_end(rest) {
            self.event(&rest[..end]);
            rest = &rest[end + sep..];
        }
        self.keep(rest);
    }

    /// Where the unfinished event ends in `chunk`, if it does, and where
    /// the next begins: a separator straddling the pieces' seam is looked
    /// for among the last bytes kept and the first of `chunk`.
    fn pending_end(&self, chunk: &[u8]) -> Option<(End, usize)> {
        let before = &self.buffer[self.buffer.len().saturating_sub(STRADDLE)..];
        let after = &chunk[..chunk.len().min(STRADDLE)];
        let mut seam = [0u8; 2 * STRADDLE];
        seam[..before.len()].copy_from_slice(before);
        seam[before.len()..before.len() + after.len()].copy_from_slice(after);
        let seam = &seam[..before.len() + after.len()];
        if let Some((end, sep)) = event_end(seam) {
            let next = end + sep - before.len();
            return Some(match end.checked_sub(before.len()) {
                Some(n) => (End::In(n), next),
                None => (End::Before(before.len() - end), next),
            });
        }
        event_end(chunk).map(|(end, sep)| (End::In(end), end + sep))
    }

    /// Keeps `rest`, the start of an event that does not end in it.
    fn keep(&mut self, rest: &[u8]) {
        if !self.skipping && self.buffer.len() + rest.len() <= MAX_EVENT_BYTES {
            self.buffer.extend_from_slice(rest);
            return;
        }
        // Only the oversized event's end matters now: keep the bytes a
        // separator may straddle.
        self.skipping = true;
        if rest.len() >= STRADDLE {
            self.buffer.clear();
            self.buffer
                .extend_from_slice(&rest[rest.len() - STRADDLE..]);
        } else {
            self.buffer.extend_from_slice(rest);
            let extra = self.buffer.len().saturating_sub(STRADDLE);
            self.buffer.drain(..extra);
        }
    }

    fn event(&mut self, event: &[u8]) {
        if self.api == Api::Anthropic
            && event_name(event).is_some_and(|name| UNMETERED_EVENTS.contains(&name))
        {
            return;
        }
        let text = String::from_utf8_lossy(event);
        let data: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return;
        }
        let data = data.join("\n");
        if self.api == Api::Openai && data.trim() == "[DONE]" {
            self.reported.complete = true;
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&data) else {
            return;
        };
        match self.api {
            Api::Anthropic => self.anthropic(&value),
            Api::Openai => self.openai(&value),
        }
    }

    fn anthropic(&mut self, value: &Value) {
        let r = &mut self.reported;
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

    fn openai(&mut self, value: &Value) {
        let r = &mut self.reported;
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
}

fn error_message(value: &Value) -> String {
    value
        .get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the provider reported an error")
        .to_owned()
}

/// Where an unfinished event ends: this many bytes before the end of what
/// was kept, or at this offset of the new piece.
#[derive(Clone, Copy, Debug)]
enum End {
    Before(usize),
    In(usize),
}

/// The name an event's `event:` line gives it, if that line comes before
/// its data (as providers send it); only the lines before the data are read.
fn event_name(event: &[u8]) -> Option<&[u8]> {
    let mut rest = event;
    loop {
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        if let Some(name) = line.strip_prefix(b"event:") {
            return Some(name.trim_ascii());
        }
        if line.starts_with(b"data:") {
            return None;
        }
        rest = next?;
    }
}

/// Where the first event in `buffer` ends (a blank line: `\n\n` or
/// `\r\n\r\n`), and its separator's length.
fn event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    for at in memchr::memchr_iter(b'\n', buffer) {
        if buffer.get(at + 1) == Some(&b'\n') {
            return Some((at, 2));
        }
        if buffer.get(at + 1..at + 3) == Some(b"\r\n") && at > 0 && buffer[at - 1] == b'\r' {
            return Some((at - 1, 4));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn events_are_read_by_their_name_and_unnamed_ones_are_parsed() {
        // A content delta carries no usage: by its name, it is not read,
        // whatever its data says. Named otherwise, or unnamed, it is.
        let stream = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\n",
            ": a comment\nevent: message_delta\ndata: {\"type\":\"message_delta\",",
            "\"usage\":{\"output_tokens\":7}}\n\n",
            "event: content_block_delta\r\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":999}}\r\n\r\n",
            "data: {\"type\":\"message_stop\"}\nevent: ping\n\n",
        );
        let mut meter = Meter::new(Api::Anthropic);
        meter.feed(stream.as_bytes());
        assert_eq!(meter.reported.tokens.input, 5);
        assert_eq!(meter.reported.tokens.output, 7);
        // An event whose name comes after its data is read by its data.
        assert!(meter.reported.complete);
        assert_eq!(event_name(b"event:  ping \r\ndata: x"), Some(&b"ping"[..]));
        assert_eq!(event_name(b"data: x\nevent: ping"), None);
        assert_eq!(event_name(b"id: 1"), None);
    }

    #[test]
    fn a_separator_split_across_pieces_ends_its_event() {
        let event = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4}}}\r\n\r\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for cut in 0..event.len() {
            let mut meter = Meter::new(Api::Anthropic);
            meter.feed(&event.as_bytes()[..cut]);
            meter.feed(&event.as_bytes()[cut..]);
            assert_eq!(meter.reported.tokens.input, 4, "cut at {cut}");
            assert!(meter.reported.complete, "cut at {cut}");
        }
    }

    #[test]
    fn an_event_past_the_bound_is_skipped_and_the_next_read() {
        let mut meter = Meter::new(Api::Anthropic);
        meter.feed(b"event: content_block_delta\ndata: ");
        let piece = vec![b'x'; 1 << 20];
        for _ in 0..5 {
            meter.feed(&piece);
        }
        meter.feed(b"\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        assert_eq!(meter.reported.tokens.output, 9);
    }

    /// A stream of events with both separators, a provider's error
    /// and a `[DONE]`-like line, as the meter must read it however cut.
    const MIXED: &str = concat!(
        "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
        "{\"input_tokens\":11,\"output_tokens\":1}}}\r\n\r\n",
        ": a comment\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":",
        "{\"text\":\"a\\n\\nb\\r\\n\"}}\n\n",
        "event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":",
        "{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":23}}\r\n\r\n",
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"message\":\"overloaded\"}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    fn read_whole(stream: &[u8]) -> Reported {
        let mut meter = Meter::new(Api::Anthropic);
        meter.feed(stream);
        meter.reported
    }

    #[test]
    fn every_way_of_cutting_a_stream_reads_the_same() {
        let stream = MIXED.as_bytes();
        let whole = read_whole(stream);
        assert_eq!(whole.tokens.input, 11);
        assert_eq!(whole.tokens.output, 23);
        assert_eq!(whole.finish_reasons, ["end_turn"]);
        assert_eq!(whole.error.as_deref(), Some("overloaded"));
        assert!(whole.complete);
        // Two cuts anywhere: three pieces, some of them empty.
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                let mut meter = Meter::new(Api::Anthropic);
                for piece in [&stream[..a], &stream[a..b], &stream[b..]] {
                    meter.feed(piece);
                }
                assert_eq!(meter.reported, whole, "cut at {a} and {b}");
            }
        }
    }

    #[test]
    fn an_oversized_events_end_is_found_however_its_pieces_fall() {
        let mut stream = b"event: content_block_delta\ndata: ".to_vec();
        stream.resize(stream.len() + MAX_EVENT_BYTES + 10, b'x');
        let big = stream.len();
        stream.extend_from_slice(b"\r\n\r\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        // The bulk in one piece, then the rest, from a little before the
        // separator, in pieces of every size from one byte up.
        let tail = big - 8;
        for size in 1..=8 {
            let mut meter = Meter::new(Api::Anthropic);
            meter.feed(&stream[..tail]);
            assert!(meter.skipping && meter.buffer.len() <= STRADDLE);
            for piece in stream[tail..].chunks(size) {
                meter.feed(piece);
            }
            assert_eq!(meter.reported.tokens.output, 9, "pieces of {size}");
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
