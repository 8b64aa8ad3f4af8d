//! Signing in and out of the console, and its API's refusals of a call
//! without the cookie or the CSRF token.

use super::*;

/// A wrong token is refused; the operator token signs in, and is then
/// nowhere the page or a script can read it.
pub(super) async fn signs_in(browser: &Browser, base: &str, ws: &str) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/")).await?;
    browser
        .type_into("#token", "not-the-operator-token-0000")
        .await?;
    browser.click("#sign-in").await?;
    browser
        .until("the refusal", "return document.querySelector('#sign-in-error').textContent.includes('not the operator token')")
        .await?;
    browser.type_into("#token", OPERATOR_TOKEN).await?;
    browser.click("#sign-in").await?;
    browser.wait_for("#workspaces table, #workspaces p").await?;
    browser
        .until(
            "the workspace",
            &format!("return document.querySelector('[data-workspace-id=\"{ws}\"]')"),
        )
        .await?;
    // The token is nowhere the page or a script can read it.
    let url = browser.client.current_url().await?.to_string();
    ensure!(!url.contains(OPERATOR_TOKEN), "token in the URL {url}");
    let found = browser
        .js(&format!(
            "const t = '{OPERATOR_TOKEN}'; return [localStorage.length, sessionStorage.length, \
             document.documentElement.outerHTML.includes(t), document.cookie.includes('troupe_console'), \
             document.querySelector('#token') !== null]"
        ))
        .await?;
    ensure!(
        found == serde_json::json!([0, 0, false, false, false]),
        "token or cookie readable: {found}"
    );
    Ok(())
}

/// The console's API refuses a call without the cookie or the CSRF token,
/// serves it with both, and a stream resumes after its `Last-Event-ID`.
pub(super) async fn refused_without_cookie_or_csrf(base: &str, talker: &str) -> anyhow::Result<()> {
    let url = format!("{base}/api/sessions/{talker}/messages");
    let json = ("content-type", "application/json");
    let body = r#"{"message":"forged"}"#;
    let plain = http::send(Method::GET, &format!("{base}/api/workspaces"), &[], "").await;
    ensure!(
        plain.status == StatusCode::UNAUTHORIZED,
        "no cookie: {}",
        plain.status
    );
    let forged = http::send(
        Method::POST,
        &url,
        &[json, ("x-troupe-csrf", "guess")],
        body,
    )
    .await;
    ensure!(
        forged.status == StatusCode::UNAUTHORIZED,
        "no cookie: {}",
        forged.status
    );
    // A sign-in of our own: the cookie, and its CSRF token.
    let signed = http::send(
        Method::POST,
        &format!("{base}/api/sign-in"),
        &[json],
        &serde_json::json!({"token": OPERATOR_TOKEN}).to_string(),
    )
    .await;
    ensure!(
        signed.status == StatusCode::OK,
        "sign-in: {}",
        signed.status
    );
    let set_cookie = signed.headers["set-cookie"].to_str()?.to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        ensure!(
            set_cookie.contains(attribute),
            "cookie without {attribute}: {set_cookie}"
        );
    }
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    let csrf = signed.json()["csrf_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let cookie = ("cookie", cookie.as_str());
    for (what, headers) in [
        ("no CSRF token", vec![json, cookie]),
        (
            "a wrong CSRF token",
            vec![json, cookie, ("x-troupe-csrf", "wrong")],
        ),
        (
            "a form's content type",
            vec![
                ("content-type", "text/plain"),
                cookie,
                ("x-troupe-csrf", csrf.as_str()),
            ],
        ),
    ] {
        let answer = http::send(Method::POST, &url, &headers, body).await;
        ensure!(
            answer.status == StatusCode::FORBIDDEN,
            "{what}: {} {}",
            answer.status,
            answer.body
        );
    }
    // A stream resumes after the Last-Event-ID it is given.
    let events = format!("{base}/api/events?session={talker}");
    let first = http::first_event_ids(&events, &[cookie], 2).await;
    let resumed = http::first_event_ids(&events, &[cookie, ("last-event-id", &first[0])], 1).await;
    ensure!(
        resumed[..] == first[1..2],
        "resumed after {}: {resumed:?}, not {}",
        first[0],
        first[1]
    );
    let unsigned = http::send(Method::GET, &events, &[], "").await;
    ensure!(
        unsigned.status == StatusCode::UNAUTHORIZED,
        "events without a cookie: {}",
        unsigned.status
    );
    // The same request with the token is served: the refusals were the token's.
    let served = http::send(
        Method::POST,
        &url,
        &[json, cookie, ("x-troupe-csrf", csrf.as_str())],
        body,
    )
    .await;
    ensure!(
        served.status == StatusCode::OK,
        "with the token: {} {}",
        served.status,
        served.body
    );
    ensure!(
        served.headers["cache-control"] == "no-store",
        "API answers are not cached"
    );
    let page = http::send(Method::GET, &format!("{base}/"), &[], "").await;
    let csp = page.headers["content-security-policy"].to_str()?;
    ensure!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "CSP: {csp}"
    );
    Ok(())
}

/// Signing out ends the sign-in: the page asks for the token again.
pub(super) async fn signs_out(browser: &Browser, base: &str) -> anyhow::Result<()> {
    browser.click("#sign-out").await?;
    browser.wait_for("#sign-in-form").await?;
    browser.goto(&format!("{base}/#/")).await?;
    browser.wait_for("#sign-in-form").await?;
    Ok(())
}
