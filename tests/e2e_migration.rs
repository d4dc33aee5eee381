//! End to end on real kcp: a shard's data moved from its embedded KineSqlite store to a managed
//! PostgreSQL while it serves (docs/operations.md, "Move a shard to another store"), as a user
//! does it: `spec.store` changed on a Ready shard with workspaces and ConfigMaps, a `/readyz`
//! poller through the front every 20 ms and a ConfigMap written every 200 ms all along. Then: no
//! poll failed, every acknowledged write is in the new store, every workspace is there, a new one
//! gets Ready (the controllers lead on the new store), the old sqlite file is left as it was, its
//! kine stopped, and status and events tell the move.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);
const CONFIGMAPS: &str = "/clusters/root/api/v1/namespaces/default/configmaps";

fn sha256(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_shard_moves_from_kine_sqlite_to_a_managed_postgres_while_it_serves() {
    let _serial = serial();
    let version = kcp_newer();
    require_components(&[&version]);
    support::require("initdb");
    support::require("pg_ctl");
    let mut env = Env::start().await;
    let shard = "move";
    let front = format!("127.0.0.1:{}", test_port());
    env.apply(shard, &version, &front).await;
    env.wait_ready(shard, READY_TIMEOUT).await;
    // Clients with client-go's patience: its TLS handshake may take 10 s (a new connection in the
    // switch waits in the front until the new store's slot takes it).
    let patient = |mut config: kube::Config| {
        config.connect_timeout = Some(Duration::from_secs(10));
        config
    };
    let admin = patient(front_admin(&env, shard, &front).await);
    let mut workspaces = Vec::new();
    for name in ["before-move-1", "before-move-2"] {
        let (status, body) = once(
            &admin,
            http::Method::POST,
            WORKSPACES,
            Some(
                &json!({ "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name } }),
            ),
        )
        .await
        .unwrap();
        assert_eq!(status, 201, "create workspace {name}: {body}");
        workspaces.push(name.to_string());
    }

    // Reads every 20 ms through the front; a ConfigMap written every 200 ms, each acknowledged
    // one remembered.
    let poller = Poller::start_every(
        patient(front_shard_admin(&env, shard, &front).await),
        Duration::from_millis(20),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (admin, stop) = (admin.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut acknowledged, mut failed) = (Vec::new(), Vec::new());
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("write-{n:04}");
                let body = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": name }, "data": { "n": n.to_string() } });
                let started = Instant::now();
                match once(&admin, http::Method::POST, CONFIGMAPS, Some(&body)).await {
                    Ok((201, _)) => acknowledged.push((name, started.elapsed())),
                    Ok((status, body)) => failed.push(format!("{name}: {status} {body}")),
                    Err(e) => failed.push(format!("{name}: {e}")),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (acknowledged, failed)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    let sqlite = env.shard_dir(shard).join("store/state.db");
    let pg_port = test_port();
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, "kcpshard-e2e-move\n").unwrap();
    let moved_at = Instant::now();
    env.patch(
        shard,
        json!({ "spec": { "store": {
            "type": "KinePostgres",
            "kinePostgres": {
                "host": "127.0.0.1",
                "port": pg_port,
                "database": "kcp",
                "user": "kcp",
                "passwordFrom": { "file": password_file.display().to_string() },
                "managed": true,
            },
        } } }),
    )
    .await;
    let status = env
        .until(shard, MOVE_TIMEOUT, "status.migration.phase Complete, and Ready", |o| {
            let migration = &o["status"]["migration"];
            if migration["phase"] == "Failed" {
                panic!("the move failed: {migration:#}");
            }
            (migration["phase"] == "Complete" && ready_now(o)).then(|| o["status"].clone())
        })
        .await;
    assert_eq!(status["store"]["type"], "KinePostgres", "{status:#}");
    let migration = status["migration"].clone();
    let reasons: Vec<String> = env
        .events(shard)
        .await
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    let took = moved_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, failed_writes) = writer.await.unwrap();
    let stats = poller.finish().await;
    env.log(&format!(
        "move: {:.1}s, status.migration {migration}; polls {} failed {} slowest {:?}; writes {} acknowledged, {} failed, slowest {:?}; events {reasons:?}",
        took.as_secs_f64(),
        stats.polls,
        stats.failures.len(),
        stats.slowest,
        acknowledged.len(),
        failed_writes.len(),
        acknowledged.iter().map(|(_, t)| *t).max()
    ));
    assert!(
        migration["oldStore"]
            .as_str()
            .is_some_and(|s| s.starts_with("KineSqlite")),
        "{migration:#}"
    );
    let pause: f64 = migration["writePause"]
        .as_str()
        .and_then(|p| p.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no writePause: {migration:#}"));
    assert!(pause < 10.0, "the front held new connections for {pause}s");
    for reason in [
        "MigrationStarted",
        "MirrorStarted",
        "MigrationCaughtUp",
        "MigrationSwitching",
        "MigrationSwitched",
        "MigrationComplete",
    ] {
        assert!(reasons.iter().any(|r| r == reason), "no {reason} event: {reasons:?}");
    }
    assert!(stats.failures.is_empty(), "failed polls: {:?}", stats.failures);
    assert!(failed_writes.is_empty(), "failed writes: {failed_writes:?}");

    // Every acknowledged write and every workspace is in the new store; a new workspace gets
    // Ready there.
    for (name, _) in &acknowledged {
        let (status, body) = once(&admin, http::Method::GET, &format!("{CONFIGMAPS}/{name}"), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "the acknowledged {name} is gone: {body}");
    }
    for name in &workspaces {
        let (status, body) = once(&admin, http::Method::GET, &format!("{WORKSPACES}/{name}"), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "workspace {name} is gone: {body}");
    }
    kubectl_works(&front_kubeconfig(&env, shard), "after-move", Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&format!("a workspace made after the move: {e}")));

    // The old store is left as it was, and nothing runs it.
    let before = sha256(&sqlite);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sha256(&sqlite), before, "the old sqlite file changed after the move");
    assert!(
        processes_with(&format!("{}", env.shard_dir(shard).join("store").display()))
            .iter()
            .all(|(_, argv)| !argv.contains("state.db")),
        "the old sqlite kine still runs"
    );
    env.shutdown(&[shard]).await;
}
