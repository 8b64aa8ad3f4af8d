//! The headers an agent sends: only an allowlist of them reaches the
//! provider, with the betas and the organisation the operator set.

use super::*;

/// The scripted provider allowing one beta, and the OpenAI one carrying
/// the operator's organisation and project.
fn with_provider_headers(text: String) -> String {
    text.replace(
        "    kind: anthropic\n",
        "    kind: anthropic\n    allowed_betas: [allowed-beta-1]\n",
    )
    .replace(
        "    kind: openai\n",
        "    kind: openai\n    organization: org-operator\n    project: proj-operator\n",
    )
}

/// Headers an agent may send that a provider must never see from it.
const HOSTILE_HEADERS: [(&str, &str); 12] = [
    ("anthropic-version", "2023-06-01"),
    (
        "anthropic-beta",
        "allowed-beta-1, mcp-client-2025-04-04,files-api-2025-04-14",
    ),
    ("openai-organization", "org-agent"),
    ("openai-project", "proj-agent"),
    ("x-forwarded-host", "evil.example"),
    ("x-forwarded-for", "10.9.9.9"),
    ("forwarded", "for=10.9.9.9;host=evil.example"),
    ("x-real-ip", "10.9.9.9"),
    ("cookie", "session=agent"),
    ("x-stainless-helper", "agent"),
    ("idempotency-key", "agent-chosen"),
    ("user-agent", "agent/1.0"),
];

/// Calls `/v1/messages` and `/v1/chat/completions` with every hostile
/// header, and returns the two requests the upstream got.
async fn hostile_calls(setup: &Setup) -> Vec<troupe_tests::upstream::Recorded> {
    let (_, token) = setup.root("alpha", None).await;
    let bearer = format!("Bearer {token}");
    let mut headers = vec![
        ("x-api-key", token.as_str()),
        ("accept", "application/json"),
    ];
    headers.extend(HOSTILE_HEADERS);
    let answer = http::post(
        &setup.url("/v1/messages?beta=true&x-api-key=agent"),
        &headers,
        &request(MODEL, false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let mut headers = vec![
        ("authorization", bearer.as_str()),
        ("accept", "application/json"),
    ];
    headers.extend(HOSTILE_HEADERS);
    let answer = http::post(
        &setup.url("/v1/chat/completions?api-version=1"),
        &headers,
        &chat(false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2);
    seen
}

fn names(seen: &troupe_tests::upstream::Recorded) -> Vec<&str> {
    let mut names: Vec<&str> = seen.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    names
}

/// Only an allowlist of the agent's headers goes upstream: `accept`, and
/// to Anthropic its API version; no forwarding, proxy or cookie header, no
/// beta the operator did not allow, no OpenAI organisation or project of
/// the agent's; and no query but Anthropic's `beta=true`.
#[tokio::test]
async fn only_allowlisted_request_headers_reach_the_provider() {
    let setup = Setup::new(vec![Turn::text("one"), Turn::text("two")]).await;
    let seen = hostile_calls(&setup).await;
    assert_eq!(seen[0].uri, "/v1/messages?beta=true");
    assert_eq!(
        names(&seen[0]),
        [
            "accept",
            "anthropic-version",
            "content-length",
            "content-type",
            "host",
            "x-api-key"
        ],
        "{:?}",
        seen[0].headers
    );
    assert_eq!(seen[0].api_key(), Some(KEY));
    assert_eq!(seen[1].uri, "/v1/chat/completions");
    assert_eq!(
        names(&seen[1]),
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host"
        ],
        "{:?}",
        seen[1].headers
    );
    assert_eq!(seen[1].api_key(), Some(KEY));
}

/// The betas a provider's `allowed_betas` lists are sent on, the agent's
/// others dropped; an OpenAI provider's `organization` and `project` are
/// the operator's, whatever the agent sent.
#[tokio::test]
async fn allowed_betas_and_the_operators_organisation_are_sent() {
    let setup = Setup::edited(
        vec![Turn::text("one"), Turn::text("two")],
        with_provider_headers,
    )
    .await;
    let seen = hostile_calls(&setup).await;
    assert_eq!(seen[0].header("anthropic-beta"), Some("allowed-beta-1"));
    assert_eq!(
        names(&seen[0]),
        [
            "accept",
            "anthropic-beta",
            "anthropic-version",
            "content-length",
            "content-type",
            "host",
            "x-api-key"
        ],
    );
    assert_eq!(seen[1].header("openai-organization"), Some("org-operator"));
    assert_eq!(seen[1].header("openai-project"), Some("proj-operator"));
    assert_eq!(
        names(&seen[1]),
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host",
            "openai-organization",
            "openai-project"
        ],
    );
}
