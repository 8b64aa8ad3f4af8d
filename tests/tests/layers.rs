//! The session service's layers, as Cargo holds them: each crate's
//! `[dependencies]` may name only what its layer may use, and only the
//! layers below it. Adding sqlx to the service, HTTP to the domain, the
//! store or the handlers, a provider client outside the gateway, or an
//! arrow pointing up, fails here.

use std::path::Path;

/// The dependencies a crate's manifest lists under `[dependencies]`, with
/// whether each is optional.
fn dependencies(krate: &str) -> Vec<(String, bool)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line
            .split(['=', '.'])
            .next()
            .expect("a name")
            .trim()
            .to_owned();
        out.push((name, line.contains("optional = true")));
    }
    assert!(!out.is_empty(), "{krate} lists no dependencies");
    out
}

/// The required (not optional) dependencies of `krate` among `names`.
fn required_among(krate: &str, names: &[&str]) -> Vec<String> {
    dependencies(krate)
        .into_iter()
        .filter(|(name, optional)| !optional && names.contains(&name.as_str()))
        .map(|(name, _)| name)
        .collect()
}

const DATABASE: &[&str] = &["sqlx"];
const HTTP: &[&str] = &[
    "axum",
    "hyper",
    "hyper-util",
    "hyper-rustls",
    "rustls",
    "http-body-util",
];

#[test]
fn only_the_store_speaks_to_a_database() {
    assert_eq!(required_among("store", DATABASE), ["sqlx"]);
    for krate in [
        "domain",
        "service",
        "gateway",
        "console",
        "session-svc",
        "runner-svc",
        "mcp-bridge",
        "cli",
    ] {
        assert_eq!(
            required_among(krate, DATABASE),
            Vec::<String>::new(),
            "{krate} depends on a database crate"
        );
    }
    // The domain names sqlx only behind the feature the store enables, for
    // the one conversion of its errors.
    assert!(
        dependencies("domain").contains(&("sqlx".to_owned(), true)),
        "the domain's sqlx is optional"
    );
}

/// What reaches a model provider: an HTTP client and TLS.
const PROVIDER_CLIENT: &[&str] = &["hyper-util", "hyper-rustls", "rustls", "webpki-roots"];

/// The session service's crates, lowest layer first.
const SESSION_CRATES: &[&str] = &[
    "domain",
    "store",
    "service",
    "gateway",
    "console",
    "session-svc",
];

#[test]
fn the_domain_the_store_and_the_handlers_serve_no_http() {
    for krate in ["domain", "store", "service"] {
        assert_eq!(
            required_among(krate, HTTP),
            Vec::<String>::new(),
            "{krate} depends on an HTTP crate"
        );
    }
    assert_eq!(
        required_among("store", &["tonic"]),
        Vec::<String>::new(),
        "the store answers no RPC"
    );
}

#[test]
fn only_the_gateway_reaches_a_provider() {
    for &krate in SESSION_CRATES {
        let found = required_among(krate, PROVIDER_CLIENT);
        if krate == "gateway" {
            assert_eq!(found, PROVIDER_CLIENT, "the gateway's client");
        } else {
            assert_eq!(found, Vec::<String>::new(), "{krate} has a provider client");
        }
    }
    for &krate in SESSION_CRATES {
        let web = !required_among(krate, &["axum"]).is_empty();
        assert_eq!(
            web,
            krate == "gateway" || krate == "console",
            "{krate}: only the gateway and the console serve HTTP routes"
        );
    }
}

#[test]
fn the_layers_point_one_way() {
    let package = |krate: &str| match krate {
        "session-svc" => "troupe-session-svc".to_owned(),
        other => format!("troupe-{other}"),
    };
    // Each crate may use the crates before it, except the two HTTP faces,
    // which know nothing of each other.
    for (at, &krate) in SESSION_CRATES.iter().enumerate() {
        let deps: Vec<String> = dependencies(krate).into_iter().map(|(n, _)| n).collect();
        for &other in &SESSION_CRATES[at + 1..] {
            assert!(
                !deps.contains(&package(other)),
                "{krate} depends on {other}, a layer above it"
            );
        }
    }
    assert!(
        !dependencies("console").contains(&("troupe-gateway".to_owned(), false)),
        "the console depends on the gateway"
    );
}
