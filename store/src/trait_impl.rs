//! [`Store`](super::Store), implemented once for both backends (see
//! `backends`): each method runs its backend's code, a write's whole
//! transaction again while it loses a lock conflict (`retrying!`:
//! PostgreSQL's; once on SQLite). Each write wakes the watchers itself,
//! after its commit.

use super::backends::each_backend;

each_backend! {
    use std::{sync::Arc, time::Duration};

    use tokio::sync::watch;

    use crate::{
        error::SessionError,
        model::{WorkspaceId, SessionId,
            AuditRecord, Failure, FannedOut, Finish, Idempotency, NewMessage, NewSession,
            Principal, ProcessChange, ProcessRow, ProgressReport, RunnerRow, RunnerSpec, SessionRow, Trust,
            now_ms,
        },
        placement::Place,
        {
            BudgetStore, Bounds, Created, DriverWork, FanOut, FanOutCheck, Fence, Holder, Lease,
            Maintenance, MessageCheck, RESERVATION_RELEASE_BATCH, RESERVATION_STALE_AFTER,
            RootCheck, Sent, SpawnCheck, Store, TerminateCheck,
        },
    };

    impl Store for This {
        async fn create_root(
            &self,
            new: NewSession,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            check: RootCheck<'_>,
        ) -> Result<Created, SessionError> {
            retrying!(self.create_root_once(&new, idem.as_ref(), &audit, check))
        }

        async fn create_child(
            &self,
            parent_id: &SessionId,
            new: NewSession,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            check: SpawnCheck<'_>,
        ) -> Result<Created, SessionError> {
            retrying!(self.create_child_once(parent_id, &new, idem.as_ref(), &audit, check))
        }

        async fn send_message(
            &self,
            recipient: &SessionId,
            message: NewMessage,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            bounds: Bounds<'_>,
            check: MessageCheck<'_>,
        ) -> Result<Sent, SessionError> {
            let idem = idem.as_ref();
            retrying!(self.send_message_once(recipient, &message, idem, &audit, bounds, check))
        }

        async fn fan_out(
            &self,
            out: &FanOut,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            bounds: Bounds<'_>,
            check: FanOutCheck<'_>,
        ) -> Result<FannedOut, SessionError> {
            retrying!(self.fan_out_once(out, idem.as_ref(), &audit, bounds, check))
        }

        async fn terminate(
            &self,
            target: &SessionId,
            terminated_by: &Principal,
            reason: &str,
            audit: AuditRecord,
            check: TerminateCheck<'_>,
        ) -> Result<(Vec<SessionId>, SessionRow), SessionError> {
            retrying!(self.terminate_once(target, terminated_by, reason, &audit, check))
        }

        async fn finish(
            &self,
            session_id: &SessionId,
            finish: &Finish,
            stop_after_ms: i64,
            audit: AuditRecord,
            check: MessageCheck<'_>,
        ) -> Result<(Vec<SessionId>, SessionRow), SessionError> {
            retrying!(self.finish_once(session_id, finish, stop_after_ms, &audit, check))
        }

        async fn finished(&self, session_id: &SessionId) -> Result<Option<Finish>, SessionError> {
            self.finished_impl(session_id).await
        }

        async fn get_session(&self, session_id: &SessionId) -> Result<Option<SessionRow>, SessionError> {
            self.get_session_impl(session_id).await
        }

        async fn children(&self, session_id: &SessionId) -> Result<Vec<SessionRow>, SessionError> {
            self.children_impl(session_id).await
        }

        async fn list_workspace(
            &self,
            workspace_id: &WorkspaceId,
            sandboxed_only: bool,
            include_ended: bool,
            after: i64,
            limit: u32,
        ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
            self.list_workspace_impl(workspace_id, sandboxed_only, include_ended, after, limit)
                .await
        }

        async fn prune_events(&self, fence: &Fence, keep: u64) -> Result<i64, SessionError> {
            retrying!(self.prune_events_once(fence, keep))
        }

        async fn prune_request_ids(
            &self,
            fence: &Fence,
            before_ms: i64,
            limit: u32,
        ) -> Result<u64, SessionError> {
            retrying!(self.prune_request_ids_once(fence, before_ms, limit))
        }

        /// Releases stale reservations (a failure is logged: the upkeep
        /// goes on), then the backend's own upkeep.
        async fn maintain(&self) -> Result<Maintenance, SessionError> {
            let stale_before = now_ms().saturating_sub(RESERVATION_STALE_AFTER.as_millis() as i64);
            match self
                .release_stale_reservations(stale_before, RESERVATION_RELEASE_BATCH)
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::warn!(released = n, "stale model-call reservations released"),
                Err(e) => tracing::warn!(error = %e, "releasing stale reservations failed"),
            }
            self.maintain_impl().await
        }

        async fn active_counts(&self) -> Result<Vec<(WorkspaceId, Trust, u32)>, SessionError> {
            self.active_counts_impl().await
        }

        fn subscribe(&self) -> watch::Receiver<u64> {
            self.events_written.subscribe()
        }

        fn subscribe_ends(&self) -> watch::Receiver<u64> {
            self.sessions_ended.subscribe()
        }

        async fn start_process(&self, fence: &Fence, session_id: &SessionId) -> Result<Place, SessionError> {
            retrying!(self.start_process_once(fence, session_id))
        }

        async fn register_runner(&self, spec: &RunnerSpec, ttl: Duration) -> Result<i64, SessionError> {
            retrying!(self.register_runner_once(spec, ttl))
        }

        async fn runners(&self) -> Result<Vec<RunnerRow>, SessionError> {
            self.runners_impl().await
        }

        async fn set_static_runner(
            &self,
            fence: &Fence,
            spec: Option<&RunnerSpec>,
        ) -> Result<(), SessionError> {
            retrying!(self.set_static_runner_once(fence, spec))
        }

        async fn record_process(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            runner_seq: u64,
            change: ProcessChange,
            tail_max: usize,
        ) -> Result<Option<SessionRow>, SessionError> {
            retrying!(self.record_process_once(fence, session_id, runner_seq, &change, tail_max))
        }

        async fn process(&self, session_id: &SessionId) -> Result<Option<ProcessRow>, SessionError> {
            self.process_impl(session_id).await
        }

        async fn mark_delivered(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            seq: u64,
        ) -> Result<(), SessionError> {
            retrying!(self.mark_delivered_once(fence, session_id, seq))
        }

        async fn active_sessions(&self) -> Result<Vec<SessionRow>, SessionError> {
            self.active_sessions_impl().await
        }

        async fn record_progress(
            &self,
            session_id: &SessionId,
            report: ProgressReport,
            audit: AuditRecord,
            check: MessageCheck<'_>,
        ) -> Result<u64, SessionError> {
            retrying!(self.record_progress_once(session_id, &report, &audit, check))
        }

        async fn fail_session(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            failure: Failure,
            detail: &str,
            audit: AuditRecord,
        ) -> Result<bool, SessionError> {
            retrying!(self.fail_session_once(fence, session_id, failure, detail, &audit))
        }

        async fn acquire_lease(&self, holder: &Holder, ttl: Duration) -> Result<Option<Fence>, SessionError> {
            retrying!(self.acquire_lease_once(holder, ttl))
        }

        async fn renew_lease(&self, fence: &Fence, ttl: Duration) -> Result<bool, SessionError> {
            retrying!(self.renew_lease_once(fence, ttl))
        }

        async fn release_lease(&self, fence: &Fence) -> Result<(), SessionError> {
            self.release_lease_impl(fence).await
        }

        async fn lease(&self) -> Result<Option<Lease>, SessionError> {
            self.lease_impl().await
        }

        async fn end_for_budget(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            audit: AuditRecord,
        ) -> Result<Vec<SessionId>, SessionError> {
            retrying!(self.end_for_budget_once(fence, session_id, &audit))
        }

        async fn driver_work(&self) -> Result<DriverWork, SessionError> {
            self.driver_work_impl().await
        }

        async fn mark_stopped(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            unstarted: bool,
        ) -> Result<(), SessionError> {
            retrying!(self.mark_stopped_once(fence, session_id, unstarted))
        }

        async fn write_callback(
            &self,
            fence: &Fence,
            child_id: &SessionId,
            message: NewMessage,
            audit: AuditRecord,
        ) -> Result<Option<Sent>, SessionError> {
            retrying!(self.write_callback_once(fence, child_id, &message, &audit))
        }
    }
}
