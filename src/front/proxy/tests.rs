//! The data path end to end on loopback: a front's accept loop in front of small TCP backends
//! that speak in TLS-shaped records (record headers and lengths as TLS 1.3 has them, bodies
//! filler), for what needs all of it: retirement and the closing of open connections.
//!
//! A test that sleeps and then looks at the front's counters runs on tokio's paused clock: its
//! sleep ends only once every task (the front's, the slots', the clients') waits and no socket has
//! anything to read, so it looks at a settled front however loaded the machine is. The tests that
//! keep clients busy without a pause (a paused clock never advances then), or that measure a
//! pause in an answer, run on the real clock and wait for what they check with a deadline.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Router, accept_loop};
use crate::front::keepalive::shapes::{FINISHED, client_hello, data, record, server_hello};
use crate::front::protocol::Backend;

fn backend(slot: &str, address: SocketAddr) -> Backend {
    Backend {
        slot: slot.into(),
        address,
    }
}

/// The server's first flight: its hello, then its encrypted handshake and session tickets.
fn server_flight() -> Vec<u8> {
    [server_hello(true), record(20, 1), data(2000), data(90)].concat()
}

/// The answer every request gets unless a test says otherwise.
const ANSWER: usize = 400;
/// What every request is.
const REQUEST: usize = 300;

/// A slot: answers a connection's first read with [`server_flight`] and every later read with
/// `answer(n)` (n from 1, per connection), written as the pieces given, `pause` apart.
struct Slot {
    address: SocketAddr,
    /// Requests it received (reads after the handshake), all connections together.
    requests: Arc<AtomicUsize>,
}

async fn slot(answer: fn(usize) -> Vec<Vec<u8>>, pause: Duration) -> Slot {
    slow_slot(Duration::ZERO, answer, pause).await
}

/// A [`slot`] that answers a connection's first read only `slow` after it.
async fn slow_slot(slow: Duration, answer: fn(usize) -> Vec<Vec<u8>>, pause: Duration) -> Slot {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut reads = 0;
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let pieces = if reads == 0 {
                        tokio::time::sleep(slow).await;
                        vec![server_flight()]
                    } else {
                        counted.fetch_add(1, Ordering::SeqCst);
                        answer(reads)
                    };
                    reads += 1;
                    for (i, piece) in pieces.iter().enumerate() {
                        if i > 0 {
                            tokio::time::sleep(pause).await;
                        }
                        if stream.write_all(piece).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Slot { address, requests }
}

fn plain_answer(_: usize) -> Vec<Vec<u8>> {
    vec![data(ANSWER)]
}

/// A front on a fresh port serving `slot` "a".
async fn front_to(address: SocketAddr) -> (Arc<Router>, SocketAddr, watch::Sender<bool>) {
    front_serving(vec![backend("a", address)]).await
}

/// A front on a fresh port serving `backends`.
async fn front_serving(backends: Vec<Backend>) -> (Arc<Router>, SocketAddr, watch::Sender<bool>) {
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_address = front.local_addr().unwrap();
    let router = Router::new(backends);
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(accept_loop(Arc::new(front), router.clone(), stopped));
    (router, front_address, stop)
}

/// A client connection through its TLS handshake and first request (sent with its Finished, as
/// Go's client does), answered.
async fn handshaken(front: SocketAddr, alpn: &[&[u8]]) -> TcpStream {
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(&client_hello(alpn)).await.unwrap();
    let mut flight = vec![0u8; server_flight().len()];
    stream.read_exact(&mut flight).await.unwrap();
    let first = [record(20, 1), data(FINISHED), data(REQUEST)].concat();
    stream.write_all(&first).await.unwrap();
    let mut answer = vec![0u8; 5 + ANSWER];
    stream.read_exact(&mut answer).await.unwrap();
    stream
}

/// How a request on a kept-alive connection went.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    /// The whole answer, `length` bytes.
    Answered,
    /// The connection closed before any byte of the answer: what clients retry.
    ClosedBeforeAnswer,
}

/// Sends a request and reads an answer of `length` bytes (all of its records): panics if the
/// answer is cut, which no client may see.
async fn ask(stream: &mut TcpStream, length: usize) -> Asked {
    if stream.write_all(&data(REQUEST)).await.is_err() {
        return Asked::ClosedBeforeAnswer;
    }
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while got < length {
        let want = (length - got).min(buf.len());
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf[..want])).await {
            Ok(Ok(0)) | Ok(Err(_)) if got == 0 => return Asked::ClosedBeforeAnswer,
            Ok(Ok(n)) if n > 0 => got += n,
            other => panic!("the answer was cut after {got} of {length} bytes: {other:?}"),
        }
    }
    Asked::Answered
}

