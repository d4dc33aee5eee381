//! End to end: kcpshard itself upgraded under a serving shard.
//! - `ten_serve_restarts_...`: `kcpshard serve` restarted 10 times, each time from another copy of
//!   the kcpshard binary, so that each start upgrades the front it finds to its own binary by
//!   handing the listening socket over (docs/front.md, Upgrades). `/readyz` pollers through the
//!   front, one on a new connection every 50 ms and one on a kept-alive connection, see 0 failures
//!   across all of it and a restart roll after it. Restarts alternate SIGTERM and SIGKILL of
//!   `serve`.
//! - `a_shard_served_by_the_previous_kcpshard_...`: the previous kcpshard (the commit
//!   hack/versions.env names KCPSHARD_PREVIOUS, built by hack/install-deps.sh) serves a shard of two
//!   slots on a managed PostgreSQL under load; it is replaced by this build as
//!   docs/how-to/install.md "Upgrade kcpshard itself" says (stop serve, start the new binary on the
//!   same state dir). No request fails, no slot, kine or PostgreSQL restarts, only the front is
//!   handed over; then this build rolls the shard the previous one made, from its records.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const UPGRADES: usize = 10;

/// The front's pid and the binary it runs, from `front.pid.json` and `/proc/<pid>/exe`.
fn front_process(shard_dir: &Path) -> Option<(u32, PathBuf)> {
    let record: Value = serde_json::from_slice(&std::fs::read(shard_dir.join("front/front.pid.json")).ok()?).ok()?;
    let pid = record["pid"].as_u64()? as u32;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    Some((pid, exe))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn ten_serve_restarts_each_upgrading_the_front_fail_no_poll() {
    let _serial = serial();
    let newer = kcp_newer();
    require_components(&[&newer]);
    let mut env = Env::start().await;
    // Two copies of this build: to the front, each is another binary.
    let copies: Vec<PathBuf> = ["kcpshard-one", "kcpshard-two"]
        .iter()
        .map(|name| {
            let path = env.dir().join(name);
            std::fs::copy(kcpshard_bin(), &path).unwrap();
            path
        })
        .collect();
    env.stop_serve();
    env.serve_binary = copies[0].clone();
    env.start_serve().await;

    let shard = "upgrade";
    let front = format!("127.0.0.1:{}", test_port());
    env.apply(shard, &newer, &front).await;
    env.wait_ready(shard, READY_TIMEOUT).await;
    let settled = env
        .until(shard, READY_TIMEOUT, "the first start to settle", |o| {
            (ready_now(o) && condition_is(o, "Progressing", "False")).then(|| o.clone())
        })
        .await;
    let slot_pid = active_pid(&settled);
    let shard_dir = env.shard_dir(shard);
    let (mut front_pid, exe) = front_process(&shard_dir).expect("a front runs");
    assert_eq!(exe, copies[0], "the front runs serve's binary");

    let config = front_shard_admin(&env, shard, &front).await;
    let poller = Poller::start(config.clone());
    // A kept-alive client: each old front closes its connection at the next request after its
    // handover, so that it follows to the new front and the roll below finds it there.
    let kept_alive = Poller::kept_alive(config, Duration::from_millis(50));
    let mut took = Vec::new();
    for i in 1..=UPGRADES {
        if i % 2 == 0 {
            env.kill_serve();
        } else {
            env.stop_serve();
        }
        let binary = copies[i % 2].clone();
        env.serve_binary = binary.clone();
        let restarted = Instant::now();
        env.start_serve().await;
        let upgraded = support::poll(Duration::from_secs(60), Duration::from_millis(50), || {
            front_process(&shard_dir).filter(|(pid, exe)| *pid != front_pid && *exe == binary)
        });
        let Some((pid, _)) = upgraded else {
            env.fail(&format!(
                "upgrade {i}: the front was not upgraded to {}",
                binary.display()
            ));
        };
        took.push(restarted.elapsed());
        env.log(&format!(
            "upgrade {i}: serve restarted ({}) and the front upgraded (pid {front_pid} -> {pid}) in {:.2}s",
            if i % 2 == 0 { "SIGKILL" } else { "SIGTERM" },
            restarted.elapsed().as_secs_f64()
        ));
        front_pid = pid;
        // Let the poller cross each upgrade's drain of the old front, not just its handover.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The last front serves a while on its own, then rolls the shard: no kept-alive connection
    // may still be on an old, draining front, which no change of the serving set reaches.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    env.request_restart(shard).await;
    env.until(shard, READY_TIMEOUT, "the restart roll after the upgrades", |o| {
        completed_roll_to(o, &newer, &asked).then_some(())
    })
    .await;
    let kept = kept_alive.finish().await;
    env.log(&format!(
        "/readyz on a kept-alive connection through the upgrades and a roll: {} polls, {} failed, {} asked again on a new connection",
        kept.polls,
        kept.failures.len(),
        kept.retried
    ));
    assert!(
        kept.failures.is_empty(),
        "kept-alive polls failed:\n{}",
        describe_failures(&kept)
    );
    let stats = poller.finish().await;
    env.log(&format!(
        "{UPGRADES} serve restarts and front upgrades: {} polls, {} failed; restart-to-upgraded {:.2}-{:.2}s",
        stats.polls,
        stats.failures.len(),
        took.iter().min().unwrap().as_secs_f64(),
        took.iter().max().unwrap().as_secs_f64()
    ));
    assert!(stats.polls > 100, "the poller ran only {} polls", stats.polls);
    assert!(
        stats.failures.is_empty(),
        "failed polls:\n{}",
        describe_failures(&stats)
    );

    let after = env.get(shard).await.unwrap();
    assert!(ready_now(&after));
    assert_ne!(active_pid(&after), slot_pid, "the restart rolled the slot");
    let upgrades = env
        .events(shard)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FrontUpgrading"))
        .count();
    assert_eq!(upgrades, UPGRADES, "one FrontUpgrading event per upgrade");
    env.shutdown(&[shard]).await;
}

/// The pids of the processes that must outlive an upgrade of kcpshard: each slot's kcp, each slot's
/// kine, and the managed PostgreSQL's postmaster.
fn shard_processes(env: &Env, shard: &str, object: &Value, pg_port: u16) -> Vec<(String, i32)> {
    let mut processes: Vec<(String, i32)> = slot_pids(object)
        .into_iter()
        .map(|pid| ("kcp".to_string(), pid))
        .collect();
    let kines = processes_with(&format!("@127.0.0.1:{pg_port}/"))
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(&format!("application_name=kcpshard-{shard}-")));
    processes.extend(kines.map(|(pid, _)| ("kine".to_string(), pid)));
    processes.extend(managed_postmaster(env, shard).map(|pid| ("postgres".to_string(), pid)));
    processes.sort();
    processes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_shard_served_by_the_previous_kcpshard_is_taken_over_by_this_one_with_nothing_restarted() {
    let _serial = serial();
    let newer = kcp_newer();
    require_components(&[&newer]);
    let previous_build = support::require("kcpshard-previous");
    support::require("initdb");
    let mut env = Env::start().await;
    // Copies, so that each is a binary of its own to the front, as two installed releases are.
    let previous = env.dir().join("kcpshard-previous");
    let current = env.dir().join("kcpshard-current");
    std::fs::copy(&previous_build, &previous).unwrap();
    std::fs::copy(kcpshard_bin(), &current).unwrap();
    env.stop_serve();
    env.serve_binary = previous.clone();
    env.start_serve().await;

    let shard = "selfupgrade";
    let front = format!("127.0.0.1:{}", test_port());
    let pg_port = test_port();
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, "selfupgrade-password").unwrap();
    let _kines = SweepKines(pg_port);
    env.apply_spec(
        shard,
        json!({
            "version": newer,
            "slots": 2,
            "store": managed_postgres_store(pg_port, &password_file),
            "front": { "type": "Tcp", "listen": front },
        }),
    )
    .await;
    let before = settled(&env, shard, 2, READY_TIMEOUT).await;
    let processes = shard_processes(&env, shard, &before, pg_port);
    let count = |what: &str| processes.iter().filter(|(name, _)| name == what).count();
    assert_eq!(
        (count("kcp"), count("kine"), count("postgres")),
        (2, 2, 1),
        "two slots, each with its own kine, on one PostgreSQL: {processes:?}"
    );
    let shard_dir = env.shard_dir(shard);
    let (front_pid, exe) = front_process(&shard_dir).expect("a front runs");
    assert_eq!(exe, previous, "the previous kcpshard runs the front");

    let config = front_shard_admin(&env, shard, &front).await;
    let new_connections = Poller::start(config.clone());
    // Pinned to the previous release's front, which keeps it while it drains after the handover:
    // that release does not move kept-alive connections to its successor, so this poller stops
    // before the roll (this release's front does: see the test above).
    let kept_alive_before = Poller::kept_alive(config.clone(), Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The procedure: stop serve (SIGTERM, as systemctl stop), put the new binary in place, start it.
    env.stop_serve();
    env.serve_binary = current.clone();
    let restarted = Instant::now();
    env.start_serve().await;
    let upgraded = support::poll(Duration::from_secs(60), Duration::from_millis(50), || {
        front_process(&shard_dir).filter(|(pid, exe)| *pid != front_pid && *exe == current)
    });
    if upgraded.is_none() {
        env.fail("this kcpshard did not take the front over from the previous one within 60 s");
    }
    env.log(&format!(
        "the previous kcpshard replaced by this one: the front handed over {:.2}s after serve's restart",
        restarted.elapsed().as_secs_f64()
    ));
    // This serve has looked at the shard: what it found is what the previous one left running.
    let after = settled(&env, shard, 2, READY_TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        shard_processes(&env, shard, &after, pg_port),
        processes,
        "no slot, kine or PostgreSQL restarted across the upgrade"
    );

    let kept_alive = Poller::kept_alive(config, Duration::from_millis(50));
    let across_the_upgrade = kept_alive_before.finish().await;

    // From the previous release's records, this one rolls the shard.
    let asked = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    env.request_restart(shard).await;
    env.until(
        shard,
        READY_TIMEOUT,
        "the restart roll by this kcpshard to complete",
        |o| completed_roll_to(o, &newer, &asked).then_some(()),
    )
    .await;
    let rolled = settled(&env, shard, 2, READY_TIMEOUT).await;
    let new_slots = slot_pids(&rolled);
    assert!(
        new_slots.iter().all(|pid| !slot_pids(&before).contains(pid)),
        "the roll replaced both slots: {:?} -> {new_slots:?}",
        slot_pids(&before)
    );

    let stats = [
        ("/readyz on new connections", new_connections.finish().await),
        (
            "/readyz on a kept-alive connection across the upgrade",
            across_the_upgrade,
        ),
        (
            "/readyz on a kept-alive connection across the roll",
            kept_alive.finish().await,
        ),
    ];
    for (what, stats) in stats {
        env.log(&format!(
            "{what}: {} polls, {} failed",
            stats.polls,
            stats.failures.len()
        ));
        assert!(stats.polls > 20, "{what}: the poller ran only {} polls", stats.polls);
        assert!(
            stats.failures.is_empty(),
            "{what}: failed polls:\n{}",
            describe_failures(&stats)
        );
    }
    env.shutdown(&[shard]).await;
}
