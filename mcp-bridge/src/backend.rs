//! The session service, as the tools reach it: one channel per bridge,
//! opened on first use (so the bridge starts even while the service is
//! down, and says so per call), and every call made with the caller's token
//! as `authorization: Bearer <token>`.

use std::time::Duration;

use tokio::sync::Mutex;
use tonic::{Request, metadata::AsciiMetadataValue, transport::Channel};
use troupe_proto::session::session_service_client::SessionServiceClient;

use crate::failure::ToolFailure;

/// How long opening the channel may take before the call is answered with an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The session service's endpoint and, once opened, the channel to it.
/// A tonic channel reconnects by itself, so it is opened once.
pub struct Backend {
    endpoint: String,
    channel: Mutex<Option<Channel>>,
}

/// A client of the session service that sends one caller's token, and its
/// trace context if it has one.
pub struct Session {
    client: SessionServiceClient<Channel>,
    auth: AsciiMetadataValue,
    traceparent: Option<AsciiMetadataValue>,
}

impl Backend {
    /// A backend for `endpoint` (`http://...` or `unix:///...`); nothing is opened yet.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Backend {
            endpoint: endpoint.into(),
            channel: Mutex::new(None),
        }
    }

    /// The endpoint text, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Returns a client acting with `auth` (the whole `Bearer <token>`
    /// value), in the trace `traceparent` if given.
    pub async fn session(
        &self,
        auth: AsciiMetadataValue,
        traceparent: Option<AsciiMetadataValue>,
    ) -> Result<Session, ToolFailure> {
        let mut channel = self.channel.lock().await;
        let channel = match channel.as_ref() {
            Some(open) => open.clone(),
            None => {
                let opened = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    troupe_proto::endpoint::connect(&self.endpoint),
                )
                .await
                .map_err(|_| {
                    ToolFailure::unreachable(
                        &self.endpoint,
                        &format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                    )
                })?
                .map_err(|e| ToolFailure::unreachable(&self.endpoint, &format!("{e:#}")))?;
                *channel = Some(opened.clone());
                opened
            }
        };
        Ok(Session {
            client: SessionServiceClient::new(channel),
            auth,
            traceparent,
        })
    }
}

impl Session {
    /// Wraps `message` in a request carrying the caller's token and trace context.
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        metadata.insert("authorization", self.auth.clone());
        if let Some(traceparent) = &self.traceparent {
            metadata.insert(crate::caller::TRACEPARENT_HEADER, traceparent.clone());
        }
        request
    }

    /// The generated client; pass it requests made with [`Session::request`].
    pub fn client(&mut self) -> &mut SessionServiceClient<Channel> {
        &mut self.client
    }
}
