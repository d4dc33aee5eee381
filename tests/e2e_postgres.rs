//! End to end on real kcp, kine and PostgreSQL the production stores.
//!
//! - `kine_postgres_rolls_with_a_kine_per_slot_snapshots_and_survives_a_postgres_outage`, one
//!   shard walked in order:
//!   1. apply (store KinePostgres on a throwaway PostgreSQL, password from a file) gives Ready;
//!      the database was created; a workspace is made through the front;
//!   2. a minor step v0.30 -> v0.31 (allowed) runs a preflight on the snapshot restored into a
//!      scratch database (its status and events, nothing left behind: no process, no copy, no
//!      scratch database), then rolls with 0 failed `/readyz` polls through the front (20 ms);
//!      both slots' kines ran during the overlap and the old one is gone after; the workspace and
//!      the APIExport bound in it made before the roll are served after it; status.lastRoll.snapshot names a pg_dump file, an event says
//!      so, and the dump restores into a fresh database holding that workspace;
//!   3. PostgreSQL stopped: StoreReady=False with PostgreSQL's message within 10 s, the slot
//!      untouched; started again: Ready again with no roll;
//!   4. a minor-version bump without spec.rollout.allowMinorVersionChange is refused, the old slot
//!      keeps serving; with the flag, but also an extra flag the new kcp refuses, its preflight
//!      fails: Degraded (PreflightFailed) with kcp's error and log, an event, nothing left, the
//!      old slot serving, no rerun; without the bad flag it rolls;
//!   5. the password is in no status, event or log line.
//! - `a_managed_postgres_is_created_started_and_stopped_with_the_shard`: managed: true makes a
//!   cluster under the state dir that takes the password (and refuses a wrong one); its
//!   postmaster's death (SIGQUIT) wakes the controller, which starts it again (StoreStarted);
//!   deleting the shard stops it. No kcp is needed: the store comes first.
//! - `an_etcd_store_serves_a_shard`: a real etcd (bin/etcd) as the store; Ready and a workspace.
//! - `postgres_tls_is_checked_as_each_sslmode_says_as_kine_does`: PostgreSQL with TLS (a
//!   certificate for 127.0.0.1 from a test CA): StoreReady for require without a CA file,
//!   verify-full with and without it, and with a host the certificate does not name, verify-ca;
//!   kine connects with the endpoint kcpshard builds. No kcp.
//!
//! A missing component fails, never skips.
//!
//! Longer than 600 lines on purpose: one shard walked in order through the production store's
//! steps, and the TLS modes beside it. Each tests/*.rs file is a test binary of its own (40-60 MB,
//! linked again on every change of the crate): one concern, one file.
mod e2e;
mod support;

use std::time::{Duration, Instant};

use e2e::*;
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);
const PASSWORD: &str = "kcpshard-e2e-Secret-4711";

