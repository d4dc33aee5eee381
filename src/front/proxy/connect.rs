//! Connecting a new client connection to its slot, before a byte is read from the client.
//!
//! Invariants:
//! - The front connects to the backend *before* reading a byte from the client, retrying a refused
//!   connect every [`RETRY_STEP`] for up to [`RETRY_WINDOW`]: a slot restarting its listener or a
//!   change of the serving set racing a connect costs latency, not a failed request. While no byte
//!   has flowed, a retry picks again from the serving set, another backend than the one that
//!   refused if the set has one; after that the connection is pinned.
//! - With an empty serving set, a connection waits up to [`HOLD_WINDOW`] for a backend, then is
//!   closed: while a move of the data switches stores, no slot serves for a moment (the old slots
//!   stop and their last changes reach the new store), and requests are delayed, not failed.
//! - A connection whose slot did not accept within the window counts as `failed` for that slot.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::warn;

use super::accounting::Pinned;
use super::router::{Active, Router};

/// How long a new connection may wait for a backend to accept (or to exist).
pub const RETRY_WINDOW: Duration = Duration::from_secs(2);
/// How long a new connection waits for a backend while the serving set is empty. A move's switch
/// took 1.6 s from the old slot's SIGTERM to the new store having its last change, on real kcp
/// (tests/slot_real_kcp.rs), plus the controller's looks.
pub const HOLD_WINDOW: Duration = Duration::from_secs(10);
/// Pause between two connect attempts.
pub const RETRY_STEP: Duration = Duration::from_millis(50);

/// The slot a new connection is given, its count in that slot, and the connected upstream (with
/// TCP_NODELAY); `None` when no slot took it within [`RETRY_WINDOW`] (logged and counted).
pub(super) async fn connect(router: &Router, peer: SocketAddr) -> Option<(Arc<Active>, Pinned, TcpStream)> {
    let mut deadline = Instant::now() + RETRY_WINDOW;
    let mut active = match router.pick(None) {
        Some(active) => active,
        None => match router.wait_for_backend(Instant::now() + HOLD_WINDOW).await {
            Some(active) => {
                deadline = Instant::now() + RETRY_WINDOW;
                active
            }
            None => {
                warn!(%peer, "closing a client connection: the front has no backend yet");
                return None;
            }
        },
    };
    let mut pin = Pinned::new(&active.counters);
    loop {
        let err = match dial(active.backend.address, deadline).await {
            Ok(upstream) => return Some((active, pin, upstream)),
            Err(err) => err.to_string(),
        };
        if Instant::now() + RETRY_STEP >= deadline {
            warn!(%peer, slot = %active.backend.slot, address = %active.backend.address, error = %err,
                "closing a client connection: its slot did not accept within {:?}", RETRY_WINDOW);
            active.counters.count_failed();
            return None;
        }
        tokio::time::sleep(RETRY_STEP).await;
        // Nothing has flowed yet, so moving to another backend is still safe.
        if let Some(now) = router.pick(Some(active.backend.address))
            && now.backend != active.backend
        {
            active = now;
            pin = Pinned::new(&active.counters);
        }
    }
}

/// A connection to a slot, with TCP_NODELAY, or the error of the last try by `deadline` (timed out
/// when it has not connected by then). The slot is a local process: a dead one closes its sockets,
/// so no keepalive is needed.
pub(super) async fn dial(address: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    let upstream = tokio::time::timeout_at(deadline, TcpStream::connect(address))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = upstream.set_nodelay(true);
    Ok(upstream)
}
