//! The data path end to end on loopback: a front's accept loop in front of small TCP backends,
//! for what needs all of it (retirement and closing of open connections).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Router, accept_loop};
use crate::front::keepalive;
use crate::front::protocol::Backend;

fn backend(slot: &str, port: u16) -> Backend {
    Backend {
        slot: slot.into(),
        address: SocketAddr::from(([127, 0, 0, 1], port)),
    }
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
