//! The store's contract of sign-ins and of a session's messages, on both
//! backends.

use super::*;

/// Sign-ins as the store keeps them, on either backend: the hash of the
/// id, never the id; none after its expiry; none after sign-out.
async fn sign_in_contract(store: impl Store) {
    let id = ConsoleSessionId::generate();
    let now = now_ms();
    let live = ConsoleSession {
        id_hash: id.hash(),
        csrf: CsrfToken::generate(),
        created_at_ms: now,
        expires_at_ms: now + 60_000,
    };
    store.create_console_session(&live).await.unwrap();
    let found = store
        .console_session(&id.hash(), now)
        .await
        .unwrap()
        .expect("found");
    assert!(found.csrf == live.csrf);
    assert!(
        store
            .console_session(id.expose(), now)
            .await
            .unwrap()
            .is_none(),
        "keyed by the hash alone"
    );
    assert!(
        store
            .console_session(&id.hash(), now + 60_001)
            .await
            .unwrap()
            .is_none(),
        "expired"
    );
    assert!(store.delete_console_session(&id.hash()).await.unwrap());
    assert!(
        store
            .console_session(&id.hash(), now)
            .await
            .unwrap()
            .is_none(),
        "signed out"
    );
    assert!(!store.delete_console_session(&id.hash()).await.unwrap());
}

/// A session's messages, in and out, bodies included, oldest first.
async fn messages_contract(store: impl Store) {
    for id in ["sess_a", "sess_b"] {
        store
            .create_root(
                new_session(id, Trust::Sandboxed),
                None,
                operator_audit(Action::CreateRootSession, id),
                &|_| Ok(QuotaLeft::default()),
            )
            .await
            .unwrap();
    }
    // Ids in the order of sending, as the service's (UUID v7) are.
    let send = |n: u32, to: &'static str, from: Principal, body: &'static str| {
        let store = store.clone();
        async move {
            store
                .send_message(
                    &to.into(),
                    NewMessage {
                        message_id: format!("msg_{n}"),
                        sender: from,
                        body: body.to_owned(),
                    },
                    None,
                    operator_audit(Action::SendMessage, to),
                    troupe_tests::stores::UNBOUNDED,
                    &|_| Ok(()),
                )
                .await
                .unwrap()
        }
    };
    send(1, "sess_a", Principal::Operator, "to a").await;
    send(2, "sess_b", Principal::Session("sess_a".into()), "from a").await;
    send(3, "sess_b", Principal::Operator, "not a's").await;
    let got = store.session_messages(&"sess_a".into(), 10).await.unwrap();
    let bodies: Vec<_> = got
        .iter()
        .map(|m| (m.session_id.as_str(), m.body.as_str()))
        .collect();
    assert_eq!(bodies, [("sess_a", "to a"), ("sess_b", "from a")]);
    assert_eq!(
        store.session_messages(&"sess_a".into(), 1).await.unwrap()[0].body,
        "from a",
        "the newest"
    );
}

#[tokio::test]
async fn sign_ins_and_messages_in_the_store_on_sqlite() {
    let (_dir, store) = troupe_tests::stores::sqlite().await;
    sign_in_contract(store.clone()).await;
    messages_contract(store).await;
}

#[tokio::test]
async fn sign_ins_and_messages_in_the_store_on_postgres() {
    let store = troupe_tests::stores::postgres().await;
    sign_in_contract(store.clone()).await;
    messages_contract(store).await;
}
