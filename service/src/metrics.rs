//! The session service's metrics, on the meter provider
//! [`troupe_telemetry::init`] installed (OTLP export, Prometheus
//! scrape); no-ops without one. Names follow OpenTelemetry's conventions;
//! Prometheus sees them with `_` for `.` and a unit or `_total` suffix
//! (`troupe.spawns` is `troupe_spawns_total`).
//!
//! | instrument | kind | attributes |
//! |---|---|---|
//! | `troupe.spawns` | counter | `troupe.spawn.kind` (`root`, `child`), `troupe.spawn.outcome` (`created`, `refused`), `troupe.refusal.reason` (`OK` when created) |
//! | `troupe.spawn.duration` | histogram, s | `troupe.spawn.kind`, `troupe.spawn.outcome` |
//! | `troupe.sessions.active` | gauge | `troupe.workspace.id`, `troupe.trust_level` |
//! | `troupe.messages.queued` | counter | (sent to a session not running yet) |
//! | `troupe.messages.delivered` | counter | (written to an agent's stdin) |
//! | `troupe.agent.output` | counter, bytes | `troupe.output.stream` (`stdout`, `stderr`) |

use std::{
    sync::{
        Arc, LazyLock, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};

use opentelemetry::{
    KeyValue,
    metrics::{BoundCounter, BoundHistogram, Counter, Histogram, Meter},
};

use crate::{
    error::SessionError,
    model::{Trust, WorkspaceId},
    store::Store,
};

/// Upper bounds of the spawn duration buckets, in seconds: 0.5 ms to 10 s
/// (a sync spawn lasts as long as its child).
const SPAWN_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
];

struct Instruments {
    spawns: Counter<u64>,
    spawn_duration: Histogram<f64>,
    /// Spawns that created a session, by [`Spawn`]: the common case, with
    /// its attributes resolved once rather than on every spawn.
    created: [(BoundCounter<u64>, BoundHistogram<f64>); 2],
    queued: Counter<u64>,
    delivered: Counter<u64>,
    output: Counter<u64>,
    model_tokens: Counter<u64>,
    model_cost: Counter<u64>,
    model_calls: Counter<u64>,
}

/// Made on first use, from the provider installed by then.
static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(|| {
    let meter = meter();
    let spawns = meter
        .u64_counter("troupe.spawns")
        .with_description("Spawns asked for, by outcome and refusal reason")
        .build();
    let spawn_duration = meter
        .f64_histogram("troupe.spawn.duration")
        .with_unit("s")
        .with_description("Time to answer a spawn (CreateRootSession, CreateSession)")
        .with_boundaries(SPAWN_BUCKETS.to_vec())
        .build();
    let created = [Spawn::Root, Spawn::Child].map(|kind| {
        let [kind, outcome] = spawn_attributes(kind, "created");
        (
            spawns.bind(&[
                kind.clone(),
                outcome.clone(),
                KeyValue::new("troupe.refusal.reason", "OK"),
            ]),
            spawn_duration.bind(&[kind, outcome]),
        )
    });
    Instruments {
        spawns,
        spawn_duration,
        created,
        queued: meter
            .u64_counter("troupe.messages.queued")
            .with_description("Messages sent to a session not running yet, kept for it")
            .build(),
        delivered: meter
            .u64_counter("troupe.messages.delivered")
            .with_description("Messages written to an agent's stdin")
            .build(),
        output: meter
            .u64_counter("troupe.agent.output")
            .with_unit("By")
            .with_description("Bytes agents printed")
            .build(),
        model_tokens: meter
            .u64_counter("troupe.model.tokens")
            .with_description("Tokens of model calls through the gateway, by workspace, agent, model and kind")
            .build(),
        model_cost: meter
            .u64_counter("troupe.model.cost")
            .with_unit("pUSD")
            .with_description("Cost of model calls through the gateway, in pico-dollars, by workspace, agent and model")
            .build(),
        model_calls: meter
            .u64_counter("troupe.model.calls")
            .with_description("Model calls through the gateway, by workspace, agent, model and outcome")
            .build(),
    }
});

