//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and Cargo does not watch it alone.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
