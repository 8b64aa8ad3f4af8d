//! The end-to-end suite, one test binary: one module per area (the rules
//! of trust, quotas, messages; the store on each backend; the gateway; the
//! console in a real browser; the hostile clients). One binary links the
//! service once rather than once per area, so a clean build takes minutes
//! and gigabytes less. `cargo test -p troupe-tests --test suite -- quotas::`
//! runs one area; `scripts/test` runs the rule areas again on PostgreSQL
//! by their names.

#[path = "agents/main.rs"]
mod agents;
mod backend;
mod budget_service;
#[path = "budgets/main.rs"]
mod budgets;
#[path = "console/main.rs"]
mod console;
mod console_activity;
mod console_pages;
mod db_health;
mod decoding;
#[path = "disk/main.rs"]
mod disk;
mod fleet;
mod gateway;
mod gateway_faults;
mod gateway_gemini;
mod gateway_openai;
mod gateway_responses;
mod gateway_tls;
#[path = "groups/main.rs"]
mod groups;
mod hostile_console;
#[path = "hostile_gateway/main.rs"]
mod hostile_gateway;
mod hostile_gateway_bytes;
mod hostile_gateway_spend;
mod hostile_messages;
mod layers;
mod lease;
#[path = "lifecycle/main.rs"]
mod lifecycle;
mod output_runs;
mod parent_end;
#[path = "parent_end_store/main.rs"]
mod parent_end_store;
mod pg_migrations;
mod pg_stalled_writes;
mod pg_store;
mod placement;
mod protocol;
#[path = "quotas/main.rs"]
mod quotas;
#[path = "replicas/main.rs"]
mod replicas;
mod request_ids;
mod results_store;
mod revocation;
mod shards;
mod store;
mod tokens;
mod trust_matrix;
mod upstream;
mod watch;
mod write_scopes;
