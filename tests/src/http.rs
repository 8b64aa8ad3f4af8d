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

/// What a raw exchange read back: the status and the body, as text.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Sends a `POST` to `path` at `addr` by hand, with `headers` and a
/// `Content-Length` of `declared`, then only `sent` bytes of body (fewer,
/// to see whether the server answers without waiting for the rest), and
/// reads the answer within `limit` (panics past it: the server waited).
pub async fn post_declared(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    declared: u64,
    sent: usize,
    limit: Duration,
) -> RawAnswer {
    use tokio::io::AsyncWriteExt;
    let mut stream = open_declared(addr, path, headers, declared).await;
    // The server may answer and close before all is sent.
    let _ = stream.write_all(&vec![b' '; sent]).await;
    read_answer(stream, limit).await
}

/// Opens a connection to `addr` and sends the head of a `POST` to `path`
/// with `headers` and a `Content-Length` of `declared`, and no body: a
/// request the server holds open, waiting for it, until the connection is
/// dropped.
pub async fn open_declared(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    declared: u64,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("the head");
    stream
}

/// Sends a `POST` to `path` at `addr` with a chunked body of `total`
/// bytes (1 MiB chunks, stopping at the first write the server refuses),
/// and reads the answer within `limit`.
pub async fn post_chunked(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    total: usize,
    limit: Duration,
) -> RawAnswer {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("the head");
    let chunk = 1 << 20;
    let piece = [
        format!("{chunk:x}\r\n").into_bytes(),
        vec![b' '; chunk],
        b"\r\n".to_vec(),
    ]
    .concat();
    let mut sent = 0;
    while sent < total {
        let write = stream.write_all(&piece);
        match tokio::time::timeout(Duration::from_secs(5), write).await {
            Ok(Ok(())) => sent += chunk,
            // Refused, or no longer read: the server has answered.
            _ => break,
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    read_answer(stream, limit).await
}

/// Reads an HTTP/1.1 answer's head and its body (by its `content-length`,
/// or to the connection's end), within `limit` (panics past it).
pub async fn read_answer(mut stream: tokio::net::TcpStream, limit: Duration) -> RawAnswer {
    use tokio::io::AsyncReadExt;
    let read = async {
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if let Some(end) = all.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&all[..end]).into_owned();
                let length = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                });
                if length.is_some_and(|n| all.len() >= end + 4 + n) {
                    let body = &all[end + 4..end + 4 + length.unwrap_or(0)];
                    return (head, String::from_utf8_lossy(body).into_owned());
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
        let end = all
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an answer's head");
        let head = String::from_utf8_lossy(&all[..end]).into_owned();
        (head, String::from_utf8_lossy(&all[end + 4..]).into_owned())
    };
    let (head, body) = tokio::time::timeout(limit, read)
        .await
        .unwrap_or_else(|_| panic!("no answer within {limit:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    RawAnswer { status, head, body }
}
