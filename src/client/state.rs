//! What the command-line client remembers between invocations: one MCP
//! session per broker (and per token), so `taskbroker tasks` sees the tasks
//! `taskbroker call --task` started, and the tool of each task it started,
//! for the tool column of `taskbroker tasks list` (a Task carries no tool).
//!
//! The file is `$XDG_STATE_HOME/taskbroker/cli.json` (else
//! `$HOME/.local/state/taskbroker/cli.json`), never the working directory.
//! It is rewritten whole, atomically (a temporary file in the same folder,
//! mode 0600, renamed over it), under an advisory lock on a `.lock` file
//! beside it, so two invocations at once neither corrupt it nor lose each
//! other's changes. A file that cannot be read or parsed is a one-line
//! warning and counts as empty; the state is a convenience, never a reason
//! to fail a call.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Connection;

/// The file's name in the state folder.
const FILE_NAME: &str = "cli.json";
/// Tools remembered per broker; the oldest are forgotten beyond this.
const MAX_REMEMBERED_TASKS: usize = 1000;

/// One warning per process is enough: the rest would say the same.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    /// What each broker (URL, and token if any) is to this client, by key.
    #[serde(default)]
    brokers: BTreeMap<String, BrokerState>,
}

/// What the client keeps about one broker.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct BrokerState {
    /// The MCP session the client uses with that broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Whether `session` was opened declaring that this client answers a
    /// tool's questions (elicitation). Sessions stored by earlier versions
    /// did not, and a question fails in them: `call` replaces such a
    /// session by a new one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answers_questions: bool,
    /// The tool of each task the client started there, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskTool>,
}

/// A task the client started, and its tool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskTool {
    /// The taskId.
    pub task: String,
    /// The tool called.
    pub tool: String,
}

impl BrokerState {
    /// The tool of `task_id`, if this client started it.
    pub fn tool_of(&self, task_id: &str) -> Option<&str> {
        self.tasks
            .iter()
            .rev()
            .find(|t| t.task == task_id)
            .map(|t| t.tool.as_str())
    }
}

/// The client's state for one connection (broker URL and token).
#[derive(Debug, Clone)]
pub struct CliState {
    /// The state file; None when there is no state folder (no
    /// `XDG_STATE_HOME`, no `HOME`).
    path: Option<PathBuf>,
    /// Which broker entry is ours: the URL, plus a hash of the token (tasks
    /// and sessions belong to the token's principal).
    key: String,
}

/// Holds the lock on the state file while alive.
pub struct StateLock {
    /// The locked `.lock` file (None when it could not be locked); dropping
    /// it unlocks.
    _held: Option<Flock<std::fs::File>>,
}

impl CliState {
    /// The state of `conn`'s broker, in the user's state folder.
    pub fn for_connection(conn: &Connection) -> Self {
        let path = state_dir().map(|dir| dir.join(FILE_NAME));
        if path.is_none() {
            warn(
                "no state folder: neither XDG_STATE_HOME nor HOME is set \
                 (sessions are not remembered; set XDG_STATE_HOME)",
            );
        }
        Self::at(path, conn)
    }

    /// The state of `conn`'s broker in the file `path`.
    pub fn at(path: Option<PathBuf>, conn: &Connection) -> Self {
        let mut key = conn.url.as_str().to_owned();
        if let Some(token) = &conn.token {
            let digest = Sha256::digest(token.as_bytes());
            let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
            key.push_str(" token-sha256:");
            key.push_str(&hex);
        }
        Self { path, key }
    }

    /// What is stored about our broker (empty when nothing is, or the file
    /// cannot be read).
    pub fn load(&self) -> BrokerState {
        self.read().brokers.remove(&self.key).unwrap_or_default()
    }

    /// Take the lock on the state file (blocking until other invocations
    /// are done with it); hold it across a read-modify-write. Without a
    /// lock (none possible) the write is still atomic.
    pub async fn lock(&self) -> StateLock {
        let Some(path) = self.path.clone() else {
            return StateLock { _held: None };
        };
        let taken = tokio::task::spawn_blocking(move || lock_file(&path)).await;
        match taken {
            Ok(Ok(lock)) => StateLock { _held: Some(lock) },
            Ok(Err(why)) => {
                warn(&why);
                StateLock { _held: None }
            }
            Err(e) => {
                warn(&format!("cannot lock the state file: {e}"));
                StateLock { _held: None }
            }
        }
    }

