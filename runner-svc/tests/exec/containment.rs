//! One exec cannot harm another: a fork bomb is contained while the others
//! work, and a sibling reads neither another session's token nor its files.

use super::*;

#[tokio::test]
async fn fork_bomb_is_contained_while_other_execs_work() {
    let runner = TestRunner::start_with(|c| {
        c.pids_limit = 200;
        c.exec_pids_limit = 40;
    })
    .await;
    let ws = runner.workspace("bomb");
    let mut client = runner.client().await;
    runner
        .sh(
            &ws,
            "ticker",
            "i=0; while [ $i -lt 1000 ]; do echo tick$i; i=$((i+1)); sleep 0.1; done",
        )
        .await;
    wait_for_output(&mut client, "ticker", "tick1").await;
    runner
        .sh(&ws, "bomb", "b() { b | b & }; b; sleep 1000")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Another agent still starts, runs and forks.
    let out = run_sh(&runner, &ws, "neighbour", "echo $(echo alive)").await;
    assert_eq!(out.stdout_text(), "alive\n");
    let before = last_tick(&runner, "ticker").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = last_tick(&runner, "ticker").await;
    assert!(after > before, "the ticker stalled at {before} ({after})");

    let reply = client
        .terminate_exec(TerminateExecRequest {
            exec_id: "bomb".into(),
            grace_ms: 100,
        })
        .await
        .expect("terminate bomb")
        .into_inner();
    assert_eq!(reply.exec.unwrap().state(), ExecState::Exited);
    let inspect = docker()
        .await
        .inspect_container(
            &troupe_runner_svc::docker::Engine::container_name(&ws),
            None,
        )
        .await
        .unwrap();
    assert_eq!(inspect.host_config.unwrap().pids_limit, Some(200));
}

#[tokio::test]
async fn a_sibling_cannot_read_another_sessions_token_or_files() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("iso");
    let mut client = runner.client().await;
    let mut req = start_request(
        &ws,
        "victim",
        &[
            "sh",
            "-c",
            "echo $$ > /workspace/victim.pid; echo ready; sleep 1000",
        ],
    );
    req.env
        .insert("TROUPE_SESSION_TOKEN".into(), "tok-victim-secret".into());
    client.start_exec(req).await.expect("start victim");
    wait_for_output(&mut client, "victim", "ready").await;

    // The victim itself can read its environment: the probe below would see it.
    let own = run_sh(
        &runner,
        &ws,
        "victim-self",
        "cat /proc/self/environ | tr '\\0' '\\n' | grep -c TROUPE_",
    )
    .await;
    assert_ne!(own.stdout_text().trim(), "0");

    let attack = "pid=$(cat /workspace/victim.pid); \
        cat /proc/$pid/environ; echo environ=$?; \
        tr '\\0' '\\n' < /proc/$pid/environ; \
        ls /run/troupe/execs; echo list=$?; \
        cat /run/troupe/execs/victim/output.log; echo log=$?; \
        echo x > /run/troupe/execs/victim/stdin; echo stdin=$?; \
        kill -9 $pid; echo kill=$?";
    let out = run_sh(&runner, &ws, "attacker", attack).await;
    let all = format!("{}{}", out.stdout_text(), out.stderr_text());
    assert!(!all.contains("tok-victim-secret"), "token leaked:\n{all}");
    for step in ["environ", "list", "log", "stdin", "kill"] {
        let text = out.stdout_text();
        assert!(
            text.contains(&format!("{step}=")),
            "{step} did not run:\n{all}"
        );
        assert!(
            !text.contains(&format!("{step}=0")),
            "{step} succeeded:\n{all}"
        );
    }
    let victim = client
        .list_execs(ListExecsRequest {
            workspace_id: ws.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == "victim")
        .unwrap();
    assert_eq!(victim.state(), ExecState::Running);
}

async fn last_tick(runner: &TestRunner, exec_id: &str) -> u32 {
    let mut client = runner.client().await;
    // Everything printed so far: the events up to the current last sequence.
    let last = client
        .list_execs(ListExecsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == exec_id)
        .unwrap()
        .last_sequence;
    let mut stream = watch(&mut client, exec_id, 0).await;
    let mut seen = Collected::default();
    while seen.events.last().is_none_or(|e| e.sequence < last) {
        let event = tokio_stream::StreamExt::next(&mut stream).await.unwrap();
        seen.add(event.unwrap());
    }
    seen.stdout_text()
        .lines()
        .filter_map(|l| l.strip_prefix("tick")?.parse().ok())
        .max()
        .unwrap_or(0)
}
