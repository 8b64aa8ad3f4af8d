//! `troupe-supervisor`: runs inside a workspace container, from Troupe's
//! read-only tools mount. It is the `troupe-runner` binary itself, copied
//! into the tools directory under this name (so the two always match):
//! [`main`] runs when the binary is called `troupe-supervisor`.
//!
//! - `run --dir DIR -- COMMAND...`: the process the runner `docker exec`s
//!   for each session, as the session's own uid. It starts COMMAND in a new
//!   process group, appends its output to `DIR/output.log` (see the runner's
//!   `log` module), forwards stdin frames from the `DIR/stdin` FIFO, obeys
//!   `term` lines on `DIR/control` and a timeout, and ends with an exit
//!   record. Since the log is a file and the FIFOs are held open by the
//!   runner, nothing the agent prints is lost while the runner restarts.
//!   Before COMMAND starts it binds the agent's model port ([`crate::forward`])
//!   and gives COMMAND its variables; what the port has to say goes to the
//!   log as the supervisor's own stderr lines.
//! - `idle`: the container's main process; waits forever.
//! - `kill-all`: kills every other process of the caller's uid (the runner's
//!   last resort when a supervisor itself is gone).
//!
//! Every process of the session runs under the session's uid, so killing
//! "every process this uid may signal" (`kill(-1)`) reaches all of them,
//! even those that left the process group; nothing else is touched, because
//! without capabilities a process may signal only its own uid.

use std::{
    fs::{File, OpenOptions},
    io::{ErrorKind, Read, Write},
    os::{
        fd::AsFd,
        unix::{fs::FileExt, process::CommandExt},
    },
    path::PathBuf,
    process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    forward::{self, ModelPort},
    layout,
    log::{self, Exit, Kind, Reason},
    scope::{self, ScopeError},
};
use clap::Parser;
use nix::{
    errno::Errno,
    fcntl::OFlag,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::{
        resource::{Resource, getrlimit, setrlimit},
        signal::{Signal, kill},
        stat::{Mode, umask},
    },
    unistd::{Pid, pipe2},
};
use troupe_proto::{agent::env as agent_env, scope::WritablePath};

#[derive(Parser)]
#[command(
    name = "troupe-supervisor",
    about = "Troupe's in-container exec supervisor"
)]
enum Cli {
    /// Runs COMMAND, spooling its output and exit to DIR/output.log.
    Run(RunArgs),
    /// Waits forever: the workspace container's main process.
    Idle,
    /// Kills every other process of the caller's uid.
    KillAll,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The exec's directory.
    #[arg(long)]
    dir: PathBuf,
    /// Terminate COMMAND after this many milliseconds (0: never).
    #[arg(long, default_value_t = 0)]
    timeout_ms: u64,
    /// Grace between SIGTERM and SIGKILL on timeout.
    #[arg(long, default_value_t = 5000)]
    grace_ms: u64,
    /// Most processes the session's uid may run (RLIMIT_NPROC).
    #[arg(long)]
    nproc: Option<u64>,
    /// Output bytes the log may run ahead of the watchers before COMMAND's
    /// output is no longer read.
    #[arg(long, default_value_t = 16 << 20)]
    window: u64,
    /// A directory COMMAND may write under (repeated); none: no write scope.
    /// Enforced by Landlock, with COMMAND's `$HOME` and `$TMPDIR` writable.
    #[arg(long = "writable", value_parser = parse_writable)]
    writable: Vec<WritablePath>,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_writable(raw: &str) -> Result<WritablePath, String> {
    WritablePath::parse(raw)
}

/// The supervisor's entry point.
pub fn main() -> ExitCode {
    match Cli::parse() {
        Cli::Run(args) => match run(args) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("troupe-supervisor: {e:#}");
                ExitCode::from(125)
            }
        },
        Cli::Idle => loop {
            thread::park();
        },
        Cli::KillAll => {
            kill_all(Signal::SIGKILL);
            ExitCode::SUCCESS
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<u8> {
    let open_rw = |name: &str| -> anyhow::Result<File> {
        let path = args.dir.join(name);
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))
    };
    let log_file = OpenOptions::new()
        .append(true)
        .open(args.dir.join(layout::LOG))?;
    // Read and write, so the FIFOs never report end of file while the
    // runner restarts.
    let stdin_fifo = open_rw(layout::STDIN)?;
    let control = open_rw(layout::CONTROL)?;
    let ack = File::open(args.dir.join(layout::ACK))?;
    let mut log = LogWriter {
        written: log_file.metadata()?.len(),
        file: log_file,
        ack,
        acked: 0,
        window: args.window,
        unbounded: Arc::new(AtomicBool::new(false)),
    };