fn meter() -> Meter {
    opentelemetry::global::meter("troupe-session")
}

/// What a spawn asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spawn {
    /// `CreateRootSession`.
    Root = 0,
    /// `CreateSession`.
    Child = 1,
}

impl Spawn {
    fn as_str(self) -> &'static str {
        match self {
            Spawn::Root => "root",
            Spawn::Child => "child",
        }
    }
}

fn spawn_attributes(kind: Spawn, outcome: &'static str) -> [KeyValue; 2] {
    [
        KeyValue::new("troupe.spawn.kind", kind.as_str()),
        KeyValue::new("troupe.spawn.outcome", outcome),
    ]
}

/// Records a spawn that took `elapsed`.
pub fn spawn<T>(kind: Spawn, elapsed: Duration, result: &Result<T, SessionError>) {
    let instruments = &*INSTRUMENTS;
    match result {
        Ok(_) => {
            let (count, duration) = &instruments.created[kind as usize];
            duration.record(elapsed.as_secs_f64());
            count.add(1);
        }
        Err(e) => {
            let [kind, outcome] = spawn_attributes(kind, "refused");
            instruments
                .spawn_duration
                .record(elapsed.as_secs_f64(), &[kind.clone(), outcome.clone()]);
            instruments.spawns.add(
                1,
                &[
                    kind,
                    outcome,
                    KeyValue::new("troupe.refusal.reason", e.reason().as_str().to_owned()),
                ],
            );
        }
    }
}

/// Records a message kept for a session that is not running.
pub fn queued() {
    INSTRUMENTS.queued.add(1, &[]);
}

/// Records `n` messages written to an agent's stdin.
pub fn delivered(n: usize) {
    INSTRUMENTS.delivered.add(n as u64, &[]);
}

/// Records `bytes` an agent printed on `stream`.
pub fn output(stream: &'static str, bytes: usize) {
    INSTRUMENTS.output.add(
        bytes as u64,
        &[KeyValue::new("troupe.output.stream", stream)],
    );
}

/// Records a settled model call of an agent of `workspace`.
pub fn model_call(workspace: &str, agent: &str, call: &crate::model::ModelCall) {
    let instruments = &*INSTRUMENTS;
    let at = [
        KeyValue::new("troupe.workspace_id", workspace.to_owned()),
        KeyValue::new("troupe.agent_name", agent.to_owned()),
        KeyValue::new("gen_ai.request.model", call.model.clone()),
    ];
    let t = &call.tokens;
    for (kind, n) in [
        ("input", t.input),
        ("output", t.output),
        ("cache_read", t.cache_read),
        ("cache_write", t.cache_write),
    ] {
        if n > 0 {
            let mut with_kind = at.to_vec();
            with_kind.push(KeyValue::new("gen_ai.token.type", kind));
            instruments.model_tokens.add(n, &with_kind);
        }
    }
    instruments.model_cost.add(call.cost.0, &at);
    let mut with_outcome = at.to_vec();
    with_outcome.push(KeyValue::new("troupe.model.outcome", call.outcome.as_str()));
    instruments.model_calls.add(1, &with_outcome);
}

/// Registers the gauge of active sessions, read from `store` at each
/// collection. The collection cannot wait: a store that answers at once
/// (SQLite's, from its ledger) is read there and then; for one that must
/// wait (a query), the last answer is reported and a new one is asked for
/// in the background, so the gauge is then one collection behind.
pub fn observe_active<S: Store>(store: S) {
    let active = Active::new(move || {
        let store = store.clone();
        async move { store.active_counts().await }.boxed()
    });
    // The provider keeps the callback; the returned handle is only a marker.
    meter()
        .u64_observable_gauge("troupe.sessions.active")
        .with_description("Pending or running sessions, by workspace and trust level")
        .with_callback(move |observer| {
            for (workspace, trust, count) in active.counts() {
                observer.observe(
                    u64::from(count),
                    &[
                        KeyValue::new("troupe.workspace.id", workspace.into_string()),
                        KeyValue::new("troupe.trust_level", trust.as_str()),
                    ],
                );
            }
        })
        .build();
}

