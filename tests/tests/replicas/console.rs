//! The web console's sign-ins live in the database: a sign-in made on one
//! replica is honoured by another (the cookie and its CSRF token), and a
//! sign-out on either ends it on both.

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;
use troupe_tests::{OPERATOR_TOKEN, TestServer, http, ports::free_addr, postgres::Backend};

const LIMIT: Duration = Duration::from_secs(10);
const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn a_console_sign_in_on_one_replica_holds_on_another() {
    let (first_addr, second_addr) = (free_addr(), free_addr());
    let first = TestServer::start_on(Backend::Postgres, |c| {
        c.console.console_listen = Some(first_addr)
    })
    .await;
    let second = first
        .replica_with(|c| c.console.console_listen = Some(second_addr))
        .await;
    http::wait_listening(first_addr).await;
    http::wait_listening(second_addr).await;
    let signed = http::send(
        Method::POST,
        &format!("http://{first_addr}/api/sign-in"),
        &[JSON],
        &json!({ "token": OPERATOR_TOKEN }).to_string(),
        LIMIT,
    )
    .await;
    assert_eq!(signed.status, StatusCode::OK, "{}", signed.body);
    let cookie = signed.headers["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let csrf = signed.json()["csrf_token"].as_str().unwrap().to_owned();
    let cookie = ("cookie", cookie.as_str());

    let on_second = http::send(
        Method::GET,
        &format!("http://{second_addr}/api/session"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(on_second.status, StatusCode::OK, "{}", on_second.body);
    assert_eq!(on_second.json()["csrf_token"], csrf.as_str());
    let out = http::send(
        Method::POST,
        &format!("http://{second_addr}/api/sign-out"),
        &[JSON, cookie, ("x-troupe-csrf", csrf.as_str())],
        "{}",
        LIMIT,
    )
    .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.body);
    let on_first = http::send(
        Method::GET,
        &format!("http://{first_addr}/api/session"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(
        on_first.status,
        StatusCode::UNAUTHORIZED,
        "signed out everywhere"
    );
    super::stop_all(vec![first, second]).await;
}
