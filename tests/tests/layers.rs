//! The session service's layers, as Cargo holds them: each crate's
//! `[dependencies]` may name only what its layer may use. Adding sqlx to
//! the service, or HTTP to the domain or the store, fails here.

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
    for krate in ["domain", "session-svc", "runner-svc", "mcp-bridge", "cli"] {
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

#[test]
fn the_domain_and_the_store_serve_no_http() {
    for krate in ["domain", "store"] {
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
