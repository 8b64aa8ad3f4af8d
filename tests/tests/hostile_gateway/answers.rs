//! What the provider sends back: never its key, whole or masked, in an
//! error, a header or a stream; never a huge error body.

use super::*;

/// A provider that echoes the key it was sent, in its error's body (whole
/// and in the masked forms providers print) and in a header: the agent
/// gets the error with every form redacted, and of the headers only the
/// allowlisted ones that show nothing of the key.
#[tokio::test]
async fn the_providers_key_never_comes_back_in_an_error_or_a_header() {
    let setup = Setup::new(vec![Turn::fault(Fault::EchoKey)]).await;
    let (_, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 401, "the provider's own status: {answer:?}");
    let json = answer.json();
    assert_eq!(json["error"]["type"], "authentication_error", "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("[redacted]"), "{message}");
    let head = &KEY[..8];
    let tail = &KEY[KEY.len() - 4..];
    for shown in [
        KEY,
        &format!("{head}*"),
        &format!("{head}..."),
        &format!("*{tail}"),
        &format!(".{tail}"),
    ] {
        assert!(!answer.body.contains(shown), "{shown} in {}", answer.body);
    }
    let names: Vec<&str> = answer.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(answer.headers["request-id"], "req_echo_1", "{names:?}");
    assert_eq!(answer.headers["retry-after"], "7", "{names:?}");
    for dropped in [
        "x-leak",
        "set-cookie",
        "anthropic-organization-id",
        "x-forwarded-for",
        "anthropic-ratelimit-requests-remaining",
    ] {
        assert!(
            !answer.headers.contains_key(dropped),
            "{dropped} in {names:?}"
        );
    }
    for (name, value) in &answer.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains(tail) && !value.contains(head),
            "{name}: {value}"
        );
    }
}

/// A provider whose stream says its key (as an error event would), whole
/// and masked, 1,200 times over pieces of 16 KB that cut some of them: the
/// agent reads every one redacted, and the rest of the stream whole.
#[tokio::test]
async fn the_providers_key_never_comes_back_in_a_stream() {
    let head = &KEY[..8];
    let tail = &KEY[KEY.len() - 4..];
    let echo = format!("invalid x-api-key {KEY} or {head}...{tail} ");
    let turn = Turn::deltas(&echo, 600);
    let setup = Setup::new(vec![Turn {
        fault: Some(Fault::Pace(1 << 20)),
        ..turn
    }])
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("message_stop"), "{}", answer.body);
    assert!(
        answer.body.len() > 3 * (16 << 10),
        "{} bytes",
        answer.body.len()
    );
    for shown in [KEY, &format!("{head}..."), &format!("...{tail}")] {
        assert!(!answer.body.contains(shown), "{shown} in the stream");
    }
    assert_eq!(
        answer
            .body
            .matches("invalid x-api-key [redacted] or [redacted]")
            .count(),
        600
    );
    let usage = settled(&setup, &id).await;
    assert_eq!(usage.own_tokens.unwrap().output, 5, "{usage:?}");
}

/// Twenty 10 MB error answers at once: each is read no further than its
/// bound, and the agent gets the gateway's own error with the provider's
/// status, in the API's shape, never the body (nor the key it held).
#[tokio::test]
async fn a_huge_error_answer_is_not_relayed() {
    let calls = 20;
    let turns = (0..calls)
        .map(|_| Turn::fault(Fault::HugeError(10 << 20)))
        .collect();
    let setup = Setup::new(turns).await;
    let (id, token) = setup.root("alpha", None).await;
    let answers = futures::future::join_all((0..calls).map(|_| setup.call(&token, false))).await;
    for answer in answers {
        assert_eq!(
            answer.status,
            500,
            "{}",
            &answer.body[..answer.body.len().min(300)]
        );
        assert!(
            answer.body.len() < 1024,
            "{} bytes relayed",
            answer.body.len()
        );
        let json = answer.json();
        assert_eq!(json["error"]["type"], "api_error", "{json}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("over 64 KiB"),
            "{json}"
        );
        assert!(!answer.body.contains(KEY));
    }
    let usage = settled(&setup, &id).await;
    assert_eq!(
        (usage.own_calls, usage.own_cost_pico_usd),
        (calls as u64, 0),
        "{usage:?}"
    );
}
