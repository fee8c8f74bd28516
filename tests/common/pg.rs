//! A PostgreSQL database of its own for one test, on the local server
//! (`TASKBROKER_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432`),
//! dropped when the test ends.
//!
//! Where no server answers, PostgreSQL cases are skipped with one line on
//! stderr saying so, unless `TASKBROKER_REQUIRE_POSTGRES=1` (CI sets it):
//! then they fail.

use std::process::Command;
use std::sync::OnceLock;

/// The server tests use, without a database name.
pub fn server_url() -> String {
    std::env::var("TASKBROKER_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

fn psql(db: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .arg(format!("{}/{db}", server_url()))
        .args(["-v", "ON_ERROR_STOP=1", "-qAtc", sql])
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether the server answers (asked once per test process).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| match psql("postgres", "SELECT 1") {
        Ok(_) => true,
        Err(e) => {
            if std::env::var_os("TASKBROKER_REQUIRE_POSTGRES").is_some() {
                panic!("PostgreSQL is required (TASKBROKER_REQUIRE_POSTGRES) but {} does not answer: {e}", server_url());
            }
            // Straight to fd 2: the test harness captures eprintln!.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipping the PostgreSQL cases: no server at {} ({})",
                server_url(),
                e.trim()
            );
            false
        }
    })
}

/// A fresh, empty database; dropped (with its connections) on drop.
pub struct PgDb {
    /// `postgres://.../<name>`.
    pub url: String,
    name: String,
}

impl PgDb {
    /// A new database, or `None` when PostgreSQL is not available here.
    pub fn create() -> Option<Self> {
        if !available() {
            return None;
        }
        let name = format!("tb_test_{}", uuid::Uuid::new_v4().simple());
        // CREATE DATABASE copies template1 and fails while another session
        // is connected to it (several test processes at once): try again.
        let mut tries = 0;
        while let Err(e) = psql("postgres", &format!("CREATE DATABASE {name}")) {
            tries += 1;
            assert!(tries < 20, "create a test database: {e}");
            std::thread::sleep(std::time::Duration::from_millis(100 * tries));
        }
        Some(Self {
            url: format!("{}/{name}", server_url()),
            name,
        })
    }

    /// Run SQL on it as an operator's psql would; the unaligned output.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        psql(&self.name, sql)
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let _ = psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}
