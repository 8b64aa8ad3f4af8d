//! Nothing an exec prints is lost: not across a restart of the runner,
//! nor when a watcher is slow (it holds the agent back instead).

use super::*;

#[tokio::test]
async fn runner_restart_loses_no_output_and_keeps_stdin() {
    let mut runner = TestRunner::start().await;
    let ws = runner.workspace("restart");
    let mut client = runner.client().await;
    runner
        .sh(
            &ws,
            "counter",
            "i=1; while [ $i -le 60 ]; do echo line $i; i=$((i+1)); sleep 0.05; done",
        )
        .await;
    client
        .start_exec(start_request(&ws, "echoer", &["cat"]))
        .await
        .expect("start cat");
    client
        .write_stdin(WriteStdinRequest {
            exec_id: "echoer".into(),
            data: b"before ".to_vec(),
            close: false,
            ..Default::default()
        })
        .await
        .unwrap();

    // Read a few events, then restart the runner mid-stream.
    let mut seen = Collected::default();
    {
        let mut stream = watch(&mut client, "counter", 0).await;
        while seen.events.len() < 5 {
            let event = tokio_stream::StreamExt::next(&mut stream)
                .await
                .unwrap()
                .unwrap();
            seen.add(event);
        }
    }
    runner.restart().await;
    let mut client = runner.client().await;
    let last = seen.events.last().unwrap().sequence;
    let rest = collect(&mut client, "counter", last, MINUTE).await;
    for event in rest.events {
        seen.add(event);
    }
    let expected: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    assert_eq!(seen.stdout_text(), expected);
    let sequences: Vec<u64> = seen.events.iter().map(|e| e.sequence).collect();
    assert_eq!(
        sequences,
        (1..=seen.events.len() as u64).collect::<Vec<_>>()
    );

    client
        .write_stdin(WriteStdinRequest {
            exec_id: "echoer".into(),
            data: b"after".to_vec(),
            close: true,
            ..Default::default()
        })
        .await
        .expect("stdin after restart");
    let out = collect(&mut client, "echoer", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), "before after");
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);
}

#[tokio::test]
async fn a_hundred_megabytes_arrive_intact_and_a_slow_watcher_holds_the_agent_back() {
    let runner = TestRunner::start_with(|c| c.output_window_kib = 4096).await;
    let ws = runner.workspace("big");
    let script = "head -c 104857600 /dev/urandom > $TMPDIR/big; sha256sum $TMPDIR/big >&2; cat $TMPDIR/big; rm $TMPDIR/big";
    runner.sh(&ws, "big", script).await;

    // Nobody watches yet: the log stops growing near the window.
    let log = runner.exec_dir(&ws, "big").join("output.log");
    let mut size = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = std::fs::metadata(&log).unwrap().len();
        if now == size && now > 1 << 20 {
            break;
        }
        size = now;
    }
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        size > 1 << 20 && size < (4 << 20) + (1 << 20),
        "log at {size} bytes while nobody watches"
    );

    let mut client = runner.client().await;
    let out = collect(&mut client, "big", 0, MINUTE * 3).await;
    assert_eq!(out.stdout.len(), 104_857_600);
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.stdout));
    assert_eq!(
        out.stderr_text().split_whitespace().next(),
        Some(digest.as_str())
    );
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);
}
