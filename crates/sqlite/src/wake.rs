//! Wake-ups across processes. After a commit a process pokes a wake file
//! beside the database (a short write at offset 0: no fsync, the file
//! stays a few hundred bytes), and the processes that act on that kind of
//! commit watch it with inotify, so they look at once instead of at their
//! next tick.
//! One file per kind of commit ([`Signal`]), so a commit wakes only the
//! processes it concerns:
//! - `<db>-wake`: statuses, progress, input requests (servers' feeds);
//! - `<db>-queue`: a job became claimable (claimers);
//! - `<db>-control`: a running task was cancelled or answered (worker
//!   processes' feeds).
//!
//! A poke of the queue's file may name the worker processes asked to claim
//! at once (`claim:` and their ids, then a newline, at offset 0: see
//! `claimers.rs`); a watcher reads the file's first line when it wakes.
//! Pokes in quick succession may be read as the last one only, or torn: a
//! worker that reads itself not named looks a moment later anyway, so a
//! lost name delays a job by that moment, never strands it.
//!
//! The poke comes after the commit, so what it announces is visible when
//! the watcher looks. Where inotify is missing (other systems) or the watch
//! cannot be set, ticks find the commits, as they do for any writer that
//! does not poke (a sqlite3 shell).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use taskbroker_storage::Signal;
use tokio_util::sync::CancellationToken;

/// The wake files of one database, one per kind of commit.
#[derive(Debug)]
pub struct Wakes {
    changed: WakeFile,
    queued: WakeFile,
    control: WakeFile,
}

impl Wakes {
    /// Open (or create) the wake files of the database at `db`.
    pub fn open(db: &Path) -> std::io::Result<Self> {
        Ok(Self {
            changed: WakeFile::open(db, "-wake")?,
            queued: WakeFile::open(db, "-queue")?,
            control: WakeFile::open(db, "-control")?,
        })
    }

    /// The file of one kind of commit.
    pub fn file(&self, signal: Signal) -> &WakeFile {
        match signal {
            Signal::Changed => &self.changed,
            Signal::Queued | Signal::SlotFreed | Signal::Due => &self.queued,
            Signal::Control => &self.control,
        }
    }
}

/// The wake file of one database.
#[derive(Debug)]
pub struct WakeFile {
    file: File,
    path: PathBuf,
}

impl WakeFile {
    /// Open (or create) the wake file `<db><suffix>`.
    fn open(db: &Path, suffix: &str) -> std::io::Result<Self> {
        let path = crate::side_file_path(db, suffix);
        let file = crate::open_side_file(&path)?;
        Ok(Self { file, path })
    }

    /// Tell the processes watching this file that this one just committed
    /// (a poke that names no one: its first line is not `claim:`...).
    pub fn poke(&self) {
        self.write(b"w");
    }

    /// [`WakeFile::poke`] whose first line is `payload` (empty: names no
    /// one).
    pub fn poke_with(&self, payload: &str) {
        if payload.is_empty() {
            return self.poke();
        }
        let mut line = Vec::with_capacity(payload.len() + 1);
        line.extend_from_slice(payload.as_bytes());
        line.push(b'\n');
        self.write(&line);
    }

    fn write(&self, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        if let Err(e) = self.file.write_at(bytes, 0) {
            tracing::debug!(error = %e, path = %self.path.display(), "wake file poke failed");
        }
    }

    /// A reader of the file's first line (what the last poke said).
    pub fn reader(&self) -> std::io::Result<PokeReader> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&self.path)?;
        Ok(PokeReader { file })
    }

    /// Call `on_poke` whenever any process pokes the file, until `shutdown`.
    #[cfg(target_os = "linux")]
    pub fn watch(
        &self,
        on_poke: impl Fn() + Send + 'static,
        shutdown: CancellationToken,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        use tokio::io::unix::AsyncFd;

        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(&self.path, AddWatchFlags::IN_MODIFY)?;
        // `AsyncFd::new` is deprecated for fds that might be closed while
        // registered; `Watched` owns its fd for the AsyncFd's whole life.
        #[allow(deprecated)]
        let fd = AsyncFd::new(Watched(inotify))?;
        Ok(tokio::spawn(async move {
            loop {
                let mut ready = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ready = fd.readable() => match ready {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(error = %e, "wake file watch failed; the feed tick goes on");
                            return;
                        }
                    },
                };
                match ready.get_inner().0.read_events() {
                    Ok(_) => on_poke(),
                    Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                    Err(e) => {
                        tracing::warn!(error = %e, "wake file watch failed; the feed tick goes on");
                        return;
                    }
                }
            }
        }))
    }

    /// No inotify here: the feed tick alone.
    #[cfg(not(target_os = "linux"))]
    pub fn watch(
        &self,
        _on_poke: impl Fn() + Send + 'static,
        _shutdown: CancellationToken,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// Reads the first line of a wake file.
#[derive(Debug)]
pub struct PokeReader {
    file: File,
}

impl PokeReader {
    /// The last poke's first line (lossy: a torn read names no one or
    /// someone else, which only delays a claim by a moment).
    pub fn payload(&self) -> String {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 1024];
        let n = self.file.read_at(&mut buf, 0).unwrap_or(0);
        let line = buf[..n].split(|&b| b == b'\n').next().unwrap_or_default();
        String::from_utf8_lossy(line).into_owned()
    }
}

/// An inotify instance as tokio's readiness wants it.
#[cfg(target_os = "linux")]
struct Watched(nix::sys::inotify::Inotify);

#[cfg(target_os = "linux")]
impl std::os::fd::AsRawFd for Watched {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}
