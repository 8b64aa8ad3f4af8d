//! `troupe.fleet.v1.FleetService`: `RegisterRunner`, `ListRunners` and
//! `ListReplicas`,
//! operator only. A runner registers (and renews its lease) about every
//! second, so only refusals are audited.

use std::time::Duration;

use tonic::{Request, Response, Status, transport::Uri};
use troupe_proto::fleet::{self as pb, fleet_service_server::FleetService};

use super::{Inner, Service, require_operator};
use crate::{
    error::SessionError,
    model::{Action, Caller, RunnerName, RunnerRow, RunnerSpec, STATIC_RUNNER},
    store::Store,
};

/// Bounds of a registration's lease, in milliseconds.
pub const LEASE_TTL_MS: std::ops::RangeInclusive<u32> = 500..=600_000;
/// Most agents one runner may declare.
pub const MAX_CAPACITY: u32 = 100_000;
/// Longest accepted endpoint, in bytes.
const MAX_ENDPOINT: usize = 1024;

/// Checks a registration: INVALID_ARGUMENT with the field at fault.
pub fn spec(req: &pb::RegisterRunnerRequest) -> Result<(RunnerSpec, Duration), SessionError> {
    let name = RunnerName::parse(&req.name)?;
    if name.as_str() == STATIC_RUNNER {
        return Err(SessionError::invalid(
            "name",
            format!("runner name {STATIC_RUNNER:?} is the embedded runner's (--runner)"),
        ));
    }
    endpoint(&req.endpoint)?;
    if req.capacity == 0 || req.capacity > MAX_CAPACITY {
        return Err(SessionError::invalid(
            "capacity",
            format!("capacity must be 1 to {MAX_CAPACITY} agents"),
        ));
    }
    if !LEASE_TTL_MS.contains(&req.lease_ttl_ms) {
        return Err(SessionError::invalid(
            "lease_ttl_ms",
            format!(
                "lease_ttl_ms must be {} to {}",
                LEASE_TTL_MS.start(),
                LEASE_TTL_MS.end()
            ),
        ));
    }
    Ok((
        RunnerSpec {
            name,
            endpoint: req.endpoint.clone(),
            capacity: req.capacity,
        },
        Duration::from_millis(u64::from(req.lease_ttl_ms)),
    ))
}

/// An endpoint the driver can call: `http(s)://host[:port]` or
/// `unix:///absolute/path`.
fn endpoint(text: &str) -> Result<(), SessionError> {
    let bad = |why: &str| {
        SessionError::invalid(
            "endpoint",
            format!("endpoint {text:?} {why}: use http://HOST:PORT or unix:///PATH"),
        )
    };
    if text.len() > MAX_ENDPOINT {
        return Err(bad("is too long"));
    }
    if let Some(path) = text.strip_prefix("unix://") {
        return if path.starts_with('/') && path.len() > 1 {
            Ok(())
        } else {
            Err(bad("needs an absolute path"))
        };
    }
    let uri: Uri = text.parse().map_err(|_| bad("is not a URL"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(authority)) if !authority.host().is_empty() => Ok(()),
        _ => Err(bad("is not an http URL")),
    }
}

async fn register<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::RegisterRunnerRequest,
) -> Result<pb::RegisterRunnerResponse, SessionError> {
    require_operator(caller)?;
    let (spec, ttl) = spec(req)?;
    let generation = inner.store.register_runner(&spec, ttl).await?;
    Ok(pb::RegisterRunnerResponse {
        generation: generation.max(0) as u64,
    })
}

async fn list<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
) -> Result<pb::ListRunnersResponse, SessionError> {
    require_operator(caller)?;
    let mut rows = inner.store.runners().await?;
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(pb::ListRunnersResponse {
        runners: rows.iter().map(runner_view).collect(),
    })
}

