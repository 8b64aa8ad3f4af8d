//! Traces: a caller's `traceparent` continued, a spawn from another trace
//! kept in its tree's and linked to the call, and each spawn tree one trace
//! shaped like the tree, across a restart.

use super::*;

/// A call that carries a `traceparent` is traced inside the caller's trace.
/// A spawn's request is served in its spawn span, a child of the caller's
/// span; other calls in a request span.
#[tokio::test(flavor = "multi_thread")]
async fn a_callers_traceparent_is_continued() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = exporting(&endpoint, &[]);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{caller_span}-01");
    let root = service
        .create_root_in(Some(&traceparent))
        .await
        .session
        .expect("a session");
    let mut operator = service.operator().await;
    let mut request = tonic::Request::new(GetSessionRequest {
        session_id: root.session_id.clone(),
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    operator.get_session(request).await.expect("get");
    assert!(service.stop().await);
    let spans = receiver.spans();
    let spawn = named(&spans, "create_root");
    assert_eq!(
        (spawn.trace.as_str(), spawn.parent.as_str()),
        (trace, caller_span)
    );
    assert_eq!(spawn.get("rpc.system"), "grpc");
    assert!(
        !spans.iter().any(|s| s.name.ends_with("/CreateRootSession")),
        "one span for the spawn's request: {spans:#?}"
    );
    let get = named(&spans, "/troupe.session.v1.SessionService/GetSession");
    assert_eq!(
        (get.trace.as_str(), get.parent.as_str()),
        (trace, caller_span)
    );
}

/// An agent's spawn called from a trace other than its tree's (one the
/// agent started itself) is in the tree's trace, under the agent's life,
/// and linked to the calling span, so both traces lead to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_spawn_called_from_another_trace_stays_in_the_tree_and_links_the_call() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = exporting(&endpoint, &[]);
    let root = service.create_root_in(None).await;
    let root_id = root.session.expect("a session").session_id;
    let (other_trace, calling_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut request = tonic::Request::new(CreateSessionRequest {
        agent_name: "worker".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{other_trace}-{calling_span}-01")
            .parse()
            .unwrap(),
    );
    let mut agent = service.client(&root.session_token).await;
    let child = agent
        .create_session(request)
        .await
        .expect("spawn")
        .into_inner()
        .session
        .expect("a session");
    service.terminate_session(&root_id, "done").await;
    assert!(service.stop().await);

    let spans = receiver.spans();
    let root_life = life_of(&spans, &root_id);
    let spawn = spawn_of(&spans, &child.session_id);
    assert_eq!(spawn.trace, child.trace_id);
    assert_eq!(
        (&spawn.trace, &spawn.parent),
        (&root_life.trace, &root_life.id),
        "in the tree, under the caller's life"
    );
    assert_eq!(
        spawn.links,
        [(other_trace.to_owned(), calling_span.to_owned())],
        "linked to the call"
    );
}

/// A tree is one trace whose nesting is the tree: each session's life span
/// hangs under the spawn span that made it, which hangs under its parent's
/// life span; messages are events of the recipient's life, and links to
/// the sender's when they cross branches. The ids survive a restart of the
/// service between the spawns and the ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_spawn_tree_is_one_trace_shaped_like_the_tree() {
    let (receiver, endpoint) = Receiver::start().await;
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let flags = ["--max-depth", "2"];
    let service = start(&flags, &otel);
    let root = service.create_root().await;
    let child = service.spawn(&root).await.unwrap().session_id;
    let sibling = service.spawn(&root).await.unwrap().session_id;
    let grandchild = service.spawn(&child).await.unwrap().session_id;

    // Restarted on the same data: the lives planned before are kept.
    let (clean, dir) = service.stop_keeping_data().await;
    assert!(clean);
    let service = dir.start(&flags, &otel);
    service.create_root().await; // waits until it answers
    assert_eq!(
        service.spawn(&grandchild).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    service.send(&child, &grandchild).await;
    service.send(&sibling, &grandchild).await;
    let trace_id = service
        .operator()
        .await
        .get_session(troupe_tests::get(&grandchild))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .trace_id;
    service.terminate_session(&root, "done").await;
    assert!(service.stop().await);

    let spans = receiver.spans();
    let life = |session: &str| life_of(&spans, session);
    let spawned = |session: &str| spawn_of(&spans, session);
    let root_life = life(&root);
    assert_eq!(root_life.trace, trace_id, "GetSession names the trace");
    assert_eq!(root_life.parent, spawned(&root).id);
    for (session, parent) in [(&child, &root), (&sibling, &root), (&grandchild, &child)] {
        let span = life(session);
        assert_eq!(span.trace, trace_id, "one trace for the tree");
        assert_eq!(
            span.parent,
            spawned(session).id,
            "a life hangs under its spawn"
        );
        assert_eq!(
            spawned(session).parent,
            life(parent).id,
            "a spawn hangs under its parent's life"
        );
        assert_eq!(span.get("troupe.tree.id"), root_life.get("troupe.tree.id"));
        assert_eq!(span.get("troupe.session.status"), "terminated");
        assert_eq!(span.get("gen_ai.operation.name"), "invoke_agent");
        assert_eq!(span.get("gen_ai.agent.name"), "worker");
        assert_eq!(span.get("troupe.parent_session.id"), **parent);
        assert_eq!(span.get("gen_ai.agent.id"), **session);
        assert_eq!(span.get("troupe.session.id"), **session);
        assert_eq!(span.get("troupe.workspace.id"), "alpha");
        assert_eq!(span.get("troupe.trust_level"), "direct");
        assert!(!span.error, "a terminated session's life is no error");
    }
    assert_eq!(life(&grandchild).get("troupe.depth"), "2");
    assert_eq!(life(&root).get("troupe.end_reason"), "done");
    assert_eq!(life(&child).get("troupe.end_reason"), "cascade");

    // The refusal after the restart is in the tree's trace too.
    let refused = spans
        .iter()
        .find(|s| s.get("troupe.refusal.reason") == "DEPTH_EXCEEDED")
        .unwrap_or_else(|| panic!("no refused spawn: {spans:#?}"));
    assert_eq!(
        (&refused.trace, &refused.parent),
        (&trace_id, &life(&grandchild).id)
    );

    // Two messages; only the one from the sibling's branch is a link.
    let senders: Vec<String> = life(&grandchild)
        .events
        .iter()
        .map(|e| lookup(e, "troupe.message.sender"))
        .collect();
    assert_eq!(
        senders,
        [format!("session:{child}"), format!("session:{sibling}")]
    );
    for event in &life(&grandchild).events {
        assert!(
            lookup(event, "troupe.message.id").starts_with("msg_"),
            "{event:?}"
        );
        assert!(
            !lookup(event, "troupe.message.sequence").is_empty(),
            "{event:?}"
        );
    }
    assert_eq!(
        life(&grandchild).links,
        [(trace_id.clone(), life(&sibling).id.clone())]
    );
}