    // Files the agent creates are shared with the workspace's group.
    umask(Mode::from_bits_truncate(0o002));
    if let Some(n) = args.nproc {
        // Without capabilities the hard limit can only be lowered.
        let (_, hard) = getrlimit(Resource::RLIMIT_NPROC)?;
        let n = n.min(hard);
        if let Err(e) = setrlimit(Resource::RLIMIT_NPROC, n, n) {
            return log.fail(&format!("cannot limit processes to {n}: {e}"));
        }
    }

    // The model port is bound before the agent starts, so its address is
    // in the agent's environment; what goes wrong with it is said in the log
    // through a pipe the pump reads (never blocking the forwarder: a full
    // pipe drops the line) and never stops the agent.
    // Close-on-exec: the agent must not inherit (and write) either end.
    let (diag_rx, diag_tx) = pipe2(OFlag::O_CLOEXEC)?;
    let diag_rx = File::from(diag_rx);
    let diag_tx = File::from(diag_tx);
    set_nonblocking(&diag_rx)?;
    set_nonblocking(&diag_tx)?;
    let diag: forward::Diag = Arc::new(Mutex::new(diag_tx));
    let endpoint = std::env::var(agent_env::SESSION_ENDPOINT).ok();
    let token = std::env::var(agent_env::SESSION_TOKEN).ok();
    let (model_port, model_vars) = match ModelPort::bind(endpoint.as_deref()) {
        Ok(Some(port)) => match port.vars(token.as_deref()) {
            Ok(vars) => (Some(port), vars),
            Err(e) => {
                log.note(&format!("model port: cannot read its address: {e}"))?;
                (None, Vec::new())
            }
        },
        Ok(None) => (None, Vec::new()),
        Err(e) => {
            log.note(&format!("model port: cannot bind 127.0.0.1: {e}"))?;
            (None, Vec::new())
        }
    };

    let ending = Ending {
        reason: Arc::new(Mutex::new(None)),
        unbounded: log.unbounded.clone(),
    };
    // Every thread of the supervisor is made before the agent starts, each
    // waiting for it: an agent that uses up its uid's processes at once
    // cannot leave its supervisor short of one.
    let (stdin_tx, stdin_rx) = mpsc::channel::<ChildStdin>();
    let (child_tx, child_rx) = mpsc::channel::<Child>();
    let (go_control, control_go) = mpsc::channel::<()>();
    let (go_timer, timer_go) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let made = spawn_thread(move || {
        if let Ok(stdin) = stdin_rx.recv() {
            forward_stdin(stdin_fifo, stdin);
        }
    })
    .and_then(|()| {
        let ending = ending.clone();
        spawn_thread(move || {
            if control_go.recv().is_ok() {
                obey_control(control, ending);
            }
        })
    })
    .and_then(|()| {
        if args.timeout_ms == 0 {
            return Ok(());
        }
        let ending = ending.clone();
        let (timeout, grace) = (args.timeout_ms, args.grace_ms);
        spawn_thread(move || {
            if timer_go.recv().is_ok() {
                thread::sleep(Duration::from_millis(timeout));
                ending.terminate(Reason::TimedOut, Duration::from_millis(grace));
            }
        })
    })
    .and_then(|()| match model_port {
        Some(port) => spawn_thread(move || port.serve(diag)),
        None => Ok(()),
    })
    .and_then(|()| {
        spawn_thread(move || {
            if let Ok(child) = child_rx.recv() {
                let status = wait(child);
                // Whatever the agent left running ends with it, so its pipes close.
                kill_all(Signal::SIGKILL);
                let _ = done_tx.send(status);
            }
        })
    });
    if let Err(e) = made {
        return log.no_room(&args.command[0], &e);
    }

    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .envs(model_vars)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let spawned = if args.writable.is_empty() {
        command.spawn()
    } else {
        match scope::spawn_scoped(&args.writable, &args.dir, command) {
            Ok(spawned) => spawned,
            Err(ScopeError::Thread(e)) => return log.no_room(&args.command[0], &e),
            Err(e) => {
                // A scoped agent never runs unscoped.
                log.exit(&Exit {
                    code: 126,
                    reason: Reason::Exited,
                    detail: format!("cannot start {:?}: {e}", args.command[0]),
                })?;
                return Ok(126);
            }
        }
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if is_out_of_processes(&e) => return log.no_room(&args.command[0], &e),
        Err(e) => {
            let code = if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            };
            log.exit(&Exit {
                code,
                reason: Reason::Exited,
                detail: format!("cannot start {:?}: {e}", args.command[0]),
            })?;
            return Ok(code as u8);
        }
    };
    log.record(Kind::Started, &log::started_payload(i64::from(child.id())))?;

    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let _ = stdin_tx.send(child.stdin.take().expect("piped"));
    let _ = child_tx.send(child);
    let _ = go_control.send(());
    let _ = go_timer.send(());

    pump(stdout, stderr, diag_rx, &mut log)?;
    let status = done_rx.recv()?;
    let (code, detail) = describe(status);
    let reason = ending
        .reason
        .lock()
        .expect("poisoned")
        .unwrap_or(Reason::Exited);
    log.exit(&Exit {
        code,
        reason,
        detail,
    })?;
    Ok(code.clamp(0, 255) as u8)
}

