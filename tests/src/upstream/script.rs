//! What a scripted upstream answers and what it saw: its [`Turn`]s (text,
//! tool uses, usage) or [`Fault`]s, and each [`Recorded`] request.

use std::time::Duration;

use serde_json::Value;

/// Tokens a turn reports, as the API names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
}

/// One content block of a scripted answer.
#[derive(Clone, Debug)]
pub enum Block {
    Text(String),
    /// A text streamed as these `text_delta`s, one event each, as a model
    /// streams its words (whole, their concatenation). Anthropic's only.
    Deltas(Vec<String>),
    /// A call of tool `name` (`mcp__troupe__create_session`, ...) with `input`.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// A scripted misbehaviour, given in place of a turn's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// This HTTP status, with an `api_error` in the API's shape.
    Status(u16),
    /// `200` with a body that is not JSON.
    Malformed,
    /// A stream cut after `message_start` (with the turn's input usage)
    /// and its first block's start: no `message_stop`.
    Truncated,
    /// A stream that sends `message_start`, then nothing, and never ends.
    Stall,
    /// A stream cut like `Truncated`, but by a broken connection (no
    /// chunked end): the client reads an error.
    BreakOff,
    /// The whole answer, each event this long after the one before: a slow
    /// provider that never stalls.
    Drip(Duration),
    /// Not a misbehaviour: the turn's own answer, its stream's events sent
    /// this long after the request, as from a model slow to begin. On
    /// every API.
    Late(Duration),
    /// Not a misbehaviour: the turn's own answer, streamed at this many
    /// bytes per second, as a provider streams at its model's pace.
    /// Anthropic's only.
    Pace(u64),
    /// A `401` that echoes the key it was sent, whole and masked as
    /// providers print it, in its body and in a header, among headers a
    /// client should never see (`set-cookie`, the provider's organisation)
    /// and those it should (`request-id`, `retry-after`).
    EchoKey,
    /// A `500` whose error body is this many bytes long.
    HugeError(usize),
    /// The turn's answer as JSON with this as its usage: usage that is
    /// no count.
    Usage(Value),
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Turn {
    pub blocks: Vec<Block>,
    /// `end_turn`, `tool_use`, `max_tokens`...
    pub stop_reason: String,
    pub usage: Usage,
    /// Misbehave instead of answering.
    pub fault: Option<Fault>,
}

impl Turn {
    /// A text answer that ends the turn, with a little usage.
    pub fn text(text: &str) -> Turn {
        Turn {
            blocks: vec![Block::Text(text.to_owned())],
            stop_reason: "end_turn".to_owned(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            fault: None,
        }
    }

    /// A text answer streamed in `count` deltas of `piece` each.
    pub fn deltas(piece: &str, count: usize) -> Turn {
        Turn {
            blocks: vec![Block::Deltas(vec![piece.to_owned(); count])],
            ..Turn::text("")
        }
    }

    /// A text turn that misbehaves as `fault` says.
    pub fn fault(fault: Fault) -> Turn {
        Turn {
            fault: Some(fault),
            ..Turn::text("never whole")
        }
    }

    /// A call of one tool, stopping for its result.
    pub fn tool_use(id: &str, name: &str, input: Value) -> Turn {
        Turn {
            blocks: vec![Block::ToolUse {
                id: id.to_owned(),
                name: name.to_owned(),
                input,
            }],
            stop_reason: "tool_use".to_owned(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            fault: None,
        }
    }

    /// The same turn with `usage`.
    pub fn with_usage(mut self, usage: Usage) -> Turn {
        self.usage = usage;
        self
    }

    /// Its fault, and the turn it would have answered.
    pub fn split(mut self) -> (Option<Fault>, Turn) {
        (self.fault.take(), self)
    }
}

/// A request the upstream got.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// The path and query: `/v1/messages?beta=true`.
    pub uri: String,
    /// Header names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
    /// The body's length in bytes, as it came.
    pub bytes: u64,
}

impl Recorded {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The key the client sent: `x-api-key`, `x-goog-api-key` (Gemini),
    /// else `Authorization: Bearer`.
    pub fn api_key(&self) -> Option<&str> {
        self.header("x-api-key")
            .or_else(|| self.header("x-goog-api-key"))
            .or_else(|| {
                self.header("authorization")
                    .and_then(|v| v.strip_prefix("Bearer "))
            })
    }

    /// Whether it asked for a stream.
    pub fn streams(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }
}
