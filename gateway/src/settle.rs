//! A call's reservation settled exactly once ([`Settlement`]): to the
//! usage the provider reported, or, when that usage cannot be read (a
//! count that is absurd, negative or overflows its price) or its final
//! usage was never seen where it must be, to the reservation's worst case,
//! never less. A settlement whose task ends otherwise is released when
//! dropped. It holds the call's `model_call` span (under the caller's life
//! span), records the usage and outcome on it, and counts the call in the
//! model metrics.

use std::time::Instant;

use axum::http::StatusCode;
use tracing::field::Empty;

use super::{forward::Call, shape::Api, usage::Reported};
use troupe_domain::model::{
    CallOutcome, Charge, Cost, ModelCall, Price, Reservation, TokenUsage, now_ms,
};
use troupe_service::metrics;
use troupe_store::Store;

/// A call's reservation, settled exactly once: by [`Settlement::settle`],
/// or, if the call's task ends otherwise, released when dropped.
pub(super) struct Settlement<S: Store + 'static> {
    store: S,
    reservation: Option<Reservation>,
    provider: String,
    model: String,
    price: Price,
    /// What the call is charged when its usage cannot be read.
    worst: Charge,
    worst_tokens: TokenUsage,
    workspace_id: String,
    agent: String,
    started_ms: i64,
    started: Instant,
    span: tracing::Span,
}

impl<S: Store + 'static> Settlement<S> {
    pub(super) fn new(store: S, call: &Call, reservation: Reservation) -> Settlement<S> {
        let operation = match call.api {
            Api::Anthropic | Api::Openai | Api::Responses => "chat",
            Api::Gemini => "generate_content",
        };
        let span = tracing::info_span!(
            "model_call",
            otel.name = %format!("{operation} {}", call.model),
            otel.kind = "client",
            gen_ai.operation.name = operation,
            gen_ai.provider.name = call.provider.kind.as_str(),
            gen_ai.request.model = %call.model,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.response.finish_reasons = Empty,
            session_id = %call.session_id,
            workspace_id = %call.workspace_id,
            outcome = Empty,
        );
        if let Some(life) = &call.life {
            life.adopt(&span, None);
        }
        Settlement {
            store,
            reservation: Some(reservation),
            provider: call.provider.name.clone(),
            model: call.model.clone(),
            price: call.price,
            worst: call.worst,
            worst_tokens: call.worst_tokens,
            workspace_id: call.workspace_id.clone(),
            agent: call.agent.clone(),
            started_ms: now_ms(),
            started: Instant::now(),
            span,
        }
    }

    /// What the call is charged: the reported usage at the price, or the
    /// worst case if that cannot be read.
    fn charged(&self, reported: &Reported) -> (TokenUsage, Cost) {
        let readable = (!reported.unreadable)
            .then(|| self.price.cost(&reported.tokens))
            .flatten();
        match readable {
            Some(cost) => (reported.tokens, cost),
            None => {
                tracing::warn!(
                    provider = %self.provider,
                    model = %self.model,
                    "a model call's usage could not be read: charged its worst case"
                );
                (self.worst_tokens, self.worst.cost)
            }
        }
    }

    fn record(
        &self,
        reported: &Reported,
        outcome: CallOutcome,
        status: Option<StatusCode>,
    ) -> ModelCall {
        let (tokens, cost) = match outcome {
            // Nothing came back: nothing to charge.
            CallOutcome::Released => (TokenUsage::default(), Cost::ZERO),
            _ => self.charged(reported),
        };
        ModelCall {
            provider: self.provider.clone(),
            model: self.model.clone(),
            tokens,
            cost,
            started_at_ms: self.started_ms,
            duration_ms: self.started.elapsed().as_millis().min(u64::MAX as u128) as u64,
            outcome,
            http_status: status.map(|s| s.as_u16()),
        }
    }

    pub(super) async fn settle(
        &mut self,
        reported: &Reported,
        outcome: CallOutcome,
        status: Option<StatusCode>,
    ) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let call = self.record(reported, outcome, status);
        self.span
            .record("gen_ai.usage.input_tokens", call.tokens.input);
        self.span
            .record("gen_ai.usage.output_tokens", call.tokens.output);
        troupe_telemetry::set_strings(
            &self.span,
            "gen_ai.response.finish_reasons",
            &reported.finish_reasons,
        );
        self.span.record("outcome", outcome.as_str());
        metrics::model_call(&self.workspace_id, &self.agent, &call);
        settle(&self.store, &reservation, &call).await;
    }
}

async fn settle<S: Store>(store: &S, reservation: &Reservation, call: &ModelCall) {
    if let Err(e) = store.settle(reservation, call).await {
        // The upkeep releases the reservation once it is stale.
        tracing::error!(error = %e, reservation = %reservation.id, "cannot settle a model call");
    }
}

impl<S: Store + 'static> Drop for Settlement<S> {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let call = self.record(&Reported::default(), CallOutcome::Released, None);
        let store = self.store.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { settle(&store, &reservation, &call).await });
        }
    }
}
