//! Connecting to a Troupe service by its endpoint text: `http://host:port`
//! or `unix:///path/to.sock` (how agents in workspace containers reach the
//! session service, with no network), and [`Bearer`], which carries the
//! caller's token on every call.

use std::time::Duration;

use anyhow::Context;
use hyper_util::rt::TokioIo;
use tonic::{
    Request, Status,
    metadata::AsciiMetadataValue,
    service::Interceptor,
    transport::{Channel, Endpoint, Uri},
};

/// Adds `authorization: Bearer <token>` to every call, or nothing (anonymous).
#[derive(Clone, Debug)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    /// Carries `token`, or nothing; fails if the token cannot be a header.
    pub fn new(token: Option<&str>) -> anyhow::Result<Self> {
        token
            .map(|t| format!("Bearer {t}").parse())
            .transpose()
            .context("the token contains characters not allowed in a header")
            .map(Bearer)
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// HTTP/2 flow-control windows a client grants, and the largest frame it
/// takes: a page of a thousand sessions (~140 KiB) arrives in one frame,
/// without waiting for the window updates the 64 KiB default would need.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 8 << 20;
pub const MAX_FRAME: u32 = 256 << 10;

/// Sets what every Troupe client connection uses: no Nagle delay on small
/// frames, and windows large enough for a big page.
fn tuned(endpoint: Endpoint) -> Endpoint {
    endpoint
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
}

/// A channel to `endpoint` that connects on first use, and reconnects:
/// for a service that may start after its caller.
pub fn connect_lazy(endpoint: &str) -> anyhow::Result<Channel> {
    lazy(endpoint, None)
}

/// As [`connect_lazy`], but a connection attempt that takes longer than
/// `timeout` fails (UNAVAILABLE): for a client that has other endpoints to try.
pub fn connect_lazy_within(endpoint: &str, timeout: Duration) -> anyhow::Result<Channel> {
    lazy(endpoint, Some(timeout))
}

fn lazy(endpoint: &str, timeout: Option<Duration>) -> anyhow::Result<Channel> {
    let within = |e: Endpoint| match timeout {
        Some(timeout) => e.connect_timeout(timeout),
        None => e,
    };
    if let Some(path) = endpoint.strip_prefix("unix://") {
        anyhow::ensure!(
            path.starts_with('/'),
            "unix endpoint {endpoint:?} needs an absolute path"
        );
        let path = path.to_owned();
        return Ok(within(tuned(Endpoint::try_from("http://troupe.invalid")?))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            })));
    }
    anyhow::ensure!(
        endpoint.starts_with("http://") || endpoint.starts_with("https://"),
        "endpoint {endpoint:?} must start with http://, https:// or unix://"
    );
    Ok(within(tuned(Endpoint::from_shared(endpoint.to_owned())?)).connect_lazy())
}

/// Opens a channel to `endpoint`.
pub async fn connect(endpoint: &str) -> anyhow::Result<Channel> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        anyhow::ensure!(
            path.starts_with('/'),
            "unix endpoint {endpoint:?} needs an absolute path"
        );
        let path = path.to_owned();
        // The URI is a placeholder: the connector below ignores it.
        let channel = tuned(Endpoint::try_from("http://troupe.invalid")?)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {endpoint}: {e}"))?;
        return Ok(channel);
    }
    anyhow::ensure!(
        endpoint.starts_with("http://") || endpoint.starts_with("https://"),
        "endpoint {endpoint:?} must start with http://, https:// or unix://"
    );
    tuned(Endpoint::from_shared(endpoint.to_owned())?)
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {endpoint}: {e}"))
}
