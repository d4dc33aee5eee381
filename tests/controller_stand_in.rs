//! The controller against a stand-in kcp (tests/support/stand_in_kcp.rs: HTTPS `/readyz`, the
//! controllers Lease and workspaces, kcp's SIGTERM behaviour), with the real `kcpshard serve`,
//! front and kine. A slot that hangs is SIGSTOPped and one that crashes SIGKILLed, as in the
//! end-to-end suite, which proves the same on real kcp; these take seconds, so every rule of the
//! loop is checked on every run:
//! - two slots serve at once and a roll replaces them one by one, with no failed poll;
//! - a slot that is killed leaves the front at once, its Lease is released, a replacement runs;
//! - a slot that hangs leaves the front within 3 s and is killed after livenessTimeout; alone, the
//!   shard says Degraded at once and serves again after livenessTimeout and one start;
//! - a kine or a front that hangs is replaced; a slot that cannot start says what kcp printed;
//! - deletion takes one short step at a time and serve honours SIGTERM at once in every state;
//!   every step of rolls, a preflight and a deletion acts within 0.5 s (the steps that still wait
//!   are named; the goal is 0.1 s);
//! - a version change is preflighted on a copy of the data, across a crash of serve mid-preflight,
//!   and a preflight that fails blocks the roll and leaves nothing behind; the copy is a job, and
//!   a slot that crashes while it runs is acted on at once;
//! - the old slot killed mid-preflight: an interim slot of the version that last served the data
//!   serves until the preflight passed, and no slot of the new version starts before it; an
//!   interim slot that crashes at start is not started again, and the preflight and roll go on.
//!
//! Longer than 600 lines on purpose: every rule of the loop against one stand-in, sharing its
//! fixtures (spec, the stand-in's knobs, what settled means). Each tests/*.rs file is a test binary
//! of its own (40-60 MB, linked again on every change of the crate): one concern, one file.
mod e2e;
mod support;

use std::time::{Duration, Instant};

use e2e::{Env, Poller, condition, describe_failures, leader, serving, settled, signal, slot_pid, test_port};
use serde_json::{Value, json};

fn stand_in() -> String {
    env!("CARGO_BIN_EXE_stand-in-kcp").to_string()
}

fn spec(front: &str, slots: u32) -> Value {
    json!({
        "version": "v0.31.2",
        "slots": slots,
        "kcp": { "binary": stand_in() },
        "store": { "type": "KineSqlite" },
        "front": { "type": "Tcp", "listen": front },
        "rollout": { "livenessTimeout": "4s", "readinessTimeout": "20s", "drainTimeout": "10s" },
    })
}

async fn start(slots: u32) -> (Env, String, kube::Config) {
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    env.apply_spec("dev", spec(&front, slots)).await;
    settled(&env, "dev", slots as usize, Duration::from_secs(60)).await;
    let poll = e2e::front_shard_admin(&env, "dev", &front).await;
    env.started = Instant::now();
    (env, front, poll)
}

