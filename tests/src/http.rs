//! A plain HTTP/1.1 client for the model gateway's routes, as an agent's
//! SDK calls them: [`post`] reads the whole answer, [`post_stream`] the
//! answer's head and its body as it comes.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, body::Incoming};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// A whole answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Answer {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    client_from(None)
}

/// A client whose connections leave from `local` (any of 127.0.0.0/8 is
/// this host's: a test's stand-in for another client's address).
fn client_from(local: Option<std::net::IpAddr>) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(local);
    Client::builder(TokioExecutor::new()).build(connector)
}

fn request(url: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Request<Full<Bytes>> {
    let mut builder = Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request")
}

/// Posts `body` as JSON to `url` with `headers`; the whole answer, within
/// `limit` (panics past it: nothing may hang).
pub async fn post(
    url: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
    limit: Duration,
) -> Answer {
    let call = async {
        let response = client()
            .request(request(url, headers, body))
            .await
            .expect("the gateway answers");
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("a whole body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    };
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("POST {url} took more than {limit:?}"))
}

/// Posts `body` and returns the answer's status and its body unread.
pub async fn post_stream(
    url: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> (StatusCode, Incoming) {
    let response = client()
        .request(request(url, headers, body))
        .await
        .expect("the gateway answers");
    let (parts, body) = response.into_parts();
    (parts.status, body)
}

/// Reads the next piece of `body` (`None` at its end).
pub async fn next_chunk(body: &mut Incoming) -> Option<Bytes> {
    loop {
        let frame = body.frame().await?.ok()?;
        if let Ok(data) = frame.into_data() {
            return Some(data);
        }
    }
}

/// Sends `body` (as it is) to `url` with `method` and `headers`; the whole
/// answer, within `limit`. For routes other than the gateway's: the web
/// console's, whose requests carry cookies and any content type.
pub async fn send(
    method: hyper::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
    limit: Duration,
) -> Answer {
    send_from(None, method, url, headers, body, limit).await
}

/// [`send`], on a connection from the local address `local` (a loopback
/// address other than 127.0.0.1 stands for another client).
pub async fn send_from(
    local: Option<std::net::IpAddr>,
    method: hyper::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
    limit: Duration,
) -> Answer {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request");
    let call = async {
        let response = client_from(local)
            .request(request)
            .await
            .expect("the server answers");
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("a whole body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    };
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("{url} took more than {limit:?}"))
}

/// Waits until something accepts connections at `addr` (a server started
/// in the background binds its listeners as it starts), within a minute.
pub async fn wait_listening(addr: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
