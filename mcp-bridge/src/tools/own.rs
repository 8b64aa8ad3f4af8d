//! The tools about the caller's own session and its parent: `finish` and
//! `reply_to_parent`. Neither names a session: the service acts on the
//! token's own, and finds its parent itself.

use rmcp::model::Extensions;
use serde_json::Value;
use troupe_proto::{
    failover,
    session::{self as pb, Outcome},
};

use super::{
    Bridge,
    args::{FinishArgs, ReplyArgs},
};
use crate::{failure::ToolFailure, view};

impl Bridge {
    pub(super) async fn finish_own(
        &self,
        extensions: &Extensions,
        args: FinishArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        // Repeated on another endpoint after the first had finished it, it is
        // refused SESSION_ENDED: the session ends once either way.
        let request = pb::FinishSessionRequest {
            result: args.result,
            outcome: args.outcome.map_or(Outcome::Success, Into::into) as i32,
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.finish_session(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::finished(&response))
    }

    pub(super) async fn reply(
        &self,
        extensions: &Extensions,
        args: ReplyArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::ReplyToParentRequest {
            message: args.message,
            request_id: failover::fresh_request_id(),
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.reply_to_parent(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::replied(&response))
    }
}
