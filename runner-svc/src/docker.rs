//! Everything the runner asks of the Docker engine: the persistent
//! container of each workspace and the `docker exec`s inside it. Nothing
//! else in Troupe talks to Docker.
//!
//! Containers are made, checked and made again when they are not what the
//! runner would make. Every call has a deadline ([`PING_TIMEOUT`],
//! [`CALL_TIMEOUT`], [`CONTAINER_TIMEOUT`]), past which the engine counts as
//! unreachable. The label [`SPEC_LABEL`] hashes the creation request: a
//! container made otherwise is kept while execs of its workspace run or
//! start, and made again by the first start that finds none.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use bollard::{
    Docker,
    exec::{CreateExecOptions, StartExecOptions},
    models::{ContainerCreateBody, HostConfig},
    query_parameters::{
        CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StatsOptions,
    },
};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use crate::layout;

/// Longest wait for the engine's `/_ping`, and for agreeing on an API
/// version: an engine that takes longer is as good as gone.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for any other call but a container's creation, start or
/// removal: inspecting a container or an exec, creating and starting an
/// exec (detached: the engine answers once its process runs), process
/// counts. An engine that takes longer is taken as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for creating, starting or removing a workspace container
/// (a start mounts its directories and starts its init; a removal kills it).
pub const CONTAINER_TIMEOUT: Duration = Duration::from_secs(60);

/// Label every Troupe workspace container carries, valued with the workspace id.
pub const WORKSPACE_LABEL: &str = "org.troupe.workspace";
/// What workspace containers' names start with, unless
/// `--container-prefix` says otherwise.
pub const DEFAULT_PREFIX: &str = "troupe-ws";

/// Label valued with a hash of everything the container was made with: one
/// made otherwise (by an older runner, or other flags) is recreated once no
/// exec of this runner runs in it.
pub const SPEC_LABEL: &str = "org.troupe.spec";

/// How workspace containers are made.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub image: String,
    pub network: String,
    pub pids_limit: i64,
    pub memory_bytes: i64,
    /// Group of every exec; owns the workspace directory.
    pub workspace_gid: u32,
    pub tools_dir: PathBuf,
    pub session_socket_dir: Option<PathBuf>,
    /// What workspace containers' names start with (`--container-prefix`):
    /// runners sharing one engine each need their own.
    pub name_prefix: String,
}

/// Host directories of one workspace.
#[derive(Clone, Debug)]
pub struct WorkspaceDirs {
    pub files: PathBuf,
    pub execs: PathBuf,
}

/// What the runner knows of one workspace's container.
#[derive(Debug, Default)]
struct ContainerSlot {
    /// The container's id, while it is known to run.
    running: Option<String>,
    /// Whether this runner has had a container for the workspace (so one
    /// that is gone is recreated, not created).
    seen: bool,
    /// The running container was made otherwise than this runner makes
    /// them, and kept for the execs that ran in it.
    outdated: bool,
}

/// The engine, plus the containers known to run.
pub struct Engine {
    /// `DOCKER_HOST` (`None`: Docker's defaults).
    host: Option<String>,
    /// The client, once an API version was agreed with the engine; none
    /// while the engine does not answer (calls then fail at once, and the
    /// next [`Engine::ping`] agrees on a version again).
    client: std::sync::RwLock<Option<Docker>>,
    spec: ContainerSpec,
    /// Container id by workspace; a workspace's lock serializes its creation.
    containers: Mutex<HashMap<String, Arc<Mutex<ContainerSlot>>>>,
    /// Whether the engine answered its last ping (see [`crate::engine_watch`]).
    reachable: AtomicBool,
}

/// What an exec's process is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecProcess {
    Running,
    Ended(Option<i64>),
    /// The engine does not know it (its container is gone).
    Unknown,
}

