//! The runner's files on disk: the exec records (out of the agents'
//! reach), the uid counter, the workspace directories, and each exec's
//! directory, made and opened without following the agent's links.

use std::{
    fs::{File, OpenOptions},
    io::ErrorKind,
    os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::Context;
use tokio::net::unix::pipe;

use super::{ExecError, Meta, Runner, Settings};
use crate::{docker::WorkspaceDirs, layout};

impl Runner {
    pub(super) fn allocate_uid(&self) -> Result<u32, ExecError> {
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

    pub(super) fn workspace_dirs(&self, workspace: &str) -> Result<WorkspaceDirs, ExecError> {
        let files = self.settings.workspaces_dir.join(workspace);
        std::fs::create_dir_all(&files)
            .with_context(|| format!("cannot create {}", files.display()))?;
        // Shared by every agent of the workspace, through its group, however
        // the directory came to exist (an operator's `mkdir` makes it
        // root's, 0755).
        share_with_group(&files, self.settings.uid_base)?;
        // The sandboxed agents' area, made once: a sandboxed session given
        // no scope writes there and nowhere else. Not made over anything
        // already there (a link is refused by the supervisor at start).
        let area = files.join(troupe_proto::scope::SANDBOXED_AREA_DIR);
        if area.symlink_metadata().is_err() {
            match std::fs::create_dir(&area) {
                Ok(()) => share_with_group(&area, self.settings.uid_base)?,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("cannot create {}", area.display()))
                        .into());
                }
            }
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
}
/// Gives a directory of the runner's making (the workspace, its sandboxed
/// area) to the workspace's group, group-writable and setgid (so what
/// agents create in it stays the group's), unless it already is.
fn share_with_group(dir: &Path, gid: u32) -> Result<(), ExecError> {
    // Through a descriptor opened without following a link: an agent that
    // swaps the area for a link to a host directory changes nothing there.
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(dir)
        .with_context(|| format!("cannot open {} as a directory", dir.display()))?;
    let meta = opened
        .metadata()
        .with_context(|| format!("cannot stat {}", dir.display()))?;
    if meta.gid() != gid {
        std::os::unix::fs::fchown(&opened, None, Some(gid))
            .with_context(|| format!("cannot chown {}", dir.display()))?;
    }
    if meta.mode() & 0o2070 != 0o2070 {
        let mode = (meta.mode() & 0o7777) | 0o2070;
        opened
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot chmod {}", dir.display()))?;
    }
    Ok(())
}

/// The descriptors of an exec's directory the runner keeps open.
pub(super) struct ExecFiles {
    pub(super) log: File,
    pub(super) ack: File,
    pub(super) stdin: pipe::Sender,
    pub(super) control: pipe::Sender,
}

pub(super) fn create_exec_dir(dir: &Path, uid: u32, gid: u32) -> Result<ExecFiles, ExecError> {
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
pub(super) fn open_exec_files(dir: &Path, uid: u32) -> anyhow::Result<ExecFiles> {
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
pub(super) fn read_ack(file: &File) -> u64 {
    let mut bytes = [0u8; 8];
    match file.read_at(&mut bytes, 0) {
        Ok(8) => u64::from_le_bytes(bytes),
        _ => 0,
    }
}

pub(super) fn meta_dir(settings: &Settings) -> PathBuf {
    settings.state_dir.join("execs")
}

pub(super) fn write_meta(path: &Path, meta: &Meta) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(meta)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The record of the last stdin frame sequence an exec received, beside
/// its exec record (out of the agent's reach).
pub(super) fn stdin_record(settings: &Settings, exec_id: &str) -> PathBuf {
    meta_dir(settings).join(format!("{exec_id}.stdin"))
}

pub(super) fn write_stdin_record(path: &Path, sequence: u64) -> anyhow::Result<()> {
    let tmp = path.with_extension("stdin.tmp");
    std::fs::write(&tmp, sequence.to_string())?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The recorded sequence; 0 when there is none (the frames are written
/// again: at least once).
pub(super) fn read_stdin_record(path: &Path) -> u64 {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(path = %path.display(), "unreadable stdin record; taken as 0");
            0
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a stdin record; taken as 0");
            0
        }
    }
}

/// Removes `path`, which may not exist.
pub(super) fn remove_if_any(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub(super) fn read_next_uid(settings: &Settings) -> anyhow::Result<u32> {
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