/// How an exec is being ended, when the runner or the timeout ends it.
#[derive(Clone)]
struct Ending {
    reason: Arc<Mutex<Option<Reason>>>,
    /// Set once ending: the last output is written whatever the window.
    unbounded: Arc<AtomicBool>,
}

impl Ending {
    /// SIGTERM to every process of the session, SIGKILL to those left after `grace`.
    fn terminate(&self, reason: Reason, grace: Duration) {
        self.reason.lock().expect("poisoned").get_or_insert(reason);
        self.unbounded.store(true, Ordering::SeqCst);
        kill_all(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            // Signal 0 to -1 fails with ESRCH once no process is left to signal.
            if kill(Pid::from_raw(-1), None) == Err(Errno::ESRCH) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        kill_all(Signal::SIGKILL);
    }
}

/// Starts a thread, or says why not (a thread is a process to the limits).
fn spawn_thread(f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    thread::Builder::new().spawn(f).map(drop)
}

/// Whether a failed fork or thread was refused for want of processes: the
/// container's pids limit or the uid's `RLIMIT_NPROC`.
fn is_out_of_processes(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(Errno::EAGAIN as i32)
}

/// Sends `signal` to every process of this uid but the caller.
fn kill_all(signal: Signal) {
    let _ = kill(Pid::from_raw(-1), signal);
}

fn wait(mut child: Child) -> ExitStatus {
    loop {
        match child.wait() {
            Ok(status) => return status,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("cannot wait for the agent: {e}"),
        }
    }
}

fn describe(status: ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, String::new()),
        (None, Some(signal)) => {
            let name = Signal::try_from(signal).map_or("unknown", |s| s.as_str());
            (128 + signal, format!("killed by signal {signal} ({name})"))
        }
        (None, None) => (-1, "ended without a status".into()),
    }
}

/// Copies stdin frames from the FIFO to the agent until the agent's stdin closes.
fn forward_stdin(mut fifo: File, stdin: ChildStdin) {
    let mut stdin = Some(stdin);
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    loop {
        if fifo.read_exact(&mut len).is_err() {
            return;
        }
        let len = u32::from_le_bytes(len);
        if len == layout::STDIN_CLOSE {
            stdin = None;
            continue;
        }
        if len as usize > layout::STDIN_FRAME {
            // Not a frame the runner wrote: stop forwarding.
            return;
        }
        buf.resize(len as usize, 0);
        if fifo.read_exact(&mut buf).is_err() {
            return;
        }
        if let Some(pipe) = stdin.as_mut()
            && pipe.write_all(&buf).is_err()
        {
            // The agent closed its stdin; later frames are dropped.
            stdin = None;
        }
    }
}

/// Reads `term <grace_ms>` lines from the control FIFO.
fn obey_control(fifo: File, ending: Ending) {
    use std::io::BufRead;
    for line in std::io::BufReader::new(fifo).lines() {
        let Ok(line) = line else { return };
        if let Some(grace) = line.strip_prefix("term ") {
            let grace = Duration::from_millis(grace.trim().parse().unwrap_or(5000));
            let waiter = ending.clone();
            if spawn_thread(move || waiter.terminate(Reason::Killed, grace)).is_err() {
                // No thread to spare: end it from here.
                ending.terminate(Reason::Killed, grace);
            }
        }
    }
}

