//! Health that follows the database, on PostgreSQL behind a proxy the test
//! can partition: while the database cannot be reached (connections open
//! but silent, as in a network partition), the health service reports
//! NOT_SERVING and Troupe's calls fail at once with UNAVAILABLE instead of
//! hanging until their deadline; when it answers again, SERVING, and calls
//! work. PostgreSQL only: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::net::{TcpListener, TcpStream};
use tonic::{Code, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use troupe_proto::session::ListWorkspaceSessionsRequest;
use troupe_tests::{TestServer, postgres};

/// A TCP proxy to PostgreSQL that, while `cut`, forwards nothing either
/// way (new connections are accepted and left silent).
struct Partition {
    addr: std::net::SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Partition {
    async fn start(upstream: String) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let flag = flag.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, flag.clone()), pump(sr, cw, flag));
                });
            }
        });
        Partition { addr, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, holding every byte back while `cut`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `url` with its host and port replaced by `addr`.
fn through(url: &str, addr: std::net::SocketAddr) -> (String, String) {
    let scheme_end = url.find("://").unwrap() + 3;
    let rest = &url[scheme_end..];
    let at = rest.find('@').map_or(0, |i| i + 1);
    let host_end = rest[at..].find(['/', '?']).map_or(rest.len(), |i| at + i);
    let upstream = rest[at..host_end].to_owned();
    let proxied = format!(
        "{}{}{addr}{}",
        &url[..scheme_end],
        &rest[..at],
        &rest[host_end..]
    );
    (proxied, upstream)
}

async fn status(channel: Channel) -> Result<i32, tonic::Status> {
    Ok(HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "troupe.session.v1.SessionService".into(),
        })
        .await?
        .into_inner()
        .status)
}

async fn wait_for(channel: &Channel, want: ServingStatus, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = status(channel.clone()).await;
        if got.as_ref().ok() == Some(&(want as i32)) {
            return;
        }
        assert!(Instant::now() < deadline, "never {want:?}: {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_health_follows_the_database_and_calls_fail_fast_while_it_is_away() {
    let url = postgres::fresh_database().await;
    let (_, upstream) = through(&url, "127.0.0.1:1".parse().unwrap());
    let partition = Partition::start(upstream).await;
    let (proxied, _) = through(&url, partition.addr);
    let server = TestServer::start_on(postgres::Backend::Postgres, |c| {
        c.database_url = Some(proxied);
    })
    .await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (root, mut agent, _) = server
        .root("alpha", troupe_proto::session::TrustLevel::Direct)
        .await;
    wait_for(&channel, ServingStatus::Serving, Duration::from_secs(5)).await;

    partition.set_cut(true);
    wait_for(&channel, ServingStatus::NotServing, Duration::from_secs(10)).await;
    let asked = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        agent.list_workspace_sessions(ListWorkspaceSessionsRequest::default()),
    )
    .await
    .expect("a call while the database is away answers at once")
    .expect_err("no database");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("database"), "{refused:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );

    partition.set_cut(false);
    wait_for(&channel, ServingStatus::Serving, Duration::from_secs(20)).await;
    let listed = agent
        .list_workspace_sessions(ListWorkspaceSessionsRequest::default())
        .await
        .expect("the database is back")
        .into_inner();
    assert!(
        listed
            .sessions
            .iter()
            .any(|s| s.session_id == root.session_id),
        "{listed:?}"
    );
    server.stop().await;
}
