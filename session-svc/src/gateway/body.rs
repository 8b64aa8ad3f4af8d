//! A request's body, read only once its token is known to be a live
//! session's ([`super::Gateway`] checks it from the headers first), and
//! never past [`MAX_REQUEST_BYTES`]: a `Content-Length` over it is refused
//! before a byte is read, a chunked body once it passes it. Either way
//! `413` in the API's shape.

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, header},
};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::shape::{ApiError, Kind};

/// Largest request body the gateway takes: the Messages API's own bound
/// (32 MB), a conversation that long is the provider's to refuse anyway.
pub const MAX_REQUEST_BYTES: usize = 32 << 20;

fn too_large() -> ApiError {
    ApiError::new(
        Kind::TooLarge,
        format!(
            "the request body is larger than the gateway takes ({} MiB)",
            MAX_REQUEST_BYTES >> 20
        ),
    )
}

/// Reads `body`, refusing it before reading when its `Content-Length` is
/// over the bound and as soon as what arrives is.
pub async fn read(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    if let Some(length) = headers.get(header::CONTENT_LENGTH) {
        let length = length
            .to_str()
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .ok_or_else(|| ApiError::new(Kind::Invalid, "content-length: not a number"))?;
        if length > MAX_REQUEST_BYTES as u64 {
            return Err(too_large());
        }
    }
    match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::new(
            Kind::Invalid,
            format!("the request body could not be read: {e}"),
        )),
    }
}