/// Moves the agent's output into the log until both pipes close, and the
/// supervisor's own diagnostics (`diag`, non-blocking) as stderr meanwhile.
fn pump(
    mut stdout: std::process::ChildStdout,
    mut stderr: std::process::ChildStderr,
    mut diag: File,
    log: &mut LogWriter,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; log::CHUNK];
    let (mut out_open, mut err_open, mut diag_open) = (true, true, true);
    while out_open || err_open {
        let (out_ready, err_ready, diag_ready) = {
            let mut fds = Vec::with_capacity(3);
            if diag_open {
                fds.push(PollFd::new(diag.as_fd(), PollFlags::POLLIN));
            }
            if out_open {
                fds.push(PollFd::new(stdout.as_fd(), PollFlags::POLLIN));
            }
            if err_open {
                fds.push(PollFd::new(stderr.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            let mut it = fds.iter();
            let diag = diag_open && it.next().is_some_and(ready);
            let out = out_open && it.next().is_some_and(ready);
            let err = err_open && it.next().is_some_and(ready);
            (out, err, diag)
        };
        if diag_ready {
            diag_open = drain(&mut diag, &mut buf, log)?;
        }
        // stdout first when both are ready: the order a terminal shows.
        if out_ready {
            out_open = copy_once(&mut stdout, Kind::Stdout, &mut buf, log)?;
        }
        if err_ready {
            err_open = copy_once(&mut stderr, Kind::Stderr, &mut buf, log)?;
        }
    }
    if diag_open {
        drain(&mut diag, &mut buf, log)?;
    }
    Ok(())
}

/// Moves what the non-blocking `diag` holds into the log, as stderr; false
/// once its writers are gone.
fn drain(diag: &mut File, buf: &mut [u8], log: &mut LogWriter) -> anyhow::Result<bool> {
    loop {
        match diag.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => log.output(Kind::Stderr, &buf[..n])?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // Empty for now.
            Err(_) => return Ok(true),
        }
    }
}

fn set_nonblocking(file: &File) -> nix::Result<()> {
    use nix::fcntl::{FcntlArg, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(file, FcntlArg::F_GETFL)?);
    fcntl(file, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(drop)
}

/// One read from `pipe` into one record; false at end of file.
fn copy_once(
    pipe: &mut impl Read,
    kind: Kind,
    buf: &mut [u8],
    log: &mut LogWriter,
) -> anyhow::Result<bool> {
    loop {
        match pipe.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                log.output(kind, &buf[..n])?;
                return Ok(true);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

struct LogWriter {
    file: File,
    written: u64,
    ack: File,
    acked: u64,
    window: u64,
    unbounded: Arc<AtomicBool>,
}

impl LogWriter {
    fn record(&mut self, kind: Kind, payload: &[u8]) -> std::io::Result<()> {
        let bytes = log::encode(kind, payload);
        self.file.write_all(&bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Appends output once the watchers are within the window.
    fn output(&mut self, kind: Kind, data: &[u8]) -> std::io::Result<()> {
        let mut pause = Duration::from_millis(1);
        while self.written.saturating_sub(self.acked) > self.window
            && !self.unbounded.load(Ordering::SeqCst)
        {
            self.acked = read_ack(&self.ack);
            if self.written.saturating_sub(self.acked) > self.window {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
        self.record(kind, data)
    }

    /// Writes a line of the supervisor's own, as stderr.
    fn note(&mut self, line: &str) -> std::io::Result<()> {
        self.record(
            Kind::Stderr,
            format!("troupe-supervisor: {line}\n").as_bytes(),
        )
    }

    /// Ends the log with the supervisor's own failure to start the agent.
    fn fail(&mut self, detail: &str) -> anyhow::Result<u8> {
        self.exit(&Exit {
            code: 125,
            reason: Reason::Exited,
            detail: format!("troupe-supervisor: {detail}"),
        })?;
        Ok(125)
    }

    /// Ends the log with the agent not started for want of processes.
    fn no_room(&mut self, program: &str, e: &std::io::Error) -> anyhow::Result<u8> {
        self.exit(&Exit {
            code: 126,
            reason: Reason::NoResources,
            detail: format!(
                "cannot start {program:?}: no process left, the workspace container's \
                 or this session's process limit is reached ({e})"
            ),
        })?;
        Ok(126)
    }

    fn exit(&mut self, exit: &Exit) -> std::io::Result<()> {
        self.record(Kind::Exited, &log::exit_payload(exit))
    }
}

fn read_ack(file: &File) -> u64 {
    let mut bytes = [0u8; 8];
    match file.read_at(&mut bytes, 0) {
        Ok(8) => u64::from_le_bytes(bytes),
        _ => 0,
    }
}
