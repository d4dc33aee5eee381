//! The fault matrix (docs/reliability.md), on real kcp, kine and PostgreSQL through
//! `kcpshard serve`, as a user sees it: a `/readyz` poller through the front (50 ms, a new
//! connection each), the status (sampled every 100 ms: what `kubectl get ks -w` shows) and the
//! events. Before each fault a workspace is created through the front; after it, every workspace
//! created so far must still be there: no data lost.
//!
//! - `kine_front_and_state_file_faults_on_a_kine_sqlite_shard`, one shard, no roll:
//!   1. SIGKILL of the shard's kine: the controller starts it again at the same address (its socket) (a Warning
//!      StoreRestarted), no roll; clients see failed `/readyz` until kcp reconnects (reported).
//!   2. SIGKILL of the front (`kcpshard front`): started again with the same backend, no roll;
//!      clients see refused connections meanwhile (measured and reported, not asserted).
//!   3. garbage in `controller.json`: Degraded=True, reason StateFileUnreadable, naming the file
//!      and what to do, one Warning event, the slot serving on (0 failed polls); moved aside, the
//!      shard is Ready again with no roll.
//!   4. `kubectl patch` of spec.store to an etcd nobody listens at (once any change of spec.store
//!      served an empty kcp at the next roll): a move begins and waits, Degraded naming the etcd,
//!      status still names KineSqlite; spec.store put back, the move is dropped, and a restart roll
//!      afterwards keeps every workspace.
//! - `slot_kine_postgres_and_roll_faults_on_a_kine_postgres_shard`, one shard on PostgreSQL:
//!   1. SIGKILL of the active slot's own kine (found by `application_name=kcpshard-<shard>-<slot>`
//!      in its argv): started again at the same address (SlotStoreRestarted), no roll.
//!   2. a slot that starts slowly: spec.rollout.readinessTimeout 1s with a restart request: the
//!      slot is started once more (SlotRestarting), then the roll is abandoned (Degraded,
//!      SlotNotReady), the old slot serves with 0 failed polls.
//!   3. raising readinessTimeout retries the roll at once; its NEW kcp is SIGKILLed after it
//!      started and before the switch: the roll is abandoned (Degraded, SlotCrashed), the old slot
//!      serves with 0 failed polls, the new slot's kine stops.
//!   4. garbage in the active slot's `slot.json`: Degraded StateFileUnreadable naming it, 0 failed
//!      polls; moved aside, the controller rebuilds the record from the running kcp.
//!   5. three restart rolls away from that rebuilt slot, PostgreSQL stopped for 5 s at a moment of
//!      the new slot's start-up each time (as soon as it started; at kcp's root phase 0, whose
//!      failed creates leave a kcp serving 404 for its own APIs; just before `/readyz` turns ok):
//!      each roll completes, and requests fail only while PostgreSQL is down.
//!
//! Covered elsewhere: SIGKILL of the active kcp and of `serve` at roll boundaries (e2e_roll.rs),
//! PostgreSQL stopped while the shard is idle (e2e_postgres.rs), a full disk and a corrupt object
//! file of the API (faults_api.rs), SIGKILL of `serve` during 20 rolls
//! (hack/faults/serve-kill-rolls.sh). Figures are printed for docs/reliability.md: run with
//! `cargo test --test e2e_faults -- --nocapture --test-threads=1`.
//!
//! Components come from bin/ (hack/install-deps.sh); a missing one fails, never skips.
//!
//! Longer than 600 lines on purpose: one fault matrix on one shard, every fault followed by the
//! same checks (poller, status, events, workspaces kept). Each tests/*.rs file is a test binary of
//! its own (40-60 MB, linked again on every change of the crate): one concern, one file.
mod e2e;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use e2e::*;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);
const RECOVER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long PostgreSQL stays down in the restart mid-roll.
const PG_DOWN: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------------------------------------
// What the user sees

/// One line of the status a user watches: phase and the conditions that matter here.
fn summary(object: &Value) -> String {
    let cond = |t: &str| match condition(object, t) {
        Some(c) if c["status"] == "True" && t == "Degraded" => format!("True({})", c["reason"].as_str().unwrap_or("")),
        Some(c) => c["status"].as_str().unwrap_or("?").to_string(),
        None => "-".into(),
    };
    format!(
        "phase={} Ready={} StoreReady={} FrontReady={} Degraded={}",
        object["status"]["phase"].as_str().unwrap_or("-"),
        cond("Ready"),
        cond("StoreReady"),
        cond("FrontReady"),
        cond("Degraded")
    )
}

/// The status as sampled every 100 ms: each change, with its time from the start.
struct Timeline {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(Duration, String)>>,
}

impl Timeline {
    fn start(env: &Env, shard: &str) -> Timeline {
        let api: Api<DynamicObject> = env.shards();
        let name = shard.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut seen: Vec<(Duration, String)> = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                if let Ok(o) = api.get(&name).await {
                    let line = summary(&serde_json::to_value(o).unwrap());
                    if seen.last().is_none_or(|(_, last)| *last != line) {
                        seen.push((started.elapsed(), line));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        });
        Timeline { stop, task }
    }

    async fn finish(self) -> Vec<(Duration, String)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("timeline task")
    }
}

