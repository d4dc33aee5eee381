//! Exit notices: whoever watches a process hears as soon as it exits, not at the next look.
//!
//! The controller looks at an idle shard every 2 s, so a slot, kine or front that died was noticed
//! up to 2 s late (docs/reliability.md). A pidfd (`pidfd_open(2)`, Linux 5.3) turns readable when
//! its process exits, whoever its parent is: processes adopted from an earlier `serve` are covered
//! like the ones this `serve` started. Where pidfds are refused, nothing is watched and the idle
//! look still finds every exit.
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Sends a process's key (for the controller, its shard) once when the process exits.
pub struct ExitNotices<K> {
    watched: Arc<Mutex<HashSet<u32>>>,
    exited: mpsc::UnboundedSender<K>,
}

impl<K: Send + 'static> ExitNotices<K> {
    /// The notices, and where the keys of exited processes arrive.
    pub fn new() -> (ExitNotices<K>, mpsc::UnboundedReceiver<K>) {
        let (exited, receiver) = mpsc::unbounded_channel();
        let notices = ExitNotices {
            watched: Default::default(),
            exited,
        };
        (notices, receiver)
    }

    /// Sends `key` when `pid` exits. A pid already watched stays as it is, so calling this on every
    /// look is cheap. Not watched: a process that has already exited (the caller saw it running,
    /// so its next look finds it gone) and any process where pidfds are refused. The caller has
    /// just seen `pid` run; if it exited and its pid was reused in between, the wrong process is
    /// watched and this one exit is found at the next look instead.
    pub fn watch(&self, pid: u32, key: K) {
        if !self.watched.lock().expect("exit watch lock").insert(pid) {
            return;
        }
        let forget = {
            let watched = self.watched.clone();
            move || watched.lock().expect("exit watch lock").remove(&pid)
        };
        let registered = pidfd_open(pid).and_then(|fd| {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same until it drops.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(std::io::Error::from)
        });
        let pidfd = match registered {
            Ok(pidfd) => pidfd,
            Err(error) => {
                tracing::debug!(pid, %error, "cannot watch this process for its exit; the next look will find it");
                forget();
                return;
            }
        };
        let exited = self.exited.clone();
        tokio::spawn(async move {
            // Readable once the process has exited (a zombie counts): nothing is read.
            let _ = pidfd.readable().await;
            forget();
            let _ = exited.send(key);
        });
    }

    /// Sends `key` now: something other than an exit that the key's owner should look at.
    pub fn wake(&self, key: K) {
        let _ = self.exited.send(key);
    }

    /// How many processes are watched now.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.watched.lock().expect("exit watch lock").len()
    }
}

pub(super) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;

    #[tokio::test]
    async fn the_key_arrives_when_the_process_exits_and_not_before() {
        let (notices, mut exited) = ExitNotices::new();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        notices.watch(child.id(), "shard-a");
        notices.watch(child.id(), "shard-a");
        assert_eq!(notices.watched(), 1, "a pid is watched once");
        let early = tokio::time::timeout(Duration::from_millis(200), exited.recv()).await;
        assert!(early.is_err(), "a notice before the exit: {early:?}");

        let killed = Instant::now();
        child.kill().unwrap();
        let key = tokio::time::timeout(Duration::from_secs(5), exited.recv()).await;
        assert_eq!(key, Ok(Some("shard-a")));
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "late: {:?}",
            killed.elapsed()
        );
        assert_eq!(notices.watched(), 0, "an exited pid is no longer watched");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_process_that_is_gone_is_not_watched() {
        let (notices, mut exited) = ExitNotices::<&str>::new();
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        notices.watch(pid, "shard-a");
        assert_eq!(notices.watched(), 0);
        let notice = tokio::time::timeout(Duration::from_millis(200), exited.recv()).await;
        assert!(
            notice.is_err(),
            "a notice for a process that was already reaped: {notice:?}"
        );
    }
}