impl Engine {
    /// An engine at `host` (`unix://...`, `tcp://...`; default: `DOCKER_HOST`
    /// or the default socket), asked once whether it answers
    /// ([`Engine::is_reachable`] says what it found). One that does not
    /// answer is no error: the runner serves without it until it does.
    pub async fn connect(host: Option<String>, spec: ContainerSpec) -> Self {
        let engine = Engine {
            host,
            client: std::sync::RwLock::new(None),
            spec,
            containers: Mutex::new(HashMap::new()),
            reachable: AtomicBool::new(false),
        };
        match engine.ping().await {
            Ok(()) => engine.set_reachable(true),
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "the docker engine does not answer; not serving until it does"
            ),
        }
        engine
    }

    /// The client, or an error that [`is_unreachable`] while the engine
    /// has not answered (since its last outage).
    fn docker(&self) -> Result<Docker, bollard::errors::Error> {
        self.client
            .read()
            .expect("poisoned")
            .clone()
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the Docker engine has not answered since it was last unreachable",
                )
                .into()
            })
    }

    /// A new client, with an API version agreed with the engine.
    async fn negotiate(&self) -> anyhow::Result<Docker> {
        let docker = match &self.host {
            Some(host) => Docker::connect_with_host(host),
            None => Docker::connect_with_defaults(),
        }
        .context("cannot reach a Docker engine (set DOCKER_HOST)")?
        .with_timeout(CALL_TIMEOUT);
        let docker = match tokio::time::timeout(PING_TIMEOUT, docker.negotiate_version()).await {
            Ok(negotiated) => {
                negotiated.context("cannot reach a Docker engine (set DOCKER_HOST)")?
            }
            Err(_) => anyhow::bail!("the Docker engine did not answer within {PING_TIMEOUT:?}"),
        };
        if let Ok(Err(e)) =
            tokio::time::timeout(PING_TIMEOUT, docker.inspect_image(&self.spec.image)).await
        {
            tracing::warn!(image = %self.spec.image, error = %e, "workspace image not found; build it with scripts/build-image");
        }
        *self.client.write().expect("poisoned") = Some(docker.clone());
        Ok(docker)
    }

    /// Asks the engine whether it answers, waiting at most [`PING_TIMEOUT`]
    /// (and first agreeing on an API version, if none is agreed yet).
    pub async fn ping(&self) -> anyhow::Result<()> {
        let docker = match self.docker() {
            Ok(docker) => docker,
            Err(_) => self.negotiate().await?,
        };
        match tokio::time::timeout(PING_TIMEOUT, docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e).context("the Docker engine does not answer"),
            Err(_) => anyhow::bail!("the Docker engine did not answer within {PING_TIMEOUT:?}"),
        }
    }

    /// Whether the engine answered its last ping.
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::SeqCst)
    }

    /// Records what the last ping found. An engine found unreachable is
    /// asked for an API version again once it answers (it may have been
    /// replaced meanwhile).
    pub fn set_reachable(&self, reachable: bool) {
        self.reachable.store(reachable, Ordering::SeqCst);
        if !reachable {
            *self.client.write().expect("poisoned") = None;
        }
    }

    /// The client for a container's creation, start or removal.
    fn slow_docker(&self) -> Result<Docker, bollard::errors::Error> {
        Ok(self.docker()?.with_timeout(CONTAINER_TIMEOUT))
    }

    /// The container name of a workspace under the default prefix.
    pub fn container_name(workspace: &str) -> String {
        Self::container_name_in(DEFAULT_PREFIX, workspace)
    }

    /// The container name of a workspace under `prefix`: readable, and
    /// unique even if two ids differ only in case.
    pub fn container_name_in(prefix: &str, workspace: &str) -> String {
        let digest = hex::encode(&Sha256::digest(workspace.as_bytes())[..4]);
        format!("{prefix}-{}-{digest}", workspace.to_ascii_lowercase())
    }

    /// Returns the id of the workspace's running container, creating it
    /// (or recreating it, if it was removed or stopped) first. One made
    /// otherwise than this runner makes them is recreated too, unless
    /// `busy` (execs of the workspace other than the caller's run or start):
    /// then it is kept until a start finds the workspace idle.
    pub async fn ensure_container(
        &self,
        workspace: &str,
        dirs: &WorkspaceDirs,
        busy: bool,
    ) -> anyhow::Result<String> {
        let slot = self
            .containers
            .lock()
            .await
            .entry(workspace.to_owned())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        let name = Self::container_name_in(&self.spec.name_prefix, workspace);
        let body = self.body(workspace, dirs);
        let spec = spec_hash(&body);
        match slot.running.clone() {
            Some(id) if !slot.outdated || busy => return Ok(id),
            Some(_) => self.replace_outdated(workspace, &name).await?,
            None => match self.docker()?.inspect_container(&name, None).await {
                Ok(found) if found.state.as_ref().and_then(|s| s.running) == Some(true) => {
                    let id = found.id.context("container without id")?;
                    let made_as = found.config.and_then(|c| c.labels?.remove(SPEC_LABEL));
                    let outdated = made_as.as_deref() != Some(spec.as_str());
                    if !outdated || busy {
                        if outdated {
                            tracing::warn!(
                                workspace,
                                "workspace container made otherwise (an older runner, other flags); kept while its execs run"
                            );
                        }
                        slot.running = Some(id.clone());
                        slot.seen = true;
                        slot.outdated = outdated;
                        return Ok(id);
                    }
                    self.replace_outdated(workspace, &name).await?;
                }
                Ok(_) => {
                    tracing::info!(workspace, "workspace container stopped; recreating it");
                    crate::metrics::container_recreated("stopped");
                    self.remove(&name).await?;
                }
                Err(e) if is_not_found(&e) => {
                    if slot.seen {
                        tracing::info!(workspace, "workspace container gone; recreating it");
                        crate::metrics::container_recreated("gone");
                    }
                }
                Err(e) => return Err(e).context("cannot inspect the workspace container"),
            },
        }
        slot.running = None;
        let id = self.create(workspace, &name, body, spec).await?;
        slot.running = Some(id.clone());
        slot.seen = true;
        slot.outdated = false;
        Ok(id)
    }

    async fn replace_outdated(&self, workspace: &str, name: &str) -> anyhow::Result<()> {
        tracing::info!(
            workspace,
            "workspace container made otherwise and idle; recreating it"
        );
        crate::metrics::container_recreated("outdated");
        self.remove(name).await
    }

    /// Forgets the workspace's container, so the next exec checks it again.
    pub async fn forget_container(&self, workspace: &str) {
        if let Some(slot) = self.containers.lock().await.get(workspace) {
            slot.lock().await.running = None;
        }
    }

    /// Forgets every workspace's container: after an outage of the engine,
    /// none is known to run until it is checked again. Never waits: a
    /// workspace whose container is being checked right now is skipped (an
    /// exec in a container that is gone after all is retried once anyway).
    pub async fn forget_containers(&self) {
        let slots: Vec<_> = self.containers.lock().await.values().cloned().collect();
        for slot in slots {
            if let Ok(mut slot) = slot.try_lock() {
                slot.running = None;
            }
        }
    }

    /// What a workspace's container is made with, but its [`SPEC_LABEL`].
    fn body(&self, workspace: &str, dirs: &WorkspaceDirs) -> ContainerCreateBody {
        let spec = &self.spec;
        let mut binds = vec![
            format!("{}:{}", dirs.files.display(), layout::CONTAINER_WORKSPACE),
            format!(
                "{}:{}:ro",
                spec.tools_dir.display(),
                layout::CONTAINER_TOOLS
            ),
            format!("{}:{}", dirs.execs.display(), layout::CONTAINER_EXECS),
        ];
        if let Some(dir) = &spec.session_socket_dir {
            binds.push(format!(
                "{}:{}:ro",
                dir.display(),
                layout::CONTAINER_SESSION_DIR
            ));
        }
        ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(vec![
                format!("{}/{}", layout::CONTAINER_TOOLS, layout::SUPERVISOR),
                "idle".into(),
            ]),
            user: Some("65534:65534".into()),
            working_dir: Some(layout::CONTAINER_WORKSPACE.into()),
            labels: Some(HashMap::from([(
                WORKSPACE_LABEL.to_owned(),
                workspace.to_owned(),
            )])),
            network_disabled: Some(spec.network == "none"),
            host_config: Some(HostConfig {
                binds: Some(binds),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                pids_limit: Some(spec.pids_limit),
                memory: (spec.memory_bytes > 0).then_some(spec.memory_bytes),
                network_mode: Some(spec.network.clone()),
                // A reaper at PID 1: orphans of agents do not stay zombies.
                init: Some(true),
                // Agents share /workspace and nothing else: the root
                // filesystem (/tmp, /var/tmp, /run included) is read-only,
                // each exec writes its own directory ($HOME, $TMPDIR), no
                // /dev/shm is mounted, and /dev/mqueue is a read-only tmpfs.
                readonly_rootfs: Some(true),
                ipc_mode: Some("none".into()),
                tmpfs: Some(HashMap::from([(
                    "/dev/mqueue".to_owned(),
                    "ro,nosuid,nodev,noexec".to_owned(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn create(
        &self,
        workspace: &str,
        name: &str,
        mut body: ContainerCreateBody,
        spec_hash: String,
    ) -> anyhow::Result<String> {
        let spec = &self.spec;
        body.labels
            .get_or_insert_default()
            .insert(SPEC_LABEL.to_owned(), spec_hash);
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        let docker = self.slow_docker()?;
        let created = match docker.create_container(Some(options), body).await {
            Ok(created) => created,
            Err(e) if is_not_found(&e) => anyhow::bail!(
                "the workspace image {} is missing: build it with scripts/build-image",
                spec.image
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot create container {name} from {}", spec.image)
                });
            }
        };
        docker
            .start_container(&created.id, None)
            .await
            .with_context(|| format!("cannot start container {name}"))?;
        tracing::info!(workspace, container = %created.id, "workspace container started");
        Ok(created.id)
    }

    async fn remove(&self, name: &str) -> anyhow::Result<()> {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self
            .slow_docker()?
            .remove_container(name, Some(options))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove container {name}")),
        }
    }

    /// Starts `cmd` in the container, detached, as `uid`; returns the Docker exec id.
    pub async fn exec(
        &self,
        container: &str,
        uid: u32,
        env: Vec<String>,
        cmd: Vec<String>,
        working_dir: &str,
    ) -> Result<String, bollard::errors::Error> {
        let options = CreateExecOptions {
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            env: Some(env),
            cmd: Some(cmd),
            user: Some(format!("{uid}:{}", self.spec.workspace_gid)),
            working_dir: Some(working_dir.to_owned()),
            ..Default::default()
        };
        let docker = self.docker()?;
        let created = docker.create_exec(container, options).await?;
        docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: true,
                    ..Default::default()
                }),
            )
            .await?;
        Ok(created.id)
    }

    /// Whether the Docker exec still runs.
    pub async fn exec_process(&self, exec_id: &str) -> anyhow::Result<ExecProcess> {
        Ok(self.exec_status(exec_id).await?.0)
    }

    /// Whether the Docker exec still runs, and while it does, the host pid
    /// of its process (as the engine sees it: the runner may be in another
    /// pid namespace).
    pub async fn exec_status(&self, exec_id: &str) -> anyhow::Result<(ExecProcess, Option<u32>)> {
        match self.docker()?.inspect_exec(exec_id).await {
            Ok(found) if found.running == Some(true) => Ok((
                ExecProcess::Running,
                found
                    .pid
                    .and_then(|pid| u32::try_from(pid).ok())
                    .filter(|pid| *pid > 0),
            )),
            Ok(found) => Ok((ExecProcess::Ended(found.exit_code), None)),
            Err(e) if is_not_found(&e) => Ok((ExecProcess::Unknown, None)),
            Err(e) => Err(e).context("cannot inspect exec"),
        }
    }

    /// Says why, when the container's processes are at its limit: a
    /// `docker exec` into it cannot make the process it starts.
    pub async fn out_of_processes(&self, container: &str) -> Option<String> {
        // What `docker exec` makes in the container before the process runs.
        const EXEC_NEEDS: u64 = 4;
        let options = StatsOptions {
            stream: false,
            one_shot: true,
        };
        let stats = self
            .docker()
            .ok()?
            .stats(container, Some(options))
            .next()
            .await?
            .ok()?;
        let pids = stats.pids_stats?;
        let (current, limit) = (pids.current?, pids.limit?);
        (limit > 0 && current + EXEC_NEEDS > limit).then(|| {
            format!(
                "the workspace container has no process left: it runs {current} of its \
                 {limit} (--pids-limit)"
            )
        })
    }

    /// Whether the container exists and runs.
    pub async fn container_running(&self, container: &str) -> anyhow::Result<bool> {
        match self.docker()?.inspect_container(container, None).await {
            Ok(found) => Ok(found.state.and_then(|s| s.running) == Some(true)),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e).context("cannot inspect container"),
        }
    }

    /// Runs the supervisor's `kill-all` as `uid` and waits for it: every
    /// process of that uid in the container ends.
    pub async fn kill_uid(&self, container: &str, uid: u32) -> anyhow::Result<()> {
        let cmd = vec![
            format!("{}/{}", layout::CONTAINER_TOOLS, layout::SUPERVISOR),
            "kill-all".into(),
        ];
        let id = self.exec(container, uid, Vec::new(), cmd, "/").await?;
        for _ in 0..100 {
            if self.exec_process(&id).await? != ExecProcess::Running {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        anyhow::bail!("kill-all did not finish")
    }
}

/// A hash of what a container is made with (maps have one entry each, and
/// JSON objects here keep their keys sorted, so the text is stable).
fn spec_hash(body: &ContainerCreateBody) -> String {
    let text = serde_json::to_value(body)
        .map(|v| v.to_string())
        .unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..16])
}

/// True when the engine answered 404.
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// True when the engine could not be reached at all (no socket, refused,
/// broken or timed-out connection), as opposed to an answer it gave.
pub fn is_unreachable(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error;
    matches!(
        e,
        Error::IOError { .. }
            | Error::HyperResponseError { .. }
            | Error::HyperLegacyError { .. }
            | Error::RequestTimeoutError
            | Error::SocketNotFoundError(_)
    )
}

/// True when an exec could not be created because its container is gone
/// (404) or not running (409).
pub fn is_container_gone(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }
    )
}
