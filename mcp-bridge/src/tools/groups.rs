//! The tools of messages to many: `broadcast`, `create_group`,
//! `add_to_group`, `post_to_group`, `list_groups`. The service decides who
//! receives what; each call is safe to repeat on another endpoint (the
//! messages carry a request id, a group's creation and additions are the
//! same the second time).

use rmcp::model::Extensions;
use serde_json::{Value, json};
use troupe_proto::{failover, session as pb};

use super::{
    Bridge,
    args::{AddToGroupArgs, BroadcastArgs, CreateGroupArgs, PostToGroupArgs, Scope},
};
use crate::{failure::ToolFailure, view};

impl Bridge {
    pub(super) async fn broadcast_to(
        &self,
        extensions: &Extensions,
        args: BroadcastArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let scope: pb::BroadcastScope = args.scope.unwrap_or(Scope::Workspace).into();
        let request = pb::BroadcastRequest {
            message: args.message,
            scope: scope as i32,
            request_id: failover::fresh_request_id(),
            workspace_id: String::new(),
        };
        let response = session
            .call(&request, |mut c, r| async move { c.broadcast(r).await })
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::fanned_out(&response.recipients))
    }

    pub(super) async fn group_create(
        &self,
        extensions: &Extensions,
        args: CreateGroupArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::CreateGroupRequest { name: args.name };
        let response = session
            .call(&request, |mut c, r| async move { c.create_group(r).await })
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(response.group.as_ref().map_or(Value::Null, view::group))
    }

    pub(super) async fn group_add(
        &self,
        extensions: &Extensions,
        args: AddToGroupArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::AddGroupMembersRequest {
            group: args.group,
            session_ids: args.session_ids,
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.add_group_members(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(response.group.as_ref().map_or(Value::Null, view::group))
    }

    pub(super) async fn group_post(
        &self,
        extensions: &Extensions,
        args: PostToGroupArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::PostToGroupRequest {
            group: args.group,
            message: args.message,
            request_id: failover::fresh_request_id(),
        };
        let response = session
            .call(&request, |mut c, r| async move { c.post_to_group(r).await })
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::fanned_out(&response.recipients))
    }

    pub(super) async fn group_list(&self, extensions: &Extensions) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::ListGroupsRequest::default();
        let response = session
            .call(&request, |mut c, r| async move { c.list_groups(r).await })
            .await
            .map_err(|s| self.refused(&s))?;
        let groups: Vec<Value> = response.groups.iter().map(view::group).collect();
        Ok(json!({ "count": groups.len(), "groups": groups }))
    }
}
