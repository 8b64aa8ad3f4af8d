//! Hostile clients of a listener: connections that stall half way through
//! a request head, or never say a word, and what the listener does to them
//! (closes them, at once past its caps, or after its timeouts).

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Opens `n` connections to `addr`, each sending `head` (half a request
/// head, or nothing) and then nothing more; the ones that connected.
pub async fn stall(addr: SocketAddr, n: usize, head: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let connected =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await;
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
