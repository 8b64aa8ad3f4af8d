//! The page, compiled into the binary (plain ES modules and a stylesheet:
//! no build step, nothing fetched at run time), and the headers every
//! answer of the console carries (the Content-Security-Policy first).
//!
//! Each module of `web/` says what it owns in its opening comment: `dom.js`
//! (every node by `createElement` and text), `api.js` (the CSRF token in
//! memory only), `live.js` (`EventSource`, each cursor applied once),
//! `ansi.js`, `output.js`, `tree.js` (a tree's snapshot page after page,
//! then events; only changed rows and lists redrawn), `session.js`,
//! `workspaces.js`, `app.js` (sign-in and routes).

use std::sync::Arc;

use axum::{
    Router,
    http::{HeaderName, HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};

use super::Console;
use troupe_store::Store;

/// No inline script or style, nothing from another origin, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; \
     form-action 'self'";

/// Each file the page is made of: its path, type and content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("web/index.html"),
    ),
    (
        "/style.css",
        "text/css; charset=utf-8",
        include_str!("web/style.css"),
    ),
    ("/app.js", JS, include_str!("web/app.js")),
    ("/api.js", JS, include_str!("web/api.js")),
    ("/dom.js", JS, include_str!("web/dom.js")),
    ("/ansi.js", JS, include_str!("web/ansi.js")),
    ("/live.js", JS, include_str!("web/live.js")),
    ("/output.js", JS, include_str!("web/output.js")),
    ("/tree.js", JS, include_str!("web/tree.js")),
    ("/session.js", JS, include_str!("web/session.js")),
    ("/workspaces.js", JS, include_str!("web/workspaces.js")),
];

const JS: &str = "text/javascript; charset=utf-8";

pub fn routes<S: Store>() -> Router<Arc<Console<S>>> {
    FILES
        .iter()
        .fold(Router::new(), |router, &(path, kind, body)| {
            router.route(
                path,
                get(move || async move {
                    (
                        [
                            (header::CONTENT_TYPE, kind),
                            (header::CACHE_CONTROL, "no-cache"),
                        ],
                        body,
                    )
                        .into_response()
                }),
            )
        })
}

/// Adds the security headers to every answer.
pub async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}
