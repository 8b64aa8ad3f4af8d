//! The agent's way to its model, inside the supervisor: a TCP port on the
//! container's loopback (the network stays `none`; loopback exists), each
//! connection forwarded byte for byte to the session service's Unix socket
//! as mounted in the container, where the model gateway answers. The agent
//! is told the port as `ANTHROPIC_BASE_URL` and `OPENAI_BASE_URL` and its
//! session token as both API keys ([`ModelPort::vars`]): the gateway knows
//! the caller by that token alone. The port serves the agent's own uid
//! only: a connection from another uid of the container (another session's
//! agent, found in `/proc/net/tcp`) is closed at once, so no neighbour can
//! take up an agent's connections.
//!
//! Synchronous, like the rest of the supervisor: one thread accepts, one
//! thread per connection copies both ways with `poll` on non-blocking
//! sockets. At most [`MAX_CONNECTIONS`] are forwarded at once (further
//! clients wait in the listen backlog), so the forwarder never takes more
//! than that many of the session's processes (`RLIMIT_NPROC` counts
//! threads). Its failures are written to `diag` (the supervisor turns them
//! into stderr records of the exec's log) and never touch the agent. It
//! dies with the supervisor, which exits once the agent has.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::{fd::AsFd, unix::net::UnixStream},
    path::PathBuf,
    sync::{Arc, Condvar, Mutex},
    thread,
};

use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
};
use troupe_proto::agent::env as agent_env;

/// Most connections forwarded at once.
pub const MAX_CONNECTIONS: usize = 32;
/// Bytes buffered per direction of a connection.
const BUFFER: usize = 64 << 10;

/// Where diagnostics go: a line per event, dropped when it cannot be written.
pub type Diag = Arc<Mutex<dyn Write + Send>>;

/// The bound port and where its connections go.
pub struct ModelPort {
    listener: TcpListener,
    socket: PathBuf,
}

impl ModelPort {
    /// Binds `127.0.0.1:0` for an agent whose session endpoint is a Unix
    /// socket (`unix://PATH`). `Ok(None)` when it has none (an exec started
    /// by hand, or an endpoint over TCP, which a container without network
    /// could not reach anyway).
    pub fn bind(endpoint: Option<&str>) -> std::io::Result<Option<ModelPort>> {
        let Some(socket) = endpoint.and_then(|e| e.strip_prefix("unix://")) else {
            return Ok(None);
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        Ok(Some(ModelPort {
            listener,
            socket: PathBuf::from(socket),
        }))
    }

    /// The variables the agent is given: the two base URLs, and, when the
    /// session has a token, the two API keys.
    pub fn vars(&self, token: Option<&str>) -> std::io::Result<Vec<(&'static str, String)>> {
        let base = format!("http://127.0.0.1:{}", self.listener.local_addr()?.port());
        let mut vars = vec![
            (agent_env::OPENAI_BASE_URL, format!("{base}/v1")),
            (agent_env::ANTHROPIC_BASE_URL, base),
        ];
        if let Some(token) = token {
            vars.push((agent_env::ANTHROPIC_API_KEY, token.to_owned()));
            vars.push((agent_env::OPENAI_API_KEY, token.to_owned()));
        }
        Ok(vars)
    }

    /// Accepts and forwards connections until the process exits.
    pub fn serve(self, diag: Diag) {
        let slots = Arc::new((Mutex::new(0usize), Condvar::new()));
        let mut failed_connects = 0u64;
        let mut strangers = 0u64;
        let own_uid = nix::unistd::getuid().as_raw();
        let ours = self.listener.local_addr();
        loop {
            {
                let (count, freed) = &*slots;
                let mut count = count.lock().expect("poisoned");
                while *count >= MAX_CONNECTIONS {
                    count = freed.wait(count).expect("poisoned");
                }
                *count += 1;
            }
            let release = Slot(slots.clone());
            let client = match self.listener.accept() {
                Ok((client, peer)) => {
                    let uid = match (peer, &ours) {
                        (SocketAddr::V4(peer), Ok(SocketAddr::V4(ours))) => peer_uid(peer, *ours),
                        _ => None,
                    };
                    if uid != Some(own_uid) {
                        strangers += 1;
                        if strangers.is_power_of_two() {
                            let who =
                                uid.map_or("an unknown uid".to_owned(), |u| format!("uid {u}"));
                            say(
                                &diag,
                                &format!(
                                    "model port: closed a connection of {who}, not this agent's ({strangers} so far)"
                                ),
                            );
                        }
                        continue;
                    }
                    client
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    say(&diag, &format!("model port: cannot accept: {e}"));
                    // A persistent failure (descriptors exhausted): do not spin.
                    thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
            };
            let server = match UnixStream::connect(&self.socket) {
                Ok(server) => server,
                Err(e) => {
                    failed_connects += 1;
                    // The first failure, then the 2nd, 4th, 8th...: a gateway
                    // that stays away does not fill the log.
                    if failed_connects.is_power_of_two() {
                        say(
                            &diag,
                            &format!(
                                "model port: cannot reach {} ({failed_connects} failed so far): {e}",
                                self.socket.display()
                            ),
                        );
                    }
                    continue;
                }
            };
            let thread_diag = diag.clone();
            let spawned = thread::Builder::new().spawn(move || {
                let _release = release;
                if let Err(e) = splice(client, server) {
                    // A peer going away mid-stream is ordinary; other errors are said.
                    if !matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) {
                        say(&thread_diag, &format!("model port: connection failed: {e}"));
                    }
                }
            });
            if let Err(e) = spawned {
                // The session's process limit is reached: this connection
                // is dropped (closed by the failed closure), the agent runs on.
                say(
                    &diag,
                    &format!("model port: no thread for a connection: {e}"),
                );
            }
        }
    }
}

/// The uid of the process that owns the loopback socket `peer`, connected
/// to `ours`: its line of `/proc/net/tcp` (this network namespace's IPv4
/// sockets, readable by every uid). `None` when it is not there.
fn peer_uid(peer: SocketAddrV4, ours: SocketAddrV4) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    owner_in(&table, peer, ours)
}

