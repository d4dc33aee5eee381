//! The address of a kcp that clients dial directly, taken over by kcpshard's front with no
//! connection refused (docs/how-to/adopt.md, "Adopt a running kcp"): a front started with
//! `--take-listener-of <kcp's pid>` shares kcp's very listening socket, kcp stops (SIGTERM), and a
//! client that dials all along is never refused; after kcp's exit every dial reaches the front's
//! backend.
//!
//! Needs `bin/kcp-<version>` of the newer pinned release and `bin/kubectl`
//! (`hack/install-deps.sh`); without them the test fails, it never skips.
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kcpshard::front::{Backend, FrontClient};
use support::embedded_kcp::EmbeddedKcp;
use support::kcp_newer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_takes_a_kcps_address_and_no_dial_is_refused_across_kcps_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kcp = EmbeddedKcp::start(&kcp_newer(), &tmp.path().join("root"), &[]);
    let address: SocketAddr = ([127, 0, 0, 1], kcp.port).into();

    // What the front forwards to: a backend that says so.
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_address = backend.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = backend.accept().await {
            let _ = stream.write_all(b"front\n").await;
        }
    });

    // A client dialling every 2 ms: a dial is refused, or accepted (by kcp or the front).
    let stop = Arc::new(AtomicBool::new(false));
    let (accepted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let dialler = {
        let (stop, accepted, refused) = (stop.clone(), accepted.clone(), refused.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(address)).await {
                    Ok(Ok(_)) => accepted.fetch_add(1, Ordering::Relaxed),
                    _ => refused.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    let dir = tmp.path().join("front");
    let log = std::fs::File::create(tmp.path().join("front.log")).unwrap();
    let mut front = std::process::Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["front", "--listen", &address.to_string(), "--dir"])
        .arg(&dir)
        .args(["--take-listener-of", &kcp.proc.pid().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        if let Ok(client) = FrontClient::connect(&dir).await {
            break client;
        }
        assert!(
            Instant::now() < deadline,
            "the front did not answer on its control socket"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let front_backend = Backend {
        slot: "new".into(),
        address: backend_address,
    };
    client.serve(&[front_backend]).await.unwrap();

    // kcp stops: it closes its listening socket and exits; the socket lives on in the front.
    let stopping = Instant::now();
    tokio::task::block_in_place(|| kcp.proc.stop());
    let exited_after = stopping.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    dialler.await.unwrap();
    let mut after = TcpStream::connect(address).await.unwrap();
    let mut greeting = String::new();
    after.read_to_string(&mut greeting).await.unwrap();
    let _ = front.kill();
    let _ = front.wait();

    let (accepted, refused) = (accepted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    println!(
        "MEASURE {accepted} dials accepted and {refused} refused while the front took kcp's socket and kcp exited ({:.2}s after SIGTERM)",
        exited_after.as_secs_f64()
    );
    assert_eq!(refused, 0, "{accepted} dials accepted");
    assert!(accepted > 20, "{accepted} dials");
    assert_eq!(greeting, "front\n", "after kcp's exit the front answers");
}