fn render(timeline: &[(Duration, String)]) -> String {
    timeline
        .iter()
        .map(|(t, line)| format!("    +{:6.2}s {line}", t.as_secs_f64()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the poller saw, relative to the fault: failures, and how long requests were disrupted
/// (from the start of the first poll that failed or took over 1 s to the end of the last one).
fn failure_window(stats: &PollStats, fault: DateTime<Utc>) -> String {
    let at = |t: DateTime<Utc>| (t - fault).num_milliseconds() as f64 / 1000.0;
    let mut out = format!(
        "{} polls, {} failed, slowest {:.2}s",
        stats.polls,
        stats.failures.len(),
        stats.slowest.as_secs_f64()
    );
    if let (Some(first), Some(last)) = (stats.disrupted.first(), stats.disrupted.last()) {
        out.push_str(&format!(
            "; requests disrupted from {:+.2}s to {:+.2}s after the fault",
            at(first.0),
            at(last.1)
        ));
    }
    let mut kinds: Vec<String> = stats
        .failures
        .iter()
        .map(|(_, e)| e.replace('\n', " ").chars().take(60).collect::<String>())
        .collect();
    kinds.dedup();
    kinds.truncate(2);
    if !kinds.is_empty() {
        out.push_str(&format!(" (e.g. {})", kinds.join(" | ")));
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Helpers

fn restart_annotation() -> Value {
    json!({ "kcpshard.io/restartedAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true) })
}

/// Ready at the current generation with nothing in progress.
async fn settle(env: &Env, shard: &str, timeout: Duration, what: &str) -> Value {
    env.until(shard, timeout, what, |o| {
        (ready_now(o) && condition_is(o, "Progressing", "False") && condition_is(o, "Degraded", "False"))
            .then(|| o.clone())
    })
    .await
}

/// Waits for Degraded=True with `reason`; returns the condition.
async fn degraded_with(env: &Env, shard: &str, reason: &str, timeout: Duration) -> Value {
    env.until(shard, timeout, &format!("Degraded=True with reason {reason}"), |o| {
        condition(o, "Degraded")
            .filter(|c| c["status"] == "True" && c["reason"] == reason)
            .cloned()
    })
    .await
}

/// Live processes whose argv contains `needle` and `also` (this run's, where another run's
/// processes may carry the same names: e.g. its PostgreSQL port).
fn live(needle: &str, also: &str) -> Vec<(i32, String)> {
    processes_with(needle)
        .into_iter()
        .filter(|(_, argv)| argv.contains(also))
        .collect()
}

/// The one live process whose argv contains `needle` and `also`.
fn one_process(env: &Env, needle: &str, also: &str, what: &str) -> (i32, String) {
    let found = live(needle, also);
    if found.len() != 1 {
        env.fail(&format!(
            "want exactly one {what} (argv contains {needle}), found {found:#?}"
        ));
    }
    found[0].clone()
}

/// A kine's `--listen-address` (`unix://<its dir>/kine.sock`).
fn listen_address(argv: &str) -> String {
    argv.split_whitespace()
        .find_map(|a| a.strip_prefix("--listen-address="))
        .unwrap_or_else(|| panic!("no --listen-address in {argv}"))
        .to_string()
}

/// Waits for a process naming `needle` and `also` other than `old`; returns it.
async fn replacement(env: &Env, needle: &str, also: &str, old: i32, what: &str) -> (i32, String) {
    let deadline = Instant::now() + RECOVER_TIMEOUT;
    loop {
        let found: Vec<(i32, String)> = live(needle, also).into_iter().filter(|(p, _)| *p != old).collect();
        if let Some(p) = found.first() {
            return p.clone();
        }
        if Instant::now() > deadline {
            env.fail(&format!("no new {what} within {RECOVER_TIMEOUT:?} of the SIGKILL"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates workspace `name` through the front as kcpshard's admin identity (201: kcp stored it).
async fn create_workspace(env: &Env, shard: &str, front: &str, name: &str) {
    let config = front_admin(env, shard, front).await;
    let body = json!({ "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name } });
    match once(&config, http::Method::POST, WORKSPACES, Some(&body)).await {
        Ok((201 | 200, _)) => {}
        other => env.fail(&format!("create workspace {name} through the front: {other:?}")),
    }
}

/// Every workspace in `names` is there (GET through the front, as the shard admin). A 404 is data
/// lost; other failures (kcp still reconnecting) are retried for a while.
async fn all_there(env: &Env, admin: &kube::Config, names: &[String], after: &str) {
    for name in names {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match once(admin, http::Method::GET, &format!("{WORKSPACES}/{name}"), None).await {
                Ok((200, _)) => break,
                Ok((404, body)) => env.fail(&format!(
                    "DATA LOST: workspace {name}, created before {after}, is gone: {body}"
                )),
                other if Instant::now() > deadline => {
                    env.fail(&format!("workspace {name} cannot be read 60s after {after}: {other:?}"))
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

/// The serving slot is still `pid`, and the last roll is the one from before.
fn no_roll(env: &Env, before: &Value, after: &Value, what: &str) {
    assert_eq!(
        active_pid(after),
        active_pid(before),
        "{what}: the serving kcp changed (a roll or a replacement): {}",
        after["status"]
    );
    assert_eq!(
        after["status"]["lastRoll"]["startedAt"], before["status"]["lastRoll"]["startedAt"],
        "{what}: a roll ran"
    );
    let pid = active_pid(after).unwrap_or_else(|| env.fail("no active pid"));
    assert!(alive(pid), "{what}: the serving kcp (pid {pid}) is gone");
}

/// Ready with the store up and `/readyz` through the front ok; returns the object.
async fn recovered(env: &Env, shard: &str, admin: &kube::Config, what: &str) -> Value {
    let deadline = Instant::now() + RECOVER_TIMEOUT;
    loop {
        let object = env.get(shard).await.unwrap();
        if ready_now(&object)
            && condition_is(&object, "StoreReady", "True")
            && condition_is(&object, "Progressing", "False")
            && readyz_ok(admin).await.is_ok()
        {
            return object;
        }
        if Instant::now() > deadline {
            env.fail(&format!(
                "{what}: not recovered within {RECOVER_TIMEOUT:?}: {}",
                summary(&object)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Garbage for a state file: what a disk error or a bad hand edit leaves.
const GARBAGE: &[u8] = b"{\"roll\": {\"to\": \"b\", \0\0\0\0\0 garbage";

/// Corrupts `file`, checks what the user sees (Degraded naming it, what to do, one event, the
/// shard serving on with 0 failed polls), moves it aside, waits for `after_move`, and returns the
/// object then.
async fn corrupt_and_move_aside(
    env: &Env,
    shard: &str,
    front: &str,
    file: &std::path::Path,
    report: &mut Report,
    after_move: impl Fn(&Value) -> bool,
) -> Value {
    let label = format!(
        "garbage in {}",
        file.strip_prefix(env.shard_dir(shard)).unwrap().display()
    );
    assert!(file.is_file(), "{label}: {} does not exist", file.display());
    let admin = front_shard_admin(env, shard, front).await;
    let before = env.get(shard).await.unwrap();
    let poller = Poller::start(admin.clone());
    let timeline = Timeline::start(env, shard);
    let since = Utc::now();
    std::fs::write(file, GARBAGE).unwrap();
    let written = Instant::now();
    let degraded = degraded_with(env, shard, "StateFileUnreadable", Duration::from_secs(30)).await;
    let noticed = written.elapsed();
    let message = degraded["message"].as_str().unwrap_or_default().to_string();
    env.log(&format!(
        "{label}: Degraded after {:.2}s: {message}",
        noticed.as_secs_f64()
    ));
    assert!(
        message.contains(&file.display().to_string()) && message.contains("Move it aside"),
        "{label}: the message does not name the file and what to do: {message}"
    );
    // Reported once, not on every look; the shard serves on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events = events_since(env, shard, since).await;
    let reported = events.iter().filter(|(_, r, _)| r == "StateFileUnreadable").count();
    assert_eq!(
        reported,
        1,
        "{label}: want one StateFileUnreadable event in 5 s:\n{}",
        render_events(&events)
    );
    let during = env.get(shard).await.unwrap();
    assert_eq!(
        active_pid(&during),
        active_pid(&before),
        "{label}: the serving slot changed"
    );

    let aside = file.with_extension("json.bad");
    std::fs::rename(file, &aside).unwrap();
    let moved = Instant::now();
    let after = env
        .until(
            shard,
            RECOVER_TIMEOUT,
            &format!("{label}: recovery once the file is moved aside"),
            |o| after_move(o).then(|| o.clone()),
        )
        .await;
    let recovery = moved.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = poller.finish().await;
    let timeline = timeline.finish().await;
    assert!(stats.polls > 20, "{label}: the poller ran only {} polls", stats.polls);
    assert!(
        stats.failures.is_empty(),
        "{label}: /readyz through the front failed:\n{}",
        describe_failures(&stats)
    );
    report.add(format!(
        "{label}: Degraded/StateFileUnreadable after {:.2}s; recovered {:.2}s after the file was moved aside; /readyz through the front: {}\n  status:\n{}\n  events:\n{}",
        noticed.as_secs_f64(),
        recovery.as_secs_f64(),
        failure_window(&stats, since),
        render(&timeline),
        render_events(&events_since(env, shard, since).await)
    ));
    after
}

// ------------------------------------------------------------------------------------------------
// KineSqlite: kine, front, controller.json

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn kine_front_and_state_file_faults_on_a_kine_sqlite_shard() {
    let _serial = serial();
    let version = kcp_newer();
    require_components(&[&version]);
    let mut env = Env::start().await;
    let shard = "sq";
    let front = format!("127.0.0.1:{}", test_port());
    let state = env.state.display().to_string();
    let mut report = Report::default();
    let mut workspaces: Vec<String> = Vec::new();

    env.apply(shard, &version, &front).await;
    settle(&env, shard, READY_TIMEOUT, "the shard to be Ready and settled").await;
    let admin = front_shard_admin(&env, shard, &front).await;

    // 1. SIGKILL of the shard's kine.
    workspaces.push("before-kine-kill".into());
    create_workspace(&env, shard, &front, "before-kine-kill").await;
    let before = env.get(shard).await.unwrap();
    // kine's own argv (the slots' name its socket in the same directory).
    let needle = format!("--endpoint=sqlite://{state}/shards/{shard}/store");
    let (kine_pid, argv) = one_process(&env, &needle, "", "kine");
    let address = listen_address(&argv);
    let poller = Poller::start(admin.clone());
    let timeline = Timeline::start(&env, shard);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = Utc::now();
    let killed = Instant::now();
    signal(kine_pid, libc::SIGKILL);
    env.log(&format!("kine: SIGKILLed pid {kine_pid} at {address})"));
    let (new_pid, new_argv) = replacement(&env, &needle, "", kine_pid, "kine").await;
    let restarted = killed.elapsed();
    let after = recovered(&env, shard, &admin, "kine SIGKILL").await;
    let recovery = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = poller.finish().await;
    let timeline = timeline.finish().await;
    assert_eq!(
        listen_address(&new_argv),
        address,
        "the new kine listens elsewhere: {new_argv}"
    );
    no_roll(&env, &before, &after, "kine SIGKILL");
    all_there(&env, &admin, &workspaces, "the kine SIGKILL").await;
    let events = events_since(&env, shard, since).await;
    assert!(
        events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "StoreRestarted" && m.contains(&address)),
        "no Warning StoreRestarted naming {address}:\n{}",
        render_events(&events)
    );
    report.add(format!(
        "KineSqlite: SIGKILL of the shard's kine: a new kine (pid {new_pid}) at the same address {address} after {:.2}s; Ready with /readyz ok through the front after {:.2}s; /readyz through the front: {}; no roll; workspaces kept\n  status:\n{}\n  events:\n{}",
        restarted.as_secs_f64(),
        recovery.as_secs_f64(),
        failure_window(&stats, since),
        render(&timeline),
        render_events(&events)
    ));

    // 2. SIGKILL of the front.
    workspaces.push("before-front-kill".into());
    create_workspace(&env, shard, &front, "before-front-kill").await;
    let before = env.get(shard).await.unwrap();
    let needle = format!("{state}/shards/{shard}/front");
    let (front_pid, _) = one_process(&env, &needle, "", "front");
    let poller = Poller::start(admin.clone());
    let timeline = Timeline::start(&env, shard);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = Utc::now();
    let killed = Instant::now();
    signal(front_pid, libc::SIGKILL);
    env.log(&format!("front: SIGKILLed pid {front_pid}"));
    // The time clients are refused: until /readyz through the front answers again.
    let mut first_error = None;
    loop {
        match readyz_ok(&admin).await {
            Ok(()) => break,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
        if killed.elapsed() > RECOVER_TIMEOUT {
            env.fail("the front did not come back");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused_for = killed.elapsed();
    let (new_front, _) = replacement(&env, &needle, "", front_pid, "front").await;
    let after = recovered(&env, shard, &admin, "front SIGKILL").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = poller.finish().await;
    let timeline = timeline.finish().await;
    no_roll(&env, &before, &after, "front SIGKILL");
    assert_eq!(
        after["status"]["front"], before["status"]["front"],
        "the new front forwards elsewhere"
    );
    all_there(&env, &admin, &workspaces, "the front SIGKILL").await;
    let events = events_since(&env, shard, since).await;
    assert!(
        events.iter().any(|(_, r, _)| r == "FrontStarted"),
        "no FrontStarted event after the front was killed:\n{}",
        render_events(&events)
    );
    report.add(format!(
        "Tcp front: SIGKILL of `kcpshard front`: clients refused for {:.2}s (first error: {}); new front pid {new_front}, same address and backend; /readyz through the front: {}; no roll; workspaces kept\n  status:\n{}\n  events:\n{}",
        refused_for.as_secs_f64(),
        first_error.as_deref().unwrap_or("none"),
        failure_window(&stats, since),
        render(&timeline),
        render_events(&events)
    ));

    // 3. Garbage in controller.json.
    workspaces.push("before-corrupt-state".into());
    create_workspace(&env, shard, &front, "before-corrupt-state").await;
    let before = env.get(shard).await.unwrap();
    let file = env.shard_dir(shard).join("controller.json");
    let after = corrupt_and_move_aside(&env, shard, &front, &file, &mut report, |o| {
        ready_now(o) && condition_is(o, "Degraded", "False") && condition_is(o, "Progressing", "False")
    })
    .await;
    assert_eq!(
        active_pid(&after),
        active_pid(&before),
        "controller.json moved aside: the serving slot changed"
    );
    all_there(&env, &admin, &workspaces, "the corrupt controller.json").await;

    // 4. A change of spec.store to an etcd nobody listens at, as a user might make it.
    let nobody = format!("127.0.0.1:{}", test_port());
    let patch_store = |store: Value| {
        kubectl(
            &env.state.join("kubeconfig"),
            &[
                "patch",
                "ks",
                shard,
                "--type",
                "merge",
                "-p",
                &json!({ "spec": { "store": store } }).to_string(),
            ],
            "",
        )
    };
    let (accepted, out) = patch_store(json!({ "type": "Etcd", "etcd": { "endpoints": [format!("http://{nobody}")] } }));
    assert!(accepted, "kubectl patch of spec.store: {out}");
    let o = env
        .until(
            shard,
            Duration::from_secs(30),
            "the move waiting, Degraded naming the etcd",
            |o| {
                let says = condition(o, "Degraded")?["message"].as_str()?.contains(&nobody);
                (says && ready_now(o)).then(|| o.clone())
            },
        )
        .await;
    assert_eq!(o["status"]["store"]["type"], "KineSqlite", "{}", o["status"]["store"]);
    let (accepted, out) = patch_store(json!({ "type": "KineSqlite", "etcd": null }));
    assert!(accepted, "kubectl patch of spec.store back: {out}");
    env.until(shard, Duration::from_secs(30), "the move dropped, not Degraded", |o| {
        (o["status"]["migration"].is_null() && condition_is(o, "Degraded", "False")).then_some(())
    })
    .await;
    let requested = Utc::now();
    env.patch(shard, json!({ "metadata": { "annotations": restart_annotation() } }))
        .await;
    env.until(
        shard,
        ROLL_TIMEOUT,
        "the restart roll after the store change and back",
        |o| {
            (completed_roll_to(
                o,
                &version,
                &requested.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ) && ready_now(o))
            .then_some(())
        },
    )
    .await;
    all_there(
        &env,
        &admin,
        &workspaces,
        "a change of spec.store and back, and a restart roll",
    )
    .await;
    report.add(format!(
        "KineSqlite: kubectl patch of spec.store to an etcd nobody listens at: the move waited, Degraded naming it; put back: dropped ({})",
        out.trim()
    ));

    let left = env.shutdown(&[shard]).await;
    report.print("e2e_faults: KineSqlite shard");
    assert!(left.is_empty(), "processes left: {left:?}");
}

// ------------------------------------------------------------------------------------------------
// KinePostgres: a slot's kine, readinessTimeout, PostgreSQL mid-roll, the new kcp, slot.json

/// Ends the slots' kines on this run's PostgreSQL (found by its port in their argv, as well as by
/// the state dir `Env` sweeps for), so that a failed test leaves none behind.
struct SlotKines(String);

impl Drop for SlotKines {
    fn drop(&mut self) {
        let left = sweep(&self.0, Duration::from_secs(5));
        if !left.is_empty() {
            eprintln!("killed {} slot kine(s) left on {}", left.len(), self.0);
        }
    }
}

fn postgres_spec(version: &str, front: &str, pg: &support::Postgres) -> Value {
    json!({
        "version": version,
        "store": {
            "type": "KinePostgres",
            "kinePostgres": { "host": "127.0.0.1", "port": pg.port, "database": "kcp_faults", "user": "postgres" },
        },
        "front": { "type": "Tcp", "listen": front },
    })
}

/// Waits until the roll requested at `requested` has started its new slot; returns that slot.
async fn new_slot_started(env: &Env, shard: &str, requested: DateTime<Utc>) -> String {
    env.until(shard, Duration::from_secs(60), "the new slot to start", |o| {
        let active = active_slot(o)?;
        roll_phase(&o["status"]["lastRoll"], "newSlotStartedAt", requested)?;
        o["status"]["slots"]
            .as_array()?
            .iter()
            .filter_map(|s| s["name"].as_str())
            .find(|s| *s != active)
            .map(str::to_string)
    })
    .await
}

fn slot_root(env: &Env, shard: &str, slot: &str) -> String {
    format!("--root-directory={}/slots/{slot}/root", env.shard_dir(shard).display())
}

/// A moment of a new slot's start-up at which PostgreSQL is taken away (docs/reliability.md, "A
/// slot that answers /readyz but not kcp's APIs", has what kcp does at each).
#[derive(Clone, Copy, Debug)]
enum StartMoment {
    /// As soon as the slot is seen started: before kcp's first store connection.
    Start,
    /// At kcp's "bootstrapping root workspace phase 0": the APIBinding creates that, failed,
    /// leave a kcp answering /readyz but 404 for its own APIs.
    Phase0,
    /// At "finished bootstrapping root workspace phase 1", the last bootstrap step: just before
    /// `/readyz` turns ok.
    Readyz,
}

impl StartMoment {
    const ALL: [StartMoment; 3] = [StartMoment::Start, StartMoment::Phase0, StartMoment::Readyz];

    fn name(self) -> &'static str {
        match self {
            StartMoment::Start => "at-start",
            StartMoment::Phase0 => "at-phase0",
            StartMoment::Readyz => "before-readyz",
        }
    }

    /// The kcp log line (kcp `pkg/server/server.go`, kcp-start-informers) the moment begins at.
    fn log_line(self) -> Option<&'static str> {
        match self {
            StartMoment::Start => None,
            StartMoment::Phase0 => Some("bootstrapping root workspace phase 0"),
            StartMoment::Readyz => Some("finished bootstrapping root workspace phase 1"),
        }
    }
}

/// The lengths of the slots' kcp logs now: a slot started again appends to its log.
fn log_lengths(env: &Env, shard: &str) -> Vec<(String, u64)> {
    ["a", "b"]
        .iter()
        .map(|slot| {
            let log = env.shard_dir(shard).join(format!("slots/{slot}/kcp.log"));
            (slot.to_string(), std::fs::metadata(log).map_or(0, |m| m.len()))
        })
        .collect()
}

/// Waits until the slot's kcp log has `line` after its first `skip` bytes (what earlier runs of
/// the slot wrote); false after `timeout`.
async fn log_has(log: &std::path::Path, skip: u64, line: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let text = std::fs::read(log).unwrap_or_default();
        // A log written anew is read from its start.
        let from = if (text.len() as u64) < skip { 0 } else { skip as usize };
        if String::from_utf8_lossy(&text[from..]).contains(line) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A restart roll with PostgreSQL stopped (fast shutdown) at `moment` of the new slot's start-up
/// and back after [`PG_DOWN`]: the roll completes, no request through the front fails outside the
/// outage, and a slot that started during it is started again (SlotRestarting) or served.
async fn restart_postgres_mid_roll(
    env: &Env,
    shard: &str,
    admin: &kube::Config,
    pg: &mut support::Postgres,
    moment: StartMoment,
    version: &str,
    report: &mut Report,
) {
    let label = moment.name();
    let active = active_slot(&env.get(shard).await.unwrap()).unwrap();
    let poller = Poller::start(admin.clone());
    let timeline = Timeline::start(env, shard);
    let since = Utc::now();
    let requested = Utc::now();
    let started = Instant::now();
    let logs_before = log_lengths(env, shard);
    env.patch(shard, json!({ "metadata": { "annotations": restart_annotation() } }))
        .await;
    let new_slot = new_slot_started(env, shard, requested).await;
    if let Some(line) = moment.log_line() {
        let log = env.shard_dir(shard).join(format!("slots/{new_slot}/kcp.log"));
        let skip = logs_before
            .iter()
            .find(|(s, _)| *s == new_slot)
            .map_or(0, |(_, len)| *len);
        assert!(
            log_has(&log, skip, line, ROLL_TIMEOUT).await,
            "{label}: slot {new_slot} never logged {line:?}: {}",
            tail(&log, 20)
        );
    }
    let pg_stopped = Instant::now();
    let pg_stopped_at = Utc::now();
    pg.stop_fast();
    env.log(&format!(
        "{label}: rolling from slot {active} to {new_slot}; PostgreSQL stopped {:.2}s after the request",
        started.elapsed().as_secs_f64()
    ));
    // Down for a while, as a restart of a loaded server may take.
    tokio::time::sleep(PG_DOWN.saturating_sub(pg_stopped.elapsed())).await;
    pg.restart();
    let pg_back_at = Utc::now();
    let pg_down = pg_stopped.elapsed();
    let done = env
        .until(
            shard,
            ROLL_TIMEOUT,
            &format!("{label}: the roll to complete after the PostgreSQL restart"),
            |o| {
                // The outage degrades the shard for a while (the store's error, slots whose /readyz
                // fails until their kine reconnects); a blocked roll is what must not happen.
                if let Some(c) = condition(o, "Degraded").filter(|c| {
                    c["status"] == "True"
                        && ["SlotNotReady", "SlotCrashed", "SlotBroken"]
                            .contains(&c["reason"].as_str().unwrap_or_default())
                }) {
                    return Some(Err(c.clone()));
                }
                (roll_phase(&o["status"]["lastRoll"], "completedAt", requested).is_some()
                    && ready_now(o)
                    && condition_is(o, "Progressing", "False"))
                .then(|| Ok(o.clone()))
            },
        )
        .await;
    let rolled_in = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = poller.finish().await;
    let timeline = timeline.finish().await;
    let events = events_since(env, shard, since).await;
    let done = match done {
        Ok(done) => done,
        Err(c) => env.fail(&format!(
            "{label}: the roll did not complete after PostgreSQL restarted mid-roll: Degraded {c}\nstatus:\n{}\nevents:\n{}",
            render(&timeline),
            render_events(&events)
        )),
    };
    assert_eq!(done["status"]["lastRoll"]["fromVersion"], version);
    assert_ne!(
        active_slot(&done),
        Some(active.clone()),
        "{label}: the roll left {active} serving"
    );
    // A poll sent up to 2 s before the stop may fail with it; none may fail 3 s after PostgreSQL is back.
    let outside: Vec<_> = stats
        .disrupted
        .iter()
        .filter(|(from, to)| {
            *from < pg_stopped_at - chrono::Duration::seconds(2) || *to > pg_back_at + chrono::Duration::seconds(3)
        })
        .collect();
    assert!(
        outside.is_empty(),
        "{label}: requests through the front failed or stalled outside the PostgreSQL outage ({pg_stopped_at} to {pg_back_at}): {outside:?}\n{}",
        describe_failures(&stats)
    );
    let restarted = events
        .iter()
        .filter(|(t, r, _)| t == "Warning" && (r == "SlotRestarting" || r == "SlotBroken"))
        .count();
    report.add(format!(
        "{label}: a restart roll from {active} to {new_slot} with PostgreSQL down {:.2}s: completed {:.2}s after the request, {restarted} restart(s) of the new slot; /readyz through the front: {}\n  status:\n{}\n  events:\n{}",
        pg_down.as_secs_f64(),
        rolled_in.as_secs_f64(),
        failure_window(&stats, pg_stopped_at),
        render(&timeline),
        render_events(&events)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn slot_kine_postgres_and_roll_faults_on_a_kine_postgres_shard() {
    let _serial = serial();
    let version = kcp_newer();
    require_components(&[&version]);
    let mut pg = support::Postgres::start();
    // This run's slot kines name its PostgreSQL in their argv.
    let on_pg = format!("@127.0.0.1:{}/", pg.port);
    // Dropped after `env` (which kills serve and sweeps what names the state dir) and before `pg`.
    let _kines = SlotKines(on_pg.clone());
    let mut env = Env::start().await;
    let shard = "pgf";
    let front = format!("127.0.0.1:{}", test_port());
    let mut report = Report::default();
    let mut workspaces: Vec<String> = Vec::new();

    env.apply_spec(shard, postgres_spec(&version, &front, &pg)).await;
    settle(&env, shard, READY_TIMEOUT, "the shard to be Ready and settled").await;
    let admin = front_shard_admin(&env, shard, &front).await;

    // 1. SIGKILL of the active slot's own kine.
    workspaces.push("before-slot-kine-kill".into());
    create_workspace(&env, shard, &front, "before-slot-kine-kill").await;
    let before = env.get(shard).await.unwrap();
    let active = active_slot(&before).unwrap();
    let needle = format!("application_name=kcpshard-{shard}-{active}");
    let (kine_pid, argv) = one_process(&env, &needle, &on_pg, "slot kine");
    let address = listen_address(&argv);
    let poller = Poller::start(admin.clone());
    let timeline = Timeline::start(&env, shard);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = Utc::now();
    let killed = Instant::now();
    signal(kine_pid, libc::SIGKILL);
    env.log(&format!("slot {active}'s kine: SIGKILLed pid {kine_pid} at {address})"));
    let (new_pid, new_argv) = replacement(&env, &needle, &on_pg, kine_pid, "slot kine").await;
    let restarted = killed.elapsed();
    let after = recovered(&env, shard, &admin, "slot kine SIGKILL").await;
    let recovery = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = poller.finish().await;
    let timeline = timeline.finish().await;
    assert_eq!(
        listen_address(&new_argv),
        address,
        "the new kine listens elsewhere: {new_argv}"
    );
    no_roll(&env, &before, &after, "slot kine SIGKILL");
    all_there(&env, &admin, &workspaces, "the slot kine SIGKILL").await;
    let events = events_since(&env, shard, since).await;
    assert!(
        events
            .iter()
            .any(|(_, r, m)| r == "SlotStoreRestarted" && m.contains(&address)),
        "no SlotStoreRestarted event naming {address}:\n{}",
        render_events(&events)
    );
    report.add(format!(
        "KinePostgres: SIGKILL of slot {active}'s kine: a new kine (pid {new_pid}) at the same address {address} after {:.2}s; Ready with /readyz ok through the front after {:.2}s; /readyz through the front: {}; no roll; workspaces kept\n  status:\n{}\n  events:\n{}",
        restarted.as_secs_f64(),
        recovery.as_secs_f64(),
        failure_window(&stats, since),
        render(&timeline),
        render_events(&events)
    ));

    // 2. A slot that starts slowly: readinessTimeout 1s, the least accepted. No kcp is ready that
    //    fast (its post-start hooks alone take seconds); with 5s a kcp on a quiet machine was
    //    ready in 4.7s and the roll completed.
    workspaces.push("before-slow-slot".into());
    create_workspace(&env, shard, &front, "before-slow-slot").await;
    let before = env.get(shard).await.unwrap();
    let poller = Poller::start(admin.clone());
    let since = Utc::now();
    let requested = Instant::now();
    env.patch(
        shard,
        json!({ "metadata": { "annotations": restart_annotation() }, "spec": { "rollout": { "readinessTimeout": "1s" } } }),
    )
    .await;
    let degraded = degraded_with(&env, shard, "SlotNotReady", Duration::from_secs(90)).await;
    let abandoned = requested.elapsed();
    let message = degraded["message"].as_str().unwrap_or_default();
    assert!(message.contains("readinessTimeout"), "{message}");
    // Degraded comes with the look that plans the abort, before the roll record goes; once it
    // is gone, status shows the last completed roll again.
    let after = env
        .until(
            shard,
            Duration::from_secs(30),
            "status.lastRoll back to the roll before the abandoned one (or did a roll complete?)",
            |o| (o["status"]["lastRoll"] == before["status"]["lastRoll"]).then(|| o.clone()),
        )
        .await;
    let new_roots = |env: &Env| {
        processes_with(&format!("--root-directory={}/slots/", env.shard_dir(shard).display()))
            .into_iter()
            .filter(|(p, _)| Some(*p) != active_pid(&before))
            .collect::<Vec<_>>()
    };
    let gone = support::poll(Duration::from_secs(15), Duration::from_millis(100), || {
        new_roots(&env).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "the abandoned slot's kcp still runs: {:?}",
        new_roots(&env)
    );
    let stats = poller.finish().await;
    no_roll(&env, &before, &after, "slow slot");
    assert!(
        stats.failures.is_empty(),
        "slow slot: /readyz through the front failed:\n{}",
        describe_failures(&stats)
    );
    all_there(&env, &admin, &workspaces, "the slow slot").await;
    // A kcp start-up that never finishes gets one more try before the roll stops.
    let slow_events = events_since(&env, shard, since).await;
    assert!(
        slow_events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "SlotRestarting" && m.contains("within 1s")),
        "the slow slot was not started once more before the roll stopped:\n{}",
        render_events(&slow_events)
    );
    report.add(format!(
        "readinessTimeout 1s: roll abandoned {:.2}s after the request (Degraded/SlotNotReady: {message}); the old slot served on: /readyz through the front: {}\n  events:\n{}",
        abandoned.as_secs_f64(),
        failure_window(&stats, since),
        render_events(&events_since(&env, shard, since).await)
    ));

    // 3. Raising the timeout retries at once. The NEW kcp of that roll is SIGKILLed as soon as it
    //    started, before the switch: the roll is abandoned, the old slot serves on.
    workspaces.push("before-new-kcp-kill".into());
    create_workspace(&env, shard, &front, "before-new-kcp-kill").await;
    let before = env.get(shard).await.unwrap();
    let poller = Poller::start(admin.clone());
    let since = Utc::now();
    let requested = Utc::now();
    let raised = Instant::now();
    env.patch(shard, json!({ "spec": { "rollout": { "readinessTimeout": "120s" } } }))
        .await;
    let new_slot = new_slot_started(&env, shard, requested).await;
    let retried = raised.elapsed();
    // Stopped, it cannot answer /readyz, so the front cannot switch to it from here on; whether it
    // had already is checked, not assumed from how long kcp takes.
    let (new_pid, _) = one_process(&env, &slot_root(&env, shard, &new_slot), "", "new kcp");
    signal(new_pid, libc::SIGSTOP);
    let rolling = env.get(shard).await.unwrap();
    assert!(
        rolling["status"]["lastRoll"]["frontSwitchedAt"].is_null(),
        "the front switched to the new slot before it could be stopped: {}",
        rolling["status"]["lastRoll"]
    );
    let killed = Instant::now();
    signal(new_pid, libc::SIGKILL);
    env.log(&format!("new kcp: SIGKILLed slot {new_slot} (pid {new_pid})"));
    let degraded = degraded_with(&env, shard, "SlotCrashed", Duration::from_secs(30)).await;
    let noticed = killed.elapsed();
    let kines = support::poll(Duration::from_secs(15), Duration::from_millis(100), || {
        (live(&format!("application_name=kcpshard-{shard}-"), &on_pg).len() == 1).then_some(())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = poller.finish().await;
    let after = env.get(shard).await.unwrap();
    no_roll(&env, &before, &after, "new kcp SIGKILL");
    assert!(kines.is_some(), "the abandoned slot's kine still runs");
    assert!(
        stats.failures.is_empty(),
        "new kcp SIGKILL: /readyz through the front failed:\n{}",
        describe_failures(&stats)
    );
    all_there(&env, &admin, &workspaces, "the new kcp SIGKILL").await;
    report.add(format!(
        "readinessTimeout raised to 120s: the roll retried, slot {new_slot} started {:.2}s later. SIGKILL of that new kcp (at its start, before the switch): roll abandoned {:.2}s later (Degraded/SlotCrashed: {}); the old slot served on: /readyz through the front: {}\n  events:\n{}",
        retried.as_secs_f64(),
        noticed.as_secs_f64(),
        degraded["message"].as_str().unwrap_or_default(),
        failure_window(&stats, since),
        render_events(&events_since(&env, shard, since).await)
    ));

    // 4. Garbage in the active slot's slot.json; moved aside, the record is rebuilt from the
    //    running kcp (the shard stays blocked on the crashed spec).
    workspaces.push("before-corrupt-slot".into());
    create_workspace(&env, shard, &front, "before-corrupt-slot").await;
    let before = env.get(shard).await.unwrap();
    let active = active_slot(&before).unwrap();
    let record = env.shard_dir(shard).join(format!("slots/{active}/slot.json"));
    let after = corrupt_and_move_aside(&env, shard, &front, &record, &mut report, |o| {
        condition(o, "Degraded").is_some_and(|c| c["reason"] == "SlotCrashed") && ready_now(o)
    })
    .await;
    assert_eq!(
        active_pid(&after),
        active_pid(&before),
        "slot.json moved aside: the serving slot changed"
    );
    let rebuilt: Value = serde_json::from_slice(&std::fs::read(&record).expect("the slot record is rebuilt")).unwrap();
    env.log(&format!("rebuilt {}: {rebuilt}", record.display()));
    assert_eq!(rebuilt["port"], after["status"]["slots"][0]["port"], "{rebuilt}");

    // 5. A new spec change rolls away from the rebuilt slot, and PostgreSQL is restarted in the
    //    middle of that roll, at each moment of the new slot's start-up that matters: the roll
    //    completes each time, and clients see failures only while PostgreSQL is down.
    for moment in StartMoment::ALL {
        let name = format!("before-postgres-restart-{}", moment.name());
        workspaces.push(name.clone());
        create_workspace(&env, shard, &front, &name).await;
        restart_postgres_mid_roll(&env, shard, &admin, &mut pg, moment, &version, &mut report).await;
        all_there(
            &env,
            &admin,
            &workspaces,
            &format!("the PostgreSQL restart {}", moment.name()),
        )
        .await;
    }

    let left = env.shutdown(&[shard]).await;
    report.print("e2e_faults: KinePostgres shard");
    assert!(left.is_empty(), "processes left: {left:?}");
}
