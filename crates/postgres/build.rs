//! Rebuild when a migration is added or changed: the migrations are
//! compiled into the crate (`refinery::embed_migrations!`), which Cargo
//! does not otherwise know to track.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/postgres");
}
