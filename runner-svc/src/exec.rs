//! Execs: starting them, following their logs, watching, writing stdin,
//! terminating, and finding them again after a restart.
//!
//! Every exec has:
//! - a record of the runner's own, `<state>/execs/<exec_id>.json`, which the
//!   agent cannot reach (uid, container, Docker exec id);
//! - a directory the agent's uid owns, `<state>/workspaces/<ws>/execs/<exec_id>`,
//!   mounted into the container (see [`crate::layout`]).
//!
//! Since the agent owns that directory, every file in it is opened without
//! following symlinks and checked (type, owner) before the runner, as root,
//! reads or writes it. The runner keeps those descriptors open for the
//! exec's life.
//!
//! One follower task per exec parses the log's record headers as the
//! supervisor appends them (woken by inotify), keeps a sparse index of
//! record offsets, and publishes the exec's [`Progress`]. Watchers read the
//! records themselves, by offset, so each goes at its own pace.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::ErrorKind,
    os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::{io::AsyncWriteExt, net::unix::pipe, sync::watch};
use tokio_util::sync::CancellationToken;

mod outage;

pub use crate::request::StartSpec;
use crate::{
    admission::Admission,
    docker::{Engine, ExecProcess, WorkspaceDirs, is_container_gone, is_unreachable},
    layout,
    log::{self, Exit, HEADER_LEN, Kind, Reason},
    request::{environment, validate},
};

mod bounds;
pub use bounds::{LogLimits, Next, Place};
/// How often a running exec's process is checked with the engine.
const LIVENESS_EVERY: Duration = Duration::from_secs(1);
/// A watcher reports its progress to the supervisor every this many bytes.
const ACK_EVERY: u64 = 256 * 1024;

/// What the runner needs to run execs.
#[derive(Clone, Debug)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub workspaces_dir: PathBuf,
    pub uid_base: u32,
    /// The container's process limit (0 or less: none), `--pids-limit`.
    pub pids_limit: i64,
    pub exec_pids_limit: u64,
    pub output_window: u64,
    /// What the logs keep.
    pub logs: LogLimits,
    pub timeout_grace_ms: u64,
    /// How long an exited exec stays listed and watchable.
    pub keep_exited: Duration,
    /// `TROUPE_SESSION_ENDPOINT` when the caller gives none.
    pub default_endpoint: Option<String>,
}

/// The runner's record of an exec; never in a directory the agent can write.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    pub exec_id: String,
    pub workspace_id: String,
    pub container_id: String,
    pub docker_exec_id: String,
    pub uid: u32,
    pub started_at_micros: u64,
    pub labels: HashMap<String, String>,
    /// The exec's timeout (0: none), which the runner enforces as well.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Its supervisor's host process, once the engine has named it: a
    /// runner started again while the engine does not answer still tells
    /// whether it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<outage::HostProcess>,
}

/// How far an exec's log goes.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Sequence of the last complete record.
    pub last_sequence: u64,
    /// Offset just after it.
    pub end: u64,
    /// Authoritative: where the runner ended the exec, its reason, not the log's.
    pub exit: Option<Exit>,
}

