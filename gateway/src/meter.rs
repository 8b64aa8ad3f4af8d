//! A stream of server-sent events read as it passes through ([`Meter`]),
//! each event handed to its API's reading ([`super::usage::read_event`]).
//!
//! The meter finds each event's end with `memchr`, searching each byte
//! once, and keeps only an unfinished event's start, up to
//! [`MAX_EVENT_BYTES`]. Anthropic's content deltas, block starts and stops
//! and pings carry no usage: they pass unparsed, by the name of their
//! `event:` line; any other event is parsed. A Responses stream's events
//! are parsed only if named as one of its ends or an error (or not named);
//! its deltas pass unparsed. An OpenAI stream is parsed chunk by chunk (its
//! chunks have no event names).

use serde_json::Value;

use super::{
    shape::Api,
    usage::{Reported, read_event},
};

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

/// The Responses events that end a stream or report an error, by the name
/// their `event:` line gives them: the only named ones parsed. Every other
/// (`response.output_text.delta` and the rest) carries no usage.
const RESPONSES_METERED_EVENTS: [&[u8]; 4] = [
    b"response.completed",
    b"response.incomplete",
    b"response.failed",
    b"error",
];

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

/// How much of an oversized event's start is read for its name.
const NAME_BYTES: usize = 1024;

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
        // separator may straddle. An event that may carry the usage and is
        // not read leaves the call's usage unknown: charged its worst case.
        if !self.skipping {
            // Its name is in its first line: a short start of it will do.
            let kept = self.buffer.len().min(NAME_BYTES);
            let mut start = self.buffer[..kept].to_vec();
            start.extend_from_slice(&rest[..rest.len().min(NAME_BYTES - kept)]);
            if !self.unmetered(&start) {
                self.reported.unreadable = true;
            }
        }
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

    /// Whether `event` (whole, or its start) is one that carries no usage,
    /// by its name.
    fn unmetered(&self, event: &[u8]) -> bool {
        let name = event_name(event);
        match self.api {
            Api::Anthropic => name.is_some_and(|name| UNMETERED_EVENTS.contains(&name)),
            Api::Responses => name.is_some_and(|name| !RESPONSES_METERED_EVENTS.contains(&name)),
            Api::Openai | Api::Gemini => false,
        }
    }

    fn event(&mut self, event: &[u8]) {
        if self.unmetered(event) {
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
        read_event(self.api, &mut self.reported, &value);
    }
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

    /// An event past the bound that may carry the usage (a Responses
    /// stream's last, which repeats the whole request; any OpenAI or Gemini
    /// chunk) is not read: the call's usage is then unknown, charged its
    /// worst case. A delta past it carries none: nothing is lost.
    #[test]
    fn an_oversized_event_that_may_carry_the_usage_leaves_it_unreadable() {
        let huge = "x".repeat(MAX_EVENT_BYTES + 100_000);
        for (api, event) in [
            (
                Api::Responses,
                format!("event: response.completed\ndata: {{\"instructions\":\"{huge}\"}}\n\n"),
            ),
            (Api::Openai, format!("data: {{\"x\":\"{huge}\"}}\n\n")),
            (Api::Gemini, format!("data: {{\"x\":\"{huge}\"}}\n\n")),
        ] {
            let mut meter = Meter::new(api);
            for piece in event.as_bytes().chunks(1 << 16) {
                meter.feed(piece);
            }
            assert!(meter.reported.unreadable, "{api:?}");
        }
        let mut meter = Meter::new(Api::Responses);
        meter.feed(format!("event: response.output_text.delta\ndata: {huge}\n\n").as_bytes());
        assert!(!meter.reported.unreadable);
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
}
