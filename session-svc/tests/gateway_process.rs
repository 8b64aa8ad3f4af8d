//! The `troupe-session` binary's model gateway: a configuration it refuses
//! names the field and stops the start; a call is a `model_call` span under
//! the caller's life span with the GenAI attributes, counted in the model
//! metrics by workspace, agent and model; the provider's key is in no line
//! of the log, whatever the call met; a provider's certificate that does
//! not verify is logged with its cause.

use std::time::Duration;

use serde_json::json;
use troupe_tests::{
    http,
    otlp::{Receiver, life_of, sample, scrape},
    process::SessionProcess,
    upstream::{Fault, Turn, Upstream, Usage},
};

const KEY: &str = "sk-ant-process-key-5b4a3c2d1e";

fn config(dir: &std::path::Path, upstream: &str) -> std::path::PathBuf {
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        format!(
            "providers:\n  scripted:\n    kind: anthropic\n    base_url: {upstream}\n    \
             key_env: PROCESS_TEST_KEY\n    models:\n      claude-p: {{ input: \"3\", output: \"15\" }}\n"
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_bad_gateway_config_stops_the_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "http://127.0.0.1:9");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"15\"", "\"1.5000001\"");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe-session"))
        .args(["--listen", "127.0.0.1:0", "--socket", "none", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--gateway-config")
        .arg(&file)
        .env("PROCESS_TEST_KEY", KEY)
        .output()
        .expect("run troupe-session");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("providers.scripted.models.claude-p.output"),
        "{stderr}"
    );
    assert!(!stderr.contains(KEY), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_call_is_a_span_of_its_sessions_life_and_counted_in_metrics() {
    let (receiver, endpoint) = Receiver::start().await;
    let upstream = Upstream::tcp(vec![
        Turn::text("hello").with_usage(Usage {
            input_tokens: 120,
            output_tokens: 7,
            ..Usage::default()
        }),
        Turn::fault(Fault::Status(500)),
        Turn::fault(Fault::Truncated),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), &upstream.base_url());
    let metrics = {
        let port = troupe_tests::ports::free_addr().port();
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    };
    let log = dir.path().join("session.log");
    let listen = metrics.to_string();
    let file = file.display().to_string();
    let data = data_with_worker();
    let service = SessionProcess::start_logging(
        env!("CARGO_BIN_EXE_troupe-session"),
        data,
        &["--gateway-config", &file, "--metrics-listen", &listen],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            ("PROCESS_TEST_KEY", KEY),
            ("RUST_LOG", "trace"),
        ],
        Some(&log),
    );
    let created = service.create_root_in(None).await;
    let root = created.session.unwrap().session_id;
    let token = created.session_token;
    let url = format!("{}/v1/messages", service.endpoint);
    let body = |stream: bool| {
        json!({"model": "claude-p", "max_tokens": 64, "stream": stream,
               "messages": [{"role": "user", "content": "hi"}]})
    };
    let limit = Duration::from_secs(20);
    let answer = http::post(&url, &[("x-api-key", &token)], &body(true), limit).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = http::post(&url, &[("x-api-key", &token)], &body(false), limit).await;
    assert_eq!(answer.status, 500, "{answer:?}");
    let answer = http::post(&url, &[("x-api-key", &token)], &body(true), limit).await;
    assert!(answer.body.contains("event: error"), "{answer:?}");

    let text = scrape(metrics).await;
    let labels = [
        ("troupe_workspace_id", "alpha"),
        ("troupe_agent_name", "worker"),
        ("gen_ai_request_model", "claude-p"),
    ];
    let tokens = |kind| {
        let mut with = labels.to_vec();
        with.push(("gen_ai_token_type", kind));
        sample(&text, "troupe_model_tokens_total", &with)
    };
    // 120 input and 7 output, and the truncated stream's worst case: its
    // bytes as input, its whole bound (64) as output.
    let cut = body(true).to_string().len() as f64;
    assert_eq!(tokens("input"), Some(120.0 + cut), "{text}");
    assert_eq!(tokens("output"), Some(7.0 + 64.0), "{text}");
    // At $3/M input and $15/M output, in pico-dollars.
    assert_eq!(
        sample(&text, "troupe_model_cost_total", &labels),
        Some((120.0 + cut) * 3_000_000.0 + 71.0 * 15_000_000.0),
        "{text}"
    );
    let mut ok = labels.to_vec();
    ok.push(("troupe_model_outcome", "ok"));
    assert_eq!(
        sample(&text, "troupe_model_calls_total", &ok),
        Some(1.0),
        "{text}"
    );
    let mut failed = labels.to_vec();
    failed.push(("troupe_model_outcome", "failed"));
    assert_eq!(
        sample(&text, "troupe_model_calls_total", &failed),
        Some(2.0),
        "{text}"
    );

    service
        .operator()
        .await
        .terminate_session(troupe_tests::terminate(root.clone()))
        .await
        .unwrap();
    assert!(service.stop().await, "clean exit");
    let spans = receiver.spans();
    let life = life_of(&spans, &root);
    let calls: Vec<_> = spans.iter().filter(|s| s.name == "chat claude-p").collect();
    assert_eq!(calls.len(), 3, "{spans:#?}");
    for call in &calls {
        assert_eq!(call.parent, life.id, "under the life span: {call:#?}");
        assert_eq!(call.trace, life.trace);
        assert_eq!(call.get("gen_ai.operation.name"), "chat");
        assert_eq!(call.get("gen_ai.request.model"), "claude-p");
    }
    let ok = calls
        .iter()
        .find(|c| c.get("outcome") == "ok")
        .expect("the call that answered");
    assert_eq!(ok.get("gen_ai.usage.input_tokens"), "120");
    assert_eq!(ok.get("gen_ai.usage.output_tokens"), "7");
    // A string array, as the GenAI conventions type it, not one string.
    assert_eq!(
        ok.strings("gen_ai.response.finish_reasons"),
        Some(&["end_turn".to_owned()][..]),
        "{ok:#?}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains(KEY), "the key is in the log");
    assert!(!format!("{spans:?}").contains(KEY));
}

/// A provider whose certificate does not verify: the agent gets the
/// upstream error, and the log says why (the TLS error), without the key.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_certificate_that_does_not_verify_is_logged_without_the_key() {
    let upstream = Upstream::tls(vec![Turn::text("never")], &["localhost", "127.0.0.1"]).await;
    let dir = tempfile::tempdir().unwrap();
    // No ca_file: the test's CA is not trusted.
    let file = config(dir.path(), &upstream.base_url());
    let file = file.display().to_string();
    let log = dir.path().join("session.log");
    let data = data_with_worker();
    let service = SessionProcess::start_logging(
        env!("CARGO_BIN_EXE_troupe-session"),
        data,
        &["--gateway-config", &file],
        &[("PROCESS_TEST_KEY", KEY)],
        Some(&log),
    );
    let token = service.create_root_in(None).await.session_token;
    let answer = http::post(
        &format!("{}/v1/messages", service.endpoint),
        &[("x-api-key", &token)],
        &json!({"model": "claude-p", "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}]}),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(upstream.requests().is_empty());
    assert!(service.stop().await, "clean exit");
    let logged = std::fs::read_to_string(&log).unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("cannot reach the provider"))
        .unwrap_or_else(|| panic!("no line of the failure in {logged}"));
    assert!(line.contains("UnknownIssuer"), "{line}");
    assert!(!logged.contains(KEY), "the key is in the log");
}

/// A data directory whose workspaces share the agent `worker` (`cat`).
fn data_with_worker() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("data/agents")).unwrap();
    std::fs::write(
        data.path().join("data/agents/worker.md"),
        "---\nname: worker\ndescription: test agent\ncommand: [\"/bin/cat\"]\n---\n",
    )
    .unwrap();
    data
}
