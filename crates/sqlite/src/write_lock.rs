//! Turns at SQLite's one write lock across processes. SQLite itself makes
//! a writer that finds the lock taken sleep and retry, in steps that grow to
//! 100 ms, so with several processes writing (a broker and worker
//! processes) a writer often sleeps long after the lock came free: a
//! commit that holds the lock for a millisecond can cost another process
//! tens. Before each write this process's one write connection takes an
//! exclusive `flock` on `<db>-writer`, a file beside the database, and
//! lets it go after the commit; a process waiting for it is woken by the
//! kernel the moment it is released. Within the process, writes queue for
//! their turn first (one at a time, as the single-connection write pool
//! would have them), so only one of them waits on the file.
//! A group commit takes its turn before it chooses its writes
//! (`Storage::write_turn`), so the writes that arrive while another process
//! commits join its batch.
//!
//! The file only orders processes that use it; SQLite's own lock remains
//! what keeps writes apart. A writer that does not take the file (a
//! `sqlite3` shell, an older taskbroker) is waited for by SQLite's busy
//! timeout, as before. The kernel drops the lock of a process that dies,
//! kill -9 included. A wait for the file is bounded by the busy timeout:
//! past it (a process frozen while it holds the file) the write goes on to
//! SQLite's lock and its busy timeout, which say "database is locked" if
//! the holder is still there, and the process writes without turns until
//! the abandoned wait gets the file (which it then lets go at once). The
//! wait runs on a thread of its own, never the runtime's blocking pool, so
//! a process shutting down does not wait for another process to let go.
//! Where the file cannot be opened (another user's, a read-only folder),
//! the process writes without turns, as SQLite alone would have it.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, oneshot};

/// What a thread blocked on the file hands over once it has it.
type Taken = oneshot::Receiver<std::io::Result<File>>;

/// The write turns of one database.
#[derive(Debug)]
pub(crate) struct WriteLock {
    /// The file, open for this process's quick `try_lock` (`None`: it
    /// could not be opened; no turns).
    file: Option<Arc<File>>,
    path: PathBuf,
    /// One write at a time in this process.
    turn: Arc<Semaphore>,
    /// How long to wait for another process's turn.
    wait_at_most: Duration,
    /// A wait for the file under way, kept when the turn that started it was
    /// dropped (a cancelled request): the next turn goes on waiting on it.
    pending: Mutex<Option<Taken>>,
    /// A wait given up on (past `wait_at_most`) still blocks its thread:
    /// turns are skipped until it ends.
    abandoned: Arc<AtomicBool>,
}

/// This process's turn to write: the file's lock (when it could be had) and
/// the in-process turn, let go in that order when dropped.
#[derive(Debug)]
pub struct WriteTurn {
    _held: Held,
    _turn: Option<OwnedSemaphorePermit>,
}

#[derive(Debug)]
enum Held {
    /// Taken at once on the shared handle.
    Shared(Arc<File>),
    /// Taken after a wait, on a handle of its own.
    Own(File),
    /// Not taken: SQLite's busy timeout orders this write.
    Nothing,
}

impl Drop for Held {
    fn drop(&mut self) {
        let file: &File = match &*self {
            Held::Shared(file) => file,
            Held::Own(file) => file,
            Held::Nothing => return,
        };
        if let Err(e) = file.unlock() {
            tracing::debug!(error = %e, "write lock release failed");
        }
    }
}

impl WriteLock {
    /// Open (or create) `<db>-writer`; without it (a warning), no turns.
    pub(crate) fn open(db: &Path, wait_at_most: Duration) -> Self {
        let path = crate::side_file_path(db, "-writer");
        let file = match crate::open_side_file(&path) {
            Ok(file) => Some(Arc::new(file)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    path = %path.display(),
                    "cannot open the write lock file; writing without turns (SQLite's busy timeout orders writers)"
                );
                None
            }
        };
        Self {
            file,
            path,
            turn: Arc::new(Semaphore::new(1)),
            wait_at_most,
            pending: Mutex::new(None),
            abandoned: Arc::default(),
        }
    }

    /// Wait for this process's turn to write.
    pub(crate) async fn turn(&self) -> WriteTurn {
        // The semaphore is never closed.
        let turn = self.turn.clone().acquire_owned().await.ok();
        let held = match &self.file {
            None => Held::Nothing,
            Some(file) => match file.try_lock() {
                Ok(()) => Held::Shared(file.clone()),
                Err(TryLockError::WouldBlock) => self.wait_for_file().await,
                Err(TryLockError::Error(e)) => {
                    tracing::debug!(error = %e, path = %self.path.display(), "write lock unavailable");
                    Held::Nothing
                }
            },
        };
        WriteTurn {
            _held: held,
            _turn: turn,
        }
    }

    /// Wait for another process to let the file go, at most
    /// `wait_at_most`, on a thread blocked in `flock` (or on the wait a
    /// cancelled turn left).
    async fn wait_for_file(&self) -> Held {
        let mut pending = self.pending.lock().await;
        let taken = match pending.as_mut() {
            Some(taken) => taken,
            None if self.abandoned.load(Ordering::Acquire) => return Held::Nothing,
            None => pending.insert(self.spawn_waiter()),
        };
        let outcome = tokio::time::timeout(self.wait_at_most, taken).await;
        if outcome.is_ok() {
            *pending = None;
        }
        match outcome {
            Ok(Ok(Ok(file))) => Held::Own(file),
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, path = %self.path.display(), "write lock wait failed");
                Held::Nothing
            }
            // The thread ended without a word (it could not start).
            Ok(Err(_)) => Held::Nothing,
            Err(_) => {
                // Abandon the wait: once closed, the thread cannot hand the
                // file over, so it lets it go as soon as it has it and
                // clears `abandoned` (set first). Unless it handed it over
                // just before the close: then it is this turn's.
                self.abandoned.store(true, Ordering::Release);
                let mut taken = pending.take();
                if let Some(taken) = taken.as_mut() {
                    taken.close();
                    if let Ok(handed) = taken.try_recv() {
                        self.abandoned.store(false, Ordering::Release);
                        return match handed {
                            Ok(file) => Held::Own(file),
                            Err(_) => Held::Nothing,
                        };
                    }
                }
                tracing::warn!(
                    path = %self.path.display(),
                    "another process has held the write lock for {:?}; writing without it",
                    self.wait_at_most
                );
                Held::Nothing
            }
        }
    }

    /// A thread that blocks until it has the file, then hands it over (or,
    /// if no one waits any more, lets it go and says the wait ended).
    fn spawn_waiter(&self) -> Taken {
        let (tx, rx) = oneshot::channel();
        let (path, abandoned) = (self.path.clone(), self.abandoned.clone());
        let spawned = std::thread::Builder::new()
            .name("taskbroker-write-lock".into())
            .spawn(move || {
                let taken =
                    crate::open_side_file(&path).and_then(|file| file.lock().map(|()| file));
                if let Err(unwanted) = tx.send(taken) {
                    drop(unwanted);
                    abandoned.store(false, Ordering::Release);
                }
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "write lock waiter did not start");
        }
        rx
    }
}
