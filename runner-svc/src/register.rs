//! Registration with the session service (`troupe.fleet.v1`), for a
//! runner that is one of several: `RegisterRunner` with the operator token,
//! renewed every `--register-every-ms` so that its lease (`--register-ttl-ms`)
//! never lapses while the runner lives. A runner that stops renewing (it
//! died, or cannot reach any endpoint) is lost to the service once the
//! lease is out.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use troupe_proto::{
    endpoint::Bearer,
    failover::{Endpoints, parse_list},
    fleet::{RegisterRunnerRequest, fleet_service_client::FleetServiceClient},
};

use crate::config::Registration;

type Client = FleetServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// What the runner registers, and where: ready to run.
pub struct Registrar {
    endpoints: Endpoints<Client>,
    request: RegisterRunnerRequest,
    every: Duration,
}

impl Registrar {
    /// The registration the flags ask for, if any: `listen` is the
    /// runner's own address (the default advertised endpoint).
    pub fn from_config(
        config: &Registration,
        listen: std::net::SocketAddr,
        operator_token: &str,
    ) -> anyhow::Result<Option<Registrar>> {
        if config.register.is_empty() {
            return Ok(None);
        }
        let list = parse_list(&config.register).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            u64::from(config.register_every_ms) * 2 <= u64::from(config.register_ttl_ms),
            "--register-every-ms ({}) must be at most half of --register-ttl-ms ({})",
            config.register_every_ms,
            config.register_ttl_ms
        );
        let advertise = match &config.advertise {
            Some(endpoint) => endpoint.clone(),
            None => {
                anyhow::ensure!(
                    !listen.ip().is_unspecified(),
                    "--listen {listen} is no address the session service can call: give --advertise"
                );
                format!("http://{listen}")
            }
        };
        let name = match &config.name {
            Some(name) => name.clone(),
            None => host_name(),
        };
        anyhow::ensure!(
            troupe_proto::names::is_slug(&name),
            "runner name {name:?} must be letters, digits, '-' or '_' (give --name)"
        );
        let bearer = Bearer::new(Some(operator_token))?;
        let endpoints = Endpoints::new(&list, |channel| {
            FleetServiceClient::with_interceptor(channel, bearer.clone())
        })
        .context("bad --register endpoint")?;
        Ok(Some(Registrar {
            endpoints,
            request: RegisterRunnerRequest {
                name,
                endpoint: advertise,
                capacity: config.capacity,
                lease_ttl_ms: config.register_ttl_ms,
            },
            every: Duration::from_millis(u64::from(config.register_every_ms)),
        }))
    }

    /// Registers, then renews, until `cancel`; every failure is logged (once
    /// per change) and tried again at the next tick.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut generation = None;
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            let call = self
                .endpoints
                .call(&self.request, |mut client, request| async move {
                    client.register_runner(request).await
                });
            // A call never outlasts the renewal interval by much: the next
            // one goes to the next endpoint.
            let answer = tokio::select! {
                answer = tokio::time::timeout(self.every * 2, call) => answer,
                () = cancel.cancelled() => return,
            };
            match answer {
                Ok(Ok(answer)) => {
                    let now = answer.generation;
                    if generation != Some(now) || failing {
                        tracing::info!(
                            runner = %self.request.name,
                            endpoint = %self.request.endpoint,
                            generation = now,
                            service = %self.endpoints.preferred(),
                            "registered with the session service"
                        );
                    }
                    generation = Some(now);
                    failing = false;
                }
                Ok(Err(status)) => {
                    if !failing {
                        tracing::warn!(runner = %self.request.name, %status, "registration refused or unreachable");
                    }
                    failing = true;
                }
                Err(_) => {
                    if !failing {
                        tracing::warn!(runner = %self.request.name, "registration timed out");
                    }
                    self.endpoints.move_on();
                    failing = true;
                }
            }
        }
    }
}

/// The host's name as a slug, for a runner not given `--name`.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let slug: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(troupe_proto::names::MAX_SLUG_LEN)
        .collect();
    if troupe_proto::names::is_slug(&slug) {
        slug
    } else {
        "runner".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(extra: &[&str]) -> Registration {
        use clap::Parser;
        let mut args = vec!["troupe-runner"];
        args.extend_from_slice(extra);
        crate::Config::parse_from(args).registration
    }

    fn listen() -> std::net::SocketAddr {
        "127.0.0.1:7401".parse().unwrap()
    }

    #[tokio::test]
    async fn no_register_flag_means_no_registration() {
        assert!(
            Registrar::from_config(&flags(&[]), listen(), "t")
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_registration_advertises_the_listen_address_by_default() {
        let registrar = Registrar::from_config(
            &flags(&["--register", "http://127.0.0.1:7400", "--name", "r1"]),
            listen(),
            "t",
        )
        .unwrap()
        .expect("a registration");
        assert_eq!(registrar.request.endpoint, "http://127.0.0.1:7401");
        assert_eq!(registrar.request.name, "r1");
        assert_eq!(registrar.request.capacity, 64);
        assert_eq!(registrar.request.lease_ttl_ms, 5000);
        assert_eq!(registrar.every, Duration::from_secs(1));
    }

    #[tokio::test]
    async fn bad_registration_flags_stop_the_start() {
        let base = ["--register", "http://127.0.0.1:7400"];
        for (extra, listen_on, why) in [
            (vec!["--name", "a b"], "127.0.0.1:7401", "runner name"),
            (
                vec!["--name", "r", "--register-every-ms", "3000"],
                "127.0.0.1:7401",
                "at most half",
            ),
            (vec!["--name", "r"], "0.0.0.0:7401", "--advertise"),
        ] {
            let mut args = base.to_vec();
            args.extend(extra);
            let error = Registrar::from_config(&flags(&args), listen_on.parse().unwrap(), "t")
                .err()
                .unwrap_or_else(|| panic!("{args:?} passed"));
            assert!(error.to_string().contains(why), "{args:?}: {error}");
        }
    }
}
