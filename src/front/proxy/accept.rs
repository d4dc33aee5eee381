//! Accepting client connections, and the life of each one: connect to its slot, open (replayed to
//! another slot if the first does not answer), copy, log.
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
use super::connect::RETRY_STEP;
use super::opening::{self, Opened};
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

const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_PROBES: u32 = 4;

/// Sets TCP_NODELAY and keepalive on the listening socket. Linux copies both into every socket
/// `accept` returns, which saves five syscalls per client connection; an inherited socket gets
/// the same treatment (idempotent).
pub fn tune_listener(listener: &TcpListener) {
    let socket = socket2::SockRef::from(listener);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket
        .set_tcp_nodelay(true)
        .and_then(|()| socket.set_tcp_keepalive(&keepalive))
    {
        warn!(%error, "cannot set TCP_NODELAY and keepalive on the front's listener");
    }
}

/// One client connection, from accept to close.
async fn forward(router: Arc<Router>, mut client: TcpStream, peer: SocketAddr) {
    let _tracked = Tracked::new(&router);
    let Some(Opened {
        active,
        pin,
        mut upstream,
        exchange,
        client_ended,
    }) = opening::open(&router, &mut client, peer).await
    else {
        return;
    };
    let address = active.backend.address;
    let mut routes = router.routes();
    let opened = (exchange, client_ended);
    match pump(&mut client, &mut upstream, &mut routes, address, pin.counters(), opened).await {
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
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        tune_listener(&listener);
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
        let accepted = socket2::SockRef::from(&accepted);
        assert!(accepted.keepalive().unwrap());
        assert_eq!(accepted.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(accepted.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(accepted.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
    }
}
