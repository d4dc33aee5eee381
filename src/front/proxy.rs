//! The data path: accept, pick the backend, connect to it, copy bytes both ways.
//!
//! Invariants (docs/front.md):
//! - The backend is read once per connection from a watch channel (an atomic pointer swap for the
//!   writer, a short read lock for the reader); a switch never touches an open connection, which
//!   stays pinned to its slot until one side closes.
//! - The front connects to the backend *before* reading a byte from the client, retrying a refused
//!   connect every [`RETRY_STEP`] for up to [`RETRY_WINDOW`]: a slot restarting its listener or a
//!   switch racing a connect costs latency, not a failed request. While no byte has flowed, a
//!   retry may follow a switch to the new backend; after that the connection is pinned.
//! - With no backend yet, a connection waits up to [`RETRY_WINDOW`] for one, then is closed.
//! - TCP_NODELAY on both sides, EOF propagated as a half-close (`shutdown(SHUT_WR)` on the other
//!   side), and no idle timeout: kcp watches stay open for hours. TCP keepalive (idle 60 s, then 4
//!   probes 15 s apart) on client connections instead finds peers that vanished without a FIN, so a
//!   dead client does not hold a slot connection (and its watch) forever. Both are set once on the
//!   listening socket; accepted sockets inherit them.
//! - The copy ([`pump`]) reads into one 64 KiB scratch buffer per thread and writes straight on;
//!   a connection owns a buffer only while its destination cannot take what was read
//!   (backpressure), so an idle watch holds no buffer and a connection costs no allocation.
//! - A kept-alive HTTP/1.1 connection to a slot the front no longer forwards to is closed as soon
//!   as it is idle between two requests, so that it is not open when that slot gets SIGTERM
//!   ([`super::keepalive`] says why and how idle is told through TLS).
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::front::keepalive;
use crate::front::protocol::{Backend, SlotConnections};

/// How long a new connection may wait for a backend to accept (or to exist).
pub const RETRY_WINDOW: Duration = Duration::from_secs(2);
/// Pause between two connect attempts.
pub const RETRY_STEP: Duration = Duration::from_millis(50);

#[derive(Default, Debug)]
struct SlotCounters {
    open: AtomicU64,
    total: AtomicU64,
    failed: AtomicU64,
}

/// The backend in force and the counters of its slot, swapped as one value.
#[derive(Debug)]
struct Active {
    backend: Backend,
    counters: Arc<SlotCounters>,
}

/// Shared by the accept loop, every connection and the control server.
#[derive(Debug)]
pub struct Router {
    active: watch::Sender<Option<Arc<Active>>>,
    slots: Mutex<BTreeMap<String, Arc<SlotCounters>>>,
    /// Connections open in this process, whatever their slot; drained to 0 on shutdown. An atomic
    /// (not a watch channel, whose every update takes a lock and wakes its shards) because it
    /// changes twice per connection; `idle` is notified when it drops to 0.
    open: AtomicU64,
    idle: Notify,
    /// Where new connections go, and which backends' open connections are to be closed: what an
    /// open connection watches.
    routes: watch::Sender<Routes>,
}

/// What an open connection needs to know of the routing, as one value it can watch.
#[derive(Debug, Default)]
struct Routes {
    /// The backend new connections go to; a connection to another one is retired.
    active: Option<SocketAddr>,
    /// Backends whose open connections are to be closed (a slot that is shutting down).
    closing: BTreeSet<SocketAddr>,
}

impl Router {
    pub fn new(initial: Option<Backend>) -> Arc<Router> {
        let router = Arc::new(Router {
            active: watch::Sender::new(None),
            slots: Mutex::new(BTreeMap::new()),
            open: AtomicU64::new(0),
            idle: Notify::new(),
            routes: watch::Sender::new(Routes::default()),
        });
        if let Some(backend) = initial {
            router.switch(backend);
        }
        router
    }

    /// Closes every open connection to `address` (a slot that is shutting down: kcp keeps a
    /// stopping process alive while watches are open through it). Clients see their connection
    /// end and reconnect, to the active slot. A later switch to the same address lifts it.
    pub fn close(&self, address: SocketAddr) {
        self.routes.send_modify(|routes| {
            routes.closing.insert(address);
        });
    }

