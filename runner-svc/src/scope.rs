//! A session's write scope, enforced by the kernel: the supervisor starts a
//! scoped agent from a thread of its own that first restricts itself with a
//! Landlock ruleset, which the agent and everything it starts inherit. The
//! supervisor's other threads (its log, its FIFOs) stay unrestricted.
//!
//! Only writing is handled (reading stays open, the workspace is shared by
//! design): creating, writing, truncating, renaming, linking and removing
//! files and directories are refused with `EACCES` (or `EXDEV` for a
//! rename or link across the scope's edge) outside the scope's directories,
//! the agent's `$HOME` and `$TMPDIR` (in its exec directory), and a few
//! character devices (`/dev/null`, ...). A kernel that cannot enforce all
//! of it (no Landlock, or older than its ABI 3, which handles truncation)
//! refuses the start: a scoped agent never runs unscoped. The scope's
//! directories are opened with `openat2` (`RESOLVE_NO_SYMLINKS`): a missing
//! one, or one reached through a symlink, refuses the start too (the
//! supervisor exits 126).

use std::{
    os::fd::OwnedFd,
    path::Path,
    process::{Child, Command},
    thread,
};

use landlock::{
    ABI, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};
use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat2};
use troupe_proto::scope::WritablePath;

use crate::layout;

/// The Landlock ABI whose write rights a scope needs: ABI 3 adds
/// truncation, without which a file outside the scope could be emptied.
const NEEDED_ABI: ABI = ABI::V3;

/// Devices an agent may write (never create or remove) whatever its scope.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];

/// Why a scoped agent was not started.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    /// The kernel cannot enforce the scope.
    #[error("write scope not enforced: {0}")]
    Unenforced(String),
    /// A writable path cannot be opened as a directory without symlinks.
    #[error("writable path {path}: {reason}")]
    Path { path: String, reason: String },
    /// The ruleset could not be made or applied.
    #[error("write scope: {0}")]
    Landlock(#[from] landlock::RulesetError),
    /// No thread to start the agent from.
    #[error("no thread to start the agent: {0}")]
    Thread(std::io::Error),
}

/// Starts `command` restricted to writing under `paths`, the exec
/// directory's `home` and `tmp` and [`DEVICES`]. Returns the spawn's own
/// result, or why the scope could not be applied (then nothing started).
pub fn spawn_scoped(
    paths: &[WritablePath],
    exec_dir: &Path,
    mut command: Command,
) -> Result<std::io::Result<Child>, ScopeError> {
    let paths = paths.to_vec();
    let exec_dir = exec_dir.to_owned();
    // Landlock restricts the calling thread and what it starts: this
    // thread does nothing else, and ends with the spawn.
    let spawner = thread::Builder::new()
        .name("scoped-spawn".into())
        .spawn(move || -> Result<std::io::Result<Child>, ScopeError> {
            restrict(&paths, &exec_dir)?;
            Ok(command.spawn())
        })
        .map_err(ScopeError::Thread)?;
    spawner.join().unwrap_or_else(|_| {
        Err(ScopeError::Unenforced(
            "the spawning thread panicked".into(),
        ))
    })
}

/// Restricts the calling thread's writes to the scope.
fn restrict(paths: &[WritablePath], exec_dir: &Path) -> Result<(), ScopeError> {
    let all = AccessFs::from_write(NEEDED_ABI);
    let file: BitFlags<AccessFs> = AccessFs::WriteFile | AccessFs::Truncate;
    let mut ruleset = Ruleset::default().handle_access(all)?.create()?;
    for path in paths {
        ruleset = ruleset.add_rule(PathBeneath::new(open_scope_dir(path)?, all))?;
    }
    for own in [layout::HOME, layout::TMP] {
        let dir = exec_dir.join(own);
        let fd = PathFd::new(&dir).map_err(|e| ScopeError::Path {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        ruleset = ruleset.add_rule(PathBeneath::new(fd, all))?;
    }
    for device in DEVICES {
        // A container may lack one; the others still apply.
        if let Ok(fd) = PathFd::new(device) {
            ruleset = ruleset.add_rule(PathBeneath::new(fd, file))?;
        }
    }
    let status = ruleset.restrict_self()?;
    require_enforced(status.ruleset)
}

/// Opens a scope's directory as a path descriptor, refusing symlinks in any
/// of its components: a parent could otherwise point its child's scope, by
/// a link inside its own, at a directory it may not write itself.
fn open_scope_dir(path: &WritablePath) -> Result<OwnedFd, ScopeError> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(AT_FDCWD, path.as_str(), how).map_err(|e| ScopeError::Path {
        path: path.to_string(),
        reason: match e {
            nix::errno::Errno::ENOENT => "no such directory".into(),
            nix::errno::Errno::ENOTDIR => "not a directory".into(),
            nix::errno::Errno::ELOOP => "is or goes through a symbolic link".into(),
            e => e.desc().to_lowercase(),
        },
    })
}

/// Refuses a ruleset the kernel does not enforce in full.
fn require_enforced(status: RulesetStatus) -> Result<(), ScopeError> {
    match status {
        RulesetStatus::FullyEnforced => Ok(()),
        RulesetStatus::PartiallyEnforced => Err(ScopeError::Unenforced(
            "the kernel's Landlock is older than ABI 3 (it cannot refuse truncation)".into(),
        )),
        RulesetStatus::NotEnforced => Err(ScopeError::Unenforced(
            "the kernel has no Landlock (or it is disabled)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fully_enforced_ruleset_lets_a_scoped_agent_start() {
        assert!(require_enforced(RulesetStatus::FullyEnforced).is_ok());
        for status in [RulesetStatus::PartiallyEnforced, RulesetStatus::NotEnforced] {
            let err = require_enforced(status).unwrap_err().to_string();
            assert!(err.starts_with("write scope not enforced: "), "{err}");
        }
    }
}
