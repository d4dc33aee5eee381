//! End to end on real kcp: a shard's data moved to another store while it serves (docs/
//! how-to/stores.md, "Move a shard to another store"), as a user does it: `spec.store` changed on a
//! Ready shard with workspaces, an APIExport bound in a workspace, ConfigMaps and a Secret, while a
//! `/readyz` poller goes through the front every 20 ms, a ConfigMap is written every 200 ms, and an
//! informer (kube-rs's reflector, resuming its watch from the resourceVersion it holds) watches
//! the ConfigMaps. Each move: no poll and no write failed, every acknowledged write and every
//! object made before is in the new store with the same content, a new workspace gets Ready (the
//! controllers lead on the new store), what ran the old store is stopped and its data left, and
//! status and events tell the move. Afterwards the informer's cache equals a fresh list.
//!
//! Walked: KineSqlite -> managed PostgreSQL -> KineSqlite again (refused until the old state.db is
//! moved aside), and Etcd -> managed PostgreSQL -> another etcd cluster (whose revision the
//! mirror raises by writes first).
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Config;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};

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

fn managed_postgres(env: &Env, port: u16) -> Value {
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, "kcpshard-e2e-move\n").unwrap();
    managed_postgres_store(port, &password_file)
}

/// A Ready shard `shard` on `store` (through a front it returns), with what [`make_objects`]
/// makes, its admin, and an informer started.
async fn serving(env: &Env, shard: &str, store: Value) -> (String, Config, Kept, Informer) {
    let front = format!("127.0.0.1:{}", test_port());
    env.apply_on(shard, &kcp_newer(), &front, store).await;
    env.wait_ready(shard, READY_TIMEOUT).await;
    let admin = patient(front_admin(env, shard, &front).await);
    let kept = make_objects(env, &admin).await;
    let informer = Informer::start(&admin);
    (front, admin, kept, informer)
}

