//! Accepting client connections, and the life of each one: connect to its slot, copy, log.
//!
//! Invariants:
//! - TCP_NODELAY and TCP keepalive (idle 60 s, then 4 probes 15 s apart) are set once on the
//!   listening socket; accepted sockets inherit them. Keepalive finds a client that vanished
//!   without a FIN, so a dead client does not hold a slot connection (and its watch) forever.
//! - The listener is shared, so that a handover can send its fd to a successor while this loop
//!   still accepts; an accept error backs off for a moment instead of spinning.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::accounting::Tracked;
use super::connect::{self, RETRY_STEP};
use super::pump::{Ended, pump};
use super::router::Router;

/// Accepts until `stop` turns true. The listener is shared so that a handover can send its fd to
/// a successor while this loop still accepts.
pub async fn accept_loop(listener: Arc<TcpListener>, router: Arc<Router>, mut stop: watch::Receiver<bool>) {
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    // A timer always due within a second, so that the connect deadline each new connection sets
    // (2 s away) is never the runtime's earliest: tokio wakes its own driver (an eventfd write, one
    // syscall per connection) whenever a new timer becomes the earliest.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => return,
            _ = tick.tick() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tokio::spawn(forward(router.clone(), stream, peer));
                }
                Err(err) => {
                    // Out of fds or memory, or an aborted handshake: keep the listener, back off
                    // a little so that a persistent error does not spin.
                    warn!(error = %err, "accept failed");
                    tokio::time::sleep(RETRY_STEP).await;
                }
            },
        }
    }
}

const KEEPALIVE_IDLE_SECS: libc::c_int = 60;
const KEEPALIVE_INTERVAL_SECS: libc::c_int = 15;
const KEEPALIVE_PROBES: libc::c_int = 4;

/// Sets TCP_NODELAY and keepalive on the listening socket. Linux copies both into every socket
/// `accept` returns, which saves five syscalls per client connection; an inherited socket gets
/// the same treatment (idempotent).
pub fn tune_listener(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    let fd = listener.as_raw_fd();
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_SECS);
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECS);
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES);
}

fn set_int(fd: std::os::fd::RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        warn!(level, name, error = %std::io::Error::last_os_error(), "setsockopt failed");
    }
}
/// One client connection, from accept to close.
async fn forward(router: Arc<Router>, mut client: TcpStream, peer: SocketAddr) {
    let _tracked = Tracked::new(&router);
    let Some((active, pin, mut upstream)) = connect::connect(&router, peer).await else {
        return;
    };
    let address = active.backend.address;
    let mut routes = router.routes();
    match pump(&mut client, &mut upstream, &mut routes, address, pin.counters()).await {
        Ok(Ended::Both { up, down }) => debug!(%peer, slot = %active.backend.slot, up, down, "connection closed"),
        Ok(Ended::SlotClosing) => {
            debug!(%peer, slot = %active.backend.slot, "closing a connection to a slot that is shutting down")
        }
        Ok(Ended::Retired) => debug!(%peer, slot = %active.backend.slot,
            "closing a kept-alive connection at its next request: its slot left the serving set"),
        Ok(Ended::Idle) => debug!(%peer, slot = %active.backend.slot,
            "closing a kept-alive connection left unused: its slot left the serving set"),
        Err(err) => debug!(%peer, slot = %active.backend.slot, error = %err, "connection ended with an error"),
    }
    drop(pin);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay_and_keepalive_from_the_listener() {
        use std::os::fd::AsRawFd;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        tune_listener(&listener);
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
        let get = |level, name| {
            let mut value: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let rc = unsafe {
                libc::getsockopt(
                    accepted.as_raw_fd(),
                    level,
                    name,
                    &mut value as *mut libc::c_int as *mut libc::c_void,
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            value
        };
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), KEEPALIVE_IDLE_SECS);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), KEEPALIVE_INTERVAL_SECS);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), KEEPALIVE_PROBES);
    }
}
