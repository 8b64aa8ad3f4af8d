//! What the bridge's test files share: `troupe-mcp http` as a process.

use std::{process::Stdio, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

pub const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");

/// `troupe-mcp http` on a free port, stopped on drop.
pub struct HttpBridge {
    pub url: String,
    _child: Child,
}

impl HttpBridge {
    pub async fn start(endpoint: &str) -> HttpBridge {
        let mut child = Command::new(BRIDGE)
            .args(["http", "--listen", "127.0.0.1:0", "--endpoint", endpoint])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("bridge starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let url = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.expect("stderr line") {
                if let Some(at) = line.find("serving MCP on ") {
                    let rest = &line[at + "serving MCP on ".len()..];
                    return rest.split_whitespace().next().expect("url").to_owned();
                }
            }
            panic!("the bridge exited before listening");
        })
        .await
        .expect("the bridge listens within 10 s");
        // Keep draining its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpBridge { url, _child: child }
    }
}
