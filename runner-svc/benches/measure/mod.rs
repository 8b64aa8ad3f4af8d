//! What the runner benchmarks share: percentiles, and the bare `docker exec`
//! that Troupe is measured against.

use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;
use troupe_tests::bench::percentile;

/// p50 and p99 of `ms`.
pub fn percentiles(ms: &mut [f64]) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (percentile(ms, 50.0), percentile(ms, 99.0))
}

/// A duration in milliseconds.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Starts `cmd` as a bare `docker exec`, attached; returns its output stream.
pub async fn bare_exec(
    docker: &bollard::Docker,
    container: &str,
    uid: &str,
    cmd: &[&str],
) -> impl futures::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>> {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                user: Some(uid.to_owned()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    match docker.start_exec(&created.id, None).await.unwrap() {
        StartExecResults::Attached { output, .. } => output,
        StartExecResults::Detached => panic!("detached"),
    }
}

/// A bare `docker exec` of `cmd`, timed from the call to its first output byte.
pub async fn bare_first_byte(
    docker: &bollard::Docker,
    container: &str,
    uid: &str,
    cmd: &[&str],
) -> f64 {
    let t = Instant::now();
    let mut output = bare_exec(docker, container, uid, cmd).await;
    let first = output.next().await.unwrap().unwrap();
    assert!(!first.into_bytes().is_empty());
    let elapsed = t.elapsed();
    while output.next().await.is_some() {}
    millis(elapsed)
}
