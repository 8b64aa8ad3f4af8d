//! `troupe replica list`: the session service's replicas and the shards of
//! background work each holds, as the database has them. Operator only.

use serde_json::{Value, json};
use troupe_proto::fleet::{ListReplicasRequest, ListReplicasResponse, Replica};

use crate::{Ctx, cli::ReplicaCommand, out, table};

/// Runs one `troupe replica ...` command.
pub async fn run(ctx: &mut Ctx, command: &ReplicaCommand) -> anyhow::Result<()> {
    match command {
        ReplicaCommand::List => list(ctx).await,
    }
}

async fn list(ctx: &mut Ctx) -> anyhow::Result<()> {
    let answer = ctx
        .call_fleet(&ListReplicasRequest {}, |mut c, m| async move {
            c.list_replicas(m).await
        })
        .await?;
    if ctx.json {
        return out::json(&answer_json(&answer));
    }
    let rows: Vec<Vec<String>> = answer.replicas.iter().map(row).collect();
    let mut text = table::render(&["REPLICA", "STATE", "SHARDS", "HELD"], &rows);
    if !answer.unheld.is_empty() {
        text.push_str(&format!(
            "unheld: {} of {} shards ({})\n",
            answer.unheld.len(),
            answer.shard_count,
            ranges(&answer.unheld)
        ));
    }
    out::text(&text)
}

fn row(r: &Replica) -> Vec<String> {
    let shards: Vec<u32> = r.shards.iter().map(|t| t.shard).collect();
    vec![
        r.holder.clone(),
        if r.live { "live" } else { "lapsed" }.to_owned(),
        shards.len().to_string(),
        ranges(&shards),
    ]
}

/// Shard numbers in order as ranges: `0-15,32,40-41`; `-` for none.
fn ranges(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(",")
    }
}

fn answer_json(answer: &ListReplicasResponse) -> Value {
    json!({
        "shard_count": answer.shard_count,
        "unheld": answer.unheld,
        "replicas": answer.replicas.iter().map(|r| json!({
            "holder": r.holder,
            "live": r.live,
            "shards": r.shards.iter().map(|t| json!({"shard": t.shard, "epoch": t.epoch}))
                .collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_show_as_ranges() {
        assert_eq!(ranges(&[]), "-");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[2, 0, 1, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&(0..64).collect::<Vec<_>>()), "0-63");
    }
}
