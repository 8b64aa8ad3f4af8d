//! Loopback ports for servers a test starts on an address it chose first
//! (the console, a process's metrics, chromedriver).
//!
//! A port found free by binding `127.0.0.1:0` and letting go comes from the
//! kernel's ephemeral range, the same one every outgoing connection (a
//! PostgreSQL pool's, a client's) and every `:0` listener draws from: before
//! the test's server binds it, or while that server restarts, another socket
//! of the machine may take it, and the server fails to start. The ports here
//! lie below that range, where nothing is handed out unasked, and each is
//! given once per process.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener},
    sync::atomic::{AtomicU16, Ordering},
};

/// The lowest port handed out: above the well-known and most registered
/// services' ports.
const FIRST: u16 = 20_000;
/// Where the ephemeral range starts when the kernel does not say.
const EPHEMERAL_START: u16 = 32_768;

/// The next port to try, counted from a start that differs per process.
static NEXT: AtomicU16 = AtomicU16::new(0);

/// A loopback address that nothing listens on, outside the ephemeral range,
/// not handed out before by this process.
pub fn free_addr() -> SocketAddr {
    let end = ephemeral_start().max(FIRST + 1_000);
    let span = end - FIRST;
    let _ = NEXT.compare_exchange(
        0,
        (std::process::id() % u32::from(span)) as u16 + 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, FIRST + offset));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port between {FIRST} and {end}");
}

/// The first port of the kernel's ephemeral range (Linux's
/// `ip_local_port_range`).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_twice() {
        let first = free_addr();
        let second = free_addr();
        assert_ne!(first, second);
        for addr in [first, second] {
            assert!(addr.port() >= FIRST && addr.port() < ephemeral_start().max(FIRST + 1_000));
            TcpListener::bind(addr).expect("still free");
        }
    }
}
