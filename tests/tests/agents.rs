//! Agent definitions kept in the database, over gRPC: operators apply, list,
//! replace and remove them; a create looks up the workspace's definition in
//! the database, then the one for every workspace, then the files; an
//! agent's token manages none of them; an invalid definition is refused
//! with the parser's message; a session keeps the command it was created
//! with. On SQLite, or PostgreSQL with `TROUPE_TEST_BACKEND=postgres`.

use tonic::Code;
use troupe_proto::session::{
    self as pb, ApplyAgentRequest, ListAgentsRequest, ListAuditRequest, RemoveAgentRequest,
    TrustLevel,
};
use troupe_tests::{Client, TestServer, agent_definition, reason};

fn apply(workspace: &str, name: &str, command: &[&str]) -> ApplyAgentRequest {
    ApplyAgentRequest {
        workspace_id: workspace.to_owned(),
        name: name.to_owned(),
        definition: agent_definition(name, command),
    }
}

fn remove(workspace: &str, name: &str) -> RemoveAgentRequest {
    RemoveAgentRequest {
        workspace_id: workspace.to_owned(),
        name: name.to_owned(),
    }
}

async fn list(client: &mut Client, workspace: &str) -> Vec<(String, String, Vec<String>)> {
    client
        .list_agents(ListAgentsRequest {
            workspace_id: workspace.to_owned(),
        })
        .await
        .expect("list agents")
        .into_inner()
        .agents
        .into_iter()
        .map(|a| (a.workspace_id, a.name, a.command))
        .collect()
}

/// Creates a root session of `agent` in `workspace`; returns its id.
async fn create(
    server: &TestServer,
    workspace: &str,
    agent: &str,
) -> Result<String, tonic::Status> {
    let created = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: workspace.to_owned(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: agent.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(created.into_inner().session.expect("a session").session_id)
}

async fn audit_of(server: &TestServer, action: &str) -> Vec<pb::AuditEntry> {
    let entries = server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries;
    entries.into_iter().filter(|e| e.action == action).collect()
}

fn strings(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|a| (*a).to_owned()).collect()
}

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
    assert_eq!(
        server.stored_launch(&first).await,
        (
            strings(&["/bin/cat"]),
            vars(&[("LIMIT", "4096"), ("MODEL_HINT", "sonnet")])
        )
    );
    assert_eq!(
        server.stored_launch(&second).await.1,
        vars(&[("MODEL_HINT", "opus")])
    );
    // A definition without env: the row holds the argv alone, as before.
    let plain = create(&server, "alpha", "worker").await.expect("create");
    assert_eq!(
        server.stored_launch(&plain).await,
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
