//! The turn loop of a CLI that takes one message per run (Gemini CLI,
//! Aider): each message on Troupe's stdin, in order, becomes one run of the
//! CLI, its conversation resumed after the first; messages that come while
//! a turn runs wait, and the next turn takes them all ([`Inbox::next_turn`]). What the CLI prints goes
//! out as it comes, as the session's output, and each turn ends with one
//! line of Troupe's, the same for every CLI ([`turn_end`]: its exit code and
//! its answer, parsed from the CLI's events). A CLI without Troupe's tools
//! finishes the session itself once no message waits: its last answer is
//! the result ([`finish`]).

use std::process::Stdio;

use anyhow::Context as _;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::Command,
};
use tonic::metadata::AsciiMetadataValue;
use troupe_proto::{
    agent::env as agent_env,
    session::{self as pb, Outcome},
};

use super::{context::Context, inbox::Inbox};
use crate::backend::Backend;

/// Longest result the launcher hands over: the session service's default
/// `--max-result-bytes`.
pub const MAX_RESULT_BYTES: usize = 64 << 10;

/// One CLI's part of the loop.
pub(super) trait TurnCli: Send {
    /// Writes its configuration, once, before the first turn.
    fn prepare(&mut self, ctx: &Context) -> anyhow::Result<()>;
    /// The run that takes `message` to the model.
    fn turn(&mut self, ctx: &Context, message: &str) -> anyhow::Result<Turn>;
    /// Reads one line the turn printed.
    fn observe(&mut self, line: &str);
    /// The turn's last answer, once it ended.
    fn answer(&mut self, ctx: &Context) -> Option<String>;
}

/// One run of the CLI.
pub(super) struct Turn {
    pub command: Command,
    /// What goes on its stdin (the message), closed after it.
    pub stdin: Option<String>,
}

/// Runs turns until Troupe's stdin ends; returns the exit code.
pub(super) async fn run(ctx: &Context, cli: &mut dyn TurnCli) -> anyhow::Result<i32> {
    cli.prepare(ctx)?;
    let mut inbox = Inbox::stdin();
    let mut code = 0;
    let mut turn = 0u64;
    while let Some(message) = inbox.next_turn().await {
        turn += 1;
        code = one_turn(ctx, cli, &message).await?;
        let answer = cli.answer(ctx);
        print_line(&turn_end(ctx, turn, code, answer.as_deref())).await?;
        if !ctx.runtime.has_tools() && inbox.is_empty() {
            return finish(ctx, answer, code).await;
        }
    }
    Ok(code)
}

/// The line that ends each turn in the session's output, the same for every
/// runtime: `{"type":"troupe.turn_end","runtime":..,"turn":N,"exit_code":..,"answer":..}`
/// (`answer` null when the CLI gave none).
pub(super) fn turn_end(ctx: &Context, turn: u64, code: i32, answer: Option<&str>) -> String {
    serde_json::json!({
        "type": "troupe.turn_end",
        "runtime": ctx.runtime.as_str(),
        "turn": turn,
        "exit_code": code,
        "answer": answer,
    })
    .to_string()
}

pub(super) async fn print_line(line: &str) -> std::io::Result<()> {
    let mut stdout = tokio::io::stdout();
    stdout.write_all(line.as_bytes()).await?;
    stdout.write_all(b"\n").await?;
    stdout.flush().await
}

async fn one_turn(ctx: &Context, cli: &mut dyn TurnCli, message: &str) -> anyhow::Result<i32> {
    let Turn { mut command, stdin } = cli.turn(ctx, message)?;
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let program = command
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start {program} (is it on PATH in the image?)"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            // A CLI that exits without reading its message ends the write.
            let _ = pipe.write_all(text.as_bytes()).await;
        });
    }
    let mut out = BufReader::new(child.stdout.take().context("the turn's stdout")?);
    let mut stdout = tokio::io::stdout();
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if out.read_until(b'\n', &mut raw).await? == 0 {
            break;
        }
        // A last line cut short still ends, so Troupe's line starts its own.
        if !raw.ends_with(b"\n") {
            raw.push(b'\n');
        }
        stdout.write_all(&raw).await?;
        stdout.flush().await?;
        cli.observe(String::from_utf8_lossy(&raw).trim_end_matches(['\n', '\r']));
    }
    let status = child.wait().await?;
    Ok(exit_code(status))
}

/// The code a shell would give: the exit code, or 128+n for signal n.
pub(super) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Ends the session's task with the CLI's last answer as its result:
/// `success` when the last turn exited 0 with an answer, else `failure`.
async fn finish(ctx: &Context, answer: Option<String>, code: i32) -> anyhow::Result<i32> {
    let outcome = if code == 0 && answer.is_some() {
        Outcome::Success
    } else {
        Outcome::Failure
    };
    let result = answer.unwrap_or_else(|| {
        format!(
            "{} gave no answer (its last turn exited with code {code})",
            ctx.runtime
        )
    });
    let request = pb::FinishSessionRequest {
        result: bounded(result, MAX_RESULT_BYTES),
        outcome: outcome as i32,
    };
    let token = std::env::var(agent_env::SESSION_TOKEN).context("no session token")?;
    let endpoint = std::env::var(agent_env::SESSION_ENDPOINT).context("no session endpoint")?;
    let auth = AsciiMetadataValue::try_from(format!("Bearer {token}"))
        .context("the session token is not ASCII")?;
    let traceparent = std::env::var(agent_env::TRACEPARENT)
        .ok()
        .and_then(|t| AsciiMetadataValue::try_from(t).ok());
    let backend = Backend::new(endpoint);
    let session = backend
        .session(auth, traceparent)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the session service: {e:?}"))?;
    session
        .call(
            &request,
            |mut c, r| async move { c.finish_session(r).await },
        )
        .await
        .map_err(|s| anyhow::anyhow!("finish was refused: {}", s.message()))?;
    eprintln!("troupe-mcp agent: {} finished its task", ctx.runtime);
    Ok(code)
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(super) fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_ends_with_one_line_of_troupes() {
        let ctx = crate::agent::context::tests::context(
            troupe_proto::agent::Runtime::Codex,
            std::path::Path::new("/h"),
        );
        let line = turn_end(&ctx, 2, 0, Some("done\n"));
        assert!(!line.contains('\n'), "{line}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            serde_json::json!({"type": "troupe.turn_end", "runtime": "codex", "turn": 2,
                               "exit_code": 0, "answer": "done\n"})
        );
        let none = turn_end(&ctx, 1, 1, None);
        assert!(none.contains("\"answer\":null"), "{none}");
    }

    #[test]
    fn a_result_is_cut_at_a_character_boundary() {
        assert_eq!(bounded("héllo".into(), 2), "h");
        assert_eq!(bounded("héllo".into(), 3), "hé");
        assert_eq!(bounded("abc".into(), 10), "abc");
    }
}