/// The replicas and the shards each holds; a shard whose lease is not live
/// is unheld (a replica not live holds none, however its rows stand).
async fn replicas<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
) -> Result<pb::ListReplicasResponse, SessionError> {
    require_operator(caller)?;
    let leases = inner.store.shard_leases().await?;
    let mut replicas: Vec<pb::Replica> = inner
        .store
        .replicas()
        .await?
        .into_iter()
        .map(|r| pb::Replica {
            holder: r.holder.to_string(),
            live: r.live,
            shards: Vec::new(),
        })
        .collect();
    let mut unheld = Vec::new();
    for lease in leases {
        let term = pb::ShardTerm {
            shard: u32::from(lease.shard.index()),
            epoch: lease.epoch.max(0) as u64,
        };
        match replicas
            .iter_mut()
            .find(|r| lease.live && r.live && r.holder == lease.holder.as_str())
        {
            Some(replica) => replica.shards.push(term),
            None => unheld.push(term.shard),
        }
    }
    Ok(pb::ListReplicasResponse {
        replicas,
        unheld,
        shard_count: u32::from(crate::shard::SHARDS),
    })
}

fn runner_view(row: &RunnerRow) -> pb::Runner {
    pb::Runner {
        name: row.name.to_string(),
        endpoint: row.endpoint.clone(),
        capacity: row.capacity,
        active: row.active,
        live: row.live,
        embedded: row.is_static,
        generation: row.generation.max(0) as u64,
    }
}

#[tonic::async_trait]
impl<S: Store> FleetService for Service<S> {
    #[tracing::instrument(name = "list_runners", skip_all)]
    async fn list_runners(
        &self,
        request: Request<pb::ListRunnersRequest>,
    ) -> Result<Response<pb::ListRunnersResponse>, Status> {
        self.call(
            request,
            Action::ListRunners,
            |_, _| String::new(),
            async |inner, caller, _| list(inner, caller).await,
        )
        .await
    }

    #[tracing::instrument(name = "list_replicas", skip_all)]
    async fn list_replicas(
        &self,
        request: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        self.call(
            request,
            Action::ListReplicas,
            |_, _| String::new(),
            async |inner, caller, _| replicas(inner, caller).await,
        )
        .await
    }

    #[tracing::instrument(name = "register_runner", skip_all, fields(runner = %request.get_ref().name))]
    async fn register_runner(
        &self,
        request: Request<pb::RegisterRunnerRequest>,
    ) -> Result<Response<pb::RegisterRunnerResponse>, Status> {
        self.call(
            request,
            Action::RegisterRunner,
            |_, req| req.name.clone(),
            register,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, endpoint: &str, capacity: u32, ttl: u32) -> pb::RegisterRunnerRequest {
        pb::RegisterRunnerRequest {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            capacity,
            lease_ttl_ms: ttl,
        }
    }

    #[test]
    fn good_registrations_pass() {
        for endpoint in [
            "http://127.0.0.1:7401",
            "https://runner-2.internal",
            "unix:///run/troupe/runner.sock",
        ] {
            let (spec, ttl) = spec(&request("r-1", endpoint, 8, 3000)).expect(endpoint);
            assert_eq!(spec.name.as_str(), "r-1");
            assert_eq!(ttl, Duration::from_secs(3));
        }
    }

    #[test]
    fn bad_registrations_name_the_field_at_fault() {
        for (req, field) in [
            (request("", "http://a:1", 1, 3000), "name"),
            (request("a b", "http://a:1", 1, 3000), "name"),
            (request("../x", "http://a:1", 1, 3000), "name"),
            (request(STATIC_RUNNER, "http://a:1", 1, 3000), "name"),
            (request("r", "", 1, 3000), "endpoint"),
            (request("r", "127.0.0.1:7401", 1, 3000), "endpoint"),
            (request("r", "ftp://a:1", 1, 3000), "endpoint"),
            (request("r", "http://", 1, 3000), "endpoint"),
            (request("r", "unix://relative.sock", 1, 3000), "endpoint"),
            (request("r", "http://a:1", 0, 3000), "capacity"),
            (
                request("r", "http://a:1", MAX_CAPACITY + 1, 3000),
                "capacity",
            ),
            (request("r", "http://a:1", 1, 0), "lease_ttl_ms"),
            (request("r", "http://a:1", 1, 600_001), "lease_ttl_ms"),
        ] {
            match spec(&req) {
                Err(SessionError::InvalidArgument { field: f, .. }) => {
                    assert_eq!(f, field, "{req:?}")
                }
                other => panic!("{req:?} gave {other:?}"),
            }
        }
    }
}
