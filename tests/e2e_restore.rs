//! End to end on real kcp (the older minor release and the newer one, hack/versions.env), kine and
//! PostgreSQL: a minor roll, its roll back, and a snapshot restore. One shard per store
//! (KinePostgres, KineSqlite, Etcd), walked in order:
//!   1. apply at the older minor (v0.30): Ready; workspace `before-snapshot`, and an APIExport in
//!      workspace `provider` bound by an APIBinding in `consumer`, with a `Widget` of it;
//!      `kcpshard snapshot create` takes a snapshot while it serves;
//!   2. spec.version to the newer release (v0.31.2, allowMinorVersionChange): a snapshot is taken
//!      first while the store serves (a pg_dump, a sqlite copy of state.db, an etcd snapshot; its
//!      name says v0.30.0's data), the roll completes; workspace `after-snapshot` is made;
//!   3. `kcpshard snapshot restore` while spec.version is still the newer one is refused, naming
//!      the snapshot's version and the patch to make; nothing changes;
//!   4. roll back to v0.30 (allowDowngrade): it completes, and what was made before and after the
//!      snapshot is served, the binding Bound, its Widget there, a new Widget accepted
//!      (docs/how-to/upgrade.md, "Roll back", records this);
//!   5. `kcpshard snapshot list` shows the snapshot; `kcpshard snapshot restore` restores it: a
//!      Warning event and Ready=False `Restoring` while the shard is down, then Ready on v0.30
//!      with `before-snapshot` there and `after-snapshot` gone, the Widget made after the
//!      snapshot gone, the one before it there, data-version.json saying v0.30, and
//!      status.lastRestore Complete.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::time::{Duration, Instant};

use e2e::*;
use kube::Config;
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);

const SCHEMAS: &str = "/clusters/root:provider/apis/apis.kcp.io/v1alpha1/apiresourceschemas";
const EXPORTS: &str = "/clusters/root:provider/apis/apis.kcp.io/v1alpha1/apiexports";
const BINDINGS: &str = "/clusters/root:consumer/apis/apis.kcp.io/v1alpha1/apibindings";
const WIDGETS: &str = "/clusters/root:consumer/apis/example.io/v1/widgets";

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The status code of `GET path` through the front (a new connection).
async fn status_of(env: &Env, config: &Config, path: &str) -> u16 {
    match once(config, http::Method::GET, path, None).await {
        Ok((status, _)) => status,
        Err(e) => env.fail(&format!("GET {path}: {e}")),
    }
}

