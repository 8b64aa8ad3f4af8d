//! `troupe runner list`: the runners the session service drives, as the
//! database has them. Operator only.

use serde_json::{Value, json};
use troupe_proto::fleet::{ListRunnersRequest, Runner};

use crate::{Ctx, cli::RunnerCommand, out, table};

/// Runs one `troupe runner ...` command.
pub async fn run(ctx: &mut Ctx, command: &RunnerCommand) -> anyhow::Result<()> {
    match command {
        RunnerCommand::List => list(ctx).await,
    }
}

async fn list(ctx: &mut Ctx) -> anyhow::Result<()> {
    let runners = ctx
        .call_fleet(&ListRunnersRequest {}, |mut c, m| async move {
            c.list_runners(m).await
        })
        .await?
        .runners;
    if ctx.json {
        return out::json(&Value::Array(runners.iter().map(runner_json).collect()));
    }
    let rows: Vec<Vec<String>> = runners.iter().map(row).collect();
    out::text(&table::render(
        &["NAME", "STATE", "ACTIVE", "CAPACITY", "ROOM", "ENDPOINT"],
        &rows,
    ))
}

fn state(r: &Runner) -> &'static str {
    match (r.embedded, r.live) {
        (true, _) => "embedded",
        (false, true) => "live",
        (false, false) => "lapsed",
    }
}

/// Capacity minus active sessions; never below zero (a runner can hold
/// more than it declared after a re-registration with less).
fn room(r: &Runner) -> u32 {
    r.capacity.saturating_sub(r.active)
}

fn row(r: &Runner) -> Vec<String> {
    vec![
        r.name.clone(),
        state(r).to_owned(),
        r.active.to_string(),
        r.capacity.to_string(),
        room(r).to_string(),
        r.endpoint.clone(),
    ]
}

fn runner_json(r: &Runner) -> Value {
    json!({
        "name": r.name,
        "endpoint": r.endpoint,
        "capacity": r.capacity,
        "active": r.active,
        "room": room(r),
        "live": r.live,
        "embedded": r.embedded,
        "generation": r.generation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(embedded: bool, live: bool, capacity: u32, active: u32) -> Runner {
        Runner {
            name: "r".into(),
            endpoint: "http://r:7401".into(),
            capacity,
            active,
            live,
            embedded,
            generation: 1,
        }
    }

    #[test]
    fn state_names_embedded_live_and_lapsed_runners() {
        assert_eq!(state(&runner(true, true, 1, 0)), "embedded");
        assert_eq!(state(&runner(false, true, 1, 0)), "live");
        assert_eq!(state(&runner(false, false, 1, 0)), "lapsed");
    }

    #[test]
    fn room_never_goes_below_zero() {
        assert_eq!(room(&runner(false, true, 8, 3)), 5);
        assert_eq!(room(&runner(false, true, 2, 5)), 0);
    }
}
