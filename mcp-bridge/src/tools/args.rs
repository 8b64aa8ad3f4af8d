//! The tools' arguments: what the agent sends, as JSON Schema for the
//! tool list and as the types the calls take, and the checks of the
//! arguments that need no service (the wait's length, a budget's amounts).

use std::{borrow::Cow, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde_json::Value;
use troupe_proto::{
    money::{self, PICO_PER_USD},
    session::{Budget, ExecutionMode, Outcome, ParentEndPolicy},
};

use crate::failure::ToolFailure;

/// `wait_for_session` waits this long when no timeout is given.
pub const DEFAULT_WAIT_SECS: f64 = 300.0;
/// ... and never longer than this.
pub const MAX_WAIT_SECS: f64 = 3600.0;

/// Arguments of `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSessionArgs {
    /// A short human-readable title for the new session, e.g. "API implementation".
    pub title: String,
    /// The agent to run: the name of an agent definition the operator made for this
    /// workspace, e.g. "python-specialist".
    pub agent_name: String,
    /// The first message the new agent receives: its task, stated completely.
    pub initial_message: String,
    /// Optional: "sandboxed" (or "untrusted") to give the child less trust than this
    /// session. Omit it to inherit this session's level. "direct" (or "trusted") is
    /// allowed only for a direct caller; trust can never be raised.
    #[serde(default)]
    pub trust_level: Option<String>,
    /// Optional: how the call returns. "async" (default): at once, follow up with
    /// get_session or wait_for_session. "sync": when the child has ended, with its
    /// result (status, exit_code, output_tail, and finished: the outcome and result it
    /// gave with finish). "callback": at once, and when the child ends this session
    /// receives a message saying so, with that outcome and result.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Optional: the most the child and its whole subtree may spend on model calls, in
    /// USD, as a decimal string ("2.50") or a number; at most 12 decimals. Like every
    /// budget_* argument it can only narrow this session's budget: it must be at most
    /// what this session (and each of its ancestors) has left.
    #[serde(default)]
    pub budget_usd: Option<Usd>,
    /// Optional: the most model tokens (input, output, cache reads and writes together)
    /// the child and its subtree may use.
    #[serde(default)]
    pub budget_tokens: Option<Whole>,
    /// Optional: the most model calls the child and its subtree may make.
    #[serde(default)]
    pub budget_calls: Option<Whole>,
    /// Optional: the child's wall-clock time in seconds from its creation; past it the
    /// child and its subtree end (end reason "budget").
    #[serde(default)]
    pub budget_wall_secs: Option<Whole>,
    /// Optional: the directories under /workspace the child may write, e.g.
    /// ["/workspace/src"]; the kernel refuses its writes anywhere else (its $HOME and
    /// $TMPDIR stay writable, reading stays open). Each must lie inside this session's
    /// own write scope. Omit it to give the child this session's scope.
    #[serde(default)]
    pub writable_paths: Option<Vec<String>>,
    /// Optional: what happens to the child when this session ends, however it ends
    /// (exits, fails, finishes, is terminated or lost). "terminate" (default): the
    /// child is terminated too. "abandon": the child keeps running, orphaned (its
    /// budgets and deadline still hold). "notify": as "abandon", and the child receives
    /// a message from "troupe" {"type":"parent_ended","status":..,"reason":..}.
    #[serde(default)]
    pub on_parent_end: Option<OnParentEnd>,
}

/// An amount of USD as the agent wrote it, a decimal string or a number;
/// read exactly by [`CreateSessionArgs::budget`].
#[derive(Clone, Debug, Deserialize)]
#[serde(transparent)]
pub struct Usd(Value);

impl JsonSchema for Usd {
    fn schema_name() -> Cow<'static, str> {
        "Usd".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": ["string", "number"], "examples": ["2.50"] })
    }
}

/// A whole, non-negative number as the agent wrote it (a number, or its
/// digits as a string); checked by [`CreateSessionArgs::budget`].
#[derive(Clone, Debug, Deserialize)]
#[serde(transparent)]
pub struct Whole(Value);

impl JsonSchema for Whole {
    fn schema_name() -> Cow<'static, str> {
        "Whole".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer", "minimum": 0 })
    }
}

impl Usd {
    /// The amount in pico-dollars, exactly: a string is parsed as a
    /// decimal, a number by its shortest decimal form (`0.1` is 0.1 USD).
    fn pico(&self, field: &str) -> Result<u64, ToolFailure> {
        let text = match &self.0 {
            Value::String(text) => text.clone(),
            Value::Number(n) => match (n.as_u64(), n.as_f64()) {
                (Some(whole), _) => {
                    return whole
                        .checked_mul(PICO_PER_USD)
                        .ok_or_else(|| usd_refused(field, &n.to_string(), "too large"));
                }
                // Rust writes a float in its shortest decimal form, never with an exponent.
                (None, Some(float)) => format!("{float}"),
                (None, None) => n.to_string(),
            },
            other => return Err(usd_refused(field, &other.to_string(), "not an amount")),
        };
        money::parse_decimal(&text, 12).map_err(|e| usd_refused(field, &text, &e.to_string()))
    }
}

