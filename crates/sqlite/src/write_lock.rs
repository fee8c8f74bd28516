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
//! the holder is still there.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The write turns of one database.
#[derive(Debug)]
pub(crate) struct WriteLock {
    /// The file, open for this process's quick `try_lock`.
    file: Arc<File>,
    path: PathBuf,
    /// One write at a time in this process.
    turn: Arc<Semaphore>,
    /// How long to wait for another process's turn.
    wait_at_most: Duration,
    /// A thread is blocked on the file (one whose wait outlived its bound,
    /// when a turn starts): no second one is started beside it.
    waiting: Arc<AtomicBool>,
}

/// This process's turn to write: the file's lock (when it could be had) and
/// the in-process turn, both let go when dropped.
#[derive(Debug)]
pub struct WriteTurn {
    _turn: Option<OwnedSemaphorePermit>,
    held: Held,
}

#[derive(Debug)]
enum Held {
    /// Taken at once on the shared handle.
    Shared(Arc<File>),
    /// Taken after a wait, on a handle of its own (closing it releases).
    Own { _file: File },
    /// Not taken: SQLite's busy timeout orders this write.
    Nothing,
}

impl Drop for WriteTurn {
    fn drop(&mut self) {
        if let Held::Shared(file) = &self.held
            && let Err(e) = file.unlock()
        {
            tracing::debug!(error = %e, "write lock release failed");
        }
    }
}

impl WriteLock {
    /// Open (or create) `<db>-writer`.
    pub(crate) fn open(db: &Path, wait_at_most: Duration) -> std::io::Result<Self> {
        let path = crate::side_file_path(db, "-writer");
        let file = crate::open_side_file(&path)?;
        Ok(Self {
            file: Arc::new(file),
            path,
            turn: Arc::new(Semaphore::new(1)),
            wait_at_most,
            waiting: Arc::default(),
        })
    }

    /// Wait for this process's turn to write.
    pub(crate) async fn turn(&self) -> WriteTurn {
        // The semaphore is never closed.
        let turn = self.turn.clone().acquire_owned().await.ok();
        let held = match self.file.try_lock() {
            Ok(()) => Held::Shared(self.file.clone()),
            Err(TryLockError::WouldBlock) => self.wait_for_file().await,
            Err(TryLockError::Error(e)) => {
                tracing::debug!(error = %e, path = %self.path.display(), "write lock unavailable");
                Held::Nothing
            }
        };
        WriteTurn { _turn: turn, held }
    }

    /// Block a thread on the file until another process lets it go, at most
    /// `wait_at_most`. A wait given up on keeps its thread until the lock
    /// comes, then closes its handle, which lets it go at once.
    async fn wait_for_file(&self) -> Held {
        if self.waiting.swap(true, Ordering::AcqRel) {
            return Held::Nothing;
        }
        let (path, waiting) = (self.path.clone(), self.waiting.clone());
        let waiter = tokio::task::spawn_blocking(move || {
            let taken = crate::open_side_file(&path).and_then(|file| file.lock().map(|()| file));
            waiting.store(false, Ordering::Release);
            taken
        });
        match tokio::time::timeout(self.wait_at_most, waiter).await {
            Ok(Ok(Ok(file))) => Held::Own { _file: file },
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, path = %self.path.display(), "write lock wait failed");
                Held::Nothing
            }
            Ok(Err(e)) => {
                self.waiting.store(false, Ordering::Release);
                tracing::debug!(error = %e, "write lock waiter ended");
                Held::Nothing
            }
            Err(_) => {
                tracing::warn!(
                    path = %self.path.display(),
                    "another process has held the write lock for {:?}; writing without it",
                    self.wait_at_most
                );
                Held::Nothing
            }
        }
    }
}
