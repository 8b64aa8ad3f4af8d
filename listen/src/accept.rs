//! TCP and Unix listeners behind a [`Gate`]: each accepted connection is
//! admitted by its peer (a TCP client's address, a Unix client's uid) or
//! closed at once, unread. A failed accept (`EMFILE` when the process is out
//! of descriptors, above all) is counted, logged at most every few
//! seconds, and retried after [`BACKOFF`] instead of at once: a tight
//! retry loop would spin a core and fill the log while nothing frees.

use std::{io, net::SocketAddr, time::Duration};

use futures::Stream;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::{
    gate::{Gate, Peer},
    io::Guarded,
};

/// Wait after a failed accept.
pub const BACKOFF: Duration = Duration::from_millis(100);

/// Whether a failed accept concerns only the connection it would have
/// been (the client gave up first): then the next is accepted at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn failed(gate: &Gate, e: io::Error) {
    if is_connection_error(&e) {
        return;
    }
    gate.accept_failed(&e);
    tokio::time::sleep(BACKOFF).await;
}

/// A TCP listener behind a gate (peers by IP address).
pub struct BoundedTcp {
    listener: TcpListener,
    gate: Gate,
}

impl BoundedTcp {
    pub fn new(listener: TcpListener, gate: Gate) -> BoundedTcp {
        BoundedTcp { listener, gate }
    }

    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The next admitted connection (with `TCP_NODELAY`: small HTTP/2
    /// frames would otherwise wait out delayed ACKs).
    pub async fn accept_bounded(&self) -> (Guarded<TcpStream>, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => match self.gate.admit(Peer::Ip(addr.ip())) {
                    Ok(permit) => {
                        let _ = stream.set_nodelay(true);
                        return (Guarded::new(stream, permit), addr);
                    }
                    Err(_) => drop(stream),
                },
                Err(e) => failed(&self.gate, e).await,
            }
        }
    }

    /// The admitted connections, for tonic's `serve_with_incoming*`.
    pub fn incoming(self) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> + Send {
        futures::stream::unfold(self, |me| async move {
            let (io, _) = me.accept_bounded().await;
            Some((Ok(io), me))
        })
    }
}

impl axum::serve::Listener for BoundedTcp {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_bounded().await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A Unix socket listener behind a gate (peers by uid).
pub struct BoundedUnix {
    listener: UnixListener,
    gate: Gate,
}

impl BoundedUnix {
    pub fn new(listener: UnixListener, gate: Gate) -> BoundedUnix {
        BoundedUnix { listener, gate }
    }

    pub async fn accept_bounded(&self) -> Guarded<UnixStream> {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    let peer = stream
                        .peer_cred()
                        .map(|cred| Peer::Uid(cred.uid()))
                        .unwrap_or(Peer::Unknown);
                    match self.gate.admit(peer) {
                        Ok(permit) => return Guarded::new(stream, permit),
                        Err(_) => drop(stream),
                    }
                }
                Err(e) => failed(&self.gate, e).await,
            }
        }
    }

    /// The admitted connections, for tonic's `serve_with_incoming*`.
    pub fn incoming(self) -> impl Stream<Item = io::Result<Guarded<UnixStream>>> + Send {
        futures::stream::unfold(self, |me| async move {
            let io = me.accept_bounded().await;
            Some((Ok(io), me))
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::gate::Bounds;

    #[tokio::test]
    async fn a_connection_past_the_cap_is_closed_unread_and_the_next_gets_in_once_one_leaves() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new(
            "test",
            Bounds {
                max_connections: 2,
                max_per_peer: 2,
                ..Bounds::default()
            },
        );
        let bounded = std::sync::Arc::new(BoundedTcp::new(listener, gate.clone()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn({
            let bounded = bounded.clone();
            async move {
                loop {
                    let (io, _) = bounded.accept_bounded().await;
                    if tx.send(io).is_err() {
                        return;
                    }
                }
            }
        });
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let first = rx.recv().await.unwrap();
        let _second = rx.recv().await.unwrap();
        // The third is accepted by the kernel, then closed by the gate.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
            .await
            .expect("closed at once");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert_eq!(gate.open(), 2);
        drop(first);
        let _fourth = TcpStream::connect(addr).await.unwrap();
        let admitted = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("admitted once a place is free");
        assert!(admitted.is_some());
        server.abort();
    }
}
