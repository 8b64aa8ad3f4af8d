//! Plain HTTP/1.1 requests to the console, as a script or another site
//! would make them: any method, any headers, no cookie unless given; and
//! the first events of a stream.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, body::Bytes};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// Sends one request; panics if it takes over ten seconds.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> troupe_tests::http::Answer {
    troupe_tests::http::send(method, url, headers, body, Duration::from_secs(10)).await
}

/// Opens an event stream and returns the ids of its first `n` events (`id:`
/// lines: cursors), reading no further.
pub async fn first_event_ids(url: &str, headers: &[(&str, &str)], n: usize) -> Vec<String> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut request = Request::builder().method(Method::GET).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::new())).expect("a request");
    let read = async {
        let response = client.request(request).await.expect("the console answers");
        assert_eq!(response.status(), StatusCode::OK, "events of {url}");
        let mut body = response.into_body();
        let mut text = String::new();
        let mut ids = Vec::new();
        while ids.len() < n {
            let Some(frame) = body.frame().await else {
                break;
            };
            if let Ok(data) = frame.expect("a frame").into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
            ids = text
                .lines()
                .filter_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
                .map(|id| id.trim().to_owned())
                .collect();
        }
        ids.truncate(n);
        ids
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("{url} sent fewer than {n} events in ten seconds"))
}
