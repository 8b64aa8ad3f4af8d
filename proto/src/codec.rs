//! The codec of every Troupe service and client, and of the gRPC health and
//! server reflection services Troupe's servers serve: tonic-prost's, except that
//! a request the server cannot decode (a `string` field that is not UTF-8,
//! bad wire data) is the caller's fault and answered `INVALID_ARGUMENT`,
//! with `ErrorInfo` reason `INVALID_ARGUMENT`, rather than tonic-prost's
//! `INTERNAL`. A response the client cannot decode stays `INTERNAL`: the
//! server sent it. Which messages are requests is known from the services'
//! descriptors: `build.rs` implements [`Decoded`] for every method's input
//! and output type.

use std::{collections::HashMap, marker::PhantomData};

use prost::Message;
use tonic::{
    Code, Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};
use tonic_types::{ErrorDetails, StatusExt};

/// Who sends a message of an RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// The caller: the message is a method's input.
    Caller,
    /// The server: the message is a method's output.
    Server,
}

/// A message one side of an RPC decodes; says which side sent it.
pub trait Decoded {
    const SENDER: Sender;
}

include!(concat!(env!("OUT_DIR"), "/decoded.rs"));

/// The codec the generated services and clients use (`codec_path`).
#[derive(Debug, Clone)]
pub struct TroupeCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for TroupeCodec<T, U> {
    fn default() -> Self {
        TroupeCodec(PhantomData)
    }
}

impl<T, U> Codec for TroupeCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Decoded + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = TroupeDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        TroupeDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// tonic-prost's decoder, with [`decode_failure`]'s codes.
#[derive(Debug, Clone)]
pub struct TroupeDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + Decoded> Decoder for TroupeDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(decode_failure::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// A failed decode of a `U`: `INVALID_ARGUMENT` when the caller sent it.
pub fn decode_failure<U: Decoded>(status: Status) -> Status {
    match U::SENDER {
        Sender::Server => status,
        Sender::Caller => {
            let message = format!("the request is not a valid message: {}", status.message());
            tracing::debug!(error = %status.message(), "undecodable request");
            Status::with_error_details(
                Code::InvalidArgument,
                message,
                ErrorDetails::with_error_info(
                    "INVALID_ARGUMENT",
                    crate::ERROR_DOMAIN,
                    HashMap::<String, String>::new(),
                ),
            )
        }
    }
}
