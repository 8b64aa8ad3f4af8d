//! The session service, as the tools reach it: one channel per endpoint
//! (several for replicas on one database), opened on first use (so the
//! bridge starts even while the service is down, and says so per call), and
//! every call made with the caller's token as `authorization: Bearer <token>`.
//! A call that cannot reach an endpoint goes on to the next
//! ([`troupe_proto::failover`]).

use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::{Request, Response, Status, metadata::AsciiMetadataValue, transport::Channel};
use troupe_proto::{
    failover::{self, Endpoints},
    session::session_service_client::SessionServiceClient,
};

use crate::failure::ToolFailure;

/// The generated client of one endpoint.
pub type Client = SessionServiceClient<Channel>;

/// The session service's endpoints and, once opened, their channels.
/// A tonic channel reconnects by itself, so each is opened once.
pub struct Backend {
    endpoint: String,
    endpoints: Mutex<Option<Arc<Endpoints<Client>>>>,
}

/// A client of the session service that sends one caller's token, and its
/// trace context if it has one.
pub struct Session {
    endpoints: Arc<Endpoints<Client>>,
    auth: AsciiMetadataValue,
    traceparent: Option<AsciiMetadataValue>,
}

impl Backend {
    /// A backend for `endpoint`: `http://...` or `unix:///...`, or several
    /// separated by commas; nothing is opened yet.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Backend {
            endpoint: endpoint.into(),
            endpoints: Mutex::new(None),
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
        let mut endpoints = self.endpoints.lock().await;
        let endpoints = match endpoints.as_ref() {
            Some(open) => open.clone(),
            None => {
                let list = failover::parse_list(&[&self.endpoint])
                    .map_err(|e| ToolFailure::unreachable(&self.endpoint, &e))?;
                let opened = Arc::new(
                    Endpoints::new(&list, SessionServiceClient::new)
                        .map_err(|e| ToolFailure::unreachable(&self.endpoint, &format!("{e:#}")))?,
                );
                *endpoints = Some(opened.clone());
                opened
            }
        };
        Ok(Session {
            endpoints,
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

    /// Calls `rpc` with `message` made into a request ([`Session::request`]),
    /// on the next endpoint while one cannot be reached. Only calls that are
    /// safe to repeat come here: reads, watches, terminations, and creates and
    /// sends with a request id.
    pub async fn call<M, R, F, Fut>(&self, message: &M, rpc: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Client, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        self.endpoints
            .call(message, |client, message| {
                rpc(client, self.request(message))
            })
            .await
    }

    /// Makes the next endpoint the first one tried, after a stream broke.
    pub fn move_on(&self) {
        self.endpoints.move_on();
    }
}