/// No scratch database of a preflight is left on `pg`.
fn assert_no_scratch_database(pg: &support::Postgres) {
    assert_eq!(
        pg.psql(
            "postgres",
            "select count(*) from pg_database where datname = 'kcp_e2e_preflight'"
        )
        .trim(),
        "0",
        "the preflight's scratch database is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn kine_postgres_rolls_with_a_kine_per_slot_snapshots_and_survives_a_postgres_outage() {
    let _serial = serial();
    let (older, newer) = (kcp_older_minor(), kcp_newer());
    require_components(&[&older, &newer]);
    let mut pg = support::Postgres::start();
    let _sweep = SweepKines(pg.port);
    let mut env = Env::start().await;
    let shard = "pg";
    let front = format!("127.0.0.1:{}", test_port());
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();

    // 1. Apply gives Ready; the database exists; a workspace through the front.
    let started = Instant::now();
    env.apply_spec(shard, postgres_spec(&older, &front, &pg, &password_file))
        .await;
    let ready = env.wait_ready(shard, READY_TIMEOUT).await;
    env.log(&format!("apply: Ready in {:.1}s", started.elapsed().as_secs_f64()));
    assert!(condition_is(&ready, "StoreReady", "True"), "{ready:#}");
    assert_eq!(
        pg.psql("postgres", "select count(*) from pg_database where datname = 'kcp_e2e'")
            .trim(),
        "1",
        "kcpshard creates the database"
    );
    assert_eq!(slot_kines(&pg, shard).len(), 1, "one kine for the one slot");
    let slot = active_slot(&ready).unwrap();
    let kcp_admin = front_admin(&env, shard, &front).await;
    create_workspace_ready(&kcp_admin, "before-roll", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    bind_an_export(&kcp_admin, "before-roll", Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    env.until(shard, READY_TIMEOUT, "the first start to settle", |o| {
        (ready_now(o) && condition_is(o, "Progressing", "False")).then_some(())
    })
    .await;

    // 2. A minor step (v0.30 -> v0.31): the snapshot, a preflight on it restored into a scratch
    //    database, then the roll with 0 failed polls (20 ms), a kine per slot during the overlap.
    let shard_admin = front_shard_admin(&env, shard, &front).await;
    let poller = Poller::start_every(shard_admin.clone(), Duration::from_millis(20));
    let mut most_kines = 0;
    let bump_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    env.patch(
        shard,
        json!({ "spec": { "version": newer, "rollout": { "allowMinorVersionChange": true } } }),
    )
    .await;
    let deadline = Instant::now() + ROLL_TIMEOUT;
    let rolled = loop {
        most_kines = most_kines.max(slot_kines(&pg, shard).len());
        let object = env.get(shard).await.unwrap();
        if completed_roll_to(&object, &newer, &bump_at) {
            break object;
        }
        if Instant::now() > deadline {
            env.fail(&format!("the roll to {newer} did not complete: {:#}", object["status"]));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stats = poller.finish().await;
    env.log(&format!("roll: {} polls, {} failed", stats.polls, stats.failures.len()));
    assert!(stats.polls > 20, "the poller ran only {} polls", stats.polls);
    assert!(
        stats.failures.is_empty(),
        "failed polls:\n{}",
        describe_failures(&stats)
    );
    assert_eq!(most_kines, 2, "both slots' kines ran during the overlap");
    await_slot_kines(&pg, shard, 1);

    let new_slot = active_slot(&rolled).unwrap();
    assert_ne!(new_slot, slot);
    let kcp_admin = front_admin(&env, shard, &front).await;
    let (status, _) = once(
        &kcp_admin,
        http::Method::GET,
        &format!("{WORKSPACES}/before-roll"),
        None,
    )
    .await
    .unwrap_or_else(|e| env.fail(&e));
    assert_eq!(status, 200, "the workspace made before the roll is there after it");
    export_served(&kcp_admin, "before-roll", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| env.fail(&format!("after the minor roll: {e}")));
    let preflight = check_preflight_before_roll(&env, shard, &newer, &bump_at).await;
    env.log(&format!(
        "preflight {older} -> {newer} (KinePostgres): {} in {:.1}s, changes: {}",
        preflight["result"],
        (parse_time(&preflight["completedAt"]).unwrap() - parse_time(&preflight["startedAt"]).unwrap())
            .num_milliseconds() as f64
            / 1000.0,
        preflight["changes"]
    ));
    assert_no_scratch_database(&pg);

    let snapshot = rolled["status"]["lastRoll"]["snapshot"]
        .as_str()
        .unwrap_or_else(|| env.fail(&format!("no lastRoll.snapshot: {:#}", rolled["status"])))
        .to_string();
    assert!(
        snapshot.starts_with(env.shard_dir(shard).join("snapshots").to_str().unwrap())
            && snapshot.contains(&format!("{older}-to-{newer}")),
        "{snapshot}"
    );
    let events = env.events(shard).await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("SnapshotTaken")
            && e.message.as_deref().is_some_and(|m| m.contains(&snapshot))),
        "no SnapshotTaken event naming {snapshot}:\n{}",
        summarize_events(&events)
    );
    // The dump restores into a fresh database, with the workspace in it.
    pg.psql("postgres", "create database restored");
    let mut restore = std::process::Command::new(support::require("pg_restore"));
    restore
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "restored",
            "--no-owner",
        ])
        .arg(&snapshot);
    let out = support::run(restore, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "pg_restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = pg.psql(
        "restored",
        "select count(*) from kine where name like '/registry/tenancy.kcp.io/workspaces/%/before-roll'",
    );
    assert_ne!(found.trim(), "0", "the restored dump holds the workspace");

    // 3. PostgreSQL stops: StoreReady=False with its message within 10 s; back: Ready, no roll.
    let settled = env
        .until(shard, READY_TIMEOUT, "the roll to settle", |o| {
            (ready_now(o) && condition_is(o, "Progressing", "False")).then(|| o.clone())
        })
        .await;
    let pid_before = active_pid(&settled);
    let roll_before = settled["status"]["lastRoll"].clone();
    pg.stop_fast();
    let stopped = Instant::now();
    let down = env
        .until(
            shard,
            Duration::from_secs(10),
            "StoreReady=False after PostgreSQL stopped",
            |o| condition_is(o, "StoreReady", "False").then(|| o.clone()),
        )
        .await;
    let message = condition(&down, "StoreReady").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    env.log(&format!(
        "PostgreSQL stopped: StoreReady=False after {:.1}s: {message}",
        stopped.elapsed().as_secs_f64()
    ));
    assert!(
        message.contains("PostgreSQL") && (message.contains("refused") || message.contains("shut")),
        "StoreReady gives PostgreSQL's error: {message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        active_pid(&env.get(shard).await.unwrap()),
        pid_before,
        "the slot is left alone"
    );
    pg.restart();
    let back = Instant::now();
    let again = env
        .until(
            shard,
            Duration::from_secs(60),
            "Ready and StoreReady after PostgreSQL is back",
            |o| (ready_now(o) && condition_is(o, "StoreReady", "True")).then(|| o.clone()),
        )
        .await;
    env.log(&format!(
        "PostgreSQL back: Ready after {:.1}s",
        back.elapsed().as_secs_f64()
    ));
    assert_eq!(active_pid(&again), pid_before, "no roll: the same slot serves");
    assert_eq!(again["status"]["lastRoll"], roll_before, "no roll");
    readyz_ok(&shard_admin)
        .await
        .unwrap_or_else(|e| env.fail(&format!("/readyz after the outage: {e}")));

    // 4. A minor bump is refused unless allowed; allowed, but with a flag the new kcp refuses, its
    //    preflight fails and blocks the roll, leaving nothing behind; without the flag it rolls.
    //    kcp has no second minor release pinned here, so the binary is named explicitly: the guard
    //    reads spec.version.
    let minor = "v0.32.0";
    let binary = support::kcp_bin(&newer).display().to_string();
    env.patch(
        shard,
        json!({ "spec": {
            "version": minor,
            "kcp": { "binary": binary, "extraArgs": ["--no-such-flag"] },
            "rollout": { "allowMinorVersionChange": false },
        } }),
    )
    .await;
    let refused = env
        .until(shard, Duration::from_secs(30), "the minor bump refused", |o| {
            condition(o, "Degraded")
                .filter(|c| c["reason"] == "VersionChangeRefused")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(refused.contains("allowMinorVersionChange"), "{refused}");
    readyz_ok(&shard_admin)
        .await
        .unwrap_or_else(|e| env.fail(&format!("/readyz while refused: {e}")));
    assert_eq!(
        active_pid(&env.get(shard).await.unwrap()),
        pid_before,
        "the old slot keeps serving"
    );
    let allowed_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let poller = Poller::start_every(shard_admin.clone(), Duration::from_millis(20));
    env.patch(
        shard,
        json!({ "spec": { "rollout": { "allowMinorVersionChange": true } } }),
    )
    .await;
    let failed = env
        .until(
            shard,
            Duration::from_secs(120),
            "the preflight with a bad flag to fail",
            |o| {
                condition(o, "Degraded")
                    .filter(|c| c["reason"] == "PreflightFailed")
                    .map(|_| o.clone())
            },
        )
        .await;
    let preflight = &failed["status"]["preflight"];
    env.log(&format!("the failed preflight: {preflight:#}"));
    assert_eq!(preflight["result"], "Failed", "{preflight:#}");
    assert!(
        preflight["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-flag") && m.contains("kcp.log")),
        "the message quotes kcp's error and its log: {preflight:#}"
    );
    let events = env.events(shard).await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("PreflightFailed")
            && e.message.as_deref().is_some_and(|m| m.contains("no-such-flag"))),
        "no PreflightFailed event:\n{}",
        summarize_events(&events)
    );
    let left = env
        .until(
            shard,
            Duration::from_secs(30),
            "the failed preflight to be removed",
            |_| {
                let left = preflight_leftovers(&env, shard);
                left.is_empty().then_some(left)
            },
        )
        .await;
    assert!(left.is_empty());
    assert_no_scratch_database(&pg);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let blocked = env.get(shard).await.unwrap();
    assert_eq!(active_pid(&blocked), pid_before, "the old slot keeps serving");
    assert_eq!(
        blocked["status"]["preflight"]["startedAt"], preflight["startedAt"],
        "not rerun in a loop"
    );
    readyz_ok(&shard_admin)
        .await
        .unwrap_or_else(|e| env.fail(&format!("/readyz while the preflight blocks the roll: {e}")));
    env.patch(shard, json!({ "spec": { "kcp": { "extraArgs": [] } } }))
        .await;
    env.until(shard, ROLL_TIMEOUT, "the allowed minor roll", |o| {
        completed_roll_to(o, minor, &allowed_at).then_some(())
    })
    .await;
    let stats = poller.finish().await;
    assert!(
        stats.failures.is_empty(),
        "failed polls in the minor roll:\n{}",
        describe_failures(&stats)
    );

    // 5. The password is nowhere a user or another local user can read it.
    let object = env.get(shard).await.unwrap();
    assert!(!object.to_string().contains(PASSWORD), "the password is in the object");
    for e in env.events(shard).await {
        assert!(
            !format!("{e:?}").contains(PASSWORD),
            "the password is in an event: {e:?}"
        );
    }
    let log = std::fs::read_to_string(env.serve_log()).unwrap_or_default();
    assert!(!log.contains(PASSWORD), "the password is in serve's log");
    for (pid, cmdline) in slot_kines(&pg, shard) {
        assert!(!cmdline.contains(PASSWORD), "the password is in kine {pid}'s argv");
    }
    env.shutdown(&[shard]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_managed_postgres_is_created_started_and_stopped_with_the_shard() {
    let _serial = serial();
    support::require("initdb");
    support::require("pg_ctl");
    let psql = support::require("psql");
    let mut env = Env::start().await;
    let shard = "managed";
    let port = test_port();
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, PASSWORD).unwrap();
    env.apply_spec(
        shard,
        json!({
            // No kcp of this version: the store comes first, and is all this test needs.
            "version": "v0.0.1",
            "store": managed_postgres_store(port, &password_file),
            "front": { "type": "Tcp", "listen": format!("127.0.0.1:{}", test_port()) },
        }),
    )
    .await;
    let up = env
        .until(
            shard,
            Duration::from_secs(120),
            "StoreReady=True on the managed PostgreSQL",
            |o| condition_is(o, "StoreReady", "True").then(|| o.clone()),
        )
        .await;
    assert!(
        env.shard_dir(shard).join("store/postgres/data/PG_VERSION").is_file(),
        "the cluster lives under the state dir"
    );
    let query = |password: &str| {
        let mut cmd = std::process::Command::new(&psql);
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "kcp",
            "-d",
            "kcp",
            "-XAtc",
            "select 1",
        ])
        .env("PGPASSWORD", password);
        support::run(cmd, Duration::from_secs(20))
    };
    assert!(query(PASSWORD).status.success(), "the password from the file logs in");
    let wrong = query("wrong");
    assert!(!wrong.status.success(), "a wrong password is refused");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("password authentication failed"));
    assert!(!up.to_string().contains(PASSWORD));

    // Its postmaster dies (SIGQUIT: an immediate shutdown, no checkpoint): the exit wakes the
    // controller, which starts the cluster again (crash recovery) and says so.
    let postmaster = managed_postmaster(&env, shard)
        .unwrap_or_else(|| env.fail("no pid in the managed PostgreSQL's postmaster.pid"));
    let store_starts = |events: &[k8s_openapi::api::core::v1::Event]| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("StoreStarted"))
            .count()
    };
    let starts_before = store_starts(&env.events(shard).await);
    let killed = Instant::now();
    signal(postmaster, libc::SIGQUIT);
    let back = loop {
        if !alive(postmaster) && query(PASSWORD).status.success() {
            break killed.elapsed();
        }
        if killed.elapsed() > Duration::from_secs(60) {
            env.fail("the managed PostgreSQL did not come back within 60 s of its postmaster's death");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    env.log(&format!(
        "managed PostgreSQL: postmaster {postmaster} SIGQUIT; logins work again after {:.2}s",
        back.as_secs_f64()
    ));
    // No slot runs here (no kcp of this version): the store's start is StoreStarted, not the
    // StoreRestarted that says slots ran through an outage. Event times are whole seconds: count.
    let mut events = env.events(shard).await;
    while store_starts(&events) <= starts_before {
        if killed.elapsed() > Duration::from_secs(60) {
            env.fail(&format!(
                "no StoreStarted event after the postmaster died:\n{}",
                summarize_events(&events)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        events = env.events(shard).await;
    }
    let metrics = env
        .client()
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| env.fail(&format!("GET /metrics: {e}")));
    assert!(
        metrics.contains(&format!("kcpshard_controller_process_exits_total{{shard=\"{shard}\"}}")),
        "the postmaster's exit did not wake the controller (no process_exits_total for {shard}):\n{metrics}"
    );

    assert!(
        env.delete_and_wait(shard, Duration::from_secs(60)).await,
        "the shard is deleted"
    );
    assert!(
        !support::port_accepts(port),
        "deleting the shard stops its managed PostgreSQL"
    );
    let log = std::fs::read_to_string(env.serve_log()).unwrap_or_default();
    assert!(!log.contains(PASSWORD), "the password is in serve's log");
    env.shutdown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn an_etcd_store_serves_a_shard() {
    let _serial = serial();
    let newer = kcp_newer();
    require_components(&[&newer]);
    let mut env = Env::start().await;
    let etcd = support::Etcd::start(env.dir());
    let shard = "etcd";
    let front = format!("127.0.0.1:{}", test_port());
    let store = json!({ "type": "Etcd", "etcd": { "endpoints": [&etcd.endpoint] } });
    env.apply_on(shard, &newer, &front, store).await;
    let ready = env.wait_ready(shard, READY_TIMEOUT).await;
    assert_eq!(ready["status"]["store"]["endpoints"], json!([&etcd.endpoint]));
    let kcp_admin = front_admin(&env, shard, &front).await;
    create_workspace_ready(&kcp_admin, "on-etcd", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    env.shutdown(&[shard]).await;
}

/// A CA and a server certificate it signed, for 127.0.0.1 only (no DNS name): PEM of the CA, and
/// the server's certificate and key.
fn postgres_certificates() -> (String, support::ServerTls) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(Vec::<String>::new()).unwrap();
    server.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
    let cert = server.signed_by(&key, &Issuer::new(ca, &ca_key)).unwrap().pem();
    (
        ca_pem,
        support::ServerTls {
            cert,
            key: key.serialize_pem(),
        },
    )
}

/// kcpshard checks PostgreSQL's certificate as kine does (libpq's sslmode, as pgx applies it), so
/// it never calls a store down that kine reaches, nor up one that kine cannot: require without a
/// CA file encrypts without verifying (a managed cloud database whose CA the system does not
/// know); verify-full checks the chain and the name; verify-ca the chain only. No kcp is needed:
/// the store comes first, and its check is what StoreReady reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn postgres_tls_is_checked_as_each_sslmode_says_as_kine_does() {
    let _serial = serial();
    let (ca_pem, tls) = postgres_certificates();
    let pg = support::Postgres::start_with_tls(&tls);
    let mut env = Env::start().await;
    let ca_file = env.dir().join("pg-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let shard = "tls";
    let front = format!("127.0.0.1:{}", test_port());
    let spec = |host: &str, ssl_mode: &str, ca: bool| {
        let mut store = json!({
            "host": host,
            "port": pg.port,
            "database": "kcp_tls",
            "user": "postgres",
            "sslMode": ssl_mode,
        });
        // null: a merge patch removes it.
        store["caFile"] = if ca {
            json!(ca_file.display().to_string())
        } else {
            Value::Null
        };
        // No kcp of this version: the store comes first, and is all this test needs.
        json!({
            "version": "v0.0.1",
            "store": { "type": "KinePostgres", "kinePostgres": store },
            "front": { "type": "Tcp", "listen": front },
        })
    };
    // Each case flips StoreReady, so a stale condition never passes for the next one.
    let cases = [
        ("127.0.0.1", "require", false, Ok(())),
        ("127.0.0.1", "verify-full", false, Err("invalid peer certificate")),
        ("127.0.0.1", "verify-full", true, Ok(())),
        ("localhost", "verify-full", true, Err("not valid for name")),
        ("localhost", "verify-ca", true, Ok(())),
    ];
    for (i, (host, ssl_mode, ca, expected)) in cases.into_iter().enumerate() {
        let case = format!(
            "host {host}, sslMode {ssl_mode}, {}",
            if ca { "caFile" } else { "no caFile" }
        );
        if i == 0 {
            env.apply_spec(shard, spec(host, ssl_mode, ca)).await;
        } else {
            env.patch(shard, json!({ "spec": spec(host, ssl_mode, ca) })).await;
        }
        let message = env
            .until(
                shard,
                Duration::from_secs(60),
                &format!("StoreReady as expected with {case}"),
                |o| {
                    let store = condition(o, "StoreReady")?;
                    let message = store["message"].as_str().unwrap_or_default().to_string();
                    match expected {
                        Ok(()) => (store["status"] == "True").then_some(message),
                        Err(why) => (store["status"] == "False" && message.contains(why)).then_some(message),
                    }
                },
            )
            .await;
        env.log(&format!(
            "{case}: StoreReady {}: {message}",
            if expected.is_ok() { "True" } else { "False" }
        ));
        if expected.is_err() && !message.contains("spec.store.kinePostgres.") {
            env.fail(&format!("{case}: the message does not say what to do: {message}"));
        }
    }

    // kine, given the same settings through the endpoint kcpshard builds, connects where kcpshard's
    // check passed: it sets up its table before it listens.
    for (ssl_mode, ca) in [
        (kcpshard::api::SslMode::Require, false),
        (kcpshard::api::SslMode::VerifyFull, true),
    ] {
        let server = kcpshard::store::PostgresServer {
            host: "127.0.0.1".into(),
            port: pg.port,
            database: "kcp_tls_kine".into(),
            user: "postgres".into(),
            password: None,
            ssl_mode,
            ca_file: ca.then(|| ca_file.clone()),
        };
        let endpoint = server.kine_endpoint("kcpshard-tls-test");
        let kine = support::Kine::start(&endpoint);
        env.log(&format!("kine on {endpoint}: ready in {:.2?}", kine.ready_in.unwrap()));
    }
    env.shutdown(&[shard]).await;
}