fn usd_refused(field: &str, text: &str, why: &str) -> ToolFailure {
    ToolFailure::invalid(
        field,
        format!(
            "{field} {text:?} is not an amount of USD ({why}): give a non-negative decimal \
             with at most 12 decimals, e.g. \"2.50\""
        ),
    )
}

impl Whole {
    fn value(&self, field: &str) -> Result<u64, ToolFailure> {
        let parsed = match &self.0 {
            Value::Number(n) => n.as_u64(),
            Value::String(text) => text.trim().parse().ok(),
            _ => None,
        };
        parsed.ok_or_else(|| {
            ToolFailure::invalid(
                field,
                format!("{field} {} is not a whole number of 0 or more", self.0),
            )
        })
    }
}

impl CreateSessionArgs {
    /// The budget the `budget_*` arguments give, if any; an amount that is
    /// not one is refused naming its argument, before anything is sent.
    pub fn budget(&self) -> Result<Option<Budget>, ToolFailure> {
        let whole =
            |value: &Option<Whole>, field| value.as_ref().map(|v| v.value(field)).transpose();
        let wall_ms = match whole(&self.budget_wall_secs, "budget_wall_secs")? {
            None => None,
            Some(secs) => Some(secs.checked_mul(1000).ok_or_else(|| {
                ToolFailure::invalid(
                    "budget_wall_secs",
                    format!("budget_wall_secs {secs} is too large"),
                )
            })?),
        };
        let budget = Budget {
            cost_pico_usd: self
                .budget_usd
                .as_ref()
                .map(|usd| usd.pico("budget_usd"))
                .transpose()?,
            tokens: whole(&self.budget_tokens, "budget_tokens")?,
            model_calls: whole(&self.budget_calls, "budget_calls")?,
            wall_ms,
        };
        Ok((budget != Budget::default()).then_some(budget))
    }
}

/// How `create_session` returns.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Mode {
    Async,
    Sync,
    Callback,
}

impl From<Mode> for ExecutionMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Async => ExecutionMode::Async,
            Mode::Sync => ExecutionMode::Sync,
            Mode::Callback => ExecutionMode::Callback,
        }
    }
}

/// What happens to a child when its parent ends.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum OnParentEnd {
    Terminate,
    Abandon,
    Notify,
}

impl From<OnParentEnd> for ParentEndPolicy {
    fn from(policy: OnParentEnd) -> Self {
        match policy {
            OnParentEnd::Terminate => ParentEndPolicy::Terminate,
            OnParentEnd::Abandon => ParentEndPolicy::Abandon,
            OnParentEnd::Notify => ParentEndPolicy::Notify,
        }
    }
}

/// Arguments of `send_message`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendMessageArgs {
    /// The recipient's session id (`sess_...`), as create_session or
    /// list_workspace_sessions returned it.
    pub session_id: String,
    /// The message text.
    pub message: String,
}

/// Arguments of `list_workspace_sessions`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Optional: also list sessions that have ended (completed, failed, terminated).
    /// Default false: active sessions only.
    #[serde(default)]
    pub include_ended: Option<bool>,
}

/// Arguments of the tools that name one session.
/// Arguments of `finish`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FinishArgs {
    /// What this session hands its parent: the answer to its task, in full (at most the
    /// service's limit, 64 KiB by default; leave long material in the workspace's files
    /// and say where).
    pub result: String,
    /// Optional: "success" (default) if the task is done, "failure" if it could not be
    /// done (say why in result).
    #[serde(default)]
    pub outcome: Option<FinishOutcome>,
}

/// How the task ended.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum FinishOutcome {
    Success,
    Failure,
}

impl From<FinishOutcome> for Outcome {
    fn from(outcome: FinishOutcome) -> Outcome {
        match outcome {
            FinishOutcome::Success => Outcome::Success,
            FinishOutcome::Failure => Outcome::Failure,
        }
    }
}

/// Arguments of `reply_to_parent`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyArgs {
    /// The message for this session's parent.
    pub message: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
}

/// Arguments of `report_progress`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProgressArgs {
    /// Percent of the task done, 0 to 100.
    pub progress: u32,
    /// Optional: what is being done now, in a few words (at most 256 bytes).
    #[serde(default)]
    pub description: Option<String>,
}

/// Arguments of `wait_for_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
    /// Optional: the longest wait in seconds (default 300, at most 3600).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// The wait's length: the default when absent, capped, never negative.