async fn ends_within(stream: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(bound, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(start_paused = true)]
async fn closing_a_slot_ends_its_open_connections_and_spares_the_others() {
    // Two backends that accept and hold their connections open, echoing nothing.
    let (old, new) = (silent_slot().await, silent_slot().await);
    let (router, front_address, _stop) = front_to(old).await;

    let mut on_old = TcpStream::connect(front_address).await.unwrap();
    on_old.write_all(b"x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    router.serve(vec![backend("b", new)]);
    let mut on_new = TcpStream::connect(front_address).await.unwrap();
    on_new.write_all(b"y").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        router.connections()["a"].retired_unjudged,
        1,
        "not TLS: the front cannot judge it"
    );

    router.close(old);
    assert!(
        ends_within(&mut on_old, Duration::from_secs(5)).await,
        "the connection to the closed slot ends"
    );
    assert!(
        !ends_within(&mut on_new, Duration::from_millis(300)).await,
        "the connection to the serving slot stays open"
    );
    assert_eq!(router.connections()["a"].open, 0);
    assert_eq!(router.connections()["a"].retired_unjudged, 0);
    assert_eq!(router.connections()["b"].open, 1);
}

#[tokio::test(start_paused = true)]
async fn the_next_request_to_a_retired_slot_closes_its_http1_connection_and_nothing_else() {
    let old = slot(plain_answer, Duration::ZERO).await;
    let new = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) = front_to(old.address).await;
    let mut http1 = handshaken(front, &[b"http/1.1"]).await;
    let mut h2 = handshaken(front, &[b"h2", b"http/1.1"]).await;
    assert_eq!(ask(&mut http1, 5 + ANSWER).await, Asked::Answered);

    router.serve(vec![backend("b", new.address)]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let counts = router.connections()["a"];
    assert_eq!(
        (counts.retired_pending, counts.retired_unjudged),
        (0, 1),
        "answered, so its next request is closed: nothing more of it reaches the slot; {counts:?}"
    );
    assert!(
        !ends_within(&mut http1, Duration::from_millis(200)).await,
        "an idle connection is not closed before its client speaks"
    );
    let before = old.requests.load(Ordering::SeqCst);
    assert_eq!(ask(&mut http1, 5 + ANSWER).await, Asked::ClosedBeforeAnswer);
    assert_eq!(
        old.requests.load(Ordering::SeqCst),
        before,
        "the retired slot never saw the request"
    );
    assert_eq!(
        ask(&mut h2, 5 + ANSWER).await,
        Asked::Answered,
        "HTTP/2 multiplexes: never judged"
    );
    let counts = router.connections()["a"];
    assert_eq!((counts.open, counts.retired_unjudged), (1, 1), "{counts:?}");
    // A kept-alive HTTP/1.1 connection to the serving slot stays.
    let mut on_new = handshaken(front, &[b"http/1.1"]).await;
    assert_eq!(ask(&mut on_new, 5 + ANSWER).await, Asked::Answered);
    assert_eq!(ask(&mut on_new, 5 + ANSWER).await, Asked::Answered);
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_at_the_retirement_gets_its_answer_and_the_next_one_a_close() {
    fn late(_: usize) -> Vec<Vec<u8>> {
        vec![Vec::new(), data(ANSWER)]
    }
    let old = slot(late, Duration::from_millis(300)).await;
    let (router, front, _stop) = front_to(old.address).await;
    let mut client = handshaken(front, &[]).await;
    let asked = tokio::spawn(async move {
        let first = ask(&mut client, 5 + ANSWER).await;
        (first, ask(&mut client, 5 + ANSWER).await)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    router.serve(Vec::new());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        router.connections()["a"].retired_pending,
        1,
        "a request in flight still reaches the retired slot"
    );
    assert_eq!(asked.await.unwrap(), (Asked::Answered, Asked::ClosedBeforeAnswer));
    assert_eq!(router.connections()["a"].retired_pending, 0);
}

#[tokio::test(start_paused = true)]
async fn a_large_answer_to_a_slow_reader_is_delivered_whole_before_the_close() {
    const RECORDS: usize = 512; // 8 MiB in 16 KiB records
    fn large(n: usize) -> Vec<Vec<u8>> {
        match n {
            2 => vec![data(16384).repeat(RECORDS)],
            _ => plain_answer(n),
        }
    }
    let old = slot(large, Duration::ZERO).await;
    let (router, front, _stop) = front_to(old.address).await;
    let mut client = handshaken(front, &[]).await;
    client.write_all(&data(REQUEST)).await.unwrap();
    // The answer backs up in the front while the client does not read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    router.serve(Vec::new());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut received = 0;
    let mut buf = vec![0u8; 16 * 1024];
    while received < RECORDS * (5 + 16384) {
        match tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => received += n,
            other => panic!("after {received} bytes: {other:?}"),
        }
        // Slowly, so that the client's socket stays full and the answer's last bytes wait in the
        // front after the slot has sent them.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(ask(&mut client, 5 + ANSWER).await, Asked::ClosedBeforeAnswer);
}

#[tokio::test]
async fn an_answer_that_pauses_mid_way_is_delivered_whole() {
    // A slot paused mid-answer (kcp under SIGSTOP for 50 ms): the first half, then the rest.
    fn paused(n: usize) -> Vec<Vec<u8>> {
        match n {
            1 => plain_answer(n),
            _ => vec![[data(16384), data(16384)].concat(), [data(16384), data(100)].concat()],
        }
    }
    let length = 3 * (5 + 16384) + 5 + 100;
    let old = slot(paused, Duration::from_millis(50)).await;
    let (router, front, _stop) = front_to(old.address).await;
    let mut client = handshaken(front, &[]).await;
    let retire = {
        let router = router.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            router.serve(Vec::new());
        })
    };
    assert_eq!(ask(&mut client, length).await, Asked::Answered, "the whole answer");
    retire.await.unwrap();
    assert_eq!(ask(&mut client, length).await, Asked::ClosedBeforeAnswer);
}

#[tokio::test]
async fn back_to_back_requests_through_a_retirement_fail_none_and_are_retried_once_each() {
    let old = slot(plain_answer, Duration::ZERO).await;
    let new = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) = front_to(old.address).await;
    const CLIENTS: usize = 8;
    let (stop, stopped) = watch::channel(false);
    let loops: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let stopped = stopped.clone();
            tokio::spawn(async move {
                let mut client = handshaken(front, &[b"http/1.1"]).await;
                let (mut answered, mut retried) = (0, 0);
                while !*stopped.borrow() {
                    match ask(&mut client, 5 + ANSWER).await {
                        Asked::Answered => answered += 1,
                        Asked::ClosedBeforeAnswer => {
                            // As Go's transport and curl do on a reused connection: dial again.
                            retried += 1;
                            client = handshaken(front, &[b"http/1.1"]).await;
                        }
                    }
                    // Back to back for half the clients, 1 ms apart for the others.
                    if i % 2 == 1 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                (answered, retried)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    router.serve(vec![backend("b", new.address)]);
    let retired_at = tokio::time::Instant::now();
    loop {
        let counts = router.connections()["a"];
        if counts.retired_pending == 0 && counts.open == 0 {
            break;
        }
        assert!(
            retired_at.elapsed() < Duration::from_secs(2),
            "every kept-alive connection to the retired slot closes within its next request: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = old.requests.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.send(true).unwrap();
    let mut retries = 0;
    for each in loops {
        let (answered, retried) = each.await.unwrap();
        assert!(answered > 10, "{answered}");
        assert_eq!(
            retried, 1,
            "each client is closed once, at its first request after the retirement"
        );
        retries += retried;
    }
    assert_eq!(retries, CLIENTS);
    assert_eq!(
        old.requests.load(Ordering::SeqCst),
        after,
        "no request reached the retired slot after"
    );
    assert!(new.requests.load(Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn a_kept_alive_connection_left_unused_after_the_retirement_is_closed_between_requests() {
    let old = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) = front_to(old.address).await;
    let mut spare = handshaken(front, &[b"http/1.1"]).await;
    // A connection mid-answer at the retirement is not one of them: the slot pauses half of
    // IDLE_CLOSE in the middle of the answer (an answer paused longer than IDLE_CLOSE is cut).
    fn slow(_: usize) -> Vec<Vec<u8>> {
        vec![data(100), data(ANSWER)]
    }
    let paused = slot(slow, crate::front::keepalive::IDLE_CLOSE / 2).await;
    let (paused_router, paused_front, _paused_stop) = front_to(paused.address).await;
    let mut waiting = handshaken_slowly(paused_front).await;
    router.serve(Vec::new());
    paused_router.serve(Vec::new());
    let started = tokio::time::Instant::now();
    assert!(
        ends_within(&mut spare, Duration::from_secs(3)).await,
        "the unused one is closed"
    );
    assert!(
        started.elapsed() >= crate::front::keepalive::IDLE_CLOSE - Duration::from_millis(100),
        "after IDLE_CLOSE of silence, not at once"
    );
    assert_eq!(router.connections()["a"].retired_pending, 0);
    let mut rest = vec![0u8; 5 + ANSWER];
    waiting.read_exact(&mut rest).await.unwrap();
    assert!(
        !ends_within(&mut waiting, Duration::from_millis(300)).await,
        "an answer still coming is not cut, and its connection is closed only once unused"
    );
}

/// A connection through its handshake whose first request gets the first part of its answer.
async fn handshaken_slowly(front: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(&client_hello(&[])).await.unwrap();
    let mut flight = vec![0u8; server_flight().len()];
    stream.read_exact(&mut flight).await.unwrap();
    stream
        .write_all(&[record(20, 1), data(FINISHED), data(REQUEST)].concat())
        .await
        .unwrap();
    let mut first = vec![0u8; 5 + 100];
    stream.read_exact(&mut first).await.unwrap();
    stream
}

/// A slot that dies under its connections: it reads `before` bytes of what a client sends, then
/// resets the connection without a byte of answer, as a killed kcp's kernel does to the
/// connections its listener had accepted.
async fn dying_slot(before: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0;
                while got < before {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                // SO_LINGER 0: the close is a RST.
                stream.set_zero_linger().unwrap();
            });
        }
    });
    address
}

/// A slot that accepts and never answers, as a stopped (SIGSTOPped) kcp's kernel does.
async fn silent_slot() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    address
}

#[tokio::test(start_paused = true)]
async fn a_slot_that_dies_before_answering_has_its_new_connections_replayed_to_another() {
    let dying = dying_slot(1).await;
    let serving = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) = front_serving(vec![backend("a", dying), backend("b", serving.address)]).await;
    // Each is held open, so the dying slot (no open connection once its own are replayed) is
    // always the one with the fewest: every connection goes to it first.
    let mut held = Vec::new();
    for _ in 0..6 {
        let handshake = tokio::time::timeout(Duration::from_secs(30), handshaken(front, &[b"http/1.1"]));
        let mut stream = handshake.await.expect("the handshake is answered by the other slot");
        assert_eq!(ask(&mut stream, 5 + ANSWER).await, Asked::Answered);
        held.push(stream);
    }
    let counts = router.connections();
    assert_eq!(
        (
            counts["a"].total,
            counts["a"].replayed,
            counts["a"].failed,
            counts["a"].open
        ),
        (6, 6, 0, 0),
        "every connection the dying slot was given went on to the other, none failed"
    );
    assert_eq!(counts["a"].last_silent, None, "it failed, it was never silent");
    assert_eq!((counts["b"].total, counts["b"].open, counts["b"].replayed), (6, 6, 0));
    assert_eq!(
        serving.requests.load(Ordering::SeqCst),
        6 * 2,
        "the first request and the one asked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_slot_has_a_new_connection_replayed_after_the_answer_wait() {
    use super::opening::ANSWER_WAIT;
    let serving = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) =
        front_serving(vec![backend("a", silent_slot().await), backend("b", serving.address)]).await;
    let started = tokio::time::Instant::now();
    let mut stream = tokio::time::timeout(Duration::from_secs(30), handshaken(front, &[b"http/1.1"]))
        .await
        .expect("the handshake is answered by the other slot");
    let waited = started.elapsed();
    assert!(
        waited >= ANSWER_WAIT && waited < ANSWER_WAIT + Duration::from_millis(100),
        "answered through the other slot after {waited:?}"
    );
    assert_eq!(ask(&mut stream, 5 + ANSWER).await, Asked::Answered);
    let counts = router.connections();
    assert_eq!((counts["a"].replayed, counts["a"].open, counts["a"].failed), (1, 0, 0));
    assert!(
        counts["a"].last_silent.is_some(),
        "the front tells when the slot was silent"
    );
    assert_eq!(counts["b"].open, 1);
}

#[tokio::test(start_paused = true)]
async fn a_connection_left_for_a_silent_slot_that_then_dies_goes_back_to_the_slow_one() {
    use super::opening::ANSWER_WAIT;
    let slow = slow_slot(ANSWER_WAIT * 3 / 2, plain_answer, Duration::ZERO).await;
    let (router, front, _stop) =
        front_serving(vec![backend("a", slow.address), backend("b", dying_slot(1).await)]).await;
    let started = tokio::time::Instant::now();
    let mut stream = tokio::time::timeout(Duration::from_secs(30), handshaken(front, &[b"http/1.1"]))
        .await
        .expect("the handshake is answered by the slow slot, asked again");
    let waited = started.elapsed();
    assert!(
        waited >= ANSWER_WAIT * 5 / 2 && waited < ANSWER_WAIT * 3,
        "answered by the slow slot, asked again once the other died: after {waited:?}"
    );
    assert_eq!(ask(&mut stream, 5 + ANSWER).await, Asked::Answered);
    let counts = router.connections();
    assert_eq!(
        (counts["a"].total, counts["a"].replayed, counts["a"].open),
        (2, 1, 1),
        "left for its silence, then asked again"
    );
    assert_eq!((counts["b"].replayed, counts["b"].failed), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn with_no_other_slot_a_dead_slot_fails_the_connection_and_a_silent_one_is_waited_for() {
    let (router, front, _stop) = front_to(dying_slot(1).await).await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(&client_hello(&[])).await.unwrap();
    assert!(
        ends_within(&mut stream, Duration::from_secs(5)).await,
        "the client sees the close"
    );
    let counts = router.connections();
    assert_eq!((counts["a"].failed, counts["a"].replayed), (1, 0));

    let (router, front, _stop) = front_to(silent_slot().await).await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(&client_hello(&[])).await.unwrap();
    assert!(
        !ends_within(&mut stream, Duration::from_secs(60)).await,
        "a slow slot is not a dead one: the connection waits on it"
    );
    let counts = router.connections();
    assert_eq!((counts["a"].open, counts["a"].failed, counts["a"].replayed), (1, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sent_more_than_is_kept_is_never_replayed() {
    use super::opening::KEPT;
    let dying = dying_slot(KEPT + 1).await;
    let other = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) = front_serving(vec![backend("b", other.address)]).await;
    // "b" the busier slot, so that the next connection goes to "a".
    let _on_b = TcpStream::connect(front).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    router.serve(vec![backend("a", dying), backend("b", other.address)]);
    let mut stream = TcpStream::connect(front).await.unwrap();
    let mut long = client_hello(&[]);
    long.resize(KEPT + 1, b'x');
    stream.write_all(&long).await.unwrap();
    assert!(
        ends_within(&mut stream, Duration::from_secs(5)).await,
        "what the slot may have acted on is not sent again: the client sees its close"
    );
    let counts = router.connections();
    assert_eq!((counts["a"].total, counts["a"].replayed), (1, 0));
    assert_eq!(counts["b"].total, 1, "only the connection that made it busier");
}

#[tokio::test(start_paused = true)]
async fn a_replay_carries_the_clients_half_close() {
    // Reads everything, then says what it read and closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut got = Vec::new();
            stream.read_to_end(&mut got).await.unwrap();
            stream.write_all(&got).await.unwrap();
        }
    });
    let hello = client_hello(&[]);
    let (router, front, _stop) =
        front_serving(vec![backend("a", dying_slot(hello.len()).await), backend("b", echo)]).await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(&hello).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, hello);
    assert_eq!(router.connections()["a"].replayed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_does_not_start_with_a_tls_handshake_is_never_replayed() {
    let other = slot(plain_answer, Duration::ZERO).await;
    let (router, front, _stop) =
        front_serving(vec![backend("a", silent_slot().await), backend("b", other.address)]).await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(b"POST /pay HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(
        !ends_within(&mut stream, Duration::from_secs(10)).await,
        "a plain request a slow slot may still act on is never sent again: it waits for its slot"
    );
    let counts = router.connections();
    assert_eq!((counts["a"].open, counts["a"].replayed), (1, 0));
    assert_eq!(counts["b"].total, 0);
}