    /// Makes `backend` the target of new connections. Open connections stay on their slot, except
    /// kept-alive HTTP/1.1 ones to another slot, which are closed once idle between requests.
    pub fn switch(&self, backend: Backend) {
        let address = backend.address;
        let counters = self
            .slots
            .lock()
            .expect("slot counters lock")
            .entry(backend.slot.clone())
            .or_default()
            .clone();
        self.active.send_replace(Some(Arc::new(Active { backend, counters })));
        self.routes.send_if_modified(|routes| {
            let lifted = routes.closing.remove(&address);
            lifted || routes.active.replace(address) != Some(address)
        });
    }

    pub fn backend(&self) -> Option<Backend> {
        self.active.borrow().as_ref().map(|a| a.backend.clone())
    }

    pub fn connections(&self) -> BTreeMap<String, SlotConnections> {
        self.slots
            .lock()
            .expect("slot counters lock")
            .iter()
            .map(|(slot, c)| {
                let counts = SlotConnections {
                    open: c.open.load(Ordering::Relaxed),
                    total: c.total.load(Ordering::Relaxed),
                    failed: c.failed.load(Ordering::Relaxed),
                };
                (slot.clone(), counts)
            })
            .collect()
    }

    pub fn open_connections(&self) -> u64 {
        self.open.load(Ordering::Acquire)
    }

