//! The real Claude Code when its provider misbehaves, through the session
//! service's model gateway: it rides out an error answer and a stream that
//! breaks off (retrying as it does against Anthropic) and its session is
//! charged what the provider reported, no more; with its provider down it
//! prints the gateway's error and is charged nothing. Never a reservation
//! left, never the provider's key in what the agent sees.

use crate::common;

use std::time::Duration;

use common::{
    claude::{self, PRICE, Team},
    pair::Pair,
    *,
};
use troupe_proto::session as pb;
use troupe_tests::upstream::{Fault, Turn, Upstream, Usage};

const KEY: &str = "sk-ant-fault-provider-key-not-in-containers";
const MODEL: &str = "claude-fault-test";

/// The session's output tail once it holds `needle` (within three minutes).
async fn output_with(pair: &Pair, id: &str, needle: &str, upstream: &Upstream) -> String {
    pair.tail_within(id, needle, 3 * MINUTE, || {
        format!("\nrequests {:#?}", upstream.requests())
    })
    .await
}

/// Its usage once nothing is reserved any more.
async fn settled(pair: &Pair, id: &str) -> pb::SessionUsage {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let usage = pair.usage(id).await;
        if usage.reserved_calls == 0 {
            return usage;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still reserved: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn status(pair: &Pair, id: &str) -> pb::SessionStatus {
    pair.get(id).await.session.unwrap().status()
}

/// A 500, then a stream that breaks off after `message_start`: Claude Code
/// retries each and prints the third answer. Three calls reached the
/// provider with its key; the session is charged the broken stream's worst
/// case (what the provider generated before the break is unknown) and the
/// answer's usage, nothing for the 500, and it is still running, waiting
/// for its next message.
#[tokio::test]
async fn claude_code_rides_out_provider_faults_and_a_broken_stream_is_charged_in_full() {
    let upstream = Upstream::tcp(vec![]).await;
    let Some(Team {
        pair,
        ws,
        dir: _dir,
    }) = claude::team(&upstream.base_url(), KEY, MODEL, "faults", &[]).await
    else {
        return;
    };
    let answer = Usage {
        input_tokens: 1_000,
        output_tokens: 20,
        ..Usage::default()
    };
    upstream.script(
        "RIDE-OUT-4a7e",
        vec![
            Turn::fault(Fault::Status(500)),
            Turn::fault(Fault::BreakOff),
            Turn::text("RECOVERED-b21f").with_usage(answer),
        ],
    );
    let root = pair.root(&ws, "claude", "RIDE-OUT-4a7e: say hello").await;

    let tail = output_with(&pair, &root.session_id, "RECOVERED-b21f", &upstream).await;
    assert!(!tail.contains(KEY), "{tail}");
    let seen = upstream.requests();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    for request in &seen {
        assert_eq!(request.api_key(), Some(KEY), "{request:#?}");
        assert_eq!(request.body["model"], MODEL);
    }
    // The stream that broke off is billed its worst case (its bytes at the
    // dearest input price, its whole output bound), the answer its usage.
    let usage = settled(&pair, &root.session_id).await;
    let own = usage.own_tokens.unwrap();
    let broken = &seen[1];
    let bound = broken.body["max_tokens"].as_u64().expect("a bound");
    assert_eq!(
        (own.input, own.output),
        (broken.bytes + 1_000, bound + 20),
        "{usage:?}"
    );
    assert_eq!(
        usage.own_cost_pico_usd,
        broken.bytes * PRICE[3] + 1_000 * PRICE[0] + (bound + 20) * PRICE[1],
        "{usage:?}"
    );
    assert_eq!(
        status(&pair, &root.session_id).await,
        pb::SessionStatus::Running
    );
    pair.terminate(&root.session_id).await;
}

/// The provider listens nowhere: Claude Code (told to retry once) prints
/// the gateway's 502 in Anthropic's shape, naming the provider and not its
/// key; nothing is charged or left reserved, and the agent keeps running.
#[tokio::test]
async fn claude_code_whose_provider_is_down_is_told_and_charged_nothing() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let Some(Team {
        pair,
        ws,
        dir: _dir,
    }) = claude::team(
        &format!("http://127.0.0.1:{port}"),
        KEY,
        MODEL,
        "provider-down",
        &[("CLAUDE_CODE_MAX_RETRIES", "1")],
    )
    .await
    else {
        return;
    };
    let root = pair.root(&ws, "claude", "say hello").await;

    let upstream = Upstream::tcp(vec![]).await; // for the failure message only
    let tail = output_with(
        &pair,
        &root.session_id,
        "cannot reach provider scripted",
        &upstream,
    )
    .await;
    assert!(!tail.contains(KEY), "{tail}");
    let usage = settled(&pair, &root.session_id).await;
    assert_eq!(usage.own_cost_pico_usd, 0, "{usage:?}");
    assert_eq!(usage.own_tokens.unwrap_or_default().input, 0, "{usage:?}");
    assert_eq!(
        status(&pair, &root.session_id).await,
        pb::SessionStatus::Running
    );
    pair.terminate(&root.session_id).await;
}
