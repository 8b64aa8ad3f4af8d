//! `troupe audit`: the audit log, oldest first, as a table or JSON.

use serde_json::Value;
use troupe_proto::session::ListAuditRequest;

use crate::{Ctx, cli::AuditArgs, out, render, table};

pub async fn run(ctx: &mut Ctx, args: &AuditArgs) -> anyhow::Result<()> {
    let request = ListAuditRequest {
        session_id: args.session.clone().unwrap_or_default(),
        after_id: args.after,
        limit: args.limit,
    };
    let entries = ctx
        .call(&request, |mut c, m| async move { c.list_audit(m).await })
        .await?
        .entries;
    if ctx.json {
        return out::json(&Value::Array(
            entries.iter().map(render::audit_entry).collect(),
        ));
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                render::time_seconds(e.at.as_ref()),
                e.caller.clone(),
                e.action.clone(),
                render::or_dash(&e.target).to_owned(),
                if e.allowed { "yes" } else { "no" }.to_owned(),
                render::or_dash(&e.reason).to_owned(),
                e.detail.clone(),
            ]
        })
        .collect();
    out::text(&table::render(
        &[
            "ID", "AT", "CALLER", "ACTION", "TARGET", "ALLOWED", "REASON", "DETAIL",
        ],
        &rows,
    ))?;
    let limit = match args.limit {
        0 => 100,
        n => n.min(10_000),
    };
    if let Some(last) = entries.last().filter(|_| entries.len() >= limit as usize) {
        eprintln!("more entries may follow: pass --after {}", last.id);
    }
    Ok(())
}
