//! Stands in for `kcpshard serve` in tests/front.rs: starts a front for a directory through the
//! library, as serve does, points it at one backend, prints `READY <front pid> <listen address>`
//! and waits to be killed; the test then checks that the front outlives it.
//!
//! Usage: `front-starter KCPSHARD_BINARY FRONT_DIR BACKEND_ADDRESS`.
use std::path::Path;

use kcpshard::front::{self, Backend, FrontLaunch};
use kcpshard::process::Runtime;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, dir, backend] = args.as_slice() else {
        panic!("usage: front-starter KCPSHARD_BINARY FRONT_DIR BACKEND_ADDRESS");
    };
    let runtime = Runtime::new();
    let launch = FrontLaunch {
        runtime: &runtime,
        shard: "test",
        binary: Path::new(binary),
        dir: Path::new(dir),
    };
    let any_port = "127.0.0.1:0".parse().expect("an address");
    let client = front::ensure_running(launch, any_port).await.expect("the front starts");
    let backends = [Backend {
        slot: "a".into(),
        address: backend.parse().expect("the backend's address"),
    }];
    client.serve(&backends).await.expect("the front takes the backend");
    let status = client.status().await.expect("the front answers");
    println!("READY {} {}", status.pid, status.listen);
    std::future::pending::<()>().await;
}
