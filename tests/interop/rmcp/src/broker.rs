//! The processes under test: `taskbroker serve --workers 0` and one
//! `taskbroker worker`, on one SQLite file in a fresh temp dir.
//!
//! Both are killed when the [`Broker`] is dropped (also while a panic
//! unwinds) and by [`kill_all_on_signal`] on SIGINT/SIGTERM.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The children, shared with the signal handler.
#[derive(Default)]
struct Procs {
    server: Option<Child>,
    worker: Option<Child>,
}

impl Procs {
    fn kill_all(&mut self) {
        for child in [self.server.take(), self.worker.take()]
            .into_iter()
            .flatten()
        {
            stop(child);
        }
    }
}

/// SIGKILL (std's `Child::kill`) and reap.
fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Every live broker's processes and temp dir, for the signal handler.
type Live = Mutex<Vec<(Arc<Mutex<Procs>>, PathBuf)>>;

static LIVE: OnceLock<Live> = OnceLock::new();

fn live() -> &'static Live {
    LIVE.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// On SIGINT or SIGTERM: kill every process started here, remove the temp
/// dirs, exit 130/143.
pub fn kill_all_on_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = int.recv() => 130,
            _ = term.recv() => 143,
        };
        for (procs, dir) in lock(live()).drain(..) {
            lock(&procs).kill_all();
            let _ = fs::remove_dir_all(dir);
        }
        eprintln!("interrupted: stopped the broker processes");
        std::process::exit(code);
    });
}

pub struct Broker {
    bin: PathBuf,
    dir: tempfile::TempDir,
    procs: Arc<Mutex<Procs>>,
    starts: u32,
    /// The port of the last server start.
    pub port: u16,
    /// `http://127.0.0.1:PORT/mcp`, as the server printed it.
    pub url: String,
}

impl Broker {
    pub fn new(bin: &Path) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("taskbroker-rmcp-interop-")
            .tempdir()
            .map_err(|e| format!("cannot make a temp dir: {e}"))?;
        let procs = Arc::new(Mutex::new(Procs::default()));
        lock(live()).push((procs.clone(), dir.path().to_owned()));
        Ok(Self {
            bin: bin.to_owned(),
            dir,
            procs,
            starts: 0,
            port: 0,
            url: String::new(),
        })
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("b.db")
    }

    fn log(&self, name: &str) -> Result<File, String> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .map_err(|e| format!("cannot open {name}.log: {e}"))
    }

    /// `taskbroker serve --workers 0 --db DIR/b.db --listen 127.0.0.1:PORT`;
    /// waits for `taskbroker listening on URL` on its stdout. With a fixed
    /// port (a restart), retries for a few seconds while the bind fails.
    pub async fn start_server(&mut self, port: u16) -> Result<(), String> {
        let retry_until = Instant::now() + Duration::from_secs(5);
        loop {
            self.starts += 1;
            let out_path = self.dir.path().join(format!("server-{}.out", self.starts));
            let out =
                File::create(&out_path).map_err(|e| format!("cannot create {out_path:?}: {e}"))?;
            let child = Command::new(&self.bin)
                .args(["serve", "--workers", "0", "--db"])
                .arg(self.db())
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(self.log("server")?)
                .spawn()
                .map_err(|e| format!("cannot start {:?} serve: {e}", self.bin))?;
            lock(&self.procs).server = Some(child);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(15) {
                let text = fs::read_to_string(&out_path).unwrap_or_default();
                if let Some(url) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("taskbroker listening on "))
                {
                    self.url = url.trim().to_owned();
                    self.port = port_of(&self.url)
                        .ok_or_else(|| format!("no port in the printed url {:?}", self.url))?;
                    return Ok(());
                }
                let exited = lock(&self.procs)
                    .server
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                if let Some(status) = exited {
                    lock(&self.procs).server = None;
                    if port != 0 && Instant::now() < retry_until {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        break; // the port may not be free yet: start again
                    }
                    return Err(format!(
                        "taskbroker serve exited ({status}) before listening; server.log:\n{}",
                        self.tail("server", 20)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if lock(&self.procs).server.is_some() {
                return Err(format!(
                    "taskbroker serve printed no 'taskbroker listening on' line in 15 s; server.log:\n{}",
                    self.tail("server", 20)
                ));
            }
        }
    }

    /// `taskbroker worker --db DIR/b.db --lease 5`.
    pub fn start_worker(&mut self) -> Result<(), String> {
        let child = Command::new(&self.bin)
            .arg("worker")
            .arg("--db")
            .arg(self.db())
            .args(["--lease", "5"])
            .stdin(Stdio::null())
            .stdout(self.log("worker")?)
            .stderr(self.log("worker")?)
            .spawn()
            .map_err(|e| format!("cannot start {:?} worker: {e}", self.bin))?;
        lock(&self.procs).worker = Some(child);
        Ok(())
    }

    /// kill -9 the server (not the worker) and reap it.
    pub fn kill_server(&mut self) {
        if let Some(child) = lock(&self.procs).server.take() {
            stop(child);
        }
    }

    /// Whether the worker is still running.
    pub fn worker_alive(&self) -> bool {
        lock(&self.procs)
            .worker
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The last `n` lines of DIR/NAME.log.
    pub fn tail(&self, name: &str, n: usize) -> String {
        let text =
            fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        lock(&self.procs).kill_all();
        lock(live()).retain(|(procs, _)| !Arc::ptr_eq(procs, &self.procs));
    }
}

fn port_of(url: &str) -> Option<u16> {
    let rest = url.split("://").nth(1)?;
    let authority = rest.split('/').next()?;
    authority.rsplit(':').next()?.parse().ok()
}
