//! The spans of spawn requests: a spawn's span is its request's, under the
//! caller's span when it names one, with the session it made (or why it was
//! refused) recorded on it. A spawn request has this one span, refusals
//! included, and `LifeSpan::adopt` sets its parent (the parent session's
//! life) before anything starts under it, so its parent is final.

use opentelemetry::trace::SpanContext;
use tonic::Request;
use tracing::{Instrument, field::Empty};
use troupe_proto::session as pb;
use troupe_telemetry as telemetry;

use crate::error::SessionError;
/// Whether a request to `path` is served in a span its handler makes (the
/// spawns': their spawn span is the request's), rather than in the one
/// [`troupe_telemetry::request_span`] makes for every other call.
pub fn makes_own_span(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(pb::session_service_server::SERVICE_NAME))
        .is_some_and(|method| matches!(method, "/CreateSession" | "/CreateRootSession"))
}

/// The span of a spawn request (`create_root` or `spawn`), with the
/// attributes [`record_spawn`] fills in. It is the request's span: a server
/// span under the caller's span (`call`), if the request names one.
pub(super) fn spawn_span(name: &'static str, call: Option<&SpanContext>) -> tracing::Span {
    let span = tracing::info_span!(
        "spawn",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        gen_ai.operation.name = "create_agent",
        gen_ai.agent.id = Empty,
        gen_ai.agent.name = Empty,
        troupe.session.id = Empty,
        troupe.tree.id = Empty,
        troupe.depth = Empty,
        troupe.workspace.id = Empty,
        troupe.trust_level = Empty,
        troupe.refusal.reason = Empty,
    );
    if let Some(call) = call {
        telemetry::continue_span(&span, call);
    }
    span
}

/// Runs `spawn` in its `span`, then records on the span the session it made
/// (`made` finds it in the response) or why it was refused.
pub(super) async fn spawning<R>(
    span: tracing::Span,
    spawn: impl Future<Output = Result<R, SessionError>>,
    made: fn(&R) -> Option<&pb::Session>,
) -> Result<R, SessionError> {
    async move {
        let result = spawn.await;
        record_spawn(&result.as_ref().map(made));
        result
    }
    .instrument(span)
    .await
}

/// The caller's span, as the request's W3C `traceparent` names it, if it
/// does (and spans are exported).
pub(super) fn caller_span<T>(request: &Request<T>) -> Option<SpanContext> {
    let traceparent = request.metadata().get("traceparent")?.to_str().ok()?;
    telemetry::remote_span(traceparent)
}

/// Records on the current span (a spawn's) the session it made, or the
/// reason it was refused: the attributes a trace view shows.
fn record_spawn(result: &Result<Option<&pb::Session>, &SessionError>) {
    let span = tracing::Span::current();
    match result {
        Ok(Some(session)) => record_all(
            &span,
            [
                ("gen_ai.agent.id", &session.session_id.as_str()),
                ("gen_ai.agent.name", &session.agent_name.as_str()),
                ("troupe.session.id", &session.session_id.as_str()),
                ("troupe.tree.id", &session.tree_id.as_str()),
                ("troupe.depth", &session.depth),
                ("troupe.workspace.id", &session.workspace_id.as_str()),
                (
                    "troupe.trust_level",
                    &troupe_proto::trust::as_str(session.trust_level()),
                ),
            ],
        ),
        Ok(None) => {}
        Err(e) => {
            span.record("troupe.refusal.reason", e.reason().as_str());
        }
    }
}

/// Records `values` on `span` in one call, where a `record` each would call
/// every layer once per value. Names the span does not declare are left
/// out, as `record` leaves them out.
fn record_all<const N: usize>(span: &tracing::Span, values: [(&str, &dyn tracing::Value); N]) {
    let Some(fields) = span.metadata().map(|m| m.fields()) else {
        return;
    };
    let Some(any) = fields.iter().next() else {
        return;
    };
    let named = values.map(|(name, value)| match fields.field(name) {
        Some(field) => (field, Some(value)),
        // A field without a value records nothing.
        None => (any.clone(), None),
    });
    let pairs = named.each_ref().map(|(field, value)| (field, *value));
    span.record_all(&fields.value_set(&pairs));
}