/// A `kine` in `dir` that runs the shell lines `first`, then the real kine.
fn kine_wrapper(dir: &std::path::Path, first: &str) -> std::path::PathBuf {
    let kine = dir.join("kine");
    let script = format!(
        "#!/bin/sh\n{first}\nexec '{}' \"$@\"\n",
        support::require("kine").display()
    );
    std::fs::write(&kine, script).unwrap();
    std::fs::set_permissions(&kine, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    kine
}

async fn reasons(env: &Env) -> Vec<String> {
    env.events("dev")
        .await
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect()
}

/// Waits up to 5 s for an event of each of `wanted` reasons: a step's event is posted once the
/// step returns, so what the step did (a socket closed, a process gone) can be seen before it.
async fn told(env: &Env, wanted: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = reasons(env).await;
        let missing: Vec<_> = wanted.iter().filter(|w| !seen.iter().any(|r| r == *w)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "no {missing:?} event in {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_slots_serve_and_a_roll_replaces_them_one_by_one_with_no_failed_request() {
    let (mut env, _front, poll) = start(2).await;
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    env.request_restart("dev").await;
    let wanted = env.get("dev").await.unwrap()["metadata"]["annotations"]["kcpshard.io/restartedAt"].clone();
    // At most three slots run at any moment, and two serve throughout.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut most = 0;
    loop {
        let o = env.get("dev").await.unwrap();
        let slots = o["status"]["slots"].as_array().cloned().unwrap_or_default();
        most = most.max(slots.iter().filter(|s| s["pid"].is_number()).count());
        let fresh = slots.len() == 2 && slots.iter().all(|s| s["serving"] == true && s["restartedAt"] == wanted);
        if fresh && condition(&o, "Progressing").is_some_and(|c| c["status"] == "False") {
            break;
        }
        assert!(Instant::now() < deadline, "the roll did not complete: {}", o["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    finish_without_a_failed_poll(&env, poller, &format!("roll of 2 slots (at most {most} ran)")).await;
    assert!(most <= 3, "{most} slots ran at once");
    let o = env.get("dev").await.unwrap();
    assert_eq!(o["status"]["lastRoll"]["toVersion"], "v0.31.2");
    told(&env, &["RollComplete"]).await;
    env.shutdown(&["dev"]).await;
}

/// `kcpshard snapshot create` takes a snapshot (a copy of state.db) while the shard serves, with
/// no failed poll, and status.lastSnapshot names it; with spec.backup.interval more follow on
/// schedule, and only spec.backup.keep of them stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_taken_on_request_and_on_schedule_while_the_shard_serves() {
    let (mut env, _front, poll) = start(1).await;
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    let said = env.cli_ok(&["snapshot", "create", "dev", "--timeout", "30"]).await;
    let o = env.get("dev").await.unwrap();
    let asked = &o["status"]["lastSnapshot"];
    let path = asked["path"].as_str().unwrap_or_default().to_string();
    assert!(said.contains(&path) && path.ends_with(".db"), "{said}\n{asked}");
    assert!(
        asked["request"].is_string() && asked["bytes"].as_u64() > Some(0),
        "{asked}"
    );
    let copy = rusqlite::Connection::open(&path).unwrap();
    let keys: i64 = copy.query_row("SELECT COUNT(*) FROM kine", [], |r| r.get(0)).unwrap();
    assert!(keys > 0, "the snapshot holds no key");
    told(&env, &["SnapshotStarted", "SnapshotTaken"]).await;

    env.patch("dev", json!({ "spec": { "backup": { "interval": "10s", "keep": 1 } } }))
        .await;
    let mut scheduled = Vec::new();
    while scheduled.len() < 2 {
        let taken = env
            .until("dev", Duration::from_secs(30), "a scheduled snapshot", |o| {
                let last = &o["status"]["lastSnapshot"];
                let path = last["path"].as_str()?;
                (last["request"].is_null() && !scheduled.iter().any(|p| p == path)).then(|| path.to_string())
            })
            .await;
        scheduled.push(taken);
    }
    let mut left: Vec<String> = std::fs::read_dir(env.shard_dir("dev").join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".db"))
        .collect();
    left.sort();
    assert_eq!(left, [scheduled[1].clone()], "keep: 1");
    finish_without_a_failed_poll(&env, poller, "snapshots on request and on schedule").await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_leaves_the_front_its_lease_goes_and_a_replacement_runs() {
    let (mut env, _front, poll) = start(2).await;
    let (name, pid) = env.until("dev", Duration::from_secs(20), "a leader", leader).await;
    let last_roll = env.get("dev").await.unwrap()["status"]["lastRoll"].clone();
    let rolls_before = roll_completes(&env).await;
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    signal(pid, libc::SIGKILL);
    let killed = Instant::now();
    // Another process leads: the survivor, or the replacement (which may take the dead one's name).
    let other = env
        .until("dev", Duration::from_secs(10), "another slot to lead", |o| {
            leader(o).filter(|(_, p)| *p != pid).map(|(n, _)| n)
        })
        .await;
    let took = killed.elapsed();
    env.log(&format!(
        "slot {name} (leader) killed: slot {other} leads {took:.2?} later"
    ));
    assert!(took < Duration::from_secs(8), "no leader for {took:?}");
    settled(&env, "dev", 2, Duration::from_secs(30)).await;
    let stats = poller.finish().await;
    env.log(&format!("{} polls, {} failed", stats.polls, stats.failures.len()));
    // Only a request in flight on the killed slot may fail.
    assert!(
        stats.failures.len() <= 1,
        "failed polls:\n{}",
        describe_failures(&stats)
    );
    told(&env, &["SlotCrashed", "LeaseReleased"]).await;
    replaced(&env, &name, "crashed: ", (&last_roll, rolls_before)).await;
    env.shutdown(&["dev"]).await;
}

/// The replacement of `slot` is done and said so, as a replacement (`cause` begins its cause), and
/// the last roll is still `last_roll`, its event not repeated (`rolls_before` RollComplete events).
async fn replaced(env: &Env, slot: &str, cause: &str, (last_roll, rolls_before): (&Value, usize)) {
    let o = env
        .until(
            "dev",
            Duration::from_secs(30),
            "status.lastReplacement completed",
            |o| {
                let r = &o["status"]["lastReplacement"];
                (r["replacedSlot"] == slot && r["completedAt"].is_string()).then(|| o.clone())
            },
        )
        .await;
    let replacement = &o["status"]["lastReplacement"];
    assert!(
        replacement["cause"].as_str().is_some_and(|c| c.starts_with(cause)),
        "{replacement:#}"
    );
    assert_eq!(&o["status"]["lastRoll"], last_roll, "a replacement is no roll");
    told(env, &["SlotReplaced"]).await;
    assert_eq!(
        roll_completes(env).await,
        rolls_before,
        "a RollComplete event for the replacement"
    );
}

async fn roll_completes(env: &Env) -> usize {
    reasons(env).await.iter().filter(|r| *r == "RollComplete").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_slot_leaves_the_front_within_3s_and_is_killed_after_the_liveness_timeout() {
    let (mut env, _front, poll) = start(2).await;
    let o = env.get("dev").await.unwrap();
    let victim = serving(&o)[0].clone();
    let pid = slot_pid(&o, &victim).unwrap();
    let last_roll = o["status"]["lastRoll"].clone();
    let rolls_before = roll_completes(&env).await;
    signal(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    env.until("dev", Duration::from_secs(3), "the hung slot out of the front", |o| {
        (!serving(o).contains(&victim)).then_some(())
    })
    .await;
    env.log(&format!(
        "slot {victim} SIGSTOPped: out of the front after {:.2?}",
        stopped.elapsed()
    ));
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    env.until("dev", Duration::from_secs(10), "the hung slot killed", |o| {
        (slot_pid(o, &victim) != Some(pid)).then_some(())
    })
    .await;
    let killed_after = stopped.elapsed();
    env.log(&format!("slot {victim} killed {killed_after:.2?} after it hung"));
    assert!(
        killed_after >= Duration::from_secs(4),
        "killed before livenessTimeout: {killed_after:?}"
    );
    settled(&env, "dev", 2, Duration::from_secs(30)).await;
    let stats = poller.finish().await;
    assert!(
        stats.failures.is_empty(),
        "failed polls once it left the front:\n{}",
        describe_failures(&stats)
    );
    told(&env, &["SlotUnresponsive", "SlotKilled"]).await;
    replaced(&env, &victim, "killed: ", (&last_roll, rolls_before)).await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_hung_slot_is_degraded_at_once_and_serves_again_after_the_liveness_timeout() {
    let (mut env, _front, poll) = start(1).await;
    let o = env.get("dev").await.unwrap();
    let pid = slot_pid(&o, &serving(&o)[0]).unwrap();
    signal(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let message = env
        .until("dev", Duration::from_secs(3), "Degraded=True SlotUnresponsive", |o| {
            condition(o, "Degraded")
                .filter(|c| c["status"] == "True" && c["reason"] == "SlotUnresponsive")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    env.log(&format!("Degraded {:.2?} after SIGSTOP: {message}", stopped.elapsed()));
    let o = env.get("dev").await.unwrap();
    assert_eq!(condition(&o, "Ready").unwrap()["status"], "False");
    settled(&env, "dev", 1, Duration::from_secs(30)).await;
    let back = stopped.elapsed();
    env.log(&format!("serving again {back:.2?} after SIGSTOP"));
    assert!(e2e::readyz_ok(&poll).await.is_ok());
    // Each step is told: the hang (no step is taken for it until livenessTimeout), then the kill.
    told(&env, &["SlotUnresponsive", "SlotKilled"]).await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_kine_and_a_hung_front_are_replaced_and_the_shard_serves_again_within_5s() {
    let (mut env, _front, poll) = start(1).await;
    for (what, marker) in [("kine", "--endpoint=sqlite://"), ("front", " front ")] {
        let took = e2e::stop_and_await_replacement(&env, &poll, what, marker, Duration::from_secs(5)).await;
        env.log(&format!("{what} SIGSTOPped: replaced, serving again after {took:.2?}"));
    }
    told(&env, &["StoreUnresponsive", "FrontUnresponsive"]).await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_that_cannot_start_says_what_kcp_printed_and_where_its_log_is() {
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    let mut bad = spec(&front, 1);
    bad["kcp"]["extraArgs"] = json!(["--bogus-flag"]);
    env.apply_spec("dev", bad).await;
    let message = env
        .until("dev", Duration::from_secs(30), "Degraded=True SlotCrashed", |o| {
            condition(o, "Degraded")
                .filter(|c| c["status"] == "True" && c["reason"] == "SlotCrashed")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(message.contains("Error: unknown flag: --bogus-flag"), "{message}");
    assert!(message.contains("kcp.log"), "{message}");
    // The event follows the status that says it (it is written after), so wait for it; then it
    // must not come again.
    let blocked = || async {
        env.events("dev")
            .await
            .iter()
            .filter(|e| e.reason.as_deref() == Some("RollBlocked"))
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>()
    };
    let seen = Instant::now();
    while blocked().await == 0 && seen.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = blocked().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = blocked().await;
    assert!(
        first == 1 && again == 1,
        "RollBlocked {first} then {again} times for one block"
    );
    let events = env.events("dev").await;
    let crashed: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("SlotCrashed"))
        .filter_map(|e| e.message.as_deref())
        .collect();
    assert!(
        crashed
            .iter()
            .any(|m| m.contains("none starts while the roll is blocked"))
            && !crashed.iter().any(|m| m.contains("a replacement starts")),
        "the crash's event says that no replacement starts: {crashed:?}"
    );
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_honours_sigterm_within_5s_mid_roll_and_deletion_leaves_nothing_running() {
    let (mut env, _front, _poll) = start(1).await;
    env.request_restart("dev").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = env.serve_pid().unwrap();
    let asked = Instant::now();
    signal(pid, libc::SIGTERM);
    while e2e::alive(pid) {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "serve still runs 5 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.log(&format!("serve exited {:.2?} after SIGTERM mid-roll", asked.elapsed()));
    env.stop_serve();
    env.start_serve().await;
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    assert!(
        env.delete_and_wait("dev", Duration::from_secs(30)).await,
        "the shard was not deleted"
    );
    let left: Vec<_> = e2e::processes_with(&env.state.display().to_string())
        .into_iter()
        .filter(|(_, argv)| !argv.contains(" serve "))
        .collect();
    assert!(left.is_empty(), "processes left after deletion: {left:?}");
    env.shutdown(&[]).await;
}

/// Waits (up to 60 s) until a one-slot shard's restart roll has completed on slot b.
async fn rolled_to_b(env: &Env) {
    env.until("dev", Duration::from_secs(60), "the restart roll complete", |o| {
        let slots = o["status"]["slots"].as_array().cloned().unwrap_or_default();
        (o["status"]["lastRoll"]["completedAt"].is_string()
            && slots.len() == 1
            && slots[0]["name"] == "b"
            && slots[0]["serving"] == true)
            .then_some(())
    })
    .await;
}

/// SIGTERM while the controller looks at a caddy front whose admin API accepts connections and
/// never answers (each look waits its 1 s bound for it; EnsureFront's check of it is a request
/// beside the reconcile): serve exits within 5 s and logs no line of a step after it let go of the
/// state dir (a look past serve's grace is aborted and waited for: cli/serve/shutdown.rs's tests).
/// The next serve brings the shard up once its spec names a front that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_in_the_middle_of_a_look_ends_it_before_the_state_dir_is_let_go() {
    // Bound and never accepted from: the kernel completes the connections, nobody answers.
    let silent_admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    let mut shard = spec(&front, 1);
    shard["front"] = json!({ "type": "Caddy", "listen": front, "caddy": {
        "adminAddress": silent_admin.local_addr().unwrap().to_string(), "upstreamId": "kcp-proxy" } });
    env.apply_spec("dev", shard).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(env.serve_log())
        .unwrap_or_default()
        .contains("planned step=EnsureFront")
    {
        assert!(Instant::now() < deadline, "serve never asked the silent caddy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = env.serve_pid().unwrap();
    let asked = Instant::now();
    signal(pid, libc::SIGTERM);
    while e2e::alive(pid) {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "serve still runs 5 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.log(&format!("serve exited {:.2?} after SIGTERM mid-look", asked.elapsed()));
    let log = std::fs::read_to_string(env.serve_log()).unwrap();
    let (_, after) = log
        .split_once("letting go of the state dir")
        .unwrap_or_else(|| panic!("serve never let go of the state dir:\n{}", env.serve_log_tail(30)));
    let late: Vec<&str> = after.lines().filter(|l| l.contains("step{")).collect();
    assert!(
        late.is_empty(),
        "a step ran after serve let go of the state dir: {late:?}"
    );

    env.stop_serve();
    env.start_serve().await;
    env.patch("dev", json!({ "spec": { "front": { "type": "Tcp", "caddy": null } } }))
        .await;
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    env.shutdown(&["dev"]).await;
}

/// A kcp that does not answer the probe's POST of a workspace (a stand-in knob, while a flag file
/// exists) holds no step: Probe returns and the roll waits for the answer (status says Probing),
/// a slot SIGKILLed meanwhile is acted on within 0.5 s, and once kcp answers the roll completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_kcp_does_not_answer_holds_back_no_step() {
    let flags = tempfile::tempdir().unwrap();
    let hang = flags.path().join("hang");
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    let mut shard = spec(&front, 2);
    shard["kcp"]["extraArgs"] = json!([format!("--stand-in-hang-posts-while={}", hang.display())]);
    env.apply_spec("dev", shard).await;
    settled(&env, "dev", 2, Duration::from_secs(60)).await;
    std::fs::write(&hang, "").unwrap();
    env.request_restart("dev").await;
    let seen = hang.with_extension("seen");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.exists() {
        assert!(Instant::now() < deadline, "the restart roll never probed its new slot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.until(
        "dev",
        Duration::from_secs(5),
        "Probing while kcp does not answer",
        |o| {
            condition(o, "Progressing")
                .filter(|c| c["reason"] == "Probing")
                .map(|_| ())
        },
    )
    .await;
    let o = env.get("dev").await.unwrap();
    let victim = serving(&o).into_iter().next().expect("a serving slot");
    signal(slot_pid(&o, &victim).unwrap(), libc::SIGKILL);
    let killed = Instant::now();
    while !reasons(&env).await.iter().any(|r| r == "SlotCrashed") {
        assert!(
            killed.elapsed() < Duration::from_millis(500),
            "slot {victim}, SIGKILLed while the probe waits for kcp, is not acted on 0.5 s later"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env.log(&format!(
        "slot {victim} SIGKILLed while the probe's POST hangs: SlotCrashed after {:.3?}",
        killed.elapsed()
    ));
    let slow = e2e::slow_steps(&env, "dev", "0.5").await;
    assert!(slow.is_empty(), "steps over 0.5 s while kcp did not answer: {slow:?}");
    std::fs::remove_file(&hang).unwrap();
    settled(&env, "dev", 2, Duration::from_secs(60)).await;
    env.shutdown(&["dev"]).await;
}

/// A kine that takes 2 s to accept (a wrapper that sleeps first) is started by EnsureStore, which
/// returns at once: status says the controller waits for it (StoreStarting), and the shard comes
/// up once it accepts. A kine that exits at its start (a wrapper that exits 1 with a message) is a
/// failed step naming its log and its last words, and the shard comes up once it starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kine_slow_to_accept_is_waited_for_outside_any_step_and_one_that_exits_says_why() {
    let wrapper_dir = tempfile::tempdir().unwrap();
    let slow = wrapper_dir.path().join("slow");
    let broken = wrapper_dir.path().join("broken");
    let kine = kine_wrapper(
        wrapper_dir.path(),
        &format!(
            "[ -e '{}' ] && {{ echo 'kine: cannot open the database' >&2; exit 1; }}\n[ -e '{}' ] && sleep 2",
            broken.display(),
            slow.display()
        ),
    );
    std::fs::write(&slow, "").unwrap();
    let mut env = Env::start_with_kine(&[], kine.clone()).await;
    let front = format!("127.0.0.1:{}", test_port());
    env.apply_spec("dev", spec(&front, 1)).await;
    let waiting = env
        .until("dev", Duration::from_secs(10), "StoreStarting while kine starts", |o| {
            condition(o, "Progressing")
                .filter(|c| c["reason"] == "StoreStarting" && c["message"].as_str().unwrap_or("").contains("waiting"))
                .map(|c| c["message"].clone())
        })
        .await;
    env.log(&format!("while kine starts: {waiting}"));
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    // A step that waited for this kine would take its 2 s.
    let slow_steps = e2e::slow_steps(&env, "dev", "0.5").await;
    assert!(
        !slow_steps.iter().any(|(step, ..)| step == "EnsureStore"),
        "EnsureStore waited for the slow kine (steps over 0.5 s: {slow_steps:?})"
    );

    std::fs::remove_file(&slow).unwrap();
    std::fs::write(&broken, "").unwrap();
    let store = env.shard_dir("dev").join("store").display().to_string();
    let running = e2e::processes_with(&store)
        .into_iter()
        .find(|(_, argv)| argv.contains("--listen-address"))
        .expect("the shard's kine");
    signal(running.0, libc::SIGKILL);
    let failed = env
        .until("dev", Duration::from_secs(10), "a failed EnsureStore", |o| {
            condition(o, "Degraded")
                .filter(|c| c["message"].as_str().unwrap_or("").contains("cannot open the database"))
                .map(|c| c["message"].as_str().unwrap().to_string())
        })
        .await;
    assert!(
        failed.contains("kine exited during startup") && failed.contains("kine.log"),
        "the failure does not name kine's exit and its log: {failed}"
    );
    std::fs::remove_file(&broken).unwrap();
    // The next attempt after the step's backoff starts kine again, on the port the slot dials.
    env.until("dev", Duration::from_secs(60), "the store back", |o| {
        condition(o, "StoreReady").filter(|c| c["status"] == "True").map(|_| ())
    })
    .await;
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    env.shutdown(&["dev"]).await;
}

/// KinePostgres: a restart roll's new slot first gets its own kine, which takes 2 s to accept (a
/// wrapper that sleeps first, once a flag file exists). StartSlot starts it and returns
/// (SlotStoreStarting), the controller waits outside any step, and starts the slot's kcp once the
/// kine accepts; the roll completes with no step over 0.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slots_own_kine_slow_to_accept_is_waited_for_outside_any_step() {
    let wrapper_dir = tempfile::tempdir().unwrap();
    let slow = wrapper_dir.path().join("slow");
    let kine = kine_wrapper(wrapper_dir.path(), &format!("[ -e '{}' ] && sleep 2", slow.display()));
    let pg = support::Postgres::start();
    let mut env = Env::start_with_kine(&[], kine).await;
    let front = format!("127.0.0.1:{}", test_port());
    let mut shard = spec(&front, 1);
    shard["store"] = json!({
        "type": "KinePostgres",
        "kinePostgres": { "host": "127.0.0.1", "port": pg.port, "database": "kcp_slow_kine", "user": "postgres" },
    });
    env.apply_spec("dev", shard).await;
    settled(&env, "dev", 1, Duration::from_secs(60)).await;

    std::fs::write(&slow, "").unwrap();
    env.started = Instant::now();
    env.request_restart("dev").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let note = loop {
        let events = env.events("dev").await;
        if let Some(e) = events.iter().find(|e| {
            e.reason.as_deref() == Some("SlotStoreStarting") && e.message.as_deref().unwrap_or("").contains("slot b")
        }) {
            break e.message.clone().unwrap_or_default();
        }
        let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.clone()).collect();
        assert!(Instant::now() < deadline, "no SlotStoreStarting event: {reasons:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    env.log(&format!("SlotStoreStarting: {note}"));
    assert!(note.contains("once it accepts"), "{note}");
    rolled_to_b(&env).await;
    let slow_steps = e2e::slow_steps(&env, "dev", "0.5").await;
    assert!(
        slow_steps.is_empty(),
        "steps over 0.5 s while slot b's kine took 2 s to accept: {slow_steps:?}"
    );
    env.shutdown(&["dev"]).await;
}

/// spec.front.listen changes: the old front stops accepting at once and drains a connection held
/// open through it, while the controller goes on: a serving slot SIGKILLed meanwhile is acted on
/// (SlotCrashed) within 0.5 s. Once that connection closes, the front starts on its new address
/// and the shard (rolled to its new URL) serves there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_front_that_moves_drains_and_starts_on_its_new_address_and_a_slot_that_dies_meanwhile_is_acted_on_at_once() {
    let (mut env, front, _poll) = start(2).await;
    // Held open through the old front, which then drains it (up to 30 s).
    let held = tokio::net::TcpStream::connect(&front).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let holder = loop {
        let status = e2e::front_status(&env, "dev").await;
        if let Some((slot, _)) = status.connections.iter().find(|(_, c)| c.open > 0) {
            break slot.clone();
        }
        assert!(Instant::now() < deadline, "the front holds no connection: {status:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The slot that does not hold the connection, chosen while both serve (a draining front
    // reports no backends).
    let o = env.get("dev").await.unwrap();
    let victim = serving(&o)
        .into_iter()
        .find(|s| *s != holder)
        .expect("another serving slot");
    let victim_pid = slot_pid(&o, &victim).unwrap();
    let moved = format!("127.0.0.1:{}", test_port());
    env.patch("dev", json!({ "spec": { "front": { "listen": moved } } }))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&front).await.is_ok() {
        assert!(Instant::now() < deadline, "the old front still accepts on {front}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    told(&env, &["FrontMoving"]).await;

    // Its crash leaves the drain as it is.
    signal(victim_pid, libc::SIGKILL);
    let killed = Instant::now();
    while !reasons(&env).await.iter().any(|r| r == "SlotCrashed") {
        assert!(
            killed.elapsed() < Duration::from_millis(500),
            "slot {victim}, SIGKILLed while the front drains, is not acted on 0.5 s later"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env.log(&format!(
        "slot {victim} SIGKILLed while the front drains: SlotCrashed after {:.3?}",
        killed.elapsed()
    ));
    assert!(
        tokio::net::TcpStream::connect(&moved).await.is_err(),
        "the new front started before the old one was gone"
    );

    drop(held);
    let o = settled(&env, "dev", 2, Duration::from_secs(60)).await;
    assert_eq!(o["spec"]["front"]["listen"], moved.as_str());
    assert_eq!(e2e::front_status(&env, "dev").await.listen.to_string(), moved);
    tokio::net::TcpStream::connect(&moved)
        .await
        .expect("the front does not accept on its new address");
    env.shutdown(&["dev"]).await;
}

/// A step starts something and returns: over a first start, a restart roll of two slots, a version
/// roll with its preflight and a deletion whose kine ignores its SIGTERM (SIGSTOPped), every step
/// acted within 0.5 s by the controller's own step durations (`/metrics`); those over 0.1 s, the
/// goal, are reported. A step that waits for
/// a process waits seconds (a stop's grace, a start); 0.5 s leaves room for the short work of a
/// step with the other tests of this file beside it on 2 cores (StartSlot writes and fsyncs about
/// ten files and spawns kcp: over 0.1 s three times in six in CI). The kine is killed once its
/// grace is over, and only then is the shard gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_step_of_rolls_a_preflight_and_a_deletion_returns_within_half_a_second() {
    let (mut env, _front, _poll) = start(2).await;
    env.request_restart("dev").await;
    let wanted = env.get("dev").await.unwrap()["metadata"]["annotations"]["kcpshard.io/restartedAt"].clone();
    env.until("dev", Duration::from_secs(60), "the restart roll", |o| {
        let slots = o["status"]["slots"].as_array().cloned().unwrap_or_default();
        let fresh = slots.len() == 2 && slots.iter().all(|s| s["serving"] == true && s["restartedAt"] == wanted);
        (fresh && condition(o, "Progressing").is_some_and(|c| c["status"] == "False")).then_some(())
    })
    .await;
    env.patch("dev", json!({ "spec": { "version": "v0.31.3" } })).await;
    let rolled = rolled_to_v0_31_3_with_two_slots(&env).await;
    assert_eq!(
        rolled["status"]["preflight"]["result"], "Compatible",
        "{}",
        rolled["status"]
    );
    assert!(
        e2e::serve_metrics(&env)
            .await
            .contains("kcpshard_controller_step_duration_seconds_count{shard=\"dev\",step=\"StopPreflight\"}"),
        "the preflight's kcp and kine were not stopped by a step of their own"
    );
    let kine: Value =
        serde_json::from_slice(&std::fs::read(env.shard_dir("dev").join("store/kine.json")).unwrap()).unwrap();
    let kine_pid = kine["pid"].as_i64().unwrap() as i32;
    signal(kine_pid, libc::SIGSTOP);
    let deleting = Instant::now();
    assert!(
        env.delete_and_wait("dev", Duration::from_secs(40)).await,
        "the shard was not deleted"
    );
    let took = deleting.elapsed();
    assert!(
        !e2e::alive(kine_pid),
        "the stopped kine (pid {kine_pid}) survived the deletion"
    );
    assert!(
        took >= kcpshard::store::kine::STOP_GRACE,
        "the shard was gone {took:?} after its deletion, before its kine's grace was over"
    );
    told(&env, &["KilledAfterGrace"]).await;
    let over_goal = e2e::slow_steps(&env, "dev", "0.1").await;
    env.log(&format!(
        "deleted in {took:?}; steps over 0.1 s (step, how many, of): {over_goal:?}"
    ));
    let unexpected = e2e::slow_steps(&env, "dev", "0.5").await;
    assert!(
        unexpected.is_empty(),
        "steps took longer than 0.5 s (step, how many, of): {unexpected:?}"
    );
    env.shutdown(&[]).await;
}

/// The preflight's copy of the data is a job: a serving slot SIGKILLed while `kcpshard job
/// sqlite-copy` is stopped mid-copy leaves the front within 0.5 s; once the copy goes on and
/// ends, the preflight runs on it and the roll completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_that_crashes_during_the_preflights_copy_of_the_data_is_acted_on_at_once() {
    let (mut env, _front, _poll) = start(2).await;
    // 200 MiB beside kine's table, so that the copy takes long enough to be caught running.
    let db = rusqlite::Connection::open(env.shard_dir("dev").join("store/state.db")).unwrap();
    db.busy_timeout(Duration::from_secs(30)).unwrap();
    db.execute_batch(
        "CREATE TABLE filler (b BLOB); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) INSERT INTO filler SELECT zeroblob(1048576) FROM n;",
    )
    .unwrap();
    drop(db);
    env.patch("dev", json!({ "spec": { "version": "v0.31.3" } })).await;
    // The snapshot before the version change is a sqlite-copy too (into snapshots/); the
    // preflight's copies into its own directory.
    let preflight_dir = env.shard_dir("dev").join("preflight").display().to_string();
    let copy = stop_a_job_mid_way(&env, &preflight_dir, "sqlite-copy").await;
    kill_a_serving_slot_and_see_it_leave_the_front(&env, "Preflight", "the preflight's copy").await;
    signal(copy, libc::SIGCONT);
    let done = rolled_to_v0_31_3_with_two_slots(&env).await;
    let p = &done["status"]["preflight"];
    assert_eq!(p["result"], "Compatible", "{p}");
    assert!(
        p["startedAt"].as_str() < p["copiedAt"].as_str() && p["copiedAt"].as_str() <= p["launchedAt"].as_str(),
        "recorded, copied, then launched: {p}"
    );
    assert!(
        e2e::preflight_leftovers(&env, "dev").is_empty(),
        "{:?}",
        e2e::preflight_leftovers(&env, "dev")
    );
    env.shutdown(&["dev"]).await;
}

/// The data loss of a store change (the next slot on an empty store) cannot happen: a move into a
/// store that cannot be reached waits, Degraded naming it, while the shard serves on the store its
/// data is in (the API's refusal of a move kcpshard cannot make is api::validation's test); a
/// KcpShard created again with such a store runs on the one its data is in, and status names that
/// store; deletion stops every kine the shard started, one that serves nothing it uses included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_to_an_unreachable_store_waits_a_re_created_shard_keeps_its_data_s_store_and_deletion_stops_every_kine()
{
    let (mut env, front, _poll) = start(1).await;
    let o = env.get("dev").await.unwrap();
    assert_eq!(o["status"]["store"]["type"], "KineSqlite");
    assert!(
        o["status"]["store"]["dataSince"].is_string(),
        "{}",
        o["status"]["store"]
    );

    // An etcd nobody listens at.
    let nobody = format!("127.0.0.1:{}", test_port());
    let elsewhere = json!({ "type": "Etcd", "etcd": { "endpoints": [format!("http://{nobody}")] } });
    env.patch("dev", json!({ "spec": { "store": elsewhere } })).await;
    let waiting = |o: &Value| {
        let degraded = condition(o, "Degraded")?;
        let says = degraded["message"].as_str()?.contains(&nobody);
        (e2e::ready_now(o) && degraded["status"] == "True" && says).then(|| o.clone())
    };
    let o = env
        .until(
            "dev",
            Duration::from_secs(30),
            "Ready, and Degraded naming the etcd",
            waiting,
        )
        .await;
    assert_eq!(o["status"]["store"]["type"], "KineSqlite", "{}", o["status"]["store"]);
    assert_eq!(
        o["status"]["migration"]["phase"], "Copying",
        "{}",
        o["status"]["migration"]
    );

    // A kine of the shard that serves nothing it uses, as an older kcpshard could leave behind.
    let orphan_dir = env.shard_dir("dev").join("slots/d/store");
    let kine = kcpshard::store::KineSpec::sqlite(&support::require("kine"), &orphan_dir, "dev").unwrap();
    let runtime = kcpshard::process::Runtime::new();
    let orphan = kcpshard::store::kine::ensure_kine(&runtime, &kine).await.unwrap();
    let orphan_pid = orphan.record.pid as i32;
    assert!(e2e::alive(orphan_pid));
    assert!(
        env.delete_and_wait("dev", Duration::from_secs(30)).await,
        "the shard was not deleted"
    );
    assert!(
        !e2e::alive(orphan_pid),
        "the orphaned kine (pid {orphan_pid}) survived the deletion"
    );
    assert!(!orphan_dir.join("kine.json").exists(), "its record stayed");

    // Created again on another store: it runs on the one its data is in.
    let mut again = spec(&front, 1);
    again["store"] = elsewhere;
    env.apply_spec("dev", again).await;
    let o = env
        .until(
            "dev",
            Duration::from_secs(60),
            "Ready, and Degraded naming the etcd",
            waiting,
        )
        .await;
    assert_eq!(o["status"]["store"]["type"], "KineSqlite", "{}", o["status"]["store"]);
    let pid = slot_pid(&o, "a").unwrap();
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let kine_port = o["status"]["store"]["endpoints"][0].as_str().unwrap().to_string();
    assert!(
        String::from_utf8_lossy(&argv).contains(&format!("--etcd-servers={kine_port}")),
        "the slot does not dial the sqlite kine {kine_port}"
    );
    env.shutdown(&["dev"]).await;
}

/// The dump of the store before a version change is a job: the roll waits for it, nothing else
/// does. A serving slot SIGKILLed while pg_dump is stopped mid-dump leaves the front within 0.5 s;
/// once the dump goes on and ends, it is kept and the roll completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_that_crashes_during_a_long_dump_of_the_store_is_acted_on_at_once() {
    let pg = support::Postgres::start();
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    let mut first = spec(&front, 2);
    first["store"] = json!({
        "type": "KinePostgres",
        "kinePostgres": { "host": "127.0.0.1", "port": pg.port, "database": "kcp_jobs", "user": "postgres" },
    });
    first["rollout"]["preflight"] = json!(false);
    env.apply_spec("dev", first).await;
    settled(&env, "dev", 2, Duration::from_secs(60)).await;
    env.patch("dev", json!({ "spec": { "version": "v0.31.3" } })).await;

    let snapshots = env.shard_dir("dev").join("snapshots").display().to_string();
    let dump = stop_a_job_mid_way(&env, &snapshots, "pg_dump").await;
    kill_a_serving_slot_and_see_it_leave_the_front(&env, "TakingSnapshot", "the dump").await;
    signal(dump, libc::SIGCONT);
    let done = rolled_to_v0_31_3_with_two_slots(&env).await;
    let kept = done["status"]["lastRoll"]["snapshot"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        kept.starts_with(&snapshots) && kept.ends_with(".dump"),
        "lastRoll.snapshot: {kept:?}"
    );
    let meta = std::fs::metadata(&kept).unwrap();
    assert!(meta.len() > 0, "an empty dump");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    told(&env, &["SnapshotStarted", "SnapshotTaken", "SlotCrashed"]).await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_changed_mid_roll_is_the_one_the_roll_record_names() {
    let (mut env, _front, _poll) = start(1).await;
    env.patch("dev", json!({ "spec": { "version": "v0.31.3" } })).await;
    env.until("dev", Duration::from_secs(10), "a slot of v0.31.3 starting", |o| {
        o["status"]["slots"]
            .as_array()?
            .iter()
            .any(|s| s["version"] == "v0.31.3")
            .then_some(())
    })
    .await;
    env.patch("dev", json!({ "spec": { "version": "v0.31.4" } })).await;
    let done = env
        .until("dev", Duration::from_secs(60), "the roll to v0.31.4 complete", |o| {
            let roll = &o["status"]["lastRoll"];
            (roll["completedAt"].is_string()
                && serving(o).len() == 1
                && o["status"]["slots"][0]["version"] == "v0.31.4")
                .then(|| roll.clone())
        })
        .await;
    assert_eq!(done["toVersion"], "v0.31.4", "{done}");
    let complete = env
        .events("dev")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RollComplete"))
        .filter_map(|e| e.message)
        .next_back()
        .unwrap_or_default();
    assert!(complete.contains("to v0.31.4"), "{complete}");
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_front_address_that_is_taken_names_who_holds_it() {
    let mut env = Env::start().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let front = taken.local_addr().unwrap().to_string();
    env.apply_spec("dev", spec(&front, 1)).await;
    let message = env
        .until("dev", Duration::from_secs(30), "Degraded=True StepFailed", |o| {
            condition(o, "Degraded")
                .filter(|c| c["status"] == "True" && c["reason"] == "StepFailed")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(
        message.contains(&format!("in use by pid {}", std::process::id())),
        "{message}"
    );
    assert!(!message.contains("another program"), "{message}");
    // The shipped alert on failing steps fires on what this serve exports.
    let metrics = e2e::serve_metrics(&env).await;
    let failed = metrics
        .lines()
        .find(|l| l.starts_with("kcpshard_controller_steps_total{") && l.contains(r#"result="front_address""#))
        .unwrap_or_else(|| panic!("no failed EnsureFront counted in serve's /metrics:\n{metrics}"));
    support::alerts::assert_fires_on_counter(
        failed,
        "KcpShardStepsFailing",
        "warning",
        "Steps of KcpShard dev failed (EnsureFront: front_address)",
    );
    drop(taken);
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_change_is_preflighted_on_a_copy_across_a_serve_crash_and_a_failed_preflight_blocks_the_roll() {
    let (mut env, _front, poll) = start(1).await;
    let slot_a = slot_pid(&env.get("dev").await.unwrap(), "a").expect("slot a runs");
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    // Slow to get ready, so that serve is killed while the preflight's kcp is starting.
    let started = preflight_of_a_slow_version(&env, 3000).await;
    env.kill_serve();
    let preflight_kcp = e2e::processes_with(&env.shard_dir("dev").join("preflight/copy/root").display().to_string());
    assert_eq!(preflight_kcp.len(), 1, "the preflight's kcp runs on: {preflight_kcp:?}");
    assert!(
        env.shard_dir("dev").join("preflight/copy/store/state.db").is_file(),
        "the copy of the sqlite file is the preflight's own"
    );
    env.start_serve().await;
    let done = rolled_to_v0_31_3(&env).await;
    let p = &done["status"]["preflight"];
    assert_eq!(
        p["startedAt"], started,
        "the same preflight, carried on after the crash: {p}"
    );
    assert_eq!(p["result"], "Compatible", "{p}");
    assert!(p["completedAt"].as_str() < done["status"]["lastRoll"]["newSlotStartedAt"].as_str());
    assert!(
        e2e::preflight_leftovers(&env, "dev").is_empty(),
        "{:?}",
        e2e::preflight_leftovers(&env, "dev")
    );
    assert!(
        slot_pid(&done, "a").is_none_or(|pid| pid != slot_a),
        "slot a was replaced"
    );
    told(&env, &["PreflightStarted", "PreflightLaunched", "PreflightPassed"]).await;

    // A version whose kcp refuses a flag: the preflight fails, the roll is blocked, nothing is left.
    let serving_pid = done["status"]["slots"][0]["pid"].clone();
    env.patch(
        "dev",
        json!({ "spec": { "version": "v0.31.4", "kcp": { "extraArgs": ["--bogus-flag"] } } }),
    )
    .await;
    let message = env
        .until("dev", Duration::from_secs(30), "Degraded=True PreflightFailed", |o| {
            condition(o, "Degraded")
                .filter(|c| c["status"] == "True" && c["reason"] == "PreflightFailed")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(
        message.contains("unknown flag: --bogus-flag") && message.contains("kcp.log"),
        "{message}"
    );
    env.until("dev", Duration::from_secs(10), "the failed preflight removed", |_| {
        e2e::preflight_leftovers(&env, "dev").is_empty().then_some(())
    })
    .await;
    let failed_at = env.get("dev").await.unwrap()["status"]["preflight"]["startedAt"].clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let o = env.get("dev").await.unwrap();
    assert_eq!(
        o["status"]["preflight"]["startedAt"], failed_at,
        "not rerun for the same spec"
    );
    assert_eq!(o["status"]["preflight"]["result"], "Failed");
    assert_eq!(
        o["status"]["slots"][0]["pid"], serving_pid,
        "the old slot keeps serving"
    );
    told(&env, &["PreflightFailed"]).await;
    finish_without_a_failed_poll(&env, poller, "preflight across a serve crash, then a failed one").await;
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_old_slot_killed_mid_preflight_an_interim_slot_of_its_version_serves_until_the_preflight_passed() {
    let (mut env, _front, poll) = start(1).await;
    let slot_a = slot_pid(&env.get("dev").await.unwrap(), "a").expect("slot a runs");
    let poller = Poller::start_every(poll, Duration::from_millis(20));
    // Slow to get ready, so that its preflight is still running when the old slot dies.
    preflight_of_a_slow_version(&env, 6000).await;
    signal(slot_a, libc::SIGKILL);
    let killed = chrono::Utc::now();
    let interim = env
        .until("dev", Duration::from_secs(20), "a slot of v0.31.2 serving again", |o| {
            let slots = o["status"]["slots"].as_array()?;
            let serves = slots.iter().find(|s| {
                s["serving"] == true && s["version"] == "v0.31.2" && s["pid"].as_i64() != Some(slot_a as i64)
            })?;
            Some((serves["name"].clone(), o["status"]["preflight"].clone()))
        })
        .await;
    let served_again = chrono::Utc::now();
    assert!(
        interim.1["result"].is_null() && interim.1["version"] == "v0.31.3",
        "the interim slot served while the preflight ran: {}",
        interim.1
    );
    env.log(&format!(
        "slot a SIGKILLed mid-preflight; interim slot {} of v0.31.2 serving {:.1}s later",
        interim.0,
        (served_again - killed).num_milliseconds() as f64 / 1000.0
    ));
    let done = rolled_to_v0_31_3(&env).await;
    let p = &done["status"]["preflight"];
    assert_eq!(p["result"], "Compatible", "{p}");
    assert!(
        p["completedAt"].as_str() < done["status"]["lastRoll"]["newSlotStartedAt"].as_str(),
        "no v0.31.3 slot before its preflight passed: {:#}",
        done["status"]
    );
    let events = env.events("dev").await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("InterimSlotStarting")
            && e.message.as_deref().is_some_and(|m| m.contains("kcp v0.31.2"))),
        "no InterimSlotStarting event:\n{}",
        e2e::summarize_events(&events)
    );
    // The shard did not serve between the kill and the interim slot; never after it.
    let stats = poller.finish().await;
    // A poll sent just before the SIGKILL may meet it.
    let early = killed - chrono::Duration::milliseconds(200);
    let late: Vec<_> = stats
        .failures
        .iter()
        .filter(|(t, _)| *t < early || *t > served_again)
        .collect();
    env.log(&format!(
        "{} polls, {} failed (none may before the kill or after the interim slot served)",
        stats.polls,
        stats.failures.len()
    ));
    assert!(
        late.is_empty(),
        "polls failed before the kill or after the interim slot served: {late:?}"
    );
    env.shutdown(&["dev"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interim_slot_that_crashes_at_start_is_not_started_again_and_the_roll_goes_on() {
    let mut env = Env::start().await;
    let front = format!("127.0.0.1:{}", test_port());
    // v0.31.2 exits at start once this file exists: the interim slot runs the same template.
    let marker = env.state.join("v0.31.2-fails-now");
    let mut first = spec(&front, 1);
    first["kcp"]["extraArgs"] = json!([format!("--stand-in-exit-if-exists={}", marker.display())]);
    env.apply_spec("dev", first).await;
    settled(&env, "dev", 1, Duration::from_secs(60)).await;
    let slot_a = slot_pid(&env.get("dev").await.unwrap(), "a").expect("slot a runs");
    preflight_of_a_slow_version(&env, 6000).await;
    std::fs::write(&marker, "").unwrap();
    signal(slot_a, libc::SIGKILL);
    let done = rolled_to_v0_31_3(&env).await;
    assert_eq!(
        done["status"]["preflight"]["result"], "Compatible",
        "{:#}",
        done["status"]
    );
    let events = env.events("dev").await;
    let count = |reason: &str| events.iter().filter(|e| e.reason.as_deref() == Some(reason)).count();
    assert_eq!(
        (count("InterimSlotStarting"), count("InterimSlotCrashed")),
        (1, 1),
        "one interim slot, started once, crashed once:\n{}",
        e2e::summarize_events(&events)
    );
    let crashed = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("InterimSlotCrashed"))
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    assert!(
        crashed.contains("told to fail") && crashed.contains("not started again"),
        "the event says what kcp printed and that no other starts: {crashed}"
    );
    env.log(&format!("interim slot crashed once; rolled to v0.31.3: {crashed}"));
    env.shutdown(&["dev"]).await;
}

/// Changes the version to v0.31.3, a stand-in that answers `/readyz` only `ready_after_ms` after
/// its start, and returns once its preflight runs: its startedAt.
async fn preflight_of_a_slow_version(env: &Env, ready_after_ms: u64) -> Value {
    env.patch(
        "dev",
        json!({ "spec": { "version": "v0.31.3", "kcp": { "extraArgs": [format!("--stand-in-ready-after-ms={ready_after_ms}")] } } }),
    )
    .await;
    env.until(
        "dev",
        Duration::from_secs(20),
        "a preflight of v0.31.3 started on its copy",
        |o| {
            let p = &o["status"]["preflight"];
            (p["version"] == "v0.31.3" && p["result"].is_null() && p["launchedAt"].is_string())
                .then(|| p["startedAt"].clone())
        },
    )
    .await
}

/// Waits for the roll to v0.31.3 to complete, one slot serving; the shard.
async fn rolled_to_v0_31_3(env: &Env) -> Value {
    env.until("dev", Duration::from_secs(60), "the roll to v0.31.3 complete", |o| {
        (o["status"]["lastRoll"]["completedAt"].is_string()
            && o["status"]["lastRoll"]["toVersion"] == "v0.31.3"
            && serving(o).len() == 1)
            .then(|| o.clone())
    })
    .await
}

/// SIGSTOPs the job's process whose argv holds `dir` and `program` once it runs; its pid.
async fn stop_a_job_mid_way(env: &Env, dir: &str, program: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = e2e::processes_with(dir);
        if let Some((pid, argv)) = found.into_iter().find(|(_, argv)| argv.contains(program)) {
            signal(pid, libc::SIGSTOP);
            env.log(&format!("{program} (pid {pid}) stopped mid-way: {argv}"));
            return pid;
        }
        assert!(Instant::now() < deadline, "no {program} started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Once Progressing says `reason` (the job runs), SIGKILLs a serving slot and fails the test
/// unless it is out of the front within 0.5 s.
async fn kill_a_serving_slot_and_see_it_leave_the_front(env: &Env, reason: &str, during: &str) {
    let o = env
        .until("dev", Duration::from_secs(10), &format!("Progressing {reason}"), |o| {
            condition(o, "Progressing")
                .filter(|c| c["reason"] == reason)
                .map(|_| o.clone())
        })
        .await;
    let victim = serving(&o)[0].clone();
    let address = format!(
        "127.0.0.1:{}",
        o["status"]["slots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == victim.as_str())
            .unwrap()["port"]
    );
    signal(slot_pid(&o, &victim).unwrap(), libc::SIGKILL);
    let killed = Instant::now();
    loop {
        let status = e2e::front_status(env, "dev").await;
        if !status.backends.iter().any(|b| b.address.to_string() == address) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_millis(500),
            "slot {victim} (SIGKILLed during {during}) is still in the front 0.5 s later"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.log(&format!(
        "slot {victim} SIGKILLed during {during}: out of the front after {:.3?}",
        killed.elapsed()
    ));
}

/// Waits for the roll to v0.31.3 to complete, two slots serving; the shard.
async fn rolled_to_v0_31_3_with_two_slots(env: &Env) -> Value {
    env.until(
        "dev",
        Duration::from_secs(60),
        "the roll to v0.31.3 complete with 2 slots",
        |o| {
            (o["status"]["lastRoll"]["toVersion"] == "v0.31.3"
                && o["status"]["lastRoll"]["completedAt"].is_string()
                && serving(o).len() == 2)
                .then(|| o.clone())
        },
    )
    .await
}

/// Stops `poller`, logs how it went under `what`, and fails the test on any failed poll.
async fn finish_without_a_failed_poll(env: &Env, poller: Poller, what: &str) {
    let stats = poller.finish().await;
    env.log(&format!(
        "{what}: {} polls, {} failed",
        stats.polls,
        stats.failures.len()
    ));
    assert!(
        stats.failures.is_empty(),
        "failed polls:\n{}",
        describe_failures(&stats)
    );
}
