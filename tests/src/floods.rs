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
