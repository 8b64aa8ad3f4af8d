//! Identity: tokens that are tampered, signed with another key, expired,
//! truncated, missing, or bound to an ended session are all refused; a
//! restart keeps live tokens valid.

use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tonic::Code;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{TestServer, child, create_child, get, reason, terminate};

async fn whoami(server: &TestServer, token: Option<&str>) -> Result<(), tonic::Status> {
    server
        .client(token)
        .await
        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest::default())
        .await
        .map(|_| ())
}

fn expect_refused(result: Result<(), tonic::Status>, why: &str) {
    let status = result.expect_err(why);
    assert_eq!(status.code(), Code::Unauthenticated, "{why}: {status:?}");
    assert_eq!(reason(&status), why);
}

fn flip_char(s: &str, at: usize) -> String {
    let mut bytes = s.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ascii")
}

#[tokio::test]
async fn malformed_and_forged_tokens_are_refused() {
    let server = TestServer::start().await;
    let (root, _, token) = server.root("alpha", TrustLevel::Direct).await;
    whoami(&server, Some(&token))
        .await
        .expect("the real token works");

    expect_refused(whoami(&server, None).await, "TOKEN_MISSING");
    expect_refused(whoami(&server, Some("")).await, "TOKEN_MISSING");
    expect_refused(whoami(&server, Some("not-a-token")).await, "TOKEN_INVALID");

    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a JWT");
    // Tampered payload: claims another live session, keeps the old
    // signature (a session that exists, so only the signature can refuse it).
    let (other, _, _) = server.root("beta", TrustLevel::Direct).await;
    let forged_claims = format!(
        "{{\"sub\":\"{}\",\"iss\":\"troupe\",\"aud\":\"troupe.session.v1\",\"iat\":1,\"exp\":{},\"jti\":\"x\"}}",
        other.session_id,
        u32::MAX
    );
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        base64url(forged_claims.as_bytes()),
        parts[2]
    );
    expect_refused(whoami(&server, Some(&forged)).await, "TOKEN_INVALID");
    // Tampered signature.
    let sig_tampered = format!("{}.{}.{}", parts[0], parts[1], flip_char(parts[2], 3));
    expect_refused(whoami(&server, Some(&sig_tampered)).await, "TOKEN_INVALID");
    // Truncated.
    expect_refused(
        whoami(&server, Some(&token[..token.len() - 5])).await,
        "TOKEN_INVALID",
    );
    expect_refused(
        whoami(&server, Some(&format!("{}.{}", parts[0], parts[1]))).await,
        "TOKEN_INVALID",
    );

    // Signed with another key under the server's key id.
    let header = jsonwebtoken::decode_header(&token).expect("header");
    let mut h = Header::new(Algorithm::HS256);
    h.kid = header.kid.clone();
    let claims = serde_json::json!({
        "sub": root.session_id, "iss": "troupe", "aud": "troupe.session.v1",
        "iat": 1, "exp": u32::MAX, "jti": "forged",
    });
    let wrong_key = jsonwebtoken::encode(
        &h,
        &claims,
        &EncodingKey::from_secret(b"not the server key at all, 32b!"),
    )
    .expect("encode");
    expect_refused(whoami(&server, Some(&wrong_key)).await, "TOKEN_INVALID");
    // Unknown key id.
    h.kid = Some("k-unknown".into());
    let unknown_kid =
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(b"x")).expect("encode");
    expect_refused(whoami(&server, Some(&unknown_kid)).await, "TOKEN_INVALID");
    // "none" algorithm.
    let none = format!(
        "{}.{}.",
        base64url(br#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    expect_refused(whoami(&server, Some(&none)).await, "TOKEN_INVALID");

    // An operator-only call with a session token.
    let status = server
        .client(Some(&token))
        .await
        .list_audit(pb::ListAuditRequest::default())
        .await
        .expect_err("operator only");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::PermissionDenied, "OPERATOR_ONLY")
    );

    // Refusals are audited.
    let audit = troupe_tests::audit_log(&server, 1000).await;
    assert!(
        audit
            .iter()
            .any(|e| !e.allowed && e.reason == "TOKEN_INVALID" && e.caller == "anonymous")
    );
    server.stop().await;
}

fn base64url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn expired_tokens_are_refused() {
    let server = TestServer::start_with(|c| c.token_ttl_secs = 1).await;
    let (_, _, token) = server.root("alpha", TrustLevel::Direct).await;
    whoami(&server, Some(&token)).await.expect("fresh");
    // exp is in whole seconds: past it after at most two.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    expect_refused(whoami(&server, Some(&token)).await, "TOKEN_EXPIRED");
    server.stop().await;
}

#[tokio::test]
async fn tokens_of_ended_sessions_are_revoked_down_the_tree() {
    let server = TestServer::start().await;
    let (root, mut as_root, root_token) = server.root("alpha", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("kid")).await;
    let kid_token = server.token_for(&kid.session_id).await;
    whoami(&server, Some(&kid_token))
        .await
        .expect("kid token works");
    server
        .operator()
        .await
        .terminate_session(terminate(root.session_id.clone()))
        .await
        .expect("terminate");
    expect_refused(whoami(&server, Some(&root_token)).await, "TOKEN_REVOKED");
    expect_refused(whoami(&server, Some(&kid_token)).await, "TOKEN_REVOKED");
    // And no new token can be had for them.
    let status = server
        .operator()
        .await
        .issue_session_token(pb::IssueSessionTokenRequest {
            session_id: kid.session_id,
        })
        .await
        .expect_err("ended");
    assert_eq!(reason(&status), "SESSION_ENDED");
    server.stop().await;
}

#[tokio::test]
async fn restart_keeps_sessions_and_tokens_valid() {
    let mut server = TestServer::start().await;
    let (root, mut as_root, token) = server.root("alpha", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("kid")).await;
    server.restart().await;
    let mut again = server.client(Some(&token)).await;
    let got = again
        .get_session(get(kid.session_id.clone()))
        .await
        .expect("the old token still works after restart")
        .into_inner()
        .session
        .expect("s");
    assert_eq!(got.parent_session_id, root.session_id);
    assert_eq!(got.depth, 1);
    again
        .create_session(child("after restart"))
        .await
        .expect("can still spawn");
    server.stop().await;
}

#[tokio::test]
async fn operator_token_file_is_generated_private_and_reused() {
    let dir = tempfile::tempdir().expect("dir");
    let token = troupe_proto::paths::operator_token(None, dir.path()).expect("generate");
    let path = dir.path().join("operator.token");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).expect("file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(
        troupe_proto::paths::operator_token(None, dir.path()).expect("reuse"),
        token
    );
    assert!(troupe_proto::paths::operator_token(Some("short"), dir.path()).is_err());

    // A token file others may read is refused, saying how to mend it.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = troupe_proto::paths::operator_token(None, dir.path())
        .expect_err("a token file others can read")
        .to_string();
    assert!(err.contains("chmod 600"), "{err}");
    // An empty one, whatever its mode, is replaced by a private new token.
    std::fs::write(&path, "").expect("empty");
    let fresh = troupe_proto::paths::operator_token(None, dir.path()).expect("regenerate");
    assert_ne!(fresh, token);
    let mode = std::fs::metadata(&path).expect("file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "made private");
}