type Counts = Vec<(WorkspaceId, Trust, u32)>;
type Ask = dyn Fn() -> BoxFuture<'static, Result<Counts, SessionError>> + Send + Sync;

/// The active counts, asked of the store, as last answered.
struct Active {
    ask: Box<Ask>,
    last: Mutex<Counts>,
    /// An answer is awaited in the background.
    asking: AtomicBool,
    runtime: Option<tokio::runtime::Handle>,
}

impl Active {
    fn new(
        ask: impl Fn() -> BoxFuture<'static, Result<Counts, SessionError>> + Send + Sync + 'static,
    ) -> Arc<Active> {
        Arc::new(Active {
            ask: Box::new(ask),
            last: Mutex::new(Vec::new()),
            asking: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// The counts now if the store answers at once, else the last answer
    /// (a new one asked for in the background, unless one already is).
    fn counts(self: &Arc<Self>) -> Counts {
        let answer = (self.ask)();
        match answer.now_or_never() {
            Some(answer) => self.keep(answer),
            None => {
                if let Some(runtime) = &self.runtime
                    && !self.asking.swap(true, Ordering::AcqRel)
                {
                    let active = self.clone();
                    runtime.spawn(async move {
                        active.keep((active.ask)().await);
                        active.asking.store(false, Ordering::Release);
                    });
                }
                self.last
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            }
        }
    }

    /// Keeps a new answer (a failure keeps the last one) and returns it.
    fn keep(&self, answer: Result<Counts, SessionError>) -> Counts {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match answer {
            Ok(counts) => *last = counts,
            Err(e) => tracing::warn!(error = %e, "cannot count the active sessions"),
        }
        last.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicU32, time::Instant};

    use super::*;
    use crate::error::StorageKind;

    fn counts(n: u32) -> Counts {
        vec![("alpha".into(), Trust::Direct, n)]
    }

    #[tokio::test]
    async fn a_store_that_answers_at_once_is_read_at_the_collection() {
        let n = Arc::new(AtomicU32::new(1));
        let active = Active::new({
            let n = n.clone();
            move || {
                let n = n.load(Ordering::SeqCst);
                async move { Ok(counts(n)) }.boxed()
            }
        });
        assert_eq!(active.counts(), counts(1));
        n.store(2, Ordering::SeqCst);
        assert_eq!(active.counts(), counts(2));
    }

    /// A store that must wait: the last answer now, the new one at the
    /// next collection; a failure keeps the last answer.
    #[tokio::test]
    async fn a_store_that_waits_is_one_collection_behind_and_a_failure_keeps_the_last() {
        let n = Arc::new(AtomicU32::new(1));
        let active = Active::new({
            let n = n.clone();
            move || {
                let n = n.load(Ordering::SeqCst);
                async move {
                    tokio::task::yield_now().await;
                    match n {
                        0 => Err(SessionError::storage(StorageKind::Unavailable, "down")),
                        n => Ok(counts(n)),
                    }
                }
                .boxed()
            }
        });
        let settled = |active: &Arc<Active>| {
            let deadline = Instant::now() + Duration::from_secs(5);
            let active = active.clone();
            async move {
                while active.asking.load(Ordering::Acquire) {
                    assert!(Instant::now() < deadline, "no answer in time");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        assert_eq!(active.counts(), Vec::new());
        settled(&active).await;
        n.store(2, Ordering::SeqCst);
        assert_eq!(active.counts(), counts(1));
        settled(&active).await;
        n.store(0, Ordering::SeqCst);
        assert_eq!(active.counts(), counts(2));
        settled(&active).await;
        assert_eq!(active.counts(), counts(2));
    }
}
