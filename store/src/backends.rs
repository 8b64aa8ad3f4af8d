//! One text for both backends: [`each_backend!`] expands the code given to
//! it once for SQLite and once for PostgreSQL, each in a module of its own
//! (`sqlite`, `postgres`), where these names stand for that backend's:
//!
//! - `This`: the store type ([`super::SqliteStore`], [`super::PgStore`]),
//!   whose `pool` is the pool reads run on;
//! - `Tx`, begun by `This::tx`: a write transaction (SQLite: `BEGIN
//!   IMMEDIATE` on the one writer; PostgreSQL: a pooled connection), with
//!   `conn()` and `commit()`; one dropped before its commit is rolled back;
//! - `Batched`, begun by `This::batched`: the transaction of a create or a
//!   message (`creates`, `messages`), whose writes SQLite sends as one batch
//!   at its commit, so its reads see the database before its writes
//!   (PostgreSQL's is a `Tx`); its primitives: `claim`, `remember`, `audit`,
//!   `events`, `workspace_active`, `spawn_facts`, `count_root`,
//!   `count_child`, `insert_session`, `account`, `body`, `entry`, `rate`,
//!   `set_rate`, `audience`, `lock_rows`, `lock_row`, `clear_callback`;
//! - `This::write_conn`: a connection for a write of one statement;
//! - `Db` and `Conn`: the backend's sqlx database and connection types;
//! - `retrying!(async { .. })`: runs a whole transaction (the block), again
//!   while it loses a lock conflict (PostgreSQL; once on SQLite, whose
//!   writer never does);
//! - `any_of!(n)`: SQL for "is one of the JSON array of texts bound as
//!   `$n`", the right-hand side of a predicate on a column;
//! - `for_update!()`: what locks the rows a `SELECT` reads (nothing on
//!   SQLite, whose writer lock serialises every write);
//! - `db_now_ms!()`: the database's clock in milliseconds (leases'
//!   expiries are compared on it); `row_order!()`: the column that orders
//!   sessions by creation;
//! - `This::rows_of(conn, ids)` and `This::row_of(conn, id)`: session rows
//!   (SQLite: its ledger; PostgreSQL: a query on the transaction's
//!   connection);
//! - `This::append_events(conn, events, ended)`: events, last in their
//!   transaction (SQLite: inserts; PostgreSQL: in each shard's commit
//!   order under the shard's row of `event_shards`), `This::touch(conn,
//!   session)` for a commit that writes none but may leave the driver work,
//!   and `This::committed(ended)` after the commit, which wakes the
//!   watchers.
//! - on `Tx`, what ending sessions needs (`ends`): `lock_row`,
//!   `lock_session` and `lock_process` (PostgreSQL's lock order; the ledger's row on
//!   SQLite), `ancestors`, `active_subtree`, `members_below`,
//!   `end_sessions`, `orphan`, `set_status` and `insert_message`; rows
//!   they change reach SQLite's ledger at the
//!   commit. `This::check_fence` checks the background work's lease, and
//!   `This::append_tail` keeps a session's output tail (`output`).
//!
//! SQL in such code is written in what both dialects accept: `$N`
//! placeholders (sqlx's SQLite driver numbers them too), `CAST($1 AS TEXT)`
//! where PostgreSQL must know a parameter's type, `NOT $1` for a bound
//! boolean, `excluded` in upserts, and integer columns read at the width
//! PostgreSQL stores them (SQLite's integers read at any width).
//!
//! What really differs stays in `sqlite` and `postgres`: SQLite's writer
//! lock, batches and in-memory ledger; PostgreSQL's lock order, retries and
//! wake-ups (`postgres::wake`).

/// Expands its items once per backend, in modules `sqlite` and `postgres`,
/// each of which sees its parent module's items and imports too.
macro_rules! each_backend {
    ($($body:tt)*) => {
        pub(crate) mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use crate::sqlite::{
                Batched, SqliteStore as This, Tx, db_now_ms, for_update, any_of, retrying,
                row_order,
            };
            #[allow(unused_imports)]
            use sqlx::{Sqlite as Db, SqliteConnection as Conn};
            $($body)*
        }
        pub(crate) mod postgres {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use crate::postgres::{
                Batched, PgStore as This, Tx, db_now_ms, for_update, any_of, retrying,
                row_order,
            };
            #[allow(unused_imports)]
            use sqlx::{PgConnection as Conn, Postgres as Db};
            $($body)*
        }
    };
}
pub(super) use each_backend;
