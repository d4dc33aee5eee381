//! The listening socket and systemd: where a front under systemd gets it, and how it asks systemd
//! to keep it.
//!
//! The front's unit (`kcpshard-<shard>-front.service`, `Restart=always`) is started with the
//! socket `serve` bound as its stdin. The front stores it in the unit's file-descriptor store
//! (`FDSTORE=1`, `FDNAME=listen`); when the front dies, systemd starts it again with the stored
//! socket (`LISTEN_FDS`, `LISTEN_FDNAMES`), and the kernel queues connections on it meanwhile, so
//! no client is refused. A successor (an upgrade, `--inherit-from`) receives the same socket from
//! its predecessor and joins the unit; the predecessor names it the unit's main process
//! (`MAINPID=`) before it exits, and the successor says so too once it is up.
//! Outside systemd none of this applies: the front binds the address itself.
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{info, warn};

use crate::process::{UnitName, procfs, systemd::JOINING_UNIT_ENV};

/// The listening socket's name in the unit's descriptor store.
pub const FD_NAME: &str = "listen";
/// How long a successor waits to be moved into the front's unit before it speaks for it.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The listening socket systemd hands this front: the one in its unit's descriptor store (a
/// restart), else its stdin when that is a listening TCP socket (the unit's first start). None:
/// the front binds its address itself.
pub fn inherited_listener() -> Option<TcpListener> {
    if let Ok(fds) = sd_notify::listen_fds_with_names() {
        let mut found = None;
        for (fd, name) in fds {
            // SAFETY: systemd passed these descriptors to this process, and nothing else owns them.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            if name == FD_NAME && found.is_none() && is_listening_tcp(owned.as_fd()) {
                found = Some(owned);
            }
        }
        if let Some(fd) = found {
            info!("took the listening socket from the unit's descriptor store");
            return Some(TcpListener::from(fd));
        }
    }
    // SAFETY: stdin stays open for the life of the process; it is only borrowed here.
    let stdin = unsafe { BorrowedFd::borrow_raw(0) };
    if !is_listening_tcp(stdin) {
        return None;
    }
    match stdin.try_clone_to_owned() {
        Ok(fd) => {
            info!("took the listening socket from stdin, where the unit's start put it");
            Some(TcpListener::from(fd))
        }
        Err(e) => {
            warn!(error = %e, "cannot duplicate the listening socket on stdin; binding instead");
            None
        }
    }
}

/// A TCP socket in the listening state.
fn is_listening_tcp(fd: BorrowedFd<'_>) -> bool {
    let socket = socket2::SockRef::from(&fd);
    socket.is_listener().unwrap_or(false)
        && matches!(socket.domain(), Ok(socket2::Domain::IPV4 | socket2::Domain::IPV6))
        && socket.r#type().is_ok_and(|t| t == socket2::Type::STREAM)
}

/// Tells systemd, when it supervises this front, that the front is ready and is the unit's main
/// process, and to keep `listener` in the unit's descriptor store. A successor first waits until
/// `serve` has moved it into the unit's cgroup: what it said before would count for `serve`'s
/// unit. Without a notify socket it does nothing.
pub async fn announce(listener: BorrowedFd<'_>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Some(unit) = std::env::var(JOINING_UNIT_ENV).ok().and_then(|u| UnitName::parse(&u)) {
        let deadline = Instant::now() + JOIN_TIMEOUT;
        while procfs::unit(std::process::id()).as_ref() != Some(&unit) {
            if Instant::now() >= deadline {
                warn!(%unit, "not moved into the front's unit in time; not announcing this front to systemd");
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let state = [
        NotifyState::Ready,
        NotifyState::MainPid(std::process::id()),
        NotifyState::FdStore,
        NotifyState::FdName(FD_NAME),
    ];
    match sd_notify::notify_with_fds(&state, &[listener]) {
        Ok(()) => info!("told systemd: ready, main process, listening socket stored"),
        Err(e) => warn!(error = %e, "cannot notify systemd; a restart of this front binds its address anew"),
    }
}

/// Old side of a handover under systemd: makes the successor the unit's main process before this
/// front exits, which the unit would otherwise take for its own end (and restart it, killing the
/// successor). `serve` moves the successor into this front's unit; this waits for that first
/// (systemd refuses a main process outside the unit). Without a notify socket it does nothing.
pub async fn hand_main_to(successor: u32) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let Some(unit) = procfs::unit(std::process::id()) else {
        return;
    };
    let deadline = Instant::now() + JOIN_TIMEOUT;
    while procfs::unit(successor).as_ref() != Some(&unit) {
        if Instant::now() >= deadline {
            warn!(successor, %unit, "the successor is not in this front's unit; it stays the main process");
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match sd_notify::notify(&[NotifyState::MainPid(successor)]) {
        Ok(()) => info!(successor, %unit, "the successor is the unit's main process now"),
        Err(e) => warn!(successor, error = %e, "cannot tell systemd about the successor"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listening_tcp_socket_counts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening_tcp(listener.as_fd()));
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(!is_listening_tcp(client.as_fd()), "a connection");
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(!is_listening_tcp(file.as_fd()), "not a socket");
        let unix = std::os::unix::net::UnixListener::bind(tempfile::tempdir().unwrap().path().join("s")).unwrap();
        assert!(!is_listening_tcp(unix.as_fd()), "a unix socket");
    }
}
