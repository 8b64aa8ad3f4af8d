//! Hostile clients of a listener: connections that stall half way through
//! a request head, or never say a word, and what the listener does to them
//! (closes them, at once past its caps, or after its timeouts).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
};

/// A loopback address of its own for a flood (all of 127/8 is loopback on
/// Linux): the test's other connections, from 127.0.0.1, count against no
/// cap of the flood's address, nor it against theirs.
pub const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Opens `n` connections to `addr`, each sending `head` (half a request
/// head, or nothing) and then nothing more; the ones that connected.
pub async fn stall(addr: SocketAddr, n: usize, head: &[u8]) -> Vec<TcpStream> {
    stall_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr, n, head).await
}

/// As [`stall`], from the local address `from`.
pub async fn stall_from(from: IpAddr, addr: SocketAddr, n: usize, head: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let connect = async {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(from, 0))?;
            socket.connect(addr).await
        };
        let connected = tokio::time::timeout(Duration::from_secs(2), connect).await;
        if let Ok(Ok(mut stream)) = connected {
            if !head.is_empty() {
                let _ = stream.write_all(head).await;
            }
            held.push(stream);
        }
    }
    held
}

/// Whether the listener closes `stream` within `within` (an end of stream
/// or a reset; whatever it wrote first is read and dropped).
pub async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, closed).await.is_ok()
}

/// Plays one address against a listener that admits `per_peer` connections
/// per address and cuts a stalled one after `timeout`: the cap's worth of
/// connections from [`FLOODER`], each sending `head`, are admitted and
/// held; one more is closed at once, unread; the held ones stay open until
/// their timeout and are cut within a few seconds of it. Panics, saying
/// which, if any of that fails.
pub async fn capped_then_cut(addr: SocketAddr, per_peer: usize, head: &[u8], timeout: Duration) {
    let mut held = stall_from(FLOODER, addr, per_peer, head).await;
    assert_eq!(held.len(), per_peer, "the cap's worth connect");
    let mut past = stall_from(FLOODER, addr, 1, head).await;
    assert!(
        closed_within(&mut past[0], Duration::from_secs(2)).await,
        "a connection past the per-peer cap is closed at once"
    );
    assert!(
        !closed_within(&mut held[0], Duration::from_millis(300)).await,
        "the admitted ones wait for their timeout"
    );
    for (n, stream) in held.iter_mut().enumerate() {
        assert!(
            closed_within(stream, timeout + Duration::from_secs(5)).await,
            "held connection {n} is cut after the timeout"
        );
    }
}