/// Why a call was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Invalid(String),
    #[error("exec {0:?} already exists")]
    AlreadyExists(String),
    #[error("no exec {0:?}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    OutOfRange(String),
    /// The engine does not answer: the caller may try again later.
    #[error("{0}")]
    Unavailable(String),
    /// The workspace's container has no room for another exec.
    #[error("{0}")]
    NoResources(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// One exec.
pub struct Exec {
    pub meta: Meta,
    log: Arc<File>,
    ack: File,
    acked: AtomicU64,
    ack_written: AtomicU64,
    /// Dropped (`None`) once stdin is closed or the exec has exited.
    stdin: Arc<tokio::sync::Mutex<Option<pipe::Sender>>>,
    /// Only ever written without waiting: the agent can fill this FIFO.
    control: Mutex<Option<pipe::Sender>>,
    /// Set when the runner ends the exec (terminate, timeout): the reason
    /// it reports, whatever the log says.
    ending: Mutex<Option<Reason>>,
    exited_at: Mutex<Option<std::time::Instant>>,
    progress: watch::Sender<Progress>,
    /// What the log keeps, and where its records start.
    kept: bounds::Kept,
    /// Its supervisor's host process, once the engine has named it.
    host: Mutex<outage::Host>,
}

impl Exec {
    /// An exec over its files, nothing of its log read yet.
    fn new(meta: Meta, files: ExecFiles) -> Exec {
        let acked = read_ack(&files.ack);
        Exec {
            log: Arc::new(files.log),
            ack: files.ack,
            acked: AtomicU64::new(acked),
            ack_written: AtomicU64::new(acked),
            stdin: Arc::new(tokio::sync::Mutex::new(Some(files.stdin))),
            control: Mutex::new(Some(files.control)),
            ending: Mutex::new(None),
            exited_at: Mutex::new(None),
            progress: watch::Sender::new(Progress::default()),
            kept: bounds::Kept::default(),
            host: Mutex::new(
                meta.supervisor
                    .map_or(outage::Host::Unnamed, outage::Host::Named),
            ),
            meta,
        }
    }

    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Reads the record at `pos`; returns it and its length.
    pub fn read_record(&self, pos: u64) -> Result<(log::Header, Vec<u8>), ExecError> {
        let header = read_header(&self.log, pos)?;
        let mut payload = vec![0u8; header.len as usize];
        self.log
            .read_exact_at(&mut payload, pos + HEADER_LEN as u64)
            .context("cannot read the exec log")?;
        Ok((header, payload))
    }

    /// Asks the supervisor to end the exec, without waiting on the FIFO.
    fn ask_to_end(&self, reason: Reason, grace: Duration) {
        self.ending.lock().expect("poisoned").get_or_insert(reason);
        let line = format!("term {}\n", grace.as_millis());
        if let Some(control) = self.control.lock().expect("poisoned").as_ref()
            && let Err(e) = control.try_write(line.as_bytes())
        {
            tracing::warn!(exec = %self.meta.exec_id, error = %e, "cannot reach the supervisor");
        }
    }

    /// Records that a watcher has read up to `pos`, releasing the supervisor's window.
    pub fn ack(&self, pos: u64, caught_up: bool) {
        let prev = self.acked.fetch_max(pos, Ordering::SeqCst).max(pos);
        let written = self.ack_written.load(Ordering::SeqCst);
        if prev >= written + ACK_EVERY || (caught_up && prev > written) {
            self.ack_written.store(prev, Ordering::SeqCst);
            if let Err(e) = self.ack.write_all_at(&prev.to_le_bytes(), 0) {
                tracing::warn!(exec = %self.meta.exec_id, error = %e, "cannot write ack");
            }
        }
    }
}

fn read_header(file: &File, pos: u64) -> Result<log::Header, ExecError> {
    let mut bytes = [0u8; HEADER_LEN];
    file.read_exact_at(&mut bytes, pos)
        .context("cannot read the exec log")?;
    Ok(log::decode_header(&bytes).map_err(anyhow::Error::from)?)
}

/// All execs of this runner.
pub struct Runner {
    settings: Settings,
    engine: Engine,
    execs: Mutex<HashMap<String, Arc<Exec>>>,
    admission: Arc<Admission>,
    next_uid: Mutex<u32>,
    shutdown: CancellationToken,
    /// What all logs keep.
    logs: bounds::Logs,
}

impl Runner {
    /// Opens the state directory and finds the execs of a previous run.
    pub async fn open(
        settings: Settings,
        engine: Engine,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        for dir in [meta_dir(&settings), settings.state_dir.join("workspaces")] {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let next_uid = read_next_uid(&settings)?;
        let admission = Arc::new(Admission::new(
            settings.pids_limit,
            settings.exec_pids_limit,
        )?);
        let runner = Arc::new(Runner {
            settings,
            engine,
            execs: Mutex::new(HashMap::new()),
            admission,
            next_uid: Mutex::new(next_uid),
            shutdown,
            logs: bounds::Logs::default(),
        });
        runner.recover().await?;
        tokio::spawn(runner.clone().forget_old());
        Ok(runner)
    }

    /// Removes execs that exited more than `keep_exited` ago: their record,
    /// their directory and log, their descriptors.
    async fn forget_old(self: Arc<Self>) {
        let every = (self.settings.keep_exited / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(60));
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = self.shutdown.cancelled() => return,
            }
            let old: Vec<Arc<Exec>> = self
                .execs
                .lock()
                .expect("poisoned")
                .values()
                .filter(|e| {
                    e.exited_at
                        .lock()
                        .expect("poisoned")
                        .is_some_and(|at| at.elapsed() >= self.settings.keep_exited)
                })
                .cloned()
                .collect();
            for exec in old {
                self.forget_log(&exec);
                let meta = &exec.meta;
                self.execs.lock().expect("poisoned").remove(&meta.exec_id);
                let record = meta_dir(&self.settings).join(format!("{}.json", meta.exec_id));
                let dir = self
                    .settings
                    .state_dir
                    .join("workspaces")
                    .join(&meta.workspace_id)
                    .join("execs")
                    .join(&meta.exec_id);
                if let Err(e) =
                    std::fs::remove_file(&record).and_then(|()| std::fs::remove_dir_all(&dir))
                {
                    tracing::warn!(exec = %meta.exec_id, error = %e, "cannot remove an old exec");
                }
            }
        }
    }

    /// Cancelled when the runner stops.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn get(&self, exec_id: &str) -> Result<Arc<Exec>, ExecError> {
        self.execs
            .lock()
            .expect("poisoned")
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ExecError::NotFound(exec_id.to_owned()))
    }

    /// Every exec, of one workspace or all.
    pub fn list(&self, workspace: Option<&str>) -> Vec<Arc<Exec>> {
        let mut execs: Vec<_> = self
            .execs
            .lock()
            .expect("poisoned")
            .values()
            .filter(|e| workspace.is_none_or(|w| e.meta.workspace_id == w))
            .cloned()
            .collect();
        execs.sort_by_key(|e| e.meta.started_at_micros);
        execs
    }

    /// How many execs of `workspace` have not ended.
    fn running_in(&self, workspace: &str) -> usize {
        self.execs
            .lock()
            .expect("poisoned")
            .values()
            .filter(|e| e.meta.workspace_id == workspace && e.progress().exit.is_none())
            .count()
    }

    /// Starts an exec; returns once its process runs (refused with
    /// [`ExecError::NoResources`] when its container has no room for it).
    pub async fn start(self: &Arc<Self>, spec: StartSpec) -> Result<Arc<Exec>, ExecError> {
        validate(&spec)?;
        let meta_path = meta_dir(&self.settings).join(format!("{}.json", spec.exec_id));
        // Creating the record reserves the id, also against a concurrent start.
        let reservation = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&meta_path);
        match reservation {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                return Err(ExecError::AlreadyExists(spec.exec_id));
            }
            Err(e) => {
                return Err(anyhow::Error::from(e)
                    .context("cannot reserve the exec")
                    .into());
            }
        }
        let started = std::time::Instant::now();
        // Room in the container is taken after the id: a start repeated
        // for an exec that runs is told so, whatever the room.
        let admitted = self
            .admission
            .admit(&spec.workspace_id, || self.running_in(&spec.workspace_id));
        let result = match admitted {
            Ok(_place) => self.start_reserved(&spec, &meta_path).await,
            Err(full) => Err(ExecError::NoResources(full.to_string())),
        };
        match result {
            Ok(exec) => {
                crate::metrics::exec_started(started.elapsed());
                Ok(exec)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&meta_path);
                Err(e)
            }
        }
    }

    async fn start_reserved(
        self: &Arc<Self>,
        spec: &StartSpec,
        meta_path: &Path,
    ) -> Result<Arc<Exec>, ExecError> {
        let dirs = self.workspace_dirs(&spec.workspace_id)?;
        // The engine first: a start it cannot take costs no uid and leaves
        // no directory, however often it is retried.
        // Other execs of the workspace run or start: its container is kept,
        // however it was made.
        let busy =
            self.running_in(&spec.workspace_id) + self.admission.starting(&spec.workspace_id) > 1;
        let mut container = self.container_for(&spec.workspace_id, &dirs, busy).await?;
        let uid = self.allocate_uid()?;
        let gid = self.settings.uid_base;
        let dir = dirs.execs.join(&spec.exec_id);
        let files = create_exec_dir(&dir, uid, gid)?;

        let container_dir = format!("{}/{}", layout::CONTAINER_EXECS, spec.exec_id);
        let mut cmd = vec![
            format!("{}/{}", layout::CONTAINER_TOOLS, layout::SUPERVISOR),
            "run".into(),
            "--dir".into(),
            container_dir.clone(),
            "--nproc".into(),
            self.settings.exec_pids_limit.to_string(),
            "--window".into(),
            self.settings
                .logs
                .window(self.settings.output_window)
                .to_string(),
            "--grace-ms".into(),
            self.settings.timeout_grace_ms.to_string(),
        ];
        if spec.timeout_ms > 0 {
            cmd.extend(["--timeout-ms".into(), spec.timeout_ms.to_string()]);
        }
        cmd.push("--".into());
        cmd.extend(spec.command.iter().cloned());
        let env = environment(
            spec,
            &container_dir,
            self.settings.default_endpoint.as_deref(),
        );
        let working_dir = if spec.working_dir.is_empty() {
            layout::CONTAINER_WORKSPACE
        } else {
            &spec.working_dir
        };

        let started_at_micros = log::now_micros();
        let mut attempt = 0;
        let launched = loop {
            attempt += 1;
            match self
                .engine
                .exec(&container, uid, env.clone(), cmd.clone(), working_dir)
                .await
            {
                Ok(id) => break Ok((container, id)),
                Err(e) if is_container_gone(&e) && attempt == 1 => {
                    self.engine.forget_container(&spec.workspace_id).await;
                    match self.container_for(&spec.workspace_id, &dirs, busy).await {
                        Ok(again) => container = again,
                        Err(e) => break Err(e),
                    }
                }
                // Processes the runner does not count (not its execs') fill it.
                Err(e)
                    if !is_unreachable(&e)
                        && let Some(why) = self.engine.out_of_processes(&container).await =>
                {
                    tracing::warn!(workspace = %spec.workspace_id, error = %e, "no process left for an exec");
                    return Err(ExecError::NoResources(format!(
                        "cannot start the exec: {why}"
                    )));
                }
                Err(e) => {
                    let e = anyhow::Error::from(e).context("cannot start the exec");
                    break Err(self.start_failed(e).await);
                }
            }
        };
        let (container_id, docker_exec_id) = match launched {
            Ok(launched) => launched,
            Err(e) => {
                // Its uid is not reused; its directory goes.
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(exec = %spec.exec_id, error = %e, "cannot remove the directory of an exec that did not start");
                }
                return Err(e);
            }
        };

        let meta = Meta {
            exec_id: spec.exec_id.clone(),
            workspace_id: spec.workspace_id.clone(),
            container_id,
            docker_exec_id,
            uid,
            started_at_micros,
            labels: spec.labels.clone(),
            timeout_ms: spec.timeout_ms,
            supervisor: None,
        };
        write_meta(meta_path, &meta)?;
        let exec = self.adopt(meta, files);
        if !spec.initial_stdin.is_empty() {
            // Queued ahead of any later write, but not awaited: an agent
            // that does not read its stdin must not block the start.
            let pending = self
                .queue_stdin(&exec, spec.initial_stdin.clone(), false)
                .await;
            tokio::spawn(async move {
                if let Err(e) = pending.await {
                    tracing::warn!(error = %e, "initial stdin not delivered");
                }
            });
        }
        Ok(exec)
    }

    /// Writes `data` (and maybe the end of input) to the exec's stdin;
    /// returns once the supervisor has it.
    pub async fn write_stdin(
        &self,
        exec: &Arc<Exec>,
        data: &[u8],
        close: bool,
    ) -> Result<(), ExecError> {
        self.queue_stdin(exec, data.to_vec(), close).await.await
    }

    /// Takes the exec's stdin (so writes keep their order), then returns the
    /// write to await. The write runs in a task of its own, so a caller that
    /// goes away cannot leave half a frame.
    async fn queue_stdin(
        &self,
        exec: &Arc<Exec>,
        data: Vec<u8>,
        close: bool,
    ) -> impl Future<Output = Result<(), ExecError>> + use<> {
        let id = exec.meta.exec_id.clone();
        let exited = exec.progress().exit.is_some();
        let stdin = exec.stdin.clone().lock_owned().await;
        let mut progress = exec.subscribe();
        let task = tokio::spawn(async move {
            let mut stdin = stdin;
            if exited {
                return Err(ExecError::Conflict(format!("exec {id:?} has exited")));
            }
            let Some(pipe) = stdin.as_mut() else {
                return Err(ExecError::Conflict(format!(
                    "stdin of exec {id:?} is closed"
                )));
            };
            tokio::select! {
                written = write_frames(pipe, &data, close) => {
                    written.context("cannot write to the exec's stdin")?;
                }
                _ = progress.wait_for(|p| p.exit.is_some()) => {
                    return Err(ExecError::Conflict(format!(
                        "exec {id:?} exited before reading its stdin"
                    )));
                }
            }
            if close {
                *stdin = None;
            }
            Ok(())
        });
        async move { task.await.map_err(anyhow::Error::from)? }
    }

    /// Stops the exec and every process it started; returns once it has exited.
    pub async fn terminate(&self, exec: &Arc<Exec>, grace: Duration) -> Result<(), ExecError> {
        let mut progress = exec.subscribe();
        if progress.borrow().exit.is_some() {
            return Ok(());
        }
        exec.ask_to_end(Reason::Killed, grace);
        let wait = grace + Duration::from_secs(3);
        if tokio::time::timeout(wait, progress.wait_for(|p| p.exit.is_some()))
            .await
            .is_ok()
        {
            return Ok(());
        }
        // The supervisor is gone, stopped or stuck: kill the uid from outside.
        tracing::warn!(exec = %exec.meta.exec_id, "supervisor did not stop the exec; killing its uid");
        self.engine
            .kill_uid(&exec.meta.container_id, exec.meta.uid)
            .await?;
        let wait = LIVENESS_EVERY * 3;
        match tokio::time::timeout(wait, progress.wait_for(|p| p.exit.is_some())).await {
            Ok(_) => Ok(()),
            Err(_) => Err(anyhow::anyhow!("the exec did not end").into()),
        }
    }

    fn allocate_uid(&self) -> Result<u32, ExecError> {
        let mut next = self.next_uid.lock().expect("poisoned");
        let uid = *next;
        let path = self.settings.state_dir.join("next_uid");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, (uid + 1).to_string())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .context("cannot persist the uid counter")?;
        *next = uid + 1;
        Ok(uid)
    }

    fn workspace_dirs(&self, workspace: &str) -> Result<WorkspaceDirs, ExecError> {
        let files = self.settings.workspaces_dir.join(workspace);
        if !files.exists() {
            std::fs::create_dir_all(&files)
                .with_context(|| format!("cannot create {}", files.display()))?;
            // Shared by every agent of the workspace, through its group.
            std::os::unix::fs::chown(&files, None, Some(self.settings.uid_base))
                .context("cannot chown the workspace")?;
            std::fs::set_permissions(&files, std::fs::Permissions::from_mode(0o2775))
                .context("cannot chmod the workspace")?;
        }
        let execs = self
            .settings
            .state_dir
            .join("workspaces")
            .join(workspace)
            .join("execs");
        if !execs.exists() {
            std::fs::create_dir_all(&execs)
                .with_context(|| format!("cannot create {}", execs.display()))?;
        }
        // Agents may enter their own directory but not list their siblings'.
        std::fs::set_permissions(&execs, std::fs::Permissions::from_mode(0o711))
            .context("cannot chmod the exec directory")?;
        Ok(WorkspaceDirs { files, execs })
    }

    /// Makes an exec and follows its log from its first record.
    fn adopt(self: &Arc<Self>, meta: Meta, files: ExecFiles) -> Arc<Exec> {
        let exec = Arc::new(Exec::new(meta, files));
        self.follow_from(exec.clone(), Scanner::default(), None);
        exec
    }

    /// Lists `exec` and follows its log from where `scanner` stands (`exit`:
    /// the exit record it has read already).
    fn follow_from(self: &Arc<Self>, exec: Arc<Exec>, scanner: Scanner, exit: Option<Exit>) {
        self.execs
            .lock()
            .expect("poisoned")
            .insert(exec.meta.exec_id.clone(), exec.clone());
        let runner = self.clone();
        tokio::spawn(async move { runner.follow(exec, scanner, exit).await });
    }

    /// Finds the execs of a previous run and follows them again.
    async fn recover(self: &Arc<Self>) -> anyhow::Result<()> {
        let dir = meta_dir(&self.settings);
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let meta: Meta = match std::fs::read(&path)
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(serde_json::from_slice(&b)?))
            {
                Ok(meta) => meta,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "dropping an unreadable exec record");
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            };
            let exec_dir = self
                .workspace_dirs(&meta.workspace_id)?
                .execs
                .join(&meta.exec_id);
            match open_exec_files(&exec_dir, meta.uid) {
                Ok(files) => {
                    tracing::info!(exec = %meta.exec_id, "re-attached to exec");
                    // What the log holds is read before any watcher can see
                    // the exec: one resuming after a sequence it was sent
                    // before the restart must find that sequence. A log
                    // that cannot be read is left to the follower, which
                    // ends the exec.
                    let exec = Arc::new(Exec::new(meta, files));
                    let mut scanner = self.resume_scanner(&exec);
                    let exit = scanner.scan_blocking(&exec).await.unwrap_or(None);
                    self.follow_from(exec, scanner, exit);
                }
                Err(e) => {
                    tracing::warn!(exec = %meta.exec_id, error = %e, "exec files unusable; killing its processes");
                    let _ = self.engine.kill_uid(&meta.container_id, meta.uid).await;
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(())
    }

    /// Follows an exec's log from where `scanner` stands until its exit
    /// record (at once if `exit` is it), then ends the exec.
    async fn follow(self: Arc<Self>, exec: Arc<Exec>, mut scanner: Scanner, exit: Option<Exit>) {
        let exit = match exit {
            Some(exit) => Some(exit),
            None => self.follow_log(&exec, &mut scanner).await,
        };
        if let Some(exit) = exit {
            self.finish(&exec, exit, &scanner).await;
            self.bound_logs(&exec).await;
        }
    }

    async fn follow_log(self: &Arc<Self>, exec: &Arc<Exec>, scanner: &mut Scanner) -> Option<Exit> {
        let mut wakeups = match watch_file(&exec.log) {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::warn!(exec = %exec.meta.exec_id, error = %e, "no inotify; polling the log");
                None
            }
        };
        let mut liveness = tokio::time::interval(LIVENESS_EVERY);
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The runner's own deadline, should the supervisor not keep its timeout.
        let deadline = (exec.meta.timeout_ms > 0).then(|| {
            let started =
                std::time::UNIX_EPOCH + Duration::from_micros(exec.meta.started_at_micros);
            let overdue = started
                + Duration::from_millis(exec.meta.timeout_ms + self.settings.timeout_grace_ms)
                + LIVENESS_EVERY * 2;
            let left = overdue
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        let mut overdue = false;
        let mut corrupt: Option<String> = None;
        loop {
            if corrupt.is_none() {
                match scanner.scan_blocking(exec).await {
                    Ok(Some(exit)) => return Some(exit),
                    Ok(None) => {
                        if scanner.seq > 0 {
                            self.name_host(exec).await;
                        }
                        self.bound_logs(exec).await;
                    }
                    Err(e) => {
                        tracing::warn!(exec = %exec.meta.exec_id, error = %e, "corrupt exec log; terminating the exec");
                        corrupt = Some(e.to_string());
                        exec.ask_to_end(Reason::Killed, Duration::ZERO);
                    }
                }
            }
            let poll = tokio::time::sleep(Duration::from_millis(50));
            let due = async {
                match deadline {
                    Some(at) if !overdue => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                _ = async {
                    match wakeups.as_mut() {
                        Some(s) => { s.next().await; }
                        None => poll.await,
                    }
                } => {}
                () = due => {
                    overdue = true;
                    tracing::warn!(exec = %exec.meta.exec_id, "exec outlived its timeout; killing its uid");
                    exec.ending.lock().expect("poisoned").get_or_insert(Reason::TimedOut);
                    if let Err(e) = self.engine.kill_uid(&exec.meta.container_id, exec.meta.uid).await {
                        tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot kill an overdue exec");
                    }
                }
                _ = liveness.tick() => {
                    match self.check_liveness(exec, scanner, corrupt.as_deref()).await {
                        Ok(Some(exit)) => return Some(exit),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(exec = %exec.meta.exec_id, error = %e, "liveness check failed"),
                    }
                }
            }
        }
    }

    /// Publishes the end of an exec. Whatever its log says, every process
    /// of its uid is killed first: an agent cannot outlive its exec by
    /// writing an exit record itself.
    async fn finish(&self, exec: &Arc<Exec>, mut exit: Exit, scanner: &Scanner) {
        if exit.reason != Reason::ContainerLost
            && let Err(e) = self
                .engine
                .kill_uid(&exec.meta.container_id, exec.meta.uid)
                .await
        {
            tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot kill what the exec left");
        }
        if let Some(reason) = *exec.ending.lock().expect("poisoned")
            && exit.reason != Reason::ContainerLost
        {
            exit.reason = reason;
        }
        *exec.control.lock().expect("poisoned") = None;
        *exec.exited_at.lock().expect("poisoned") = Some(std::time::Instant::now());
        exec.progress.send_modify(|p| {
            p.last_sequence = scanner.seq;
            p.end = scanner.pos;
            p.exit = Some(exit);
        });
        *exec.stdin.lock().await = None;
    }

    /// Ends the log for the supervisor when it can no longer do it itself.
    async fn check_liveness(
        &self,
        exec: &Arc<Exec>,
        scanner: &mut Scanner,
        corrupt: Option<&str>,
    ) -> anyhow::Result<Option<Exit>> {
        let meta = &exec.meta;
        let process = match self.observe(exec).await? {
            outage::Seen::Running => return Ok(None),
            outage::Seen::Ended(process) => Some(process),
            outage::Seen::DiedWithEngine => None,
        };
        if corrupt.is_none() {
            // The supervisor may have written its exit just now.
            if let Some(exit) = scanner.scan_blocking(exec).await? {
                return Ok(Some(exit));
            }
        }
        let exit = if process.is_none() {
            self.engine.forget_container(&meta.workspace_id).await;
            outage::died_with_engine()
        } else if !self.engine.container_running(&meta.container_id).await? {
            self.engine.forget_container(&meta.workspace_id).await;
            Exit {
                code: -1,
                reason: Reason::ContainerLost,
                detail: "the workspace container stopped or was removed".into(),
            }
        } else {
            // Whatever the agent left running goes with it.
            self.engine.kill_uid(&meta.container_id, meta.uid).await?;
            let code = match process {
                Some(ExecProcess::Ended(Some(code))) => i32::try_from(code).unwrap_or(-1),
                _ => -1,
            };
            Exit {
                code,
                reason: Reason::Killed,
                detail: match corrupt {
                    Some(e) => format!("the agent corrupted its output log ({e})"),
                    None => "the supervisor ended without recording an exit".into(),
                },
            }
        };
        // Only the runner writes now: cut a partial record, then append the exit.
        let record = log::encode(Kind::Exited, &log::exit_payload(&exit));
        exec.log.set_len(scanner.pos)?;
        exec.log.write_all_at(&record, scanner.pos)?;
        scanner
            .scan_blocking(exec)
            .await?
            .context("the appended exit record was not read back")
            .map(Some)
    }
}

/// Parses record headers from where it stopped.
#[derive(Default)]
struct Scanner {
    pos: u64,
    seq: u64,
    /// Offset of the exit record, once read.
    exit_at: u64,
}

impl Scanner {
    /// [`Scanner::scan`] off the async threads: a log may hold many records.
    async fn scan_blocking(&mut self, exec: &Arc<Exec>) -> anyhow::Result<Option<Exit>> {
        let mut scanner = std::mem::take(self);
        let exec = exec.clone();
        let (scanner, result) = tokio::task::spawn_blocking(move || {
            let result = scanner.scan(&exec);
            (scanner, result)
        })
        .await?;
        *self = scanner;
        result
    }

    /// Advances over complete records, publishing progress; returns the exit once read.
    fn scan(&mut self, exec: &Exec) -> anyhow::Result<Option<Exit>> {
        let len = exec.log.metadata()?.len();
        if len < self.pos {
            return Err(log::Corrupt("the log shrank").into());
        }
        let mut exit = None;
        let start_seq = self.seq;
        while self.pos + HEADER_LEN as u64 <= len {
            let header = read_header(&exec.log, self.pos).map_err(|e| anyhow::anyhow!("{e}"))?;
            if self.pos + header.record_len() > len {
                break;
            }
            if header.kind == Kind::Exited {
                self.exit_at = self.pos;
                let (_, payload) = exec
                    .read_record(self.pos)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                exit = Some(log::decode_exit(&payload)?);
            }
            exec.kept.note(
                Place {
                    sequence: self.seq + 1,
                    offset: self.pos,
                },
                header.record_len(),
            );
            self.seq += 1;
            self.pos += header.record_len();
            if exit.is_some() {
                break;
            }
        }
        if self.seq != start_seq {
            // The exit record is published with the exit itself, by `finish`.
            let (seq, end) = match &exit {
                Some(_) => (self.seq - 1, self.exit_at),
                None => (self.seq, self.pos),
            };
            exec.progress.send_modify(|p| {
                p.last_sequence = seq;
                p.end = end;
            });
        }
        Ok(exit)
    }
}

/// Wakes whenever the file is written (inotify, which sees writes made
/// from inside the container too).
fn watch_file(file: &File) -> std::io::Result<impl futures::Stream<Item = ()> + Unpin + use<>> {
    use inotify::{Inotify, WatchMask};
    use std::os::fd::AsRawFd;
    let inotify = Inotify::init()?;
    // Through our own descriptor: the path in the agent's directory may change.
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    inotify
        .watches()
        .add(&path, WatchMask::MODIFY | WatchMask::ATTRIB)?;
    Ok(inotify.into_event_stream([0u8; 1024])?.map(|_| ()).boxed())
}

struct ExecFiles {
    log: File,
    ack: File,
    stdin: pipe::Sender,
    control: pipe::Sender,
}

fn create_exec_dir(dir: &Path, uid: u32, gid: u32) -> Result<ExecFiles, ExecError> {
    use std::os::unix::fs::{DirBuilderExt, chown};
    let created = std::fs::DirBuilder::new().mode(0o700).create(dir);
    match created {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            // Left by an earlier exec of the same id whose record was dropped.
            std::fs::remove_dir_all(dir).context("cannot clear an old exec directory")?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .context("cannot create the exec directory")?;
        }
        Err(e) => {
            return Err(anyhow::Error::from(e)
                .context("cannot create the exec directory")
                .into());
        }
    }
    let setup = || -> anyhow::Result<()> {
        for name in [layout::LOG, layout::ACK] {
            File::options()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(name))?;
        }
        for name in [layout::STDIN, layout::CONTROL] {
            nix::unistd::mkfifo(
                &dir.join(name),
                nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
            )?;
        }
        for name in [layout::HOME, layout::TMP] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir.join(name))?;
        }
        for name in [
            layout::LOG,
            layout::ACK,
            layout::STDIN,
            layout::CONTROL,
            layout::HOME,
            layout::TMP,
            "",
        ] {
            chown(dir.join(name), Some(uid), Some(gid))?;
        }
        Ok(())
    };
    setup().context("cannot prepare the exec directory")?;
    Ok(open_exec_files(dir, uid)?)
}

