//! [`TestServer`]: a session service running in this process, on `127.0.0.1:0`
//! with its own data directory: started, restarted on the same data,
//! stopped (propagating its errors); on PostgreSQL, replicas sharing its
//! database.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use troupe_proto::session::{self as pb, TrustLevel, session_service_client::SessionServiceClient};
use troupe_session_svc::{Config, Limits};

use crate::{Bearer, Client, OPERATOR_TOKEN, get, postgres};

/// A session service running in this process, on SQLite in its data
/// directory or, with `TROUPE_TEST_BACKEND=postgres`, on a fresh PostgreSQL
/// database (see [`postgres`]).
pub struct TestServer {
    pub addr: SocketAddr,
    pub config: Config,
    /// Its own directory first, then those of the server it replicates
    /// (whose workspaces it uses); kept until the server task is gone.
    dirs: Vec<Arc<tempfile::TempDir>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Starts a server with default limits, except unlimited spawn and
    /// message rates.
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    /// Starts a server after `adjust` has changed its configuration, on the
    /// backend `TROUPE_TEST_BACKEND` names ([`postgres::Backend::from_env`]).
    /// Its database is chosen first, so `adjust` sees it and may change it.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        TestServer::start_on(postgres::Backend::from_env(), adjust).await
    }

    /// Starts a server on `backend` (whatever `TROUPE_TEST_BACKEND` says)
    /// after `adjust` has changed its configuration.
    pub async fn start_on(
        backend: postgres::Backend,
        adjust: impl FnOnce(&mut Config),
    ) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::with_data_dir(dir.path().join("data"));
        config.operator_token = Some(OPERATOR_TOKEN.to_owned());
        config.workspaces_dir = Some(dir.path().join("workspaces"));
        config.agents_dir = Some(dir.path().join("agents"));
        config.database_url = match backend {
            postgres::Backend::Sqlite => None,
            postgres::Backend::Postgres => Some(postgres::fresh_database().await),
        };
        config.limits = Limits {
            spawn_rate_per_sec: 0.0,
            ..Limits::default()
        };
        config.messaging.message_rate_per_sec = 0.0;
        adjust(&mut config);
        let mut server = TestServer {
            addr: "127.0.0.1:0".parse().expect("addr"),
            config,
            dirs: vec![Arc::new(dir)],
            shutdown: None,
            task: None,
        };
        server.write_agent(None, "worker");
        server.launch().await;
        server
    }

    /// Starts another server on this one's PostgreSQL database, with the
    /// same configuration (operator token and workspaces included) but its
    /// own port and data directory (its Unix socket). Panics on SQLite:
    /// replicas share a PostgreSQL database.
    pub async fn replica(&self) -> TestServer {
        self.replica_with(|_| {}).await
    }

    /// As [`TestServer::replica`], after `adjust` has changed the replica's
    /// configuration.
    pub async fn replica_with(&self, adjust: impl FnOnce(&mut Config)) -> TestServer {
        let url = self.config.database_url();
        assert!(
            postgres::is_postgres(&url),
            "replicas share a PostgreSQL database; this server is on {url} \
             (run with {}=postgres)",
            postgres::BACKEND_ENV
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = self.config.clone();
        config.data_dir = dir.path().join("data");
        if config.socket().is_some() {
            config.socket = None; // its own, in its data directory
        }
        adjust(&mut config);
        let mut dirs = vec![Arc::new(dir)];
        dirs.extend(self.dirs.iter().cloned());
        let mut server = TestServer {
            addr: "127.0.0.1:0".parse().expect("addr"),
            config,
            dirs,
            shutdown: None,
            task: None,
        };
        server.launch().await;
        server
    }

    /// Serves on a fresh port the first time, and on the same one after a
    /// restart, so that clients (and a CLI given the address) find it again;
    /// on a fresh one if another test took that port meanwhile.
    async fn launch(&mut self) {
        let listener = match TcpListener::bind(self.addr).await {
            Ok(listener) => listener,
            Err(_) => TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        };
        self.addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel();
        let config = self.config.clone();
        self.shutdown = Some(tx);
        self.task = Some(tokio::spawn(troupe_session_svc::serve(
            config,
            listener,
            async move {
                let _ = rx.await;
            },
        )));
    }

    /// Waits until something accepts connections at `addr`, a listener of
    /// this server's (its console, say), within a minute; panics with the
    /// server's own error if it stopped instead.
    pub async fn wait_listening(&mut self, addr: SocketAddr) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if self.task.as_ref().is_some_and(JoinHandle::is_finished) {
                let ended = self.task.take().expect("the task").await;
                panic!("the server stopped before {addr} listened: {ended:?}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nothing listens on {addr}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Stops the server, waits for it, and starts it again on the same data.
    pub async fn restart(&mut self) {
        self.stop_inner().await;
        self.launch().await;
    }

    async fn stop_inner(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("server task panicked")
                .expect("server failed");
        }
    }

    /// Stops the server; panics if it failed.
    /// Stops the server, keeping its data, until [`TestServer::start_again`].
    pub async fn stop_for_restart(&mut self) {
        self.stop_inner().await;
    }

    /// Starts a stopped server again on the same data.
    pub async fn start_again(&mut self) {
        self.launch().await;
    }

    pub async fn stop(mut self) {
        self.stop_inner().await;
    }

    /// Root of the workspaces directory.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.config.workspaces_dir.clone().expect("workspaces dir")
    }

    /// Root of the agent definition files.
    pub fn agents_dir(&self) -> PathBuf {
        self.config.agents_dir.clone().expect("agents dir")
    }

    /// Writes a valid agent definition, in `workspace` or (None) shared by all workspaces.
    pub fn write_agent(&self, workspace: Option<&str>, name: &str) -> PathBuf {
        self.write_agent_text(
            workspace,
            name,
            &format!("---\nname: {name}\ndescription: test agent\ncommand: [\"/bin/cat\"]\n---\nYou are {name}.\n"),
        )
    }

    /// Writes an agent file with the given contents.
    pub fn write_agent_text(&self, workspace: Option<&str>, name: &str, text: &str) -> PathBuf {
        let mut dir = self.agents_dir();
        if let Some(ws) = workspace {
            dir = dir.join(ws);
        }
        std::fs::create_dir_all(&dir).expect("agents dir");
        let path = dir.join(format!("{name}.md"));
        std::fs::write(&path, text).expect("agent file");
        path
    }

    /// The command a session was created with, as its row in the database
    /// keeps it (what the runner is asked to start), read on a connection
    /// of the test's own.
    pub async fn stored_command(&self, session_id: &str) -> Vec<String> {
        self.stored_launch(session_id).await.command
    }

    /// The command and the definition's variables a session was created
    /// with, as its row keeps them.
    pub async fn stored_launch(&self, session_id: &str) -> troupe_session_svc::agents::Started {
        let text = self.stored_column(session_id, "agent_command").await;
        serde_json::from_str::<troupe_session_svc::agents::Launch>(&text)
            .expect("a JSON argv, an argv and its env, or a runtime")
            .into_parts()
    }

    /// The write scope a session's row keeps (empty: the whole workspace).
    pub async fn stored_scope(&self, session_id: &str) -> Vec<String> {
        let text = self.stored_column(session_id, "writable_paths").await;
        serde_json::from_str(&text).expect("a JSON array of paths")
    }

    /// A text column of a session's row, read on a connection of the test's own.
    async fn stored_column(&self, session_id: &str, column: &str) -> String {
        use sqlx::{AssertSqlSafe, Connection};
        let sql = format!("SELECT {column} FROM sessions WHERE session_id = $1");
        let sql = AssertSqlSafe(sql.as_str());
        let url = self.config.database_url();
        let text: String = if postgres::is_postgres(&url) {
            let mut db = sqlx::PgConnection::connect(&url).await.expect("connect");
            sqlx::query_scalar(sql)
                .bind(session_id)
                .fetch_one(&mut db)
                .await
        } else {
            let url = url.replace("mode=rwc", "mode=ro");
            let mut db = sqlx::SqliteConnection::connect(&url).await.expect("open");
            sqlx::query_scalar(sql)
                .bind(session_id)
                .fetch_one(&mut db)
                .await
        }
        .expect("the session's row");
        text
    }

    /// What `sql`, a query of one BIGINT (write `CAST(... AS BIGINT)` for a
    /// sum), answers on this server's database, read on a connection of the
    /// test's own.
    pub async fn stored_number(&self, sql: &'static str) -> i64 {
        use sqlx::Connection;
        let url = self.config.database_url();
        if postgres::is_postgres(&url) {
            let mut db = sqlx::PgConnection::connect(&url).await.expect("connect");
            sqlx::query_scalar(sql).fetch_one(&mut db).await
        } else {
            let url = url.replace("mode=rwc", "mode=ro");
            let mut db = sqlx::SqliteConnection::connect(&url).await.expect("open");
            sqlx::query_scalar(sql).fetch_one(&mut db).await
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// A client carrying `token` (or none).
    pub async fn client(&self, token: Option<&str>) -> Client {
        let channel = troupe_proto::endpoint::connect(&format!("http://{}", self.addr))
            .await
            .expect("connect");
        SessionServiceClient::with_interceptor(channel, Bearer::new(token).expect("ascii token"))
    }

    /// A client carrying the operator token.
    pub async fn operator(&self) -> Client {
        self.client(Some(OPERATOR_TOKEN)).await
    }

    /// Creates a root session; returns it and a client acting as it.
    pub async fn root(&self, workspace: &str, trust: TrustLevel) -> (pb::Session, Client, String) {
        let response = self
            .operator()
            .await
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: workspace.to_owned(),
                trust_level: trust as i32,
                title: format!("{workspace} root"),
                agent_name: "worker".to_owned(),
                initial_message: "start".to_owned(),
                request_id: String::new(),
                budget: None,
                writable_paths: Vec::new(),
            })
            .await
            .expect("create root")
            .into_inner();
        let client = self.client(Some(&response.session_token)).await;
        (
            response.session.expect("session"),
            client,
            response.session_token,
        )
    }

    /// The operator's view of a session: it, its children, its inbox count.
    pub async fn get(&self, session_id: &str) -> pb::GetSessionResponse {
        self.operator()
            .await
            .get_session(get(session_id))
            .await
            .expect("get")
            .into_inner()
    }

    /// Returns a client acting as `session_id`, with a token the operator had issued.
    pub async fn act_as(&self, session_id: &str) -> Client {
        let token = self.token_for(session_id).await;
        self.client(Some(&token)).await
    }

    /// `troupe-mcp` (the binary at `bridge`) as an agent's MCP client
    /// starts it, over stdio: acting as `session_id` with a token of its
    /// own, reaching this server over its Unix socket as agents in
    /// containers do. Killed when dropped.
    pub async fn bridge(
        &self,
        bridge: impl AsRef<std::ffi::OsStr>,
        session_id: &str,
    ) -> tokio::process::Command {
        let socket = self.config.socket().expect("a Unix socket");
        let mut command = tokio::process::Command::new(bridge);
        command
            .env("TROUPE_SESSION_TOKEN", self.token_for(session_id).await)
            .env(
                "TROUPE_SESSION_ENDPOINT",
                format!("unix://{}", socket.display()),
            )
            .kill_on_drop(true);
        command
    }

    /// Issues a token for `session_id`.
    pub async fn token_for(&self, session_id: &str) -> String {
        self.operator()
            .await
            .issue_session_token(pb::IssueSessionTokenRequest {
                session_id: session_id.to_owned(),
            })
            .await
            .expect("issue token")
            .into_inner()
            .session_token
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // Keep the data directories alive until the server task is gone.
        if let (Some(task), Ok(runtime)) = (self.task.take(), tokio::runtime::Handle::try_current())
        {
            let dirs = std::mem::take(&mut self.dirs);
            runtime.spawn(async move {
                let _ = task.await;
                drop(dirs);
            });
        }
    }
}
