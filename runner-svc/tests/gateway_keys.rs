//! No provider key inside a workspace container: agents of a direct and a
//! sandboxed session, calling their model through the session service's
//! gateway, search their environment, every process's environment and
//! command line they can read, and the container's files for the key, and
//! print what the gateway answered them; none of it holds the key. A call
//! from inside without a token, or with one that is no session's, is
//! refused: the model port is no credential.

use crate::common;

use common::{claude, pair::Pair, *};
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::upstream::{Turn, Upstream};

/// Every provider key of the test starts with this; the agents look for it.
const KEY: &str = "sk-ant-hidden-provider-key-0f9e8d7c";

/// Looks for the key's prefix everywhere it can read (as a pattern that
/// does not match itself, so no command line of the search does: in the
/// image's software, `/bin`, `/opt` and `/usr`, the files written since the
/// container was made, as reading 1.7 GB of CLIs takes minutes), calls
/// the model once
/// and prints the answer, then `found:[...]` with where it found the key.
const SEARCH: &str = r#"
pat='sk-ant-hidde[n]'
found=""
env | grep -q "$pat" && found="$found env"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  grep -qs "$pat" "$f" && found="$found $f"
done
for d in /etc /home /root /run /srv /tmp /var /workspace; do
  grep -rqs "$pat" "$d" 2>/dev/null && found="$found $d"
done
for f in $(find /bin /opt /usr -xdev -type f -newer /etc/hostname 2>/dev/null); do
  grep -qs "$pat" "$f" && found="$found $f"
done
wget -q -O - --header "x-api-key: $ANTHROPIC_API_KEY" --header 'content-type: application/json' \
  --post-data '{"model":"claude-keys","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' \
  "$ANTHROPIC_BASE_URL/v1/messages"
echo
for key in '' 'x-api-key: not-a-token'; do
  wget -q -O - ${key:+--header "$key"} --header 'content-type: application/json' \
    --post-data '{"model":"claude-keys","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' \
    "$ANTHROPIC_BASE_URL/v1/messages" 2>&1 | grep -o 'HTTP/1.1 [0-9]*' | sed 's/^/refused /'
done
echo "found:[$found]"
cat
"#;

#[tokio::test]
async fn no_provider_key_can_be_found_inside_the_container() {
    let upstream = Upstream::tcp(vec![Turn::text("answer one"), Turn::text("answer two")]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = claude::gateway_config_priced(
        dir.path(),
        &upstream.base_url(),
        KEY,
        "claude-keys",
        r#"{ input: "1", output: "1" }"#,
    );
    let pair = Pair::start_with(move |c| c.gateway_config = Some(config)).await;
    let ws = pair.runner.workspace("keys");
    pair.agent(&ws, "searcher", SEARCH);
    let root = pair.root(&ws, "searcher", "").await;
    let sandboxed = pair
        .server
        .operator()
        .await
        .create_session(pb::CreateSessionRequest {
            title: "sandboxed".into(),
            agent_name: "searcher".into(),
            parent_session_id: root.session_id.clone(),
            trust_level: TrustLevel::Sandboxed as i32,
            ..Default::default()
        })
        .await
        .expect("sandboxed child")
        .into_inner()
        .session
        .unwrap();
    for id in [&root.session_id, &sandboxed.session_id] {
        let tail = pair.tail_with(id, "found:[").await;
        assert!(tail.contains("found:[]"), "{id}: {tail}");
        assert!(tail.contains("answer "), "the model answered: {tail}");
        assert_eq!(
            tail.matches("refused HTTP/1.1 401").count(),
            2,
            "no token and a token of no session are refused: {tail}"
        );
        assert!(!tail.contains(KEY), "{tail}");
    }
    // The key went upstream, and only there.
    let seen = upstream.wait_for_requests(2, MINUTE).await;
    assert!(seen.iter().all(|r| r.api_key() == Some(KEY)), "{seen:#?}");
    pair.terminate(&root.session_id).await;
}