/// Creates `body` at `path`, retrying for up to 60 s while the API is not served yet (a bound
/// resource appears a moment after its APIBinding is Bound).
async fn create(env: &Env, config: &Config, path: &str, body: Value) {
    let started = Instant::now();
    loop {
        match once(config, http::Method::POST, path, Some(&body)).await {
            Ok((200 | 201, _)) => return,
            Ok((status, text)) if started.elapsed() > Duration::from_secs(60) => {
                env.fail(&format!("POST {path}: {status} {text}"))
            }
            Err(e) if started.elapsed() > Duration::from_secs(60) => env.fail(&format!("POST {path}: {e}")),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The APIBinding's phase (Bound once the export's resources are served in `consumer`).
async fn binding_phase(config: &Config) -> String {
    match once(config, http::Method::GET, &format!("{BINDINGS}/widgets"), None).await {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap_or_default()["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Ok((status, body)) => format!("{status} {body}"),
        Err(e) => e,
    }
}

fn widget(name: &str) -> Value {
    json!({ "apiVersion": "example.io/v1", "kind": "Widget", "metadata": { "name": name } })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    KinePostgres,
    KineSqlite,
    Etcd,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn on_kine_postgres_a_minor_roll_rolls_back_and_a_snapshot_restore_brings_back_the_data_and_version_it_holds() {
    let _serial = serial();
    walk(Store::KinePostgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn on_kine_sqlite_a_minor_roll_rolls_back_and_a_snapshot_restore_brings_back_the_data_and_version_it_holds() {
    let _serial = serial();
    walk(Store::KineSqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn on_etcd_a_minor_roll_rolls_back_and_a_snapshot_restore_brings_back_the_data_and_version_it_holds() {
    let _serial = serial();
    walk(Store::Etcd).await;
}

async fn walk(store: Store) {
    let (older, newer) = (support::kcp_older_minor(), kcp_newer());
    require_components(&[&older, &newer]);
    let pg = (store == Store::KinePostgres).then(|| {
        support::require("pg_dump");
        support::require("pg_restore");
        support::Postgres::start()
    });
    let _sweep = pg.as_ref().map(|pg| SweepKines(pg.port));
    let mut env = Env::start().await;
    let etcd = (store == Store::Etcd).then(|| {
        // The restore opens the snapshot with etcdutl and a private etcd.
        support::require("etcdutl");
        support::Etcd::start(env.dir())
    });
    let begun = Instant::now();
    let (shard, extension) = match store {
        Store::KinePostgres => ("restore", "dump"),
        Store::KineSqlite => ("restore-sqlite", "db"),
        Store::Etcd => ("restore-etcd", "etcd"),
    };
    let front = format!("127.0.0.1:{}", test_port());

    // 1. v0.30: a workspace, an APIExport bound in another workspace, a Widget of it.
    let mut spec = match (&pg, &etcd) {
        (Some(pg), _) => {
            let password_file = env.dir().join("pgpass");
            std::fs::write(&password_file, "unused-by-trust-auth\n").unwrap();
            postgres_spec(&older, &front, pg, &password_file)
        }
        (None, Some(etcd)) => json!({
            "version": older,
            "store": { "type": "Etcd", "etcd": { "endpoints": [&etcd.endpoint] } },
            "front": { "type": "Tcp", "listen": front },
        }),
        (None, None) => json!({
            "version": older,
            "store": { "type": "KineSqlite" },
            "front": { "type": "Tcp", "listen": front },
        }),
    };
    spec["rollout"] = json!({ "allowMinorVersionChange": true, "allowDowngrade": true });
    env.apply_spec(shard, spec).await;
    env.wait_ready(shard, READY_TIMEOUT).await;
    let admin = front_admin(&env, shard, &front).await;
    for ws in ["before-snapshot", "provider", "consumer"] {
        create_workspace_ready(&admin, ws, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| env.fail(&e));
    }
    create(
        &env,
        &admin,
        SCHEMAS,
        json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": { "name": "v1.widgets.example.io" },
            "spec": {
                "group": "example.io",
                "names": { "kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget" },
                "scope": "Cluster",
                "versions": [{ "name": "v1", "served": true, "storage": true,
                               "schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }],
            },
        }),
    )
    .await;
    create(
        &env,
        &admin,
        EXPORTS,
        json!({ "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport", "metadata": { "name": "widgets" },
                "spec": { "latestResourceSchemas": ["v1.widgets.example.io"] } }),
    )
    .await;
    create(
        &env,
        &admin,
        BINDINGS,
        json!({ "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": { "name": "widgets" },
                "spec": { "reference": { "export": { "path": "root:provider", "name": "widgets" } } } }),
    )
    .await;
    create(&env, &admin, WIDGETS, widget("before-snapshot")).await;
    assert_eq!(binding_phase(&admin).await, "Bound");
    env.until(shard, READY_TIMEOUT, "the first start to settle", |o| {
        (ready_now(o) && condition_is(o, "Progressing", "False")).then_some(())
    })
    .await;
    env.log(&format!("{older}: Ready with an APIExport bound"));
    // A snapshot on request, while it serves, of every kind of store.
    let created = env.cli_ok(&["snapshot", "create", shard]).await;
    assert!(
        created.contains(&format!(".{extension}")),
        "kcpshard snapshot create: {created}"
    );
    env.log(&format!("snapshot create: {}", created.trim()));

    // 2. The minor roll up: a snapshot of v0.30's data first.
    let up_at = now();
    env.patch(shard, json!({ "spec": { "version": newer } })).await;
    let rolled = env
        .until(shard, ROLL_TIMEOUT, "the minor roll up", |o| {
            completed_roll_to(o, &newer, &up_at).then(|| o.clone())
        })
        .await;
    let snapshot = rolled["status"]["lastRoll"]["snapshot"]
        .as_str()
        .unwrap_or_else(|| env.fail(&format!("no lastRoll.snapshot: {:#}", rolled["status"])))
        .to_string();
    let file = std::path::Path::new(&snapshot)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        file.contains(&format!("-{older}-to-{newer}-")) && file.ends_with(&format!(".{extension}")),
        "{file}"
    );
    let admin = front_admin(&env, shard, &front).await;
    create_workspace_ready(&admin, "after-snapshot", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    create(&env, &admin, WIDGETS, widget("after-snapshot")).await;
    env.log(&format!("{older} -> {newer}: rolled; snapshot {file}"));

    // 3. A restore while spec.version is not the snapshot's: refused, saying what to do.
    let refused = env.cli(&["snapshot", "restore", shard, &file]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a restore to another version than spec.version runs"
    );
    assert!(
        stderr.contains(&format!("kcp {older} served"))
            && stderr.contains(&format!("spec.version is {newer}"))
            && stderr.contains(&format!("kubectl patch ks {shard}")),
        "{stderr}"
    );
    let object = env.get(shard).await.unwrap();
    assert!(
        object["metadata"]["annotations"]["kcpshard.io/restoreSnapshot"].is_null(),
        "a refused restore sets no annotation"
    );

    // 4. The roll back, allowed: what v0.30 does on data v0.31.2 has served.
    let back_at = now();
    env.patch(shard, json!({ "spec": { "version": older } })).await;
    env.until(shard, ROLL_TIMEOUT, "the roll back", |o| {
        completed_roll_to(o, &older, &back_at).then_some(())
    })
    .await;
    let admin = front_admin(&env, shard, &front).await;
    for path in [
        format!("{WORKSPACES}/before-snapshot"),
        format!("{WORKSPACES}/after-snapshot"),
        format!("{WIDGETS}/before-snapshot"),
        format!("{WIDGETS}/after-snapshot"),
    ] {
        assert_eq!(status_of(&env, &admin, &path).await, 200, "after the roll back: {path}");
    }
    assert_eq!(binding_phase(&admin).await, "Bound", "after the roll back");
    create(&env, &admin, WIDGETS, widget("after-roll-back")).await;
    env.log(&format!(
        "{newer} -> {older}: rolled back; workspaces, the binding and its widgets serve"
    ));

    // 5. The restore: listed, asked for, the shard down and back on the snapshot's data.
    let listed = tokio::process::Command::new(kcpshard_bin())
        .args(["snapshot", "list", shard, "--state-dir"])
        .arg(&env.state)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.status.success()
            && text
                .lines()
                .any(|l| l.starts_with(&file) && l.contains(&older) && l.ends_with("kept")),
        "kcpshard snapshot list: {text}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let asked = Instant::now();
    let restoring = env
        .cli(&["snapshot", "restore", shard, &file, "--timeout", "600"])
        .spawn()
        .unwrap();
    let output = tokio::spawn(restoring.wait_with_output());
    let mut down = None;
    while !output.is_finished() {
        if let Some(object) = env.get(shard).await
            && let Some(ready) = condition(&object, "Ready").filter(|c| c["reason"] == "Restoring")
        {
            down.get_or_insert_with(|| ready["message"].as_str().unwrap_or_default().to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let output = output.await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kcpshard snapshot restore: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    env.log(&format!(
        "restore: {:.1}s, the CLI said:\n{stdout}",
        asked.elapsed().as_secs_f64()
    ));
    let down = down.unwrap_or_else(|| env.fail("Ready never said Restoring while the shard was down"));
    assert!(down.contains("down for a restore") && down.contains(&file), "{down}");

    let restored = env.wait_ready(shard, READY_TIMEOUT).await;
    assert_eq!(restored["status"]["version"], older.as_str());
    let last = &restored["status"]["lastRestore"];
    assert_eq!(last["phase"], "Complete", "{last:#}");
    assert_eq!(last["version"], older.as_str());
    let admin = front_admin(&env, shard, &front).await;
    for (path, want) in [
        (format!("{WORKSPACES}/before-snapshot"), 200),
        (format!("{WORKSPACES}/after-snapshot"), 404),
        (format!("{WIDGETS}/before-snapshot"), 200),
        (format!("{WIDGETS}/after-snapshot"), 404),
        (format!("{WIDGETS}/after-roll-back"), 404),
    ] {
        assert_eq!(status_of(&env, &admin, &path).await, want, "after the restore: {path}");
    }
    assert_eq!(binding_phase(&admin).await, "Bound", "after the restore");
    let data: Value =
        serde_json::from_slice(&std::fs::read(env.shard_dir(shard).join("store/data-version.json")).unwrap()).unwrap();
    assert_eq!(data["version"], older.as_str(), "the data's version is the snapshot's");
    let events = env.events(shard).await;
    for (reason, type_) in [
        ("RestoreStarted", "Warning"),
        ("SnapshotRestored", "Normal"),
        ("RestoreComplete", "Normal"),
    ] {
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some(type_)),
            "no {type_} {reason} event:\n{}",
            summarize_events(&events)
        );
    }
    env.log(&format!(
        "{store:?}: the whole walk took {:.1}s",
        begun.elapsed().as_secs_f64()
    ));
    // No step of the snapshot, the restore and the deletion waited, not even for kcp's or
    // PostgreSQL's answers (docs/architecture.md, "Jobs").
    assert!(
        env.delete_and_wait(shard, Duration::from_secs(90)).await,
        "KcpShard {shard} was not deleted"
    );
    let slow = slow_steps(&env, shard, "0.1").await;
    env.log(&format!("steps over 0.1 s on real kcp (step, how many, of): {slow:?}"));
    let unexpected = slow_steps(&env, shard, STEP_BOUND).await;
    assert!(unexpected.is_empty(), "steps over {STEP_BOUND} s: {unexpected:?}");
    env.shutdown(&[]).await;
}

/// Disaster recovery: a snapshot taken on one state dir, copied elsewhere with its key material,
/// is restored into a KcpShard of the same name on a fresh state dir (another host, as far as
/// kcpshard can tell). Before the restore, the new shard has a CA of its own and a copy of the old
/// front kubeconfig is refused; after it, that copy reads the workspace made before the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_snapshot_restored_on_a_fresh_state_dir_brings_back_the_data_and_what_clients_trust() {
    let _serial = serial();
    let version = kcp_newer();
    require_components(&[&version]);
    let shard = "recovered";
    let front = format!("127.0.0.1:{}", test_port());
    let spec = json!({
        "version": version,
        "store": { "type": "KineSqlite" },
        "front": { "type": "Tcp", "listen": front },
    });
    let kept = tempfile::tempdir().unwrap();

    // The first host: a workspace, a copy of the front kubeconfig, a snapshot copied away; then
    // the host is gone.
    let mut first = Env::start().await;
    first.apply_spec(shard, spec.clone()).await;
    first.wait_ready(shard, READY_TIMEOUT).await;
    let admin = front_admin(&first, shard, &front).await;
    create_workspace_ready(&admin, "kept", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| first.fail(&e));
    let old_kubeconfig = kept.path().join("front.kubeconfig");
    std::fs::copy(front_kubeconfig(&first, shard), &old_kubeconfig).unwrap();
    first.cli_ok(&["snapshot", "create", shard, "--timeout", "120"]).await;
    let o = first.get(shard).await.unwrap();
    let snapshot = std::path::PathBuf::from(o["status"]["lastSnapshot"]["path"].as_str().unwrap());
    let backup = kept.path().join(snapshot.file_name().unwrap());
    std::fs::copy(&snapshot, &backup).unwrap();
    let keys = kcpshard::store::snapshot::keys_of(&snapshot);
    std::fs::create_dir(kcpshard::store::snapshot::keys_of(&backup)).unwrap();
    for file in std::fs::read_dir(&keys).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(
            &file,
            kcpshard::store::snapshot::keys_of(&backup).join(file.file_name().unwrap()),
        )
        .unwrap();
    }
    first.log(&format!(
        "snapshot {} and its key material copied away",
        snapshot.display()
    ));
    first.shutdown(&[shard]).await;

    // The second host: the same KcpShard on a fresh state dir, an empty kcp with a CA of its own.
    let mut second = Env::start().await;
    second.apply_spec(shard, spec).await;
    second.wait_ready(shard, READY_TIMEOUT).await;
    let stranger = front_admin_of(&old_kubeconfig, &front).await;
    let refused = once(&stranger, http::Method::GET, &format!("{WORKSPACES}/kept"), None).await;
    assert!(
        refused.is_err(),
        "the old kubeconfig was accepted by a new shard: {refused:?}"
    );
    let backup_arg = backup.display().to_string();
    let said = second
        .cli_ok(&["snapshot", "restore", shard, &backup_arg, "--timeout", "600"])
        .await;
    second.log(&format!("restore on the fresh state dir, the CLI said:\n{said}"));
    let old = front_admin_of(&old_kubeconfig, &front).await;
    assert_eq!(
        status_of(&second, &old, &format!("{WORKSPACES}/kept")).await,
        200,
        "the old front kubeconfig after the restore"
    );
    let events = second.events(shard).await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("SnapshotRestored")
            && e.message.as_deref().is_some_and(|m| m.contains("another identity"))),
        "no SnapshotRestored event saying the key material was put back:\n{}",
        summarize_events(&events)
    );
    second.shutdown(&[shard]).await;
}