/// The `uid` column of the line of `table` whose local address is `peer`
/// and remote address `ours` (addresses as the kernel prints them: the
/// IPv4 address as a native-endian hex word, the port in hex).
fn owner_in(table: &str, peer: SocketAddrV4, ours: SocketAddrV4) -> Option<u32> {
    let hex = |a: SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        )
    };
    let (local, remote) = (hex(peer), hex(ours));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 7 && fields[1] == local && fields[2] == remote)
            .then(|| fields[7].parse().ok())
            .flatten()
    })
}

/// A taken connection slot, given back when dropped.
struct Slot(Arc<(Mutex<usize>, Condvar)>);

impl Drop for Slot {
    fn drop(&mut self) {
        let (count, freed) = &*self.0;
        *count.lock().expect("poisoned") -= 1;
        freed.notify_one();
    }
}

fn say(diag: &Diag, line: &str) {
    if let Ok(mut out) = diag.lock() {
        let _ = out.write_all(format!("troupe-supervisor: {line}\n").as_bytes());
    }
}

/// One direction of a connection: what was read and is not yet written.
struct Half {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The source said end of file.
    eof: bool,
    /// The end of file was passed on (the destination's write side shut).
    done: bool,
}

impl Half {
    fn new() -> Half {
        Half {
            buf: vec![0; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            done: false,
        }
    }

    fn wants_read(&self) -> bool {
        !self.eof && self.end < self.buf.len()
    }

    fn wants_write(&self) -> bool {
        self.start < self.end
    }

    /// Reads and writes what it can without blocking.
    fn step(&mut self, from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
        if self.wants_read() {
            match from.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if would_wait(&e) => {}
                Err(e) => return Err(e),
            }
        }
        while self.wants_write() {
            match to.write(&self.buf[self.start..self.end]) {
                Ok(n) => self.start += n,
                Err(e) if would_wait(&e) => break,
                Err(e) => return Err(e),
            }
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(())
    }
}

fn would_wait(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// Copies both ways until both directions have ended (each end of file is
/// passed on as a shutdown of the other side's writing) or a side fails.
fn splice(mut client: TcpStream, mut server: UnixStream) -> std::io::Result<()> {
    client.set_nonblocking(true)?;
    server.set_nonblocking(true)?;
    let _ = client.set_nodelay(true);
    let (mut up, mut down) = (Half::new(), Half::new());
    while !(up.done && down.done) {
        up.step(&mut client, &mut server)?;
        down.step(&mut server, &mut client)?;
        if up.eof && !up.wants_write() && !up.done {
            let _ = server.shutdown(std::net::Shutdown::Write);
            up.done = true;
        }
        if down.eof && !down.wants_write() && !down.done {
            let _ = client.shutdown(std::net::Shutdown::Write);
            down.done = true;
        }
        if up.done && down.done {
            break;
        }
        let flags = |read: bool, write: bool| {
            let mut f = PollFlags::empty();
            if read {
                f |= PollFlags::POLLIN;
            }
            if write {
                f |= PollFlags::POLLOUT;
            }
            f
        };
        let client_flags = flags(up.wants_read(), down.wants_write());
        let server_flags = flags(down.wants_read(), up.wants_write());
        // A side with nothing to wait for is left out: its hang-up alone
        // must not wake this loop for nothing.
        let mut fds = Vec::with_capacity(2);
        if !client_flags.is_empty() {
            fds.push(PollFd::new(client.as_fd(), client_flags));
        }
        if !server_flags.is_empty() {
            fds.push(PollFd::new(server.as_fd(), server_flags));
        }
        if fds.is_empty() {
            // Both buffers full and nothing writable cannot happen; be safe.
            break;
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn sink() -> Diag {
        Arc::new(Mutex::new(Vec::<u8>::new()))
    }

    #[test]
    fn a_peers_uid_is_read_from_its_line_of_the_table() {
        // Lines as the kernel writes them (on a little-endian host).
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:A411 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001        0 111 1\n\
            1: 0100007F:D431 0100007F:A411 01 00000000:00000000 00:00000000 00000000 10002        0 222 1\n\
            2: 0100007F:A411 0100007F:D431 01 00000000:00000000 00:00000000 00000000 10001        0 333 1\n";
        let ours = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0xA411);
        let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0xD431);
        if cfg!(target_endian = "little") {
            assert_eq!(owner_in(table, peer, ours), Some(10002));
        }
        let other = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0xD432);
        assert_eq!(owner_in(table, other, ours), None);
        // A real connection of this process's own uid.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (SocketAddr::V4(peer), SocketAddr::V4(ours)) =
            (client.local_addr().unwrap(), listener.local_addr().unwrap())
        else {
            unreachable!()
        };
        assert_eq!(peer_uid(peer, ours), Some(nix::unistd::getuid().as_raw()));
    }

    #[test]
    fn no_port_without_a_unix_endpoint() {
        assert!(ModelPort::bind(None).unwrap().is_none());
        assert!(
            ModelPort::bind(Some("http://127.0.0.1:1"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_vars_name_the_port_and_the_token() {
        let port = ModelPort::bind(Some("unix:///nowhere.sock"))
            .unwrap()
            .unwrap();
        let n = port.listener.local_addr().unwrap().port();
        let vars = port.vars(Some("tok")).unwrap();
        assert_eq!(
            vars,
            [
                (
                    agent_env::OPENAI_BASE_URL,
                    format!("http://127.0.0.1:{n}/v1")
                ),
                (
                    agent_env::ANTHROPIC_BASE_URL,
                    format!("http://127.0.0.1:{n}")
                ),
                (agent_env::ANTHROPIC_API_KEY, "tok".to_owned()),
                (agent_env::OPENAI_API_KEY, "tok".to_owned()),
            ]
        );
        assert_eq!(port.vars(None).unwrap().len(), 2);
    }

    /// A large request and a large answer cross at once, each end of file
    /// passed on: the echo server answers only after reading to the end.
    #[test]
    fn bytes_cross_both_ways_with_half_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let server = UnixListener::bind(&path).unwrap();
        let port = ModelPort::bind(Some(&format!("unix://{}", path.display())))
            .unwrap()
            .unwrap();
        let addr = port.listener.local_addr().unwrap();
        thread::spawn(move || port.serve(sink()));
        thread::spawn(move || {
            for conn in server.incoming() {
                let mut conn = conn.unwrap();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    conn.read_to_end(&mut got).unwrap();
                    got.reverse();
                    conn.write_all(&got).unwrap();
                });
            }
        });
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let body = body.clone();
            clients.push(thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                // A lost end of file fails the test instead of hanging it.
                c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                    .unwrap();
                let mut writer = c.try_clone().unwrap();
                let w = thread::spawn(move || {
                    writer.write_all(&body).unwrap();
                    writer.shutdown(std::net::Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                c.read_to_end(&mut back).unwrap();
                w.join().unwrap();
                back
            }));
        }
        let mut expected = body;
        expected.reverse();
        for c in clients {
            assert!(c.join().unwrap() == expected);
        }
    }

    #[test]
    fn an_absent_socket_closes_the_connection_and_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let port = ModelPort::bind(Some(&format!(
            "unix://{}",
            dir.path().join("none.sock").display()
        )))
        .unwrap()
        .unwrap();
        let addr = port.listener.local_addr().unwrap();
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let diag: Diag = out.clone();
        thread::spawn(move || port.serve(diag));
        let mut c = TcpStream::connect(addr).unwrap();
        let mut rest = Vec::new();
        assert_eq!(c.read_to_end(&mut rest).unwrap(), 0);
        let said = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert!(
            said.contains("cannot reach") && said.contains("none.sock"),
            "{said}"
        );
    }
}