fn require_managed_postgres() {
    require_components(&[&kcp_newer()]);
    support::require("initdb");
    support::require("pg_ctl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_shard_moves_from_kine_sqlite_to_a_managed_postgres_and_back_while_it_serves() {
    let _serial = serial();
    require_managed_postgres();
    let mut env = Env::start().await;
    let shard = "move";
    let (front, admin, kept, informer) = serving(&env, shard, json!({ "type": "KineSqlite" })).await;
    let sqlite = env.shard_dir(shard).join("store/state.db");
    let postgres = managed_postgres(&env, test_port());
    move_under_load(&env, shard, &front, &admin, &postgres, "KineSqlite", "to-postgres").await;
    assert_objects_kept(&env, &admin, &kept).await;

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

    // Back to KineSqlite: refused while the old state.db is there (it is never overwritten), and
    // made once the user moved it aside.
    env.patch(
        shard,
        json!({ "spec": { "store": { "type": "KineSqlite", "kinePostgres": null } } }),
    )
    .await;
    let refusal = env
        .until(shard, Duration::from_secs(60), "Degraded StoreChangeRefused", |o| {
            o["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Degraded" && c["reason"] == "StoreChangeRefused")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(refusal.contains("holds an earlier store's data"), "{refusal}");
    assert!(refusal.contains(&sqlite.display().to_string()), "{refusal}");
    assert_eq!(sha256(&sqlite), before, "the refused move touched the old sqlite file");
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", sqlite.display());
        if std::path::Path::new(&file).exists() {
            std::fs::rename(&file, format!("{file}.old")).unwrap();
        }
    }
    let back = json!({ "type": "KineSqlite" });
    move_under_load(&env, shard, &front, &admin, &back, "KinePostgres", "to-sqlite").await;
    assert_objects_kept(&env, &admin, &kept).await;
    assert_managed_postgres_stopped(&env, shard);
    informer.check(&admin).await;
    env.shutdown(&[shard]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_shard_moves_from_etcd_to_a_managed_postgres_and_into_another_etcd_while_it_serves() {
    let _serial = serial();
    require_managed_postgres();
    let mut env = Env::start().await;
    let mut etcd = support::Etcd::start(env.dir());
    let shard = "move-etcd";
    let etcd_store = json!({ "type": "Etcd", "etcd": { "endpoints": [&etcd.endpoint] } });
    let (front, admin, kept, informer) = serving(&env, shard, etcd_store).await;
    let postgres = managed_postgres(&env, test_port());
    let mut store = postgres.clone();
    store["etcd"] = Value::Null;
    move_under_load(&env, shard, &front, &admin, &store, "Etcd", "from-etcd").await;
    assert_objects_kept(&env, &admin, &kept).await;
    // The etcd cluster is the user's: it still runs, with the shard's keys as they were.
    assert!(etcd.proc.is_running(), "the user's etcd was stopped");

    // Into another etcd cluster, whose revision the mirror raises by writes first.
    let other_dir = env.dir().join("other-etcd");
    std::fs::create_dir(&other_dir).unwrap();
    let other = support::Etcd::start(&other_dir);
    let into_etcd = json!({ "type": "Etcd", "etcd": { "endpoints": [&other.endpoint] }, "kinePostgres": null });
    move_under_load(&env, shard, &front, &admin, &into_etcd, "KinePostgres", "into-etcd").await;
    assert_objects_kept(&env, &admin, &kept).await;
    assert_managed_postgres_stopped(&env, shard);
    informer.check(&admin).await;
    env.shutdown(&[shard]).await;
}

/// The managed PostgreSQL the data left is stopped (its cluster stays in the store directory).
fn assert_managed_postgres_stopped(env: &Env, shard: &str) {
    assert!(
        processes_with(&env.shard_dir(shard).join("store/postgres").display().to_string()).is_empty(),
        "the old managed PostgreSQL still runs"
    );
}

/// Patches spec.store to `store` on a serving shard and waits for the move to complete, with a
/// poller and a writer going all along (their ConfigMaps named `<tag>-<n>`); asserts what a user
/// sees of it.
async fn move_under_load(env: &Env, shard: &str, front: &str, admin: &Config, store: &Value, from: &str, tag: &str) {
    let poller = Poller::start_every(
        patient(front_shard_admin(env, shard, front).await),
        Duration::from_millis(20),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (admin, stop, tag) = (admin.clone(), stop.clone(), tag.to_string());
        tokio::spawn(async move {
            let (mut acknowledged, mut failed) = (Vec::new(), Vec::new());
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("{tag}-{n:04}");
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

    let events_before = env.events(shard).await.len();
    let moved_at = Instant::now();
    env.patch(shard, json!({ "spec": { "store": store } })).await;
    let to = store["type"].as_str().unwrap().to_string();
    let status = env
        .until(shard, MOVE_TIMEOUT, "status.migration.phase Complete, and Ready", |o| {
            let migration = &o["status"]["migration"];
            if migration["phase"] == "Failed" {
                panic!("the move failed: {migration:#}");
            }
            let this_move = migration["to"].as_str().is_some_and(|t| t.starts_with(&to));
            (this_move && migration["phase"] == "Complete" && ready_now(o)).then(|| o["status"].clone())
        })
        .await;
    assert_eq!(status["store"]["type"], to.as_str(), "{status:#}");
    let migration = status["migration"].clone();
    let reasons: Vec<String> = env.events(shard).await[events_before..]
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    let took = moved_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, failed_writes) = writer.await.unwrap();
    let stats = poller.finish().await;
    env.log(&format!(
        "move {from} -> {to}: {:.1}s, status.migration {migration}; polls {} failed {} slowest {:?}; writes {} acknowledged, {} failed, slowest {:?}; events {reasons:?}",
        took.as_secs_f64(),
        stats.polls,
        stats.failures.len(),
        stats.slowest,
        acknowledged.len(),
        failed_writes.len(),
        acknowledged.iter().map(|(_, t)| *t).max()
    ));
    assert!(
        migration["oldStore"].as_str().is_some_and(|s| s.starts_with(from)),
        "{migration:#}"
    );
    let pause: f64 = migration["writePause"]
        .as_str()
        .and_then(|p| p.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no writePause: {migration:#}"));
    assert!(pause < 10.0, "the front held new connections for {pause}s");
    // Store to store: before the switch ended the mirror read every key of the old store again,
    // at its last revision, and found each written as of its last change.
    let verified = migration["verifiedKeys"].as_u64().unwrap_or(0);
    assert!(verified > 0, "the mirror checked no key: {migration:#}");
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

    // Every acknowledged write is in the new store, with what was written; a new workspace gets
    // Ready there.
    for (n, (name, _)) in acknowledged.iter().enumerate() {
        let (status, body) = once(admin, http::Method::GET, &format!("{CONFIGMAPS}/{name}"), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "the acknowledged {name} is gone: {body}");
        let written: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            written["data"]["n"],
            n.to_string(),
            "{name} holds another write: {body}"
        );
    }
    kubectl_works(
        &front_kubeconfig(env, shard),
        &format!("after-{tag}"),
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| env.fail(&format!("a workspace made after the move: {e}")));
}

/// A reflector of the ConfigMaps in root's default namespace through the front, as a controller
/// keeps one: after a broken watch it resumes from the resourceVersion it holds, and relists when
/// told that version is gone (410).
struct Informer {
    store: reflector::Store<ConfigMap>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Informer {
    fn start(admin: &Config) -> Informer {
        let mut config = admin.clone();
        let base = config.cluster_url.to_string();
        config.cluster_url = format!("{}/clusters/root", base.trim_end_matches('/')).parse().unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
        let (store, writer) = reflector::store();
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = errors.clone();
        let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    seen.lock().unwrap().push(e.to_string());
                }
            }
        });
        Informer { store, errors, task }
    }

    /// Its cache equals a fresh list (names and resourceVersions), which holds every write.
    async fn check(self, admin: &Config) {
        let (status, body) = once(admin, http::Method::GET, CONFIGMAPS, None).await.unwrap();
        assert_eq!(status, 200, "list: {body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        let fresh: BTreeMap<String, String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o["metadata"]["resourceVersion"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let cached = loop {
            let cached: BTreeMap<String, String> = self
                .store
                .state()
                .iter()
                .map(|c| {
                    (
                        c.metadata.name.clone().unwrap_or_default(),
                        c.metadata.resource_version.clone().unwrap_or_default(),
                    )
                })
                .collect();
            if cached == fresh || Instant::now() > deadline {
                break cached;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.task.abort();
        let errors = self.errors.lock().unwrap().clone();
        println!("informer: {} objects cached; its errors: {errors:?}", cached.len());
        assert_eq!(cached, fresh, "the informer's cache differs from a fresh list");
        assert!(
            errors.iter().any(|e| e.contains("too old resource version")),
            "the informer resumed its watch across the switch without being told to list again: {errors:?}"
        );
    }
}
