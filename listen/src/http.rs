//! An axum app served behind a [`BoundedTcp`], with what `axum::serve`
//! leaves out: an HTTP/1 request's head must arrive within the gate's
//! header time (hyper's `header_read_timeout`), HTTP/2 connections are
//! pinged so that a dead peer is found. Each request carries the client's
//! address as axum's `ConnectInfo<SocketAddr>`. When `shutdown` completes,
//! the listener closes, open connections are asked to finish (HTTP/1 after
//! their request, HTTP/2 with GOAWAY), and the future returns once they
//! have.

use std::{net::SocketAddr, time::Duration};

use axum::{Router, extract::ConnectInfo};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto::Builder, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tower::ServiceExt;

use crate::accept::BoundedTcp;

/// How often an idle HTTP/2 connection is pinged.
pub const HTTP2_KEEPALIVE: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `shutdown`, then drains.
pub async fn serve(
    listener: BoundedTcp,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let header = listener.gate().bounds().header;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(HTTP2_KEEPALIVE));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, addr): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept_bounded() => accepted,
            () = &mut shutdown => break,
        };
        let service = app
            .clone()
            .map_request(move |request: hyper::Request<Incoming>| {
                let mut request = request.map(axum::body::Body::new);
                request.extensions_mut().insert(ConnectInfo(addr));
                request
            });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service))
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpListener, TcpStream},
    };

    use super::*;
    use crate::gate::{Bounds, Gate};

    #[tokio::test]
    async fn a_request_head_that_never_ends_is_cut_and_the_client_address_is_given() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new(
            "test",
            Bounds {
                header: Duration::from_millis(500),
                ..Bounds::default()
            },
        );
        let app = Router::new().route(
            "/",
            axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                peer.ip().to_string()
            }),
        );
        let stop = tokio_util_free_stop();
        let server = tokio::spawn(serve(BoundedTcp::new(listener, gate.clone()), app, stop.1));

        let mut whole = TcpStream::connect(addr).await.unwrap();
        whole
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        whole.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("127.0.0.1"), "{answer}");

        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest))
            .await
            .expect("the half-sent head is cut");
        assert!(started.elapsed() >= Duration::from_millis(400));
        let _ = stop.0.send(());
        server.await.unwrap().unwrap();
    }

    /// A stop signal without tokio-util: a oneshot whose receiving end is
    /// the shutdown future.
    fn tokio_util_free_stop() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Future<Output = ()> + Send,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (tx, async move {
            let _ = rx.await;
        })
    }
}
