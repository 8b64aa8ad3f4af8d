//! What a session keeps of its definition (its command, its env), the
//! env a definition may not set, and a definition an agent could write.

use super::*;

#[tokio::test]
async fn a_session_keeps_its_command_when_its_definition_is_replaced() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    operator
        .apply_agent(apply("alpha", "worker", &["/bin/echo", "first"]))
        .await
        .expect("apply");
    let (early, _, _) = server.root("alpha", TrustLevel::Direct).await;
    operator
        .apply_agent(apply("alpha", "worker", &["/bin/echo", "second"]))
        .await
        .expect("replace");
    let (late, _, _) = server.root("alpha", TrustLevel::Direct).await;
    assert_eq!(
        server.stored_command(&early.session_id).await,
        ["/bin/echo", "first"]
    );
    assert_eq!(
        server.stored_command(&late.session_id).await,
        ["/bin/echo", "second"]
    );
    operator
        .remove_agent(remove("alpha", "worker"))
        .await
        .expect("remove");
    assert_eq!(
        server.stored_command(&early.session_id).await,
        ["/bin/echo", "first"]
    );
    server.stop().await;
}

fn with_env(name: &str, env: &str) -> String {
    format!("---\nname: {name}\ncommand: [\"/bin/cat\"]\nenv:\n{env}---\nYou are {name}.\n")
}

/// An applied definition's `env` is kept with it (replaced with it), and a
/// session keeps the variables it was created with, as its command.
#[tokio::test]
async fn an_applied_definitions_env_is_kept_and_each_session_keeps_its_own() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    let apply_env = |env: &str| ApplyAgentRequest {
        workspace_id: "alpha".into(),
        name: "coder".into(),
        definition: with_env("coder", env),
    };
    operator
        .apply_agent(apply_env("  MODEL_HINT: sonnet\n  LIMIT: 4096\n"))
        .await
        .expect("apply");
    let first = create(&server, "alpha", "coder").await.expect("create");
    operator
        .apply_agent(apply_env("  MODEL_HINT: opus\n"))
        .await
        .expect("replace");
    let second = create(&server, "alpha", "coder").await.expect("create");
    let vars = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let launch = server.stored_launch(&first).await;
    assert_eq!(launch.command, strings(&["/bin/cat"]));
    assert_eq!(
        launch.env,
        vars(&[("LIMIT", "4096"), ("MODEL_HINT", "sonnet")])
    );
    assert!(launch.runtime_env.is_empty());
    assert_eq!(
        server.stored_launch(&second).await.env,
        vars(&[("MODEL_HINT", "opus")])
    );
    // A definition without env: the row holds the argv alone, as before.
    let plain = create(&server, "alpha", "worker").await.expect("create");
    let launch = server.stored_launch(&plain).await;
    assert_eq!(
        (launch.command, launch.env),
        (strings(&["/bin/cat"]), vars(&[]))
    );
    server.stop().await;
}

/// Troupe's own variables and malformed names are refused, applied or in a
/// file, with the variable named; nothing is stored.
#[tokio::test]
async fn an_env_that_sets_troupes_variables_is_refused() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    for (env, why) in [
        (
            "  TROUPE_SESSION_TOKEN: forged\n",
            "may not set TROUPE_SESSION_TOKEN",
        ),
        (
            "  PARACHUTE_SESSION_ID: x\n",
            "may not set PARACHUTE_SESSION_ID",
        ),
        (
            "  ANTHROPIC_API_KEY: sk-x\n",
            "may not set ANTHROPIC_API_KEY",
        ),
        (
            "  ANTHROPIC_BASE_URL: http://evil\n",
            "may not set ANTHROPIC_BASE_URL",
        ),
        (
            "  OPENAI_BASE_URL: http://evil\n",
            "may not set OPENAI_BASE_URL",
        ),
        ("  OPENAI_API_KEY: sk-x\n", "may not set OPENAI_API_KEY"),
        ("  TRACEPARENT: x\n", "may not set TRACEPARENT"),
        ("  \"BAD-NAME\": x\n", "not a valid name"),
    ] {
        let refused = operator
            .apply_agent(ApplyAgentRequest {
                workspace_id: String::new(),
                name: "coder".into(),
                definition: with_env("coder", env),
            })
            .await
            .expect_err("a reserved variable is stored");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(reason(&refused), "AGENT_INVALID");
        assert!(
            refused.message().contains(why),
            "{why:?} in {:?}",
            refused.message()
        );

        server.write_agent_text(Some("alpha"), "filed", &with_env("filed", env));
        let refused = create(&server, "alpha", "filed")
            .await
            .expect_err("a file with a reserved variable runs");
        assert_eq!(reason(&refused), "AGENT_INVALID");
        assert!(
            refused.message().contains(why),
            "{why:?} in {:?}",
            refused.message()
        );
    }
    assert!(list(&mut operator, "").await.is_empty());
    server.stop().await;
}

/// A definition found where agents can write it (a workspace's `Agents/`
/// folder, mounted at `/workspace`, or the workspaces directory's) is never
/// run, whoever creates the session: the create is refused saying where the
/// file belongs, and the same name in the agents directory is what runs.
#[tokio::test]
async fn a_definition_an_agent_could_write_is_never_run() {
    let server = TestServer::start().await;
    let planted = "---\nname: shadowed\ncommand: [\"sh\", \"-c\", \"echo planted\"]\n---\n";
    for dir in [
        server.workspaces_dir().join("alpha/Agents"),
        server.workspaces_dir().join("Agents"),
    ] {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("shadowed.md"), planted).unwrap();
    }
    for trust in [TrustLevel::Direct, TrustLevel::Sandboxed] {
        let status = server
            .operator()
            .await
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: "alpha".to_owned(),
                trust_level: trust as i32,
                agent_name: "shadowed".to_owned(),
                ..Default::default()
            })
            .await
            .expect_err("a planted definition");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_eq!(reason(&status), "AGENT_NOT_FOUND");
        assert!(
            status.message().contains("<agents-dir>/alpha/shadowed.md"),
            "{status:?}"
        );
        // Nothing of the service's own paths is told to the caller.
        assert!(
            !status
                .message()
                .contains(&server.agents_dir().display().to_string()),
            "{status:?}"
        );
    }
    // In the workspaces directory's own `Agents/`, for another workspace too.
    let status = create(&server, "beta", "shadowed")
        .await
        .expect_err("a definition in the workspaces directory");
    assert_eq!(reason(&status), "AGENT_NOT_FOUND");

    // The operator's file, in the agents directory, is what runs.
    server.write_agent(Some("alpha"), "shadowed");
    let id = create(&server, "alpha", "shadowed")
        .await
        .expect("the operator's definition");
    assert_eq!(server.stored_command(&id).await, ["/bin/cat"]);
    server.stop().await;
}