    /// Change what is stored about our broker (call with the lock held).
    pub fn update(&self, _lock: &StateLock, change: impl FnOnce(&mut BrokerState)) {
        let Some(path) = &self.path else { return };
        let mut file = self.read();
        let entry = file.brokers.entry(self.key.clone()).or_default();
        change(entry);
        if entry.tasks.len() > MAX_REMEMBERED_TASKS {
            let extra = entry.tasks.len() - MAX_REMEMBERED_TASKS;
            entry.tasks.drain(..extra);
        }
        if entry.session.is_none() && entry.tasks.is_empty() {
            file.brokers.remove(&self.key);
        }
        if let Err(why) = write_atomically(path, &file) {
            warn(&format!(
                "cannot save the state file {}: {why} (sessions are not remembered; check the folder's permissions)",
                path.display()
            ));
        }
    }

    /// Remember that task `task` runs tool `tool`.
    pub async fn remember_task(&self, task: &str, tool: &str) {
        let lock = self.lock().await;
        self.update(&lock, |b| {
            b.tasks.push(TaskTool {
                task: task.to_owned(),
                tool: tool.to_owned(),
            });
        });
    }

    /// The whole file; empty (with a warning) when it cannot be read.
    fn read(&self) -> StateFile {
        let Some(path) = &self.path else {
            return StateFile::default();
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return StateFile::default(),
            Err(e) => {
                warn(&format!(
                    "cannot read the state file {}: {e} (remembered sessions are ignored; check its permissions)",
                    path.display()
                ));
                return StateFile::default();
            }
        };
        match serde_json::from_str(&text) {
            Ok(file) => file,
            Err(e) => {
                warn(&format!(
                    "the state file {} is not valid ({e}) (it is ignored and rewritten: remembered sessions are forgotten)",
                    path.display()
                ));
                StateFile::default()
            }
        }
    }
}

/// `$XDG_STATE_HOME/taskbroker`, else `$HOME/.local/state/taskbroker`
/// (the XDG Base Directory rules: a relative `XDG_STATE_HOME` is ignored).
fn state_dir() -> Option<PathBuf> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))
        .map(|base| base.join("taskbroker"))
}

/// Make the state folder (0700) and lock `<file>.lock` in it.
fn lock_file(path: &Path) -> Result<Flock<std::fs::File>, String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    make_dir(dir)?;
    let lock_path = path.with_extension("json.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock {}: {e}", lock_path.display()))
}

fn make_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make the state folder {}: {e}", dir.display()))
}

/// Write `file` to a temporary file beside `path` (mode 0600), flush it to
/// disk, rename it over `path`.
fn write_atomically(path: &Path, file: &StateFile) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    make_dir(dir)?;
    let text = serde_json::to_string_pretty(file).map_err(|e| e.to_string())?;
    let mut temp = tempfile::Builder::new()
        .prefix(".cli.json.")
        .tempfile_in(dir)
        .map_err(|e| e.to_string())?;
    temp.write_all(text.as_bytes())
        .and_then(|()| temp.write_all(b"\n"))
        .and_then(|()| temp.as_file().sync_all())
        .map_err(|e| e.to_string())?;
    temp.persist(path).map_err(|e| e.error.to_string())?;
    Ok(())
}

/// One warning line on stderr, once per process.
fn warn(what: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("taskbroker: warning: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(url: &str, token: Option<&str>) -> Connection {
        Connection {
            url: url.parse().expect("a URL"),
            session: None,
            token: token.map(str::to_owned),
        }
    }

    #[test]
    fn brokers_and_tokens_have_their_own_keys() {
        let a = CliState::at(None, &conn("http://127.0.0.1:1/mcp", None));
        let b = CliState::at(None, &conn("http://127.0.0.1:2/mcp", None));
        let t = CliState::at(None, &conn("http://127.0.0.1:1/mcp", Some("tbk_x_y")));
        assert_ne!(a.key, b.key);
        assert_ne!(a.key, t.key);
        assert!(
            !t.key.contains("tbk_x_y"),
            "no token in the file: {}",
            t.key
        );
    }

    #[tokio::test]
    async fn updates_are_kept_and_a_corrupt_file_counts_as_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("taskbroker").join(FILE_NAME);
        let state = CliState::at(Some(path.clone()), &conn("http://127.0.0.1:1/mcp", None));
        let set = |id: &'static str| {
            let state = state.clone();
            async move {
                let lock = state.lock().await;
                state.update(&lock, |b| b.session = Some(id.to_owned()));
            }
        };
        set("s1").await;
        state.remember_task("t1", "sleep").await;
        let stored = state.load();
        assert_eq!(stored.session.as_deref(), Some("s1"));
        assert_eq!(stored.tool_of("t1"), Some("sleep"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        std::fs::write(&path, "{not json").expect("write");
        assert!(state.load().session.is_none());
        set("s2").await;
        assert_eq!(state.load().session.as_deref(), Some("s2"));
    }
}
