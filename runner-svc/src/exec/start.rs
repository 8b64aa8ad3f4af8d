//! Starting an exec: reserving its id, taking room in its workspace's
//! container, making its directory, and `docker exec`ing its supervisor.

use std::{fs::OpenOptions, io::ErrorKind, os::unix::fs::OpenOptionsExt, path::Path, sync::Arc};

use super::{
    Exec, ExecError, Meta, Runner, StartSpec,
    files::{create_exec_dir, meta_dir, remove_if_any, stdin_record, write_meta},
};
use crate::{
    docker::{is_container_gone, is_unreachable},
    layout, log,
    request::{environment, validate, write_scope},
};

impl Runner {
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
        // A stdin record left by an earlier exec of the same id is not this one's.
        if let Err(e) = remove_if_any(&stdin_record(&self.settings, &spec.exec_id)) {
            let _ = std::fs::remove_file(&meta_path);
            return Err(anyhow::Error::from(e)
                .context("cannot clear an old stdin record")
                .into());
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
        for path in write_scope(spec)?.paths() {
            cmd.extend(["--writable".into(), path.to_string()]);
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
}