pub(super) fn wait_timeout(seconds: Option<f64>) -> Result<Duration, ToolFailure> {
    let seconds = seconds.unwrap_or(DEFAULT_WAIT_SECS);
    if !seconds.is_finite() {
        return Err(ToolFailure::invalid(
            "timeout_s",
            "timeout_s must be a number of seconds",
        ));
    }
    Ok(Duration::from_secs_f64(seconds.clamp(0.0, MAX_WAIT_SECS)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wait_timeout_defaults_and_caps() {
        assert_eq!(wait_timeout(None).unwrap(), Duration::from_secs(300));
        assert_eq!(wait_timeout(Some(1e9)).unwrap(), Duration::from_secs(3600));
        assert_eq!(wait_timeout(Some(-5.0)).unwrap(), Duration::ZERO);
        assert_eq!(wait_timeout(Some(0.5)).unwrap(), Duration::from_millis(500));
        assert!(wait_timeout(Some(f64::NAN)).is_err());
    }

    #[test]
    fn mode_words() {
        let args: CreateSessionArgs = serde_json::from_value(json!({
            "title": "t", "agent_name": "a", "initial_message": "m", "mode": "sync"
        }))
        .unwrap();
        assert_eq!(args.mode, Some(Mode::Sync));
        assert_eq!(ExecutionMode::from(Mode::Callback), ExecutionMode::Callback);
    }

    #[test]
    fn parent_end_words() {
        let args = |policy: &str| {
            serde_json::from_value::<CreateSessionArgs>(json!({
                "title": "t", "agent_name": "a", "initial_message": "m", "on_parent_end": policy
            }))
        };
        assert_eq!(
            args("notify").unwrap().on_parent_end,
            Some(OnParentEnd::Notify)
        );
        assert_eq!(
            ParentEndPolicy::from(OnParentEnd::Abandon),
            ParentEndPolicy::Abandon
        );
        assert!(args("orphan").is_err());
    }

    fn budget(extra: Value) -> Result<Option<Budget>, ToolFailure> {
        let mut value = json!({"title": "t", "agent_name": "a", "initial_message": "m"});
        value
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<CreateSessionArgs>(value)
            .unwrap()
            .budget()
    }

    #[test]
    fn budgets_are_read_exactly() {
        assert_eq!(budget(json!({})).unwrap(), None);
        let given = budget(json!({
            "budget_usd": "2.50", "budget_tokens": 1000, "budget_calls": "20",
            "budget_wall_secs": 60
        }))
        .unwrap()
        .unwrap();
        assert_eq!(
            given,
            Budget {
                cost_pico_usd: Some(2_500_000_000_000),
                tokens: Some(1000),
                model_calls: Some(20),
                wall_ms: Some(60_000),
            }
        );
        for (usd, pico) in [
            (json!(0.1), 100_000_000_000u64),
            (json!(3), 3_000_000_000_000),
            (json!(0.000001), 1_000_000),
            (json!("0.000000000001"), 1),
        ] {
            let got = budget(json!({ "budget_usd": usd })).unwrap().unwrap();
            assert_eq!(got.cost_pico_usd, Some(pico), "{usd}");
        }
    }

    #[test]
    fn bad_budgets_are_refused_naming_the_argument() {
        for (field, value) in [
            ("budget_usd", json!("-1")),
            ("budget_usd", json!(-0.5)),
            ("budget_usd", json!("2.5e3")),
            ("budget_usd", json!("0.0000000000001")),
            ("budget_usd", json!(true)),
            ("budget_usd", json!(1e300)),
            ("budget_tokens", json!(-3)),
            ("budget_tokens", json!(1.5)),
            ("budget_tokens", json!(true)),
            ("budget_calls", json!("many")),
            ("budget_wall_secs", json!(u64::MAX)),
        ] {
            let failure = budget(json!({ field: value })).unwrap_err();
            assert_eq!(failure.code, "INVALID_ARGUMENT", "{field} {value}");
            assert_eq!(
                failure.metadata,
                [("field".to_owned(), field.to_owned())],
                "{field} {value}"
            );
            assert!(failure.message.starts_with(field), "{}", failure.message);
        }
    }
}

/// Arguments of `broadcast`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct BroadcastArgs {
    /// The message text; every recipient gets it once.
    pub message: String,
    /// Optional: who gets it. "workspace" (default): every active session of this
    /// workspace this session may message. "subtree": this session's active
    /// descendants. "children": its active direct children.
    #[serde(default)]
    pub scope: Option<Scope>,
}

/// Who a broadcast goes to.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Scope {
    Workspace,
    Subtree,
    Children,
}

impl From<Scope> for troupe_proto::session::BroadcastScope {
    fn from(scope: Scope) -> Self {
        match scope {
            Scope::Workspace => Self::Workspace,
            Scope::Subtree => Self::Subtree,
            Scope::Children => Self::Children,
        }
    }
}

/// Arguments of `create_group`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateGroupArgs {
    /// The group's name, unique in this workspace: letters, digits, '-' and '_', e.g.
    /// "reviewers".
    pub name: String,
}

/// Arguments of `add_to_group`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AddToGroupArgs {
    /// The group's name (one this session is a member of).
    pub group: String,
    /// The session ids (`sess_...`) to add: sessions this session may message.
    pub session_ids: Vec<String>,
}

/// Arguments of `post_to_group`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PostToGroupArgs {
    /// The group's name (one this session is a member of).
    pub group: String,
    /// The message text; every other member this session may message gets it once.
    pub message: String,
}
