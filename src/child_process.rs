//! Child processes the broker starts (command tools, stdio upstream
//! servers): each runs in a process group of its own, so that a cancel, a
//! timeout or the end of its use reaches the program and whatever it
//! started; the group is killed as one (TERM, then KILL after a grace); a
//! group may be tied to this process's life; the lines a child writes are
//! read with a cap.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Kills a process group when dropped or told to: TERM now, KILL after the
/// grace period. Only once: after that it holds no group, so a later call
/// cannot reach a group that reused the id.
#[derive(Debug)]
pub struct GroupGuard {
    /// The group's id (its leader's pid); `None` once terminated.
    pgid: Option<Pid>,
    /// Wait between TERM and KILL.
    grace: Duration,
}

impl GroupGuard {
    /// A guard for the group whose leader is `leader_pid` (none when the
    /// spawn gave no pid: then it does nothing).
    pub fn new(leader_pid: Option<u32>, grace: Duration) -> Self {
        let pgid = leader_pid
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        Self { pgid, grace }
    }

    /// TERM the group now and KILL it after the grace period.
    pub fn terminate(&mut self) {
        let Some(pgid) = self.pgid.take() else { return };
        if killpg(pgid, Signal::SIGTERM).is_err() {
            return; // the group is gone already
        }
        let grace = self.grace;
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            let _ = killpg(pgid, Signal::SIGKILL);
        });
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The sentinel's script: wait for its stdin to close, then KILL its whole
/// process group. Its stdin is a pipe whose only write end this process
/// holds (close-on-exec, so no other child inherits it), and the kernel
/// closes that end however this process ends, `kill -9` included.
const SENTINEL_SCRIPT: &str = "read -r _ignored; kill -s KILL 0";

/// A process group that dies with this process: its leader is a small
/// `sh` sentinel that KILLs the group when this process's end of its stdin
/// closes. Children are put into the group with
/// `Command::process_group(group.pgid())`.
///
/// Why not `PR_SET_PDEATHSIG`: it needs code between fork and exec
/// (`pre_exec`, unsafe, which this crate forbids), reaches only the direct
/// child (not the node a launcher such as `npx` starts), and fires when
/// the *thread* that spawned the child ends, which a runtime's threads do.
#[derive(Debug)]
pub struct TiedGroup {
    /// The sentinel (the group's leader); reaped by tokio once dropped.
    _sentinel: tokio::process::Child,
    /// Our end of the sentinel's stdin: closing it kills the group.
    _lifeline: tokio::process::ChildStdin,
    /// The group's id.
    pgid: u32,
    /// Kills the group when this value is dropped or told to.
    guard: GroupGuard,
}

impl TiedGroup {
    /// Start the sentinel of a new group.
    pub fn start(grace: Duration) -> std::io::Result<Self> {
        let mut sentinel = tokio::process::Command::new("/bin/sh")
            .args(["-c", SENTINEL_SCRIPT])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        let lifeline = sentinel
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the sentinel has no stdin pipe"))?;
        let pgid = sentinel
            .id()
            .ok_or_else(|| std::io::Error::other("the sentinel exited at once"))?;
        Ok(Self {
            _sentinel: sentinel,
            _lifeline: lifeline,
            pgid,
            guard: GroupGuard::new(Some(pgid), grace),
        })
    }

    /// The group's id, for `Command::process_group`.
    pub fn pgid(&self) -> i32 {
        i32::try_from(self.pgid).unwrap_or(0)
    }

    /// TERM the whole group now, KILL it after the grace period.
    pub fn terminate(&mut self) {
        self.guard.terminate();
    }
}

/// One line read by [`read_lines`].
#[derive(Debug, PartialEq, Eq)]
pub enum ReadLine<'a> {
    /// A whole line, without its newline.
    Line(&'a [u8]),
    /// A line longer than the cap, skipped.
    TooLong,
}

/// Read newline-ended lines from `reader` until it ends, handing each to
/// `on_line`; a line longer than `max` bytes is skipped (and said). An
/// unfinished last line is dropped.
pub async fn read_lines(
    mut reader: impl AsyncRead + Unpin,
    max: usize,
    mut on_line: impl FnMut(ReadLine<'_>),
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        loop {
            let end = chunk.iter().position(|&b| b == b'\n');
            let part = &chunk[..end.unwrap_or(chunk.len())];
            if !skipping {
                if pending.len() + part.len() > max {
                    skipping = true;
                    pending.clear();
                } else {
                    pending.extend_from_slice(part);
                }
            }
            let Some(end) = end else { break };
            if skipping {
                on_line(ReadLine::TooLong);
            } else {
                on_line(ReadLine::Line(&pending));
            }
            pending.clear();
            skipping = false;
            chunk = &chunk[end + 1..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_long_ones_skipped() {
        let input: &[u8] = b"one\n\ntoo-long-line\nfour\nunfinished";
        let mut seen = Vec::new();
        read_lines(input, 8, |line| {
            seen.push(match line {
                ReadLine::Line(l) => String::from_utf8_lossy(l).into_owned(),
                ReadLine::TooLong => "<too long>".to_owned(),
            })
        })
        .await;
        assert_eq!(seen, ["one", "", "<too long>", "four"]);
    }
}
