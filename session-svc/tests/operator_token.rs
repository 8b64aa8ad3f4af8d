//! The operator token lives in the database: `troupe-session` processes
//! started in turn on one database, each with a data directory of its own,
//! share the first one's token (writing it to their token file, mode 0600);
//! one configured with another token refuses to start, naming neither; and
//! no token reaches a log. On SQLite (the same file through
//! `--database-url`), or PostgreSQL with `TROUPE_TEST_BACKEND=postgres`.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::process::{Child, Command};
use troupe_proto::session::ListAuditRequest;
use troupe_tests::postgres::{self, Backend};

const BINARY: &str = env!("CARGO_BIN_EXE_troupe-session");

/// A fresh database: a SQLite file in `dir`, or a fresh PostgreSQL database.
async fn database(dir: &Path) -> String {
    match Backend::from_env() {
        Backend::Sqlite => format!("sqlite://{}?mode=rwc", dir.join("shared.db").display()),
        Backend::Postgres => postgres::fresh_database().await,
    }
}

/// One `troupe-session` process, its stderr kept in a file.
struct Service {
    child: Child,
    endpoint: String,
    data: PathBuf,
    log: PathBuf,
}

impl Service {
    /// Starts the binary on `url` with the data directory `dir/name`, the
    /// operator token `configured` in its environment if given (and none
    /// otherwise), logging everything.
    fn start(dir: &Path, name: &str, url: &str, configured: Option<&str>) -> Service {
        let port = troupe_tests::ports::free_addr().port();
        let data = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        let mut command = Command::new(BINARY);
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--socket", "none"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--workspaces-dir")
            .arg(dir.join("workspaces"))
            .args(["--database-url", url])
            .env_remove("TROUPE_OPERATOR_TOKEN")
            .env("RUST_LOG", "trace")
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        for (name, _) in std::env::vars() {
            if name.starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        if let Some(token) = configured {
            command.env("TROUPE_OPERATOR_TOKEN", token);
        }
        Service {
            child: command.spawn().expect("troupe-session starts"),
            endpoint: format!("http://127.0.0.1:{port}"),
            data,
            log,
        }
    }

    /// Waits until an operator call with `token` succeeds.
    async fn answers(&self, token: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let call = async {
                let channel = troupe_proto::endpoint::connect(&self.endpoint).await.ok()?;
                let auth = troupe_proto::endpoint::Bearer::new(Some(token)).ok()?;
                let mut client =
                    troupe_proto::session::session_service_client::SessionServiceClient::with_interceptor(
                        channel, auth,
                    );
                client.list_audit(ListAuditRequest::default()).await.ok()
            };
            if call.await.is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no operator call with that token succeeded on {}: {}",
                self.endpoint,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The token file of its data directory, once it exists, and its mode.
    async fn token_file(&self) -> (String, u32) {
        let path = self.data.join("operator.token");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && !text.trim().is_empty()
            {
                let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
                return (text.trim().to_owned(), mode);
            }
            assert!(
                Instant::now() < deadline,
                "no token file: {}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops it with SIGTERM; panics unless it exits cleanly.
    async fn stop(mut self) -> String {
        let pid = self.child.id().expect("running").to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().await;
        assert!(killed.unwrap().success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("stops after SIGTERM")
            .unwrap();
        assert!(status.success(), "{status:?}: {}", self.log_text());
        self.log_text()
    }

    /// How it exited, if it did within a while.
    async fn exit(mut self) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits")
            .unwrap();
        (status, self.log_text())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn assert_secret(token: &str, logs: &[&str]) {
    for log in logs {
        assert!(
            !log.contains(token),
            "a log holds the operator token:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn services_in_turn_on_one_database_share_the_first_ones_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = database(dir.path()).await;

    // The first start generates a token, stores it, writes it to its file.
    let first = Service::start(dir.path(), "one", &url, None);
    let (token, mode) = first.token_file().await;
    assert_eq!(mode, 0o600, "the token file is its owner's alone");
    first.answers(&token).await;
    let first_log = first.stop().await;

    // A newcomer with an empty data directory adopts it.
    let second = Service::start(dir.path(), "two", &url, None);
    second.answers(&token).await;
    let (adopted, mode) = second.token_file().await;
    assert_eq!(adopted, token);
    assert_eq!(mode, 0o600);
    let second_log = second.stop().await;

    // One whose file holds another token adopts the database's too, and
    // its file holds it from then on.
    let stale = "troupe-op-a-stale-token-of-another-database";
    std::fs::create_dir_all(dir.path().join("three")).unwrap();
    let file = dir.path().join("three/operator.token");
    std::fs::write(&file, stale).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let third = Service::start(dir.path(), "three", &url, None);
    third.answers(&token).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    let third_log = third.stop().await;

    // One configured with the same token starts as well.
    let fourth = Service::start(dir.path(), "four", &url, Some(&token));
    fourth.answers(&token).await;
    let fourth_log = fourth.stop().await;

    assert!(
        third_log.contains("operator token"),
        "the adoption is logged: {third_log}"
    );
    assert_secret(&token, &[&first_log, &second_log, &third_log, &fourth_log]);
    assert_secret(stale, &[&third_log]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_token_other_than_the_databases_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = database(dir.path()).await;
    let stored = "troupe-op-the-first-configured-token";
    let other = "troupe-op-another-configured-token";

    let first = Service::start(dir.path(), "one", &url, Some(stored));
    first.answers(stored).await;
    let first_log = first.stop().await;

    let refused = Service::start(dir.path(), "two", &url, Some(other));
    let (status, log) = refused.exit().await;
    assert!(!status.success(), "it started: {log}");
    assert!(
        log.contains("is not the one this database holds"),
        "the error says why: {log}"
    );
    // On one line of its own, even with backtraces asked for, not as a
    // Debug print with a backtrace.
    let line = log
        .lines()
        .find(|l| l.contains("is not the one this database holds"))
        .unwrap_or_default();
    assert!(line.starts_with("troupe-session: "), "{log}");
    assert!(
        !log.contains("Stack backtrace") && !log.contains("Caused by"),
        "{log}"
    );
    assert_secret(stored, &[&first_log, &log]);
    assert_secret(other, &[&log]);

    // The database's token is unchanged: a service with it starts.
    let again = Service::start(dir.path(), "three", &url, Some(stored));
    again.answers(stored).await;
    again.stop().await;
}
