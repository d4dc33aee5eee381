//! The copy loop of one connection: bytes both ways, until both sides end, the slot is closed, or
//! a kept-alive HTTP/1.1 connection to a retired slot starts its next request.
//!
//! Invariants:
//! - Reads go into one 64 KiB scratch buffer per thread and are written straight on; a connection
//!   owns a buffer only while its destination cannot take what was read (backpressure), so an idle
//!   watch holds no buffer and a connection costs no allocation.
//! - An EOF from one side becomes a `shutdown(SHUT_WR)` on the other (a half-close), and there is
//!   no idle timeout: kcp watches stay open for hours.
//! - Every read is shown to the connection's [`keepalive::Exchange`] before it is written on; a
//!   client read that starts the next request on a kept-alive HTTP/1.1 connection to a retired
//!   slot is not written: the connection is closed instead, as it is when left unused for
//!   [`keepalive::IDLE_CLOSE`] after an answer ([`crate::front::keepalive`] says why and how those
//!   moments are told through TLS). While retired, the connection is counted in its slot's
//!   `retired_pending` while it may still carry a request to the slot, or in `retired_unjudged`.
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::accounting::{Retired, RetiredCount, SlotCounters};
use super::router::Routes;
use crate::front::keepalive::{self, Verdict};

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
}

/// Why a direction stopped copying.
#[derive(Debug, PartialEq, Eq)]
enum Halt {
    /// The source ended.
    Eof,
    /// `inspect` refused what was read: the connection is to be closed.
    Refused,
}

impl Half {
    /// Copies until the source ends or `inspect` refuses a read (Ready) or a socket is not ready
    /// (Pending, with the task's waker registered on it). Reads and writes go through tokio's
    /// `poll_read`/`poll_write`, which clear a socket's readiness on a short read or write, so the
    /// copy needs no `EAGAIN` syscall; each read spends tokio's cooperative budget, so a bulk
    /// transfer yields to other connections.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut ReadHalf<'_>,
        dst: &mut WriteHalf<'_>,
        mut inspect: impl FnMut(&[u8]) -> Verdict,
    ) -> Poll<io::Result<Halt>> {
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
                    return Poll::Ready(Ok(Some(Halt::Eof)));
                }
                if inspect(&scratch[..n]) == Verdict::Close {
                    return Poll::Ready(Ok(Some(Halt::Refused)));
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
                Poll::Ready(Ok(None))
            });
            if let Some(halt) = ready!(step)? {
                self.ended = halt == Halt::Eof;
                return Poll::Ready(Ok(halt));
            }
        }
    }
}

/// How a connection ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Both directions ended; the bytes copied client to upstream and back.
    Both { up: u64, down: u64 },
    /// Its slot is shutting down ([`super::Router::close`]).
    SlotClosing,
    /// A kept-alive HTTP/1.1 connection to a retired slot started its next request.
    Retired,
    /// A kept-alive HTTP/1.1 connection to a retired slot was left unused after an answer.
    Idle,
}

/// Copies both ways until both directions have ended (or one fails), the connection's slot is
/// closed, or the connection is a kept-alive HTTP/1.1 one to a retired slot and its client starts
/// the next request. It takes over from the connection's opening ([`super::opening`]): the TLS
/// records followed so far, and whether the client has ended its side already. An EOF from one side becomes a `shutdown(SHUT_WR)` on the other, unless the
/// other direction has ended already: the close that follows sends the FIN then.
pub(super) async fn pump(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    routes: &mut watch::Receiver<Routes>,
    address: SocketAddr,
    counters: &SlotCounters,
    (mut exchange, client_ended): (keepalive::Exchange, bool),
) -> io::Result<Ended> {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let mut up = Half {
        ended: client_ended,
        ..Half::default()
    };
    let mut down = Half::default();
    let mut counted = RetiredCount::new(counters);
    let mut watching = true;
    // A change or close made before this connection subscribed.
    let mut retired = {
        let now = routes.borrow_and_update();
        if now.closing.contains(&address) {
            return Ok(Ended::SlotClosing);
        }
        now.retired(address)
    };
    // When the slot last sent bytes (kept only for a connection the front follows).
    let mut slot_spoke = Instant::now();
    loop {
        // A retired connection between two requests is closed once unused for IDLE_CLOSE.
        let idle_at = (retired && exchange.answered()).then(|| slot_spoke + keepalive::IDLE_CLOSE);
        if idle_at.is_some_and(|at| at <= Instant::now()) {
            return Ok(Ended::Idle);
        }
        let copy = std::future::poll_fn(|cx| {
            let slot_copied = down.copied;
            // Both directions first, then the shutdowns: when both ends closed together (the common
            // end of a short connection), neither needs one.
            let up_ends = match up.ended {
                false => {
                    let inspect = |bytes: &[u8]| exchange.client_sent(bytes, retired);
                    match up.poll(cx, &mut client_read, &mut upstream_write, inspect) {
                        Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                        Poll::Ready(Ok(Halt::Refused)) => return Poll::Ready(Some(Ok(Ended::Retired))),
                        polled => polled.is_ready(),
                    }
                }
                true => false,
            };
            let down_ends = match down.ended {
                false => {
                    let inspect = |bytes: &[u8]| {
                        exchange.slot_sent(bytes);
                        Verdict::Forward
                    };
                    match down.poll(cx, &mut upstream_read, &mut client_write, inspect) {
                        Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                        polled => polled.is_ready(),
                    }
                }
                true => false,
            };
            if down.copied != slot_copied && exchange.closable() {
                slot_spoke = Instant::now();
            }
            if retired {
                counted.set(retired_as(&exchange));
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
            } else if retired && idle_at.is_none() && exchange.answered() {
                // An answer just completed: time the idle close (above).
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
                retired = now.retired(address);
                counted.set(if retired { retired_as(&exchange) } else { Retired::No });
            }
            // Wakes to look again: the slot may have spoken since (then the moment moves on).
            () = tokio::time::sleep_until(idle_at.unwrap_or_else(Instant::now)), if idle_at.is_some() => {}
        }
    }
}

fn retired_as(exchange: &keepalive::Exchange) -> Retired {
    if !exchange.closable() {
        Retired::Unjudged
    } else if exchange.answering() {
        // Its next request is closed, not forwarded: nothing more of it reaches the slot.
        Retired::No
    } else {
        Retired::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::net::TcpListener;

    use super::*;

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
        let (_routes, mut watched) = watch::channel(Routes {
            serving: vec![address],
            ..Routes::default()
        });
        let pump = tokio::spawn(async move {
            let counters = SlotCounters::default();
            let opened = (keepalive::Exchange::default(), false);
            match pump(
                &mut client_near,
                &mut upstream_near,
                &mut watched,
                address,
                &counters,
                opened,
            )
            .await?
            {
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
