//! Definitions applied, listed, replaced and removed by operators alone,
//! refused when invalid, and the order a create finds them in.

use super::*;

#[tokio::test]
async fn operators_apply_list_replace_and_remove_definitions() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;

    let applied = operator
        .apply_agent(apply("", "reviewer", &["/bin/echo", "one"]))
        .await
        .expect("apply")
        .into_inner()
        .agent
        .expect("the stored definition");
    assert_eq!(applied.name, "reviewer");
    assert_eq!(applied.workspace_id, "");
    assert_eq!(applied.command, ["/bin/echo", "one"]);
    assert_eq!(applied.description, "reviewer from the database");
    assert_eq!(
        applied.definition,
        agent_definition("reviewer", &["/bin/echo", "one"])
    );
    assert_eq!(applied.updated_by, "operator");
    assert!(applied.updated_at.is_some());

    operator
        .apply_agent(apply("alpha", "reviewer", &["/bin/echo", "alpha"]))
        .await
        .expect("apply for alpha");
    // Replacing keeps one definition per workspace and name.
    operator
        .apply_agent(apply("", "reviewer", &["/bin/echo", "two"]))
        .await
        .expect("replace");
    assert_eq!(
        list(&mut operator, "").await,
        [
            ("".into(), "reviewer".into(), strings(&["/bin/echo", "two"])),
            (
                "alpha".into(),
                "reviewer".into(),
                strings(&["/bin/echo", "alpha"])
            ),
        ]
    );
    assert_eq!(
        list(&mut operator, "alpha").await,
        [(
            "alpha".into(),
            "reviewer".into(),
            strings(&["/bin/echo", "alpha"])
        )]
    );
    assert!(list(&mut operator, "beta").await.is_empty());

    let removed = operator
        .remove_agent(remove("alpha", "reviewer"))
        .await
        .expect("remove")
        .into_inner()
        .agent
        .expect("the removed definition");
    assert_eq!(removed.command, ["/bin/echo", "alpha"]);
    assert_eq!(
        list(&mut operator, "").await,
        [("".into(), "reviewer".into(), strings(&["/bin/echo", "two"]))]
    );
    let again = operator
        .remove_agent(remove("alpha", "reviewer"))
        .await
        .expect_err("already removed");
    assert_eq!(again.code(), Code::NotFound);
    assert_eq!(reason(&again), "AGENT_NOT_FOUND");

    // Each change is audited, as allowed, naming workspace and agent.
    let applies = audit_of(&server, "apply_agent").await;
    let targets: Vec<(&str, bool)> = applies
        .iter()
        .map(|e| (e.target.as_str(), e.allowed))
        .collect();
    assert_eq!(
        targets,
        [
            ("*/reviewer", true),
            ("alpha/reviewer", true),
            ("*/reviewer", true)
        ]
    );
    let removes = audit_of(&server, "remove_agent").await;
    let outcomes: Vec<(&str, bool, &str)> = removes
        .iter()
        .map(|e| (e.target.as_str(), e.allowed, e.reason.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("alpha/reviewer", true, "OK"),
            ("alpha/reviewer", false, "AGENT_NOT_FOUND")
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_create_uses_the_workspaces_stored_definition_then_the_global_one_then_the_file() {
    let server = TestServer::start().await;
    // The harness's file: `worker` runs /bin/cat in every workspace.
    let file = create(&server, "alpha", "worker").await.expect("create");
    assert_eq!(server.stored_command(&file).await, ["/bin/cat"]);

    let mut operator = server.operator().await;
    operator
        .apply_agent(apply("", "worker", &["/bin/echo", "global"]))
        .await
        .expect("apply global");
    let global = create(&server, "alpha", "worker").await.expect("create");
    assert_eq!(
        server.stored_command(&global).await,
        ["/bin/echo", "global"]
    );

    operator
        .apply_agent(apply("alpha", "worker", &["/bin/echo", "alpha"]))
        .await
        .expect("apply for alpha");
    let own = create(&server, "alpha", "worker").await.expect("create");
    assert_eq!(server.stored_command(&own).await, ["/bin/echo", "alpha"]);
    // Another workspace still gets the global one.
    let other = create(&server, "beta", "worker").await.expect("create");
    assert_eq!(server.stored_command(&other).await, ["/bin/echo", "global"]);

    // Removing the stored ones brings the file back.
    operator
        .remove_agent(remove("alpha", "worker"))
        .await
        .expect("remove alpha's");
    operator
        .remove_agent(remove("", "worker"))
        .await
        .expect("remove the global one");
    let back = create(&server, "alpha", "worker").await.expect("create");
    assert_eq!(server.stored_command(&back).await, ["/bin/cat"]);

    // A definition that only the database holds is found there.
    let missing = create(&server, "alpha", "planner")
        .await
        .expect_err("no such agent");
    assert_eq!(reason(&missing), "AGENT_NOT_FOUND");
    operator
        .apply_agent(apply("alpha", "planner", &["/bin/true"]))
        .await
        .expect("apply planner");
    let planner = create(&server, "alpha", "planner").await.expect("create");
    assert_eq!(server.stored_command(&planner).await, ["/bin/true"]);
    let elsewhere = create(&server, "beta", "planner")
        .await
        .expect_err("alpha's only");
    assert_eq!(reason(&elsewhere), "AGENT_NOT_FOUND");
    server.stop().await;
}

#[tokio::test]
async fn an_agents_token_can_neither_apply_nor_list_nor_remove() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    operator
        .apply_agent(apply("alpha", "reviewer", &["/bin/echo"]))
        .await
        .expect("apply");
    let (root, mut agent, _) = server.root("alpha", TrustLevel::Direct).await;

    let refusals = [
        agent
            .apply_agent(apply("alpha", "reviewer", &["/bin/sh"]))
            .await
            .map(|_| ())
            .expect_err("an agent applies"),
        agent
            .list_agents(ListAgentsRequest::default())
            .await
            .map(|_| ())
            .expect_err("an agent lists"),
        agent
            .remove_agent(remove("alpha", "reviewer"))
            .await
            .map(|_| ())
            .expect_err("an agent removes"),
    ];
    for refusal in &refusals {
        assert_eq!(refusal.code(), Code::PermissionDenied, "{refusal:?}");
        assert_eq!(reason(refusal), "OPERATOR_ONLY");
    }
    // Nothing changed, and every refusal is audited as the agent's.
    assert_eq!(
        list(&mut operator, "").await,
        [("alpha".into(), "reviewer".into(), strings(&["/bin/echo"]))]
    );
    let caller = format!("session:{}", root.session_id);
    for action in ["apply_agent", "list_agents", "remove_agent"] {
        let refused: Vec<_> = audit_of(&server, action)
            .await
            .into_iter()
            .filter(|e| e.caller == caller)
            .collect();
        assert_eq!(refused.len(), 1, "{action}: {refused:?}");
        assert!(!refused[0].allowed);
        assert_eq!(refused[0].reason, "OPERATOR_ONLY");
    }
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_definition_is_refused_with_the_parsers_message() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    let cases = [
        ("---\nname: reviewer\n---\nNo command.\n", "no `command`"),
        ("no front matter at all", "front matter"),
        ("---\nname: other\ncommand: x\n---\n", "named"),
        ("---\ncommand: [\n---\n", "front matter:"),
    ];
    for (text, why) in cases {
        let refused = operator
            .apply_agent(ApplyAgentRequest {
                workspace_id: String::new(),
                name: "reviewer".into(),
                definition: text.into(),
            })
            .await
            .expect_err("an invalid definition is stored");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(reason(&refused), "AGENT_INVALID");
        assert!(
            refused.message().contains(why) && refused.message().contains("reviewer"),
            "{why:?} in {:?}",
            refused.message()
        );
    }
    for (name, workspace) in [("../x", ""), ("reviewer", "a/b"), ("", "")] {
        let refused = operator
            .apply_agent(ApplyAgentRequest {
                workspace_id: workspace.into(),
                name: name.into(),
                definition: agent_definition("reviewer", &["/bin/echo"]),
            })
            .await
            .expect_err("a bad name is stored");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    let huge = operator
        .apply_agent(ApplyAgentRequest {
            workspace_id: String::new(),
            name: "reviewer".into(),
            definition: format!(
                "{}{}",
                agent_definition("reviewer", &["/bin/echo"]),
                "x".repeat(64 * 1024)
            ),
        })
        .await
        .expect_err("a definition past 64 KiB is stored");
    assert_eq!(huge.code(), Code::InvalidArgument);
    assert!(list(&mut operator, "").await.is_empty());
    server.stop().await;
}
