//! Calls made of hand-written wire bytes, for what a generated client
//! cannot send: a `string` field that is not UTF-8, a field of the wrong
//! wire type, a truncated message; and such requests for the services
//! every Troupe server serves besides its own.

use bytes::{Buf, BufMut};
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    transport::Channel,
};

/// Returns one length-delimited field (`string`, `bytes` or a message) with
/// any bytes as its value.
pub fn field(tag: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(value.len() as u64, &mut out);
    out.extend_from_slice(value);
    out
}

/// Calls the unary method at `path` (`/package.Service/Method`) with `body`
/// as the request's bytes and `authorization: Bearer <token>`; returns the
/// response's bytes.
pub async fn unary(
    channel: Channel,
    token: &str,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(body);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII token"),
    );
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    Ok(grpc.unary(request, path, Bytes).await?.into_inner())
}

/// What a streaming call answered: the messages, then how it ended.
#[derive(Debug)]
pub struct Streamed {
    pub messages: Vec<Vec<u8>>,
    pub end: Result<(), Status>,
}

/// Calls the method at `path` as a stream (which any method accepts on the
/// wire): sends each of `bodies`, closes its side, and reads every answer.
pub async fn streaming(
    channel: Channel,
    token: &str,
    path: &'static str,
    bodies: Vec<Vec<u8>>,
) -> Streamed {
    let mut messages = Vec::new();
    let end = async {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(futures::stream::iter(bodies));
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII token"),
        );
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        let mut answers = grpc.streaming(request, path, Bytes).await?.into_inner();
        while let Some(answer) = answers.message().await? {
            messages.push(answer);
        }
        Ok(())
    }
    .await;
    Streamed { messages, end }
}

/// A `string` that is not UTF-8.
pub const NOT_UTF8: &[u8] = b"\xff\xfe\xc3";

/// The methods every Troupe server serves besides its own: gRPC health and
/// server reflection, v1 and v1alpha.
pub const STANDARD_METHODS: [&str; 4] = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Requests none of [`STANDARD_METHODS`] can decode, with what the refusal
/// says of each: a `string` that is not UTF-8 (field 1 is a string in each
/// request: the service of a health check, the host of a reflection
/// request), a truncated message, a field of the wrong wire type.
pub fn standard_bad_requests() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut truncated = field(1, b"troupe");
    truncated.pop();
    let mut requests = Vec::new();
    for path in STANDARD_METHODS {
        requests.push((path, field(1, NOT_UTF8), "UTF-8"));
        requests.push((path, truncated.clone(), "buffer underflow"));
        requests.push((path, vec![0x08, 0x01], "wire type"));
    }
    requests
}

/// Bytes in, bytes out.
#[derive(Clone, Copy, Default)]
struct Bytes;

impl Codec for Bytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Bytes;
    type Decoder = Bytes;

    fn encoder(&mut self) -> Bytes {
        Bytes
    }

    fn decoder(&mut self) -> Bytes {
        Bytes
    }
}

impl Encoder for Bytes {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Bytes {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}
