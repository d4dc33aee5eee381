//! End to end with Debian's caddy as the front (a roll with 0 failed `/readyz`
//! polls at 50 ms through caddy), the way docs/how-to/fronts.md tells a user to set it up:
//! 1. apply a KcpShard with `front.type: Caddy`. Caddy is not running yet: it serves the shard's
//!    certificate, which the first slot makes. The slot starts, and the shard says what to do
//!    (start caddy with the config from `kcpshard front caddy-config`), naming where the
//!    certificate is;
//! 2. render caddy's config with `kcpshard front caddy-config` from the shard's shared material and
//!    start caddy: the controller switches caddy's upstream to the slot and the shard is Ready;
//! 3. a version bump rolls with a `/readyz` poller through caddy every 50 ms: 0 failures.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::time::{Duration, Instant};

use e2e::*;
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_caddy_front_is_switched_through_its_admin_api_and_a_roll_fails_no_poll() {
    let _serial = serial();
    let (older, newer) = (kcp_older(), kcp_newer());
    require_components(&[&older, &newer]);
    let caddy = support::require("caddy");
    let mut env = Env::start().await;
    let shard = "caddy";
    let front = format!("127.0.0.1:{}", test_port());
    let admin = format!("127.0.0.1:{}", test_port());

    // 1. Apply: the slot starts although caddy does not run; the shard says what to do.
    let started = Instant::now();
    env.apply_spec(
        shard,
        json!({
            "version": older,
            "store": { "type": "KineSqlite" },
            "front": { "type": "Caddy", "listen": front, "caddy": { "adminAddress": admin, "upstreamId": "kcp-proxy" } },
        }),
    )
    .await;
    let shared = env.shard_dir(shard).join("shared");
    let waiting = env
        .until(
            shard,
            READY_TIMEOUT,
            "the shard to ask for caddy once a slot is ready",
            |o| {
                condition(o, "Degraded")
                    .and_then(|c| c["message"].as_str())
                    .filter(|m| m.contains("caddy's admin API") && m.contains(shared.to_str().unwrap()))
                    .map(str::to_string)
            },
        )
        .await;
    env.log(&format!("caddy not running yet: {waiting}"));
    assert!(waiting.contains("kcpshard front caddy-config"), "{waiting}");
    assert!(shared.join("apiserver.crt").is_file() && shared.join("apiserver.key").is_file());

    // 2. Start caddy with the rendered config: the controller switches it to the slot.
    let home = env.dir().join("caddy-home");
    std::fs::create_dir_all(&home).unwrap();
    let rendered = std::process::Command::new(kcpshard_bin())
        .args([
            "front",
            "caddy-config",
            "--listen",
            &front,
            "--admin",
            &admin,
            "--upstream-id",
            "kcp-proxy",
        ])
        .arg("--cert")
        .arg(shared.join("apiserver.crt"))
        .arg("--key")
        .arg(shared.join("apiserver.key"))
        .arg("--storage")
        .arg(home.join("storage"))
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let config = env.dir().join("caddy.json");
    std::fs::write(&config, &rendered.stdout).unwrap();
    let mut cmd = std::process::Command::new(caddy);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"));
    let _caddy = support::Proc::spawn("caddy", cmd, &env.dir().join("caddy.log"));
    let ready = env.wait_ready(shard, READY_TIMEOUT).await;
    env.log(&format!(
        "apply -> Ready through caddy in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let slot = active_slot(&ready).unwrap();
    let port = ready["status"]["slots"][0]["port"].as_u64().unwrap();
    assert_eq!(
        ready["status"]["front"]["backend"],
        format!("127.0.0.1:{port}"),
        "caddy's upstream is the slot"
    );
    let shard_admin = front_shard_admin(&env, shard, &front).await;
    readyz_ok(&shard_admin)
        .await
        .unwrap_or_else(|e| env.fail(&format!("/readyz through caddy: {e}")));
    env.until(shard, READY_TIMEOUT, "the first start to settle", |o| {
        (ready_now(o) && condition_is(o, "Progressing", "False")).then_some(())
    })
    .await;

    // 3. A roll through caddy: 0 failed polls at 50 ms.
    // kcpshard's admin identity is a bearer token, which caddy (it terminates TLS) passes on: a
    // copy of the kubeconfig through the front taken now works after the roll.
    let copy = copy_front_kubeconfig(&env, shard, "before-caddy-roll");
    let poller = Poller::start(shard_admin.clone());
    let bump_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    env.patch(shard, json!({ "spec": { "version": newer } })).await;
    let rolled = env
        .until(shard, ROLL_TIMEOUT, "the roll through caddy", |o| {
            let roll = &o["status"]["lastRoll"];
            (roll["toVersion"] == newer.as_str()
                && roll["completedAt"].is_string()
                && roll["startedAt"].as_str().is_some_and(|t| t > bump_at.as_str())
                && ready_now(o))
            .then(|| o.clone())
        })
        .await;
    let stats = poller.finish().await;
    env.log(&format!(
        "roll through caddy: {} polls, {} failed",
        stats.polls,
        stats.failures.len()
    ));
    assert!(stats.polls > 20, "the poller ran only {} polls", stats.polls);
    assert!(
        stats.failures.is_empty(),
        "failed polls through caddy:\n{}",
        describe_failures(&stats)
    );
    assert_ne!(active_slot(&rolled).unwrap(), slot);
    let took = create_workspace_ready(
        &front_admin_of(&copy, &front).await,
        "through-caddy",
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| env.fail(&format!("the kubeconfig copied before the roll, through caddy: {e}")));
    env.log(&format!(
        "the kubeconfig copied before the roll: a workspace through caddy Ready in {:.2}s",
        took.as_secs_f64()
    ));
    // Each change of caddy's upstreams is checked by later looks, as a client would: the last one
    // passed (no FrontCheckFailed) and nothing is left to check.
    let state = env.shard_dir(shard).join("controller.json");
    let checked = support::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let text = std::fs::read_to_string(&state).ok()?;
        (!text.contains("\"frontCheck\"")).then_some(())
    });
    let finished =
        format!("kcpshard_controller_step_duration_seconds_count{{shard=\"{shard}\",step=\"FinishFrontCheck\"}}");
    assert!(
        serve_metrics(&env).await.contains(&finished),
        "no change of caddy's upstreams was checked"
    );
    let events = env.events(shard).await;
    assert!(
        checked.is_some(),
        "a check of caddy's change is still due 10 s after the roll: {}",
        std::fs::read_to_string(&state).unwrap_or_default()
    );
    assert!(
        !events.iter().any(|e| e.reason.as_deref() == Some("FrontCheckFailed")),
        "{}",
        summarize_events(&events)
    );
    env.shutdown(&[shard]).await;
}
