//! End to end (the front handover): `kcpshard serve` restarted 10 times, each time from
//! another copy of the kcpshard binary, so that each start upgrades the front it finds to its own
//! binary by handing the listening socket over (docs/front.md, Upgrades). A `/readyz` poller
//! through the front, on a new connection every 50 ms, sees 0 failures across all of it; the
//! shard does not roll. Restarts alternate SIGTERM and SIGKILL of `serve`.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::Value;

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

    let poller = Poller::start(front_shard_admin(&env, shard, &front).await);
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
    // The last front serves a while on its own before the poller stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
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
    assert_eq!(active_pid(&after), slot_pid, "the shard did not roll");
    let upgrades = env
        .events(shard)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FrontUpgrading"))
        .count();
    assert_eq!(upgrades, UPGRADES, "one FrontUpgrading event per upgrade");
    env.shutdown(&[shard]).await;
}
