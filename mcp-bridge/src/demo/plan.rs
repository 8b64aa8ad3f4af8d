//! The plan: what the agent does, read from its first message. A message
//! that is not a JSON object is a plan that only says that text.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// `collect` waits this long for the callbacks when the plan does not say.
pub const DEFAULT_COLLECT_TIMEOUT_S: f64 = 120.0;

/// The steps, each optional, run in the order of the fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Printed as a `say` event.
    #[serde(default)]
    pub say: Option<String>,
    /// Children to create, in order.
    #[serde(default)]
    pub spawn: Vec<Spawn>,
    /// Lists the workspace's sessions.
    #[serde(default)]
    pub list: bool,
    /// Messages to send.
    #[serde(default)]
    pub send: Vec<Send>,
    /// How many messages from sessions or the operator to wait for.
    #[serde(default)]
    pub wait_messages: u32,
    /// Tools to call after the wait, in order, each with its arguments as
    /// given (a `called` or `refused` event each).
    #[serde(default)]
    pub calls: Vec<Call>,
    /// Waits for the end of every callback-mode child.
    #[serde(default)]
    pub collect: bool,
    /// The longest `collect` waits, in seconds.
    #[serde(default)]
    pub collect_timeout_s: Option<f64>,
    /// A message to the parent session.
    #[serde(default)]
    pub reply: Option<String>,
    /// The exit code.
    #[serde(default)]
    pub exit: Option<i64>,
}

/// One child to create.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spawn {
    /// The agent definition's name.
    pub agent: String,
    /// The session's title; the agent's name when absent.
    #[serde(default)]
    pub title: Option<String>,
    /// The child's first message: a string as is, anything else (a plan for
    /// another demo agent) as its JSON text.
    #[serde(default)]
    pub message: Option<Value>,
    #[serde(default)]
    pub mode: Mode,
    /// Passed to `create_session` as is.
    #[serde(default)]
    pub trust_level: Option<String>,
    /// Passed to `create_session` as is: `terminate`, `abandon` or `notify`.
    #[serde(default)]
    pub on_parent_end: Option<String>,
}

/// How `create_session` returns; callback children are what `collect` waits for.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Async,
    Sync,
    #[default]
    Callback,
}

impl Mode {
    /// The word `create_session` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Async => "async",
            Mode::Sync => "sync",
            Mode::Callback => "callback",
        }
    }
}

/// One tool call, as an agent's model would make it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub tool: String,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// One message to send.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Send {
    /// `parent`, `children`, or a session id.
    pub to: String,
    pub message: String,
}

/// Whom a `send` entry names.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    Parent,
    Children,
    Session(&'a str),
}

impl Send {
    pub fn target(&self) -> Target<'_> {
        match self.to.trim() {
            "parent" => Target::Parent,
            "children" => Target::Children,
            id => Target::Session(id),
        }
    }
}

impl Spawn {
    pub fn title(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.agent)
    }

    /// The first message as `create_session` takes it.
    pub fn initial_message(&self) -> String {
        match &self.message {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        }
    }
}

impl Plan {
    /// Reads the plan from the first message's text: a JSON object is a plan
    /// (an error if its fields are wrong), anything else is `{"say": text}`.
    pub fn parse(text: &str) -> Result<Plan, String> {
        match serde_json::from_str::<Value>(text) {
            Ok(value @ Value::Object(_)) => {
                serde_json::from_value(value).map_err(|e| format!("the plan is not valid: {e}"))
            }
            _ => Ok(Plan {
                say: Some(text.to_owned()),
                ..Plan::default()
            }),
        }
    }

    pub fn collect_timeout(&self) -> Duration {
        let seconds = self
            .collect_timeout_s
            .filter(|s| s.is_finite())
            .unwrap_or(DEFAULT_COLLECT_TIMEOUT_S);
        Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0))
    }

    /// The exit code, within what a process can return.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(self.exit.unwrap_or(0).clamp(0, 255)).unwrap_or(u8::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_not_an_object_is_said() {
        for text in ["hello", "[1, 2]", "\"quoted\"", "42", ""] {
            let plan = Plan::parse(text).unwrap();
            assert_eq!(plan.say.as_deref(), Some(text));
            assert_eq!(plan.exit_code(), 0);
        }
    }

    #[test]
    fn object_plan_with_defaults() {
        let plan = Plan::parse(
            r#"{"spawn": [{"agent": "worker", "message": {"say": "hi"}, "on_parent_end": "notify"},
                          {"agent": "b", "title": "B", "mode": "sync", "message": "go"}],
                "send": [{"to": "children", "message": "m"}, {"to": "sess_1", "message": "n"}],
                "collect": true, "exit": 3}"#,
        )
        .unwrap();
        assert_eq!(plan.spawn[0].mode, Mode::Callback);
        assert_eq!(plan.spawn[0].on_parent_end.as_deref(), Some("notify"));
        assert_eq!(plan.spawn[1].on_parent_end, None);
        assert_eq!(plan.spawn[0].title(), "worker");
        assert_eq!(plan.spawn[0].initial_message(), r#"{"say":"hi"}"#);
        assert_eq!(plan.spawn[1].mode, Mode::Sync);
        assert_eq!(plan.spawn[1].title(), "B");
        assert_eq!(plan.spawn[1].initial_message(), "go");
        assert_eq!(plan.send[0].target(), Target::Children);
        assert_eq!(plan.send[1].target(), Target::Session("sess_1"));
        assert_eq!(plan.collect_timeout(), Duration::from_secs(120));
        assert_eq!(plan.exit_code(), 3);
    }

    #[test]
    fn wrong_fields_are_an_error() {
        assert!(Plan::parse(r#"{"spwan": []}"#).is_err());
        assert!(Plan::parse(r#"{"spawn": [{"agent": "a", "mode": "later"}]}"#).is_err());
        assert!(Plan::parse(r#"{"exit": "one"}"#).is_err());
    }

    #[test]
    fn exit_codes_are_clamped() {
        assert_eq!(Plan::parse(r#"{"exit": 300}"#).unwrap().exit_code(), 255);
        assert_eq!(Plan::parse(r#"{"exit": -1}"#).unwrap().exit_code(), 0);
    }
}