    /// Waits until every connection of this process has closed, or `bound` has passed; returns the
    /// number still open.
    pub async fn drain(&self, bound: Duration) -> u64 {
        let _ = tokio::time::timeout(bound, async {
            loop {
                // Registered before the check, so that a close in between is not missed.
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if self.open_connections() == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await;
        self.open_connections()
    }

    fn current(&self) -> Option<Arc<Active>> {
        self.active.borrow().clone()
    }

    async fn wait_for_backend(&self, deadline: Instant) -> Option<Arc<Active>> {
        let mut rx = self.active.subscribe();
        let found = tokio::time::timeout_at(deadline, async {
            rx.wait_for(|a| a.is_some()).await.ok().map(|a| a.clone())
        });
        found.await.ok().flatten().flatten()
    }
}

/// Counts one connection in its slot: total at once, open for as long as it lives.
struct Pinned(Arc<SlotCounters>);

impl Pinned {
    fn new(counters: &Arc<SlotCounters>) -> Pinned {
        counters.total.fetch_add(1, Ordering::Relaxed);
        counters.open.fetch_add(1, Ordering::Relaxed);
        Pinned(counters.clone())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a connection in the process total, from accept to close.
struct Tracked(Arc<Router>);

impl Tracked {
    fn new(router: &Arc<Router>) -> Tracked {
        router.open.fetch_add(1, Ordering::AcqRel);
        Tracked(router.clone())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

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

async fn forward(router: Arc<Router>, mut client: TcpStream, peer: SocketAddr) {
    let _tracked = Tracked::new(&router);
    let deadline = Instant::now() + RETRY_WINDOW;
    let mut active = match router.current() {
        Some(active) => active,
        None => match router.wait_for_backend(deadline).await {
            Some(active) => active,
            None => {
                warn!(%peer, "closing a client connection: the front has no backend yet");
                return;
            }
        },
    };
    let mut pin = Pinned::new(&active.counters);
    let mut upstream = loop {
        let attempt = tokio::time::timeout_at(deadline, TcpStream::connect(active.backend.address)).await;
        let err = match attempt {
            Ok(Ok(stream)) => break Some(stream),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "connect timed out".to_string(),
        };
        if Instant::now() + RETRY_STEP >= deadline {
            warn!(%peer, slot = %active.backend.slot, address = %active.backend.address, error = %err,
                "closing a client connection: its slot did not accept within {:?}", RETRY_WINDOW);
            active.counters.failed.fetch_add(1, Ordering::Relaxed);
            break None;
        }
        tokio::time::sleep(RETRY_STEP).await;
        // Nothing has flowed yet, so following a switch is still safe.
        if let Some(now) = router.current()
            && now.backend != active.backend
        {
            active = now;
            pin = Pinned::new(&active.counters);
        }
    };
    let Some(upstream) = upstream.as_mut() else {
        return;
    };
    // The slot is a local process: a dead one closes its sockets, so no keepalive is needed here.
    let _ = upstream.set_nodelay(true);
    let address = active.backend.address;
    let mut routes = router.routes.subscribe();
    match pump(&mut client, upstream, &mut routes, address).await {
        Ok(Ended::Both { up, down }) => debug!(%peer, slot = %active.backend.slot, up, down, "connection closed"),
        Ok(Ended::SlotClosing) => {
            debug!(%peer, slot = %active.backend.slot, "closing a connection to a slot that is shutting down")
        }
        Ok(Ended::Idle) => debug!(%peer, slot = %active.backend.slot,
            "closing an idle kept-alive connection to a slot new connections no longer go to"),
        Err(err) => debug!(%peer, slot = %active.backend.slot, error = %err, "connection ended with an error"),
    }
    drop(pin);
}

/// Size of the per-thread scratch buffer every read goes into: large enough that a bulk transfer
/// moves in few syscalls, and shared, so that it costs one allocation per thread, not per connection.
const SCRATCH: usize = 64 * 1024;

thread_local! {
    static SCRATCH_BUFFER: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// One direction of a connection: bytes from a read half to a write half.
#[derive(Default)]
struct Half {
    /// Read but not yet taken by the destination (its send buffer was full); empty, and
    /// unallocated, otherwise.
    pending: Vec<u8>,
    sent: usize,
    /// The source has ended (EOF).
    ended: bool,
    copied: u64,
    /// The first bytes read were a ClientHello that does not offer HTTP/2 (see
    /// [`keepalive::offers_http1_only`]); only meaningful for the client's direction.
    opened_http1: bool,
}

impl Half {
    /// Copies until the source ends (Ready) or a socket is not ready (Pending, with the task's
    /// waker registered on it). Reads and writes go through tokio's `poll_read`/`poll_write`, which
    /// clear a socket's readiness on a short read or write, so the copy needs no `EAGAIN` syscall;
    /// each read spends tokio's cooperative budget, so a bulk transfer yields to other connections.
    fn poll(&mut self, cx: &mut Context<'_>, src: &mut ReadHalf<'_>, dst: &mut WriteHalf<'_>) -> Poll<io::Result<()>> {
        loop {
            while self.sent < self.pending.len() {
                let n = ready!(Pin::new(&mut *dst).poll_write(cx, &self.pending[self.sent..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.sent += n;
            }
            if !self.pending.is_empty() {
                self.pending = Vec::new();
                self.sent = 0;
            }
            let step = SCRATCH_BUFFER.with_borrow_mut(|scratch| {
                let mut read = ReadBuf::new(scratch);
                ready!(Pin::new(&mut *src).poll_read(cx, &mut read))?;
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(Ok(true));
                }
                if self.copied == 0 {
                    self.opened_http1 = keepalive::offers_http1_only(&scratch[..n]);
                }
                self.copied += n as u64;
                let mut sent = 0;
                while sent < n {
                    match Pin::new(&mut *dst).poll_write(cx, &scratch[sent..n]) {
                        Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                        Poll::Ready(Ok(k)) => sent += k,
                        Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                        Poll::Pending => {
                            // The waker is registered for the destination's room; keep the rest.
                            self.pending = scratch[sent..n].to_vec();
                            return Poll::Pending;
                        }
                    }
                }
                Poll::Ready(Ok(false))
            });
            if ready!(step)? {
                self.ended = true;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// How a connection ended.
#[derive(Debug)]
enum Ended {
    /// Both directions ended; the bytes copied client to upstream and back.
    Both { up: u64, down: u64 },
    /// Its slot is shutting down ([`Router::close`]).
    SlotClosing,
    /// A kept-alive HTTP/1.1 connection to a retired slot, idle between requests.
    Idle,
}

/// Copies both ways until both directions have ended (or one fails), the connection's slot is
/// closed, or the connection is a kept-alive HTTP/1.1 one to a retired slot and idle. An EOF from
/// one side becomes a `shutdown(SHUT_WR)` on the other, unless the other direction has ended
/// already: the close that follows sends the FIN then.
async fn pump(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    routes: &mut watch::Receiver<Routes>,
    address: SocketAddr,
) -> io::Result<Ended> {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let mut up = Half::default();
    let mut down = Half::default();
    let mut turns = keepalive::Turns::default();
    let mut watching = true;
    // A switch or close made before this connection subscribed.
    let mut retired = {
        let now = routes.borrow_and_update();
        if now.closing.contains(&address) {
            return Ok(Ended::SlotClosing);
        }
        now.active.is_some_and(|a| a != address)
    };
    loop {
        let idle_at = (retired && up.opened_http1 && up.pending.is_empty() && down.pending.is_empty())
            .then(|| turns.idle_at())
            .flatten();
        if idle_at.is_some_and(|at| at <= Instant::now()) {
            return Ok(Ended::Idle);
        }
        let copy = std::future::poll_fn(|cx| {
            let copied = (up.copied, down.copied);
            let backlog = !up.pending.is_empty() || !down.pending.is_empty();
            // Both directions first, then the shutdowns: when both ends closed together (the common
            // end of a short connection), neither needs one.
            let up_ends = match up.ended {
                false => match up.poll(cx, &mut client_read, &mut upstream_write) {
                    Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                    polled => polled.is_ready(),
                },
                true => false,
            };
            let down_ends = match down.ended {
                false => match down.poll(cx, &mut upstream_read, &mut client_write) {
                    Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                    polled => polled.is_ready(),
                },
                true => false,
            };
            let mut answered = false;
            if up.opened_http1 {
                // Both in one poll: the client's counts as the later (a request may be in flight).
                if down.copied != copied.1 {
                    turns.slot_sent(Instant::now());
                    answered = true;
                }
                if up.copied != copied.0 {
                    turns.client_sent();
                    answered = false;
                }
            }
            if up_ends && !down.ended {
                let _ = Pin::new(&mut upstream_write).poll_shutdown(cx);
            }
            if down_ends && !up.ended {
                let _ = Pin::new(&mut client_write).poll_shutdown(cx);
            }
            if up.ended && down.ended {
                Poll::Ready(Some(Ok(Ended::Both {
                    up: up.copied,
                    down: down.copied,
                })))
            } else if retired && (answered || (backlog && up.pending.is_empty() && down.pending.is_empty())) {
                // The connection may become idle (an answer came, or the last of it went out): time
                // it (below).
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        });
        tokio::select! {
            biased;
            ended = copy => if let Some(ended) = ended {
                return ended;
            },
            changed = routes.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let now = routes.borrow_and_update();
                if now.closing.contains(&address) {
                    return Ok(Ended::SlotClosing);
                }
                retired = now.active.is_some_and(|a| a != address);
            }
            () = tokio::time::sleep_until(idle_at.unwrap_or_else(Instant::now)), if idle_at.is_some() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(slot: &str, port: u16) -> Backend {
        Backend {
            slot: slot.into(),
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    #[test]
    fn a_switch_changes_the_backend_and_keeps_each_slots_counts() {
        let router = Router::new(Some(backend("blue", 1)));
        let blue = router.current().unwrap();
        let pinned = Pinned::new(&blue.counters);
        router.switch(backend("green", 2));
        assert_eq!(router.backend(), Some(backend("green", 2)));
        let green = Pinned::new(&router.current().unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 1));
        assert_eq!((counts["green"].open, counts["green"].total), (1, 1));
        drop(pinned);
        drop(green);
        // Back to blue: the same counters continue.
        router.switch(backend("blue", 1));
        let _again = Pinned::new(&router.current().unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 2));
        assert_eq!((counts["green"].open, counts["green"].total), (0, 1));
    }

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

    #[tokio::test]
    async fn drain_waits_for_the_last_connection_or_the_bound() {
        let router = Router::new(None);
        assert_eq!(router.drain(Duration::from_secs(5)).await, 0);
        let tracked = Tracked::new(&router);
        assert_eq!(router.drain(Duration::from_millis(50)).await, 1);
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(tracked);
        });
        assert_eq!(router.drain(Duration::from_secs(5)).await, 0);
        closer.await.unwrap();
    }

    #[tokio::test]
    async fn closing_a_slot_ends_its_open_connections_and_spares_the_others() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Two backends that accept and hold their connections open, echoing nothing.
        let hold = || async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((stream, _)) = listener.accept().await {
                    held.push(stream);
                }
            });
            address
        };
        let (old, new) = (hold().await, hold().await);
        let (router, front_address, _stop) = front_to(old).await;

        let mut on_old = TcpStream::connect(front_address).await.unwrap();
        on_old.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        router.switch(Backend {
            slot: "b".into(),
            address: new,
        });
        let mut on_new = TcpStream::connect(front_address).await.unwrap();
        on_new.write_all(b"y").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;

        router.close(old);
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), on_old.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the connection to the closed slot ends: {read:?}"
        );
        let still = tokio::time::timeout(Duration::from_millis(300), on_new.read(&mut buf)).await;
        assert!(still.is_err(), "the connection to the active slot stays open");
        assert_eq!(router.connections()["a"].open, 0);
        assert_eq!(router.connections()["b"].open, 1);
    }

    /// A backend that answers every read with "answer", after `delay`.
    async fn answering_backend(delay: Duration) -> SocketAddr {
        answering_backend_with(delay, |_| b"answer".to_vec()).await
    }

    /// A backend that answers the `n`th read (from 1) with `answer(n)`, after `delay`.
    async fn answering_backend_with(delay: Duration, answer: fn(usize) -> Vec<u8>) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut reads = 0;
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        reads += 1;
                        tokio::time::sleep(delay).await;
                        if stream.write_all(&answer(reads)).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    /// A front on a fresh port forwarding to `backend`.
    async fn front_to(backend: SocketAddr) -> (Arc<Router>, SocketAddr, watch::Sender<bool>) {
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = front.local_addr().unwrap();
        let router = Router::new(Some(Backend {
            slot: "a".into(),
            address: backend,
        }));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept_loop(Arc::new(front), router.clone(), stopped));
        (router, address, stop)
    }

    /// Sends each flight and reads the answer to it, as a TLS client and then an HTTP/1.1 one do.
    async fn exchange(stream: &mut TcpStream, flights: &[&[u8]]) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for flight in flights {
            stream.write_all(flight).await.unwrap();
            let mut answer = [0u8; 6];
            stream.read_exact(&mut answer).await.unwrap();
        }
    }

    async fn ends_within(stream: &mut TcpStream, bound: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(bound, stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn an_idle_http1_connection_to_a_retired_slot_is_closed_and_others_are_not() {
        let old = answering_backend(Duration::ZERO).await;
        let new = answering_backend(Duration::ZERO).await;
        let (router, front, _stop) = front_to(old).await;
        let http1 = keepalive::client_hello(&[b"http/1.1"]);
        let h2 = keepalive::client_hello(&[b"h2", b"http/1.1"]);
        let mut idle_http1 = TcpStream::connect(front).await.unwrap();
        exchange(&mut idle_http1, &[&http1, b"finished", b"GET /readyz"]).await;
        let mut idle_h2 = TcpStream::connect(front).await.unwrap();
        exchange(&mut idle_h2, &[&h2, b"finished", b"GET /readyz"]).await;
        let mut in_handshake = TcpStream::connect(front).await.unwrap();
        exchange(&mut in_handshake, &[&http1]).await;

        router.switch(Backend {
            slot: "b".into(),
            address: new,
        });
        assert!(
            ends_within(&mut idle_http1, Duration::from_secs(2)).await,
            "an idle kept-alive HTTP/1.1 connection to the retired slot is closed"
        );
        assert!(
            !ends_within(&mut idle_h2, Duration::from_millis(300)).await,
            "an HTTP/2 connection multiplexes: it is never known to be idle"
        );
        assert!(
            !ends_within(&mut in_handshake, Duration::from_millis(100)).await,
            "a connection still in its TLS handshake is left alone"
        );
        // A kept-alive HTTP/1.1 connection to the active slot stays.
        let mut on_new = TcpStream::connect(front).await.unwrap();
        exchange(&mut on_new, &[&http1, b"finished", b"GET /readyz"]).await;
        assert!(!ends_within(&mut on_new, Duration::from_millis(300)).await);
    }

    #[tokio::test]
    async fn a_request_in_flight_at_the_switch_gets_its_answer_before_the_close() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let old = answering_backend(Duration::from_millis(300)).await;
        let (router, front, _stop) = front_to(old).await;
        let mut client = TcpStream::connect(front).await.unwrap();
        exchange(&mut client, &[&keepalive::client_hello(&[]), b"finished", b"GET /a"]).await;
        client.write_all(b"GET /b").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        router.switch(backend("b", 1));
        let mut answer = [0u8; 6];
        let read = tokio::time::timeout(Duration::from_secs(2), client.read_exact(&mut answer)).await;
        assert!(matches!(read, Ok(Ok(_))), "the request in flight is answered: {read:?}");
        assert_eq!(&answer, b"answer");
        assert!(
            ends_within(&mut client, Duration::from_secs(2)).await,
            "then the connection is closed"
        );
    }

    #[tokio::test]
    async fn a_large_answer_to_a_slow_reader_is_delivered_whole_before_the_close() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const LARGE: usize = 8 << 20;
        let old = answering_backend_with(Duration::ZERO, |n| match n {
            3 => vec![7u8; LARGE],
            _ => b"answer".to_vec(),
        })
        .await;
        let (router, front, _stop) = front_to(old).await;
        let mut client = TcpStream::connect(front).await.unwrap();
        exchange(&mut client, &[&keepalive::client_hello(&[]), b"finished"]).await;
        client.write_all(b"GET /large").await.unwrap();
        // The answer backs up in the front while the client does not read.
        tokio::time::sleep(Duration::from_millis(200)).await;
        router.switch(backend("b", 1));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut received = 0;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => {
                    assert!(buf[..n].iter().all(|b| *b == 7));
                    received += n;
                    // Slowly, so that the client's socket stays full and the answer's last bytes
                    // wait in the front after the slot has sent them.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                other => panic!("after {received} bytes: {other:?}"),
            }
        }
        assert_eq!(received, LARGE, "the whole answer, then the close");
    }

    #[tokio::test]
    async fn a_connection_without_a_backend_waits_for_a_switch() {
        let router = Router::new(None);
        let waiter = {
            let router = router.clone();
            tokio::spawn(async move {
                router
                    .wait_for_backend(Instant::now() + Duration::from_secs(5))
                    .await
                    .map(|a| a.backend.clone())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        router.switch(backend("blue", 1));
        assert_eq!(waiter.await.unwrap(), Some(backend("blue", 1)));
        let none = Router::new(None)
            .wait_for_backend(Instant::now() + Duration::from_millis(20))
            .await;
        assert!(none.is_none());
    }

    /// A connected pair of loopback sockets: (ours, theirs).
    async fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialled = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (accepted, dialled)
    }

    /// A client, the pump, an upstream: returns the client's and the upstream's far ends.
    async fn pumped() -> (TcpStream, TcpStream, tokio::task::JoinHandle<io::Result<(u64, u64)>>) {
        let (mut client_near, client_far) = socket_pair().await;
        let (mut upstream_near, upstream_far) = socket_pair().await;
        let address = upstream_near.peer_addr().unwrap();
        let (_routes, mut watched) = watch::channel(Routes::default());
        let pump = tokio::spawn(async move {
            match pump(&mut client_near, &mut upstream_near, &mut watched, address).await? {
                Ended::Both { up, down } => Ok((up, down)),
                other => panic!("the pump ended as {other:?}"),
            }
        });
        (client_far, upstream_far, pump)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_pump_carries_a_large_transfer_intact_through_a_slow_reader() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, mut upstream, pump) = pumped().await;
        const SIZE: usize = 8 << 20;
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 4096) as u8).collect();
        let sender = {
            let data = data.clone();
            tokio::spawn(async move {
                upstream.write_all(&data).await.unwrap();
                upstream.shutdown().await.unwrap();
                upstream
            })
        };
        // Read in small, slow steps, so that the pump's writes to the client come up short and it
        // holds the rest as pending bytes.
        let mut got = Vec::with_capacity(SIZE);
        let mut buf = vec![0u8; 3000];
        loop {
            let n = client.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if got.len() % 7 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert_eq!(got.len(), SIZE);
        assert!(got == data, "the bytes arrive in order and unchanged");
        // The client ends too; the pump returns with the counts.
        drop(client);
        let _upstream = sender.await.unwrap();
        let (up, down) = tokio::time::timeout(Duration::from_secs(5), pump)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((up, down), (0, SIZE as u64));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_eof_from_the_upstream_is_a_half_close_and_the_client_can_still_send() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, mut upstream, pump) = pumped().await;
        upstream.write_all(b"bye").await.unwrap();
        upstream.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye", "the client sees the bytes, then EOF");
        client.write_all(b"still here").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got, b"still here",
            "the other direction stays open until the client ends it"
        );
        let counts = tokio::time::timeout(Duration::from_secs(5), pump)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(counts, (10, 3));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reset_ends_the_pump_with_an_error() {
        let (client, _upstream, pump) = pumped().await;
        // SO_LINGER 0: close sends a RST instead of a FIN.
        client.set_zero_linger().unwrap();
        drop(client);
        let ended = tokio::time::timeout(Duration::from_secs(5), pump)
            .await
            .unwrap()
            .unwrap();
        assert!(ended.is_err(), "{ended:?}");
    }
}
