//! Rebuild when a migration file is added or changed: `refinery::embed_migrations!`
//! reads `migrations/` at compile time, and cargo does not know that by itself.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
