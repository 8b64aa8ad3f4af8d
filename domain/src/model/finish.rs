//! A session's own result (`FinishSession`): its outcome and its text, as
//! stored with the session and shown to whoever may see it.

use troupe_proto::session::{self as pb, SessionStatus};

/// How a session's task ended, as the session said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    /// The stored text (`success`, `failure`).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }

    pub fn parse(text: &str) -> Option<Outcome> {
        match text {
            "success" => Some(Outcome::Success),
            "failure" => Some(Outcome::Failure),
            _ => None,
        }
    }

    /// Reads a request's outcome: unspecified is success.
    pub fn from_proto(outcome: pb::Outcome) -> Outcome {
        match outcome {
            pb::Outcome::Failure => Outcome::Failure,
            pb::Outcome::Success | pb::Outcome::Unspecified => Outcome::Success,
        }
    }

    pub fn to_proto(self) -> pb::Outcome {
        match self {
            Outcome::Success => pb::Outcome::Success,
            Outcome::Failure => pb::Outcome::Failure,
        }
    }

    /// The status the session ends with.
    pub fn status(self) -> SessionStatus {
        match self {
            Outcome::Success => SessionStatus::Completed,
            Outcome::Failure => SessionStatus::Failed,
        }
    }
}

/// A session's own result, as it finished its task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub outcome: Outcome,
    pub result: String,
}

impl Finish {
    /// The end reason of a finished session.
    pub const END_REASON: &'static str = "finished";

    /// The detail of the event that ends the session.
    pub fn event_detail(&self) -> super::EventDetail {
        super::EventDetail::Finished(super::Finished {
            reason: Finish::END_REASON.to_owned(),
            outcome: self.outcome.as_str().to_owned(),
            result: self.result.clone(),
        })
    }

    /// A finished session's result from its stored columns (both set, or
    /// neither: not finished).
    pub fn stored(
        outcome: Option<String>,
        result: Option<String>,
    ) -> Result<Option<Finish>, crate::error::SessionError> {
        match (outcome, result) {
            (Some(outcome), result) => Ok(Some(Finish {
                outcome: crate::error::parse_stored("outcome", &outcome, Outcome::parse)?,
                result: result.unwrap_or_default(),
            })),
            (None, _) => Ok(None),
        }
    }

    pub fn to_proto(&self) -> pb::Finished {
        pb::Finished {
            outcome: self.outcome.to_proto() as i32,
            result: self.result.clone(),
        }
    }
}
