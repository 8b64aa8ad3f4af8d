//! What clients see of a server that stops: its health watches, its
//! streams, a call that never finishes sending, and whether it still
//! accepts connections. Shared by the stop tests of both servers.

use std::{net::SocketAddr, time::Duration};

use futures::StreamExt;
use tonic::{Code, Status, codegen::http::uri::PathAndQuery, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse, health_check_response::ServingStatus,
    health_client::HealthClient,
};

/// How long a stopping server may take to tell a client anything.
const TELL: Duration = Duration::from_secs(5);

/// A health watch of `service` (`""`: the whole server), after its first
/// answer, which must be SERVING.
pub async fn health_watch(
    channel: Channel,
    service: &str,
) -> tonic::Streaming<HealthCheckResponse> {
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("health watch")
        .into_inner();
    let first = watch.message().await.expect("health").expect("a status");
    assert_eq!(first.status(), ServingStatus::Serving, "{service:?} serves");
    watch
}

/// Asserts that a health watch is told NOT_SERVING, then ends with
/// UNAVAILABLE and a message that says to resume.
pub async fn assert_told_not_serving(watch: &mut tonic::Streaming<HealthCheckResponse>) {
    let told = tokio::time::timeout(TELL, watch.message())
        .await
        .expect("a status before the stream ends")
        .expect("NOT_SERVING comes before the end")
        .expect("a status");
    assert_eq!(told.status(), ServingStatus::NotServing);
    let ended = tokio::time::timeout(TELL, watch.message())
        .await
        .expect("the health watch ends");
    assert_resume(ended.map(|m| m.map(|_| ())));
}

/// Asserts that a stream's next item is the end a stop gives: UNAVAILABLE
/// with a message that says to resume.
pub fn assert_resume(next: Result<Option<()>, Status>) {
    match next {
        Err(status) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(
                status.message().contains("resume"),
                "the end says to resume: {status:?}"
            );
        }
        Ok(item) => panic!("the stream should end with UNAVAILABLE, got {item:?}"),
    }
}

/// Starts a call to `path` that sends its headers and never its message,
/// as a stalled or hostile client would: the server cannot finish it.
/// The call is held until the returned task is dropped or aborted.
pub fn stalled_call(channel: Channel, path: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        let never = futures::stream::pending::<()>();
        let _ = grpc
            .client_streaming::<_, (), (), _>(
                tonic::Request::new(never),
                PathAndQuery::from_static(path),
                EmptyCodec,
            )
            .await;
    })
}

/// Waits until `addr` refuses new connections (the server stopped
/// accepting), within a few seconds.
pub async fn assert_stops_accepting(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + TELL;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr} still accepts connections"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next item of `stream`, which must come within a few seconds.
pub async fn next_soon<T>(stream: &mut (impl futures::Stream<Item = T> + Unpin)) -> Option<T> {
    tokio::time::timeout(TELL, stream.next())
        .await
        .expect("the stream goes on or ends within a few seconds")
}

/// A codec for a call whose message is never sent and whose answer is
/// never read.
#[derive(Default)]
struct EmptyCodec;

impl tonic::codec::Codec for EmptyCodec {
    type Encode = ();
    type Decode = ();
    type Encoder = EmptyCodec;
    type Decoder = EmptyCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EmptyCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EmptyCodec
    }
}

impl tonic::codec::Encoder for EmptyCodec {
    type Item = ();
    type Error = Status;

    fn encode(&mut self, _: (), _: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        Ok(())
    }
}

impl tonic::codec::Decoder for EmptyCodec {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, _: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, Status> {
        Ok(Some(()))
    }
}
