//! [`Runner`]: the execs of this runner. Opening it finds the execs of a
//! previous run; it lists them, looks them up, and forgets those that
//! exited longer ago than they are kept.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{
    Exec, ExecError, Meta, Settings, bounds,
    files::{ExecFiles, meta_dir, read_next_uid, remove_if_any, stdin_record},
    scanner::Scanner,
};
use crate::{admission::Admission, docker::Engine, log::Exit};

/// All execs of this runner.
pub struct Runner {
    pub(super) settings: Settings,
    pub(super) engine: Engine,
    execs: Mutex<HashMap<String, Arc<Exec>>>,
    pub(super) admission: Arc<Admission>,
    pub(super) next_uid: Mutex<u32>,
    pub(super) shutdown: CancellationToken,
    /// What all logs keep.
    pub(super) logs: bounds::Logs,
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
                if let Err(e) = std::fs::remove_file(&record)
                    .and_then(|()| remove_if_any(&stdin_record(&self.settings, &meta.exec_id)))
                    .and_then(|()| std::fs::remove_dir_all(&dir))
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
    pub(super) fn running_in(&self, workspace: &str) -> usize {
        self.execs
            .lock()
            .expect("poisoned")
            .values()
            .filter(|e| e.meta.workspace_id == workspace && e.progress().exit.is_none())
            .count()
    }

    /// Makes an exec and follows its log from its first record.
    pub(super) fn adopt(self: &Arc<Self>, meta: Meta, files: ExecFiles) -> Arc<Exec> {
        let exec = Arc::new(Exec::new(meta, files));
        self.follow_from(exec.clone(), Scanner::default(), None);
        exec
    }

    /// Lists `exec` and follows its log from where `scanner` stands (`exit`:
    /// the exit record it has read already).
    pub(super) fn follow_from(
        self: &Arc<Self>,
        exec: Arc<Exec>,
        scanner: Scanner,
        exit: Option<Exit>,
    ) {
        self.execs
            .lock()
            .expect("poisoned")
            .insert(exec.meta.exec_id.clone(), exec.clone());
        let runner = self.clone();
        tokio::spawn(async move { runner.follow(exec, scanner, exit).await });
    }
}
