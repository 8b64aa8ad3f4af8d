//! A connection bounded in time: closed (its reads and writes fail with
//! `TimedOut`) once no byte has moved either way for its idle time. A
//! client that stalls in the middle of a request, or a reader that stops
//! reading, so frees its place; a long answer that keeps flowing, or an
//! HTTP/2 connection whose keepalive pings are answered, does not time out.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

use crate::gate::Permit;

/// An accepted connection holding its place at its listener.
pub struct Guarded<T> {
    io: T,
    permit: Permit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    timed_out: bool,
}

impl<T> Guarded<T> {
    pub fn new(io: T, permit: Permit) -> Guarded<T> {
        let idle = permit.gate().bounds().idle;
        Guarded {
            io,
            permit,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            timed_out: false,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    fn moved(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// Whether the idle time has passed (then the connection is done).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.timed_out {
            return true;
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.timed_out = true;
            self.permit.gate().timed_out();
            return true;
        }
        false
    }
}

impl<T> Guarded<T> {
    /// What a write gave: bytes moved restart the idle time; a write that
    /// waits past it fails.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no byte moved for the idle time")
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(Err(timed_out()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(Err(timed_out()));
        }
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(Err(timed_out()));
        }
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::gate::{Bounds, Gate, Peer};

    #[tokio::test]
    async fn a_silent_connection_times_out_and_a_flowing_one_does_not() {
        let idle = Duration::from_millis(400);
        let gate = Gate::new(
            "test",
            Bounds {
                idle,
                ..Bounds::default()
            },
        );
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(ours, gate.admit(Peer::Uid(1)).unwrap());
        // A byte every 200 ms keeps it open well past its idle time.
        let started = std::time::Instant::now();
        let mut buf = [0u8; 8];
        for _ in 0..5 {
            tokio::time::sleep(idle / 2).await;
            theirs.write_all(b"x").await.unwrap();
            assert_eq!(guarded.read(&mut buf).await.unwrap(), 1);
        }
        assert!(started.elapsed() > idle * 2);
        // Then nothing: the read fails once the idle time has passed, and
        // the place is freed when the connection is dropped.
        let silent = std::time::Instant::now();
        let err = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(silent.elapsed() >= idle, "{:?}", silent.elapsed());
        assert_eq!(gate.open(), 1);
        drop(guarded);
        assert_eq!(gate.open(), 0);
    }
}
