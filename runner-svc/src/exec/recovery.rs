//! Finding the execs of a previous run: each record is read, its exec's
//! files opened again and its log read as far as it goes before the exec
//! is listed and followed.

use std::sync::Arc;

use super::{
    Exec, Meta, Runner,
    files::{meta_dir, open_exec_files, read_stdin_record, stdin_record},
};

impl Runner {
    /// Finds the execs of a previous run and follows them again.
    pub(super) async fn recover(self: &Arc<Self>) -> anyhow::Result<()> {
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
                    exec.stdin_sequence.store(
                        read_stdin_record(&stdin_record(&self.settings, &exec.meta.exec_id)),
                        std::sync::atomic::Ordering::SeqCst,
                    );
                    let mut scanner = self.resume_scanner(&exec);
                    let exit = scanner.scan_blocking(&exec).await.unwrap_or(None);
                    self.follow_from(exec, scanner, exit);
                }
                Err(e) => {
                    tracing::warn!(exec = %meta.exec_id, error = %e, "exec files unusable; killing its processes");
                    let _ = self.engine.kill_uid(&meta.container_id, meta.uid).await;
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_file(stdin_record(&self.settings, &meta.exec_id));
                }
            }
        }
        Ok(())
    }
}
