//! What a start asks for: [`StartSpec`], its checks, made before anything
//! is created, and the environment the exec gets.

use std::collections::HashMap;

use troupe_proto::{agent::env as agent_env, scope::WriteScope};

use crate::{
    exec::{ExecError, Frame, StdinInput},
    layout,
};

/// What a caller asks to run.
#[derive(Clone, Debug, Default)]
pub struct StartSpec {
    pub exec_id: String,
    pub workspace_id: String,
    pub command: Vec<String>,
    pub env: HashMap<String, String>,
    /// Written right after start, before any later write.
    pub initial_stdin: StdinInput,
    pub working_dir: String,
    pub timeout_ms: u64,
    pub traceparent: String,
    pub labels: HashMap<String, String>,
    /// What the exec may write under (see [`WriteScope`]); as given, checked by [`validate`].
    pub writable_paths: Vec<String>,
}

/// The environment of an exec: the caller's, with Troupe's defaults. The
/// session service gives its agents their whole context ([`AgentEnv`]);
/// a caller that starts an exec by hand gets the `PARACHUTE_*` aliases of
/// what it gives, and the exec's and workspace's ids as the session's and
/// workspace's when it gives none.
///
/// [`AgentEnv`]: troupe_proto::agent::AgentEnv
pub fn environment(
    spec: &StartSpec,
    container_dir: &str,
    default_endpoint: Option<&str>,
) -> Vec<String> {
    let mut env = spec.env.clone();
    agent_env::add_aliases(&mut env);
    env.entry(agent_env::SESSION_ID.into())
        .or_insert_with(|| spec.exec_id.clone());
    env.entry(agent_env::WORKSPACE_ID.into())
        .or_insert_with(|| spec.workspace_id.clone());
    if let Some(endpoint) = default_endpoint {
        env.entry(agent_env::SESSION_ENDPOINT.into())
            .or_insert_with(|| endpoint.to_owned());
    }
    if !spec.traceparent.is_empty() {
        env.insert("TRACEPARENT".into(), spec.traceparent.clone());
    }
    env.entry("HOME".into())
        .or_insert_with(|| format!("{container_dir}/{}", layout::HOME));
    env.entry("TMPDIR".into())
        .or_insert_with(|| format!("{container_dir}/{}", layout::TMP));
    env.entry("PATH".into()).or_insert_with(|| {
        format!(
            "{}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
            layout::CONTAINER_TOOLS
        )
    });
    let mut env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.sort();
    env
}

/// Checks a start request before anything is created.
pub fn validate(spec: &StartSpec) -> Result<(), ExecError> {
    let invalid = |m: String| Err(ExecError::Invalid(m));
    if !troupe_proto::names::is_slug(&spec.exec_id) {
        return invalid(format!(
            "exec_id {:?} must be 1 to 64 letters, digits, '-' or '_'",
            spec.exec_id
        ));
    }
    if !troupe_proto::names::is_slug(&spec.workspace_id) {
        return invalid(format!(
            "workspace_id {:?} must be 1 to 64 letters, digits, '-' or '_', starting with a letter or digit",
            spec.workspace_id
        ));
    }
    if spec.command.is_empty() || spec.command[0].is_empty() {
        return invalid("command must name a program".into());
    }
    if spec.command.iter().any(|a| a.contains('\0')) {
        return invalid("command arguments must not contain NUL".into());
    }
    for (key, value) in &spec.env {
        let good_key = !key.is_empty()
            && !key.as_bytes()[0].is_ascii_digit()
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !good_key || value.contains('\0') {
            return invalid(format!("environment variable {key:?} is not valid"));
        }
    }
    if !spec.working_dir.is_empty() && !spec.working_dir.starts_with('/') {
        return invalid("working_dir must be absolute".into());
    }
    write_scope(spec)?;
    Ok(())
}

/// The exec's write scope, normalised.
pub fn write_scope(spec: &StartSpec) -> Result<WriteScope, ExecError> {
    WriteScope::parse(&spec.writable_paths).map_err(ExecError::Invalid)
}

/// What a request gives stdin: its unsequenced `data` or its `frames`,
/// not both; frames numbered from 1, increasing.
pub fn stdin_input(data: Vec<u8>, frames: Vec<Frame>) -> Result<StdinInput, ExecError> {
    if frames.is_empty() {
        return Ok(StdinInput::Bytes(data));
    }
    if !data.is_empty() {
        return Err(ExecError::Invalid(
            "stdin is given either as data or as frames, not both".into(),
        ));
    }
    let mut last = 0;
    for frame in &frames {
        if frame.sequence <= last {
            return Err(ExecError::Invalid(format!(
                "stdin frame sequences must start at 1 and increase ({} after {last})",
                frame.sequence
            )));
        }
        last = frame.sequence;
    }
    Ok(StdinInput::Frames(frames))
}