/// Opens the files of an exec directory without following links, checking
/// each is what the runner made and belongs to the exec's uid.
fn open_exec_files(dir: &Path, uid: u32) -> anyhow::Result<ExecFiles> {
    let open = |name: &str, fifo: bool| -> anyhow::Result<File> {
        let path = dir.join(name);
        // Non-blocking as well: a lease the agent takes on a file must not
        // hold the runner up.
        let flags = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let meta = file.metadata()?;
        use std::os::unix::fs::FileTypeExt;
        let right_type = if fifo {
            meta.file_type().is_fifo()
        } else {
            meta.file_type().is_file()
        };
        anyhow::ensure!(
            right_type && meta.uid() == uid,
            "{} is not the runner's",
            path.display()
        );
        Ok(file)
    };
    Ok(ExecFiles {
        log: open(layout::LOG, false)?,
        ack: open(layout::ACK, false)?,
        stdin: pipe::Sender::from_file(open(layout::STDIN, true)?)?,
        control: pipe::Sender::from_file(open(layout::CONTROL, true)?)?,
    })
}

/// Writes `data` as stdin frames, each in one `write` of at most
/// `PIPE_BUF` bytes, which a pipe takes whole or not at all: a runner that
/// stops between two writes never leaves half a frame in the FIFO.
async fn write_frames(pipe: &mut pipe::Sender, data: &[u8], close: bool) -> std::io::Result<()> {
    let mut frames: Vec<Vec<u8>> = data
        .chunks(layout::STDIN_FRAME)
        .map(|chunk| {
            let mut frame = Vec::with_capacity(chunk.len() + 4);
            frame.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            frame.extend_from_slice(chunk);
            frame
        })
        .collect();
    if close {
        frames.push(layout::STDIN_CLOSE.to_le_bytes().to_vec());
    }
    for frame in frames {
        let written = pipe.write(&frame).await?;
        if written != frame.len() {
            return Err(std::io::Error::other("a stdin frame was split"));
        }
    }
    Ok(())
}

fn read_ack(file: &File) -> u64 {
    let mut bytes = [0u8; 8];
    match file.read_at(&mut bytes, 0) {
        Ok(8) => u64::from_le_bytes(bytes),
        _ => 0,
    }
}

fn meta_dir(settings: &Settings) -> PathBuf {
    settings.state_dir.join("execs")
}

fn write_meta(path: &Path, meta: &Meta) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(meta)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn read_next_uid(settings: &Settings) -> anyhow::Result<u32> {
    let path = settings.state_dir.join("next_uid");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .with_context(|| format!("{} is not a uid", path.display())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(settings.uid_base + 1),
        Err(e) => Err(e.into()),
    }
}
