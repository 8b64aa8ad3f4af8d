//! What every Troupe server serves besides its own service, and how its
//! binary learns to stop.
//!
//! Server reflection is tonic-reflection's, served by a server generated
//! with Troupe's codec ([`crate::grpc`]): requests are decoded by that
//! codec, so one that cannot be decoded is refused `INVALID_ARGUMENT` as on
//! every Troupe method, and the ones that can are passed on to
//! tonic-reflection's service, called in process, which answers them.
//! tonic-reflection implements its answers only behind its own server
//! (its service type cannot be built outside the crate), and would end a
//! stream whose request it could not decode with OK and no word.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};
use tonic_reflection::{
    pb::{v1, v1alpha},
    server::{v1 as tonic_v1, v1alpha as tonic_v1alpha},
};

use crate::grpc::reflection::{
    v1::server_reflection_server::{ServerReflection, ServerReflectionServer},
    v1alpha::server_reflection_server::{
        ServerReflection as ServerReflectionV1Alpha,
        ServerReflectionServer as ServerReflectionServerV1Alpha,
    },
};

/// Server reflection over Troupe's protocol and gRPC health: v1, and
/// v1alpha for older tools (grpcurl 1.8 speaks only v1alpha).
#[allow(clippy::type_complexity)]
pub fn reflection() -> anyhow::Result<(
    ServerReflectionServer<impl ServerReflection>,
    ServerReflectionServerV1Alpha<impl ServerReflectionV1Alpha>,
)> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok((
        ServerReflectionServer::new(Reflection { answers: v1 }),
        ServerReflectionServerV1Alpha::new(Reflection { answers: v1alpha }),
    ))
}

/// Server reflection answered by `answers`, tonic-reflection's server.
pub struct Reflection<S> {
    answers: S,
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl<S: tonic_v1::ServerReflection> ServerReflection
    for Reflection<tonic_v1::ServerReflectionServer<S>>
{
    type ServerReflectionInfoStream = Answers<v1::ServerReflectionResponse>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1::ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let (requests, refused) = until_refused(request.into_inner());
        let answers =
            v1::server_reflection_client::ServerReflectionClient::new(self.answers.clone())
                .server_reflection_info(requests)
                .await?
                .into_inner();
        Ok(Response::new(then_refusal(answers, refused)))
    }
}

#[tonic::async_trait]
impl<S: tonic_v1alpha::ServerReflection> ServerReflectionV1Alpha
    for Reflection<tonic_v1alpha::ServerReflectionServer<S>>
{
    type ServerReflectionInfoStream = Answers<v1alpha::ServerReflectionResponse>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1alpha::ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let (requests, refused) = until_refused(request.into_inner());
        let answers =
            v1alpha::server_reflection_client::ServerReflectionClient::new(self.answers.clone())
                .server_reflection_info(requests)
                .await?
                .into_inner();
        Ok(Response::new(then_refusal(answers, refused)))
    }
}

/// The requests of `requests` up to the first that could not be decoded,
/// whose refusal (the codec's `INVALID_ARGUMENT`) is then sent on the
/// returned channel; dropped unsent if there is none.
fn until_refused<Q: Send + 'static>(
    requests: Streaming<Q>,
) -> (
    impl Stream<Item = Q> + Send + 'static,
    oneshot::Receiver<Status>,
) {
    let (refuse, refused) = oneshot::channel();
    let requests = futures::stream::unfold((requests, refuse), |(mut requests, refuse)| async {
        match requests.next().await? {
            Ok(request) => Some((request, (requests, refuse))),
            Err(status) => {
                let _ = refuse.send(status);
                None
            }
        }
    });
    (requests.fuse(), refused)
}

/// `answers`, then the refusal that ended the requests, if one did. The
/// refusal is sent before the requests end, so after every answer to them;
/// the answering call drops the requests, and so the sender, when it ends.
fn then_refusal<A: Send + 'static>(
    answers: Streaming<A>,
    refused: oneshot::Receiver<Status>,
) -> Answers<A> {
    let refusal =
        futures::stream::once(refused).filter_map(|refused| async { refused.ok().map(Err) });
    Box::pin(answers.chain(refusal))
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
