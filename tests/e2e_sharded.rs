//! A sharded kcp end to end on real kcp and kine, as a user sees it through kcp-front-proxy: a root
//! shard and a second shard (two KcpShards of one `kcpshard serve`, two fronts, two KineSqlite
//! stores), kcp-front-proxy beside them run from the files the root shard's state holds
//! (docs/how-to/sharded-kcp.md, "A sharded kcp with kcpshard"). Walked in order on one set-up:
//! 1. a shard whose rootShard does not exist, then names a shard that is not a root, and the
//!    second shard while its root is not Ready yet: Blocked with RootShardNotReady saying which,
//!    no slot started; the orphan is deleted;
//! 2. both Ready; `kubectl get ks` shows each one's role (root, shard-2);
//! 3. kcp-front-proxy in front of both: a workspace scheduled onto the second shard (a label on
//!    its Shard object, `spec.location.selector` on the Workspace) and one onto the root, both
//!    Ready through the front-proxy as the root's admin identity; the second one is served by the
//!    second shard's own front, the first is not;
//! 4. the root rolled, then the second shard, each under a 20 ms poller through the front-proxy on
//!    each of the two workspaces, polling as client-go does (an answer with `Retry-After` is asked
//!    again after it, see docs/how-to/sharded-kcp.md, "A roll seen through kcp-front-proxy"): 0 failed;
//!    the second shard's roll proven by the controllers Lease its new slot holds (event
//!    ProbeSucceeded).
//!
//! Components come from bin/ (hack/install-deps.sh, kcp-front-proxy included); a missing one fails,
//! never skips. Figures: `cargo test --test e2e_sharded -- --nocapture`.
mod e2e;
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(240);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);
const POLL_EVERY: Duration = Duration::from_millis(20);
const SHARD_LABEL: &str = "kcpshard.io/e2e-shard";

/// kcp-front-proxy, run as docs/how-to/sharded-kcp.md says, from the root shard's `sharded/` files.
struct FrontProxy {
    child: Child,
}

impl FrontProxy {
    fn start(env: &Env, root: &str, listen_port: u16) -> FrontProxy {
        let bin = std::path::absolute("bin/kcp-front-proxy").unwrap();
        assert!(bin.is_file(), "no {}: run hack/install-deps.sh", bin.display());
        let shard = env.shard_dir(root);
        let trust = shard.join("sharded");
        let dir = env.dir().join("front-proxy");
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(env.dir().join("front-proxy.log")).unwrap();
        let arg = |flag: &str, path: std::path::PathBuf| format!("--{flag}={}", path.display());
        let child = Command::new(bin)
            .args([
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={listen_port}"),
                arg("root-directory", dir),
                arg("mapping-file", trust.join("mapping.yaml")),
                arg("root-kubeconfig", trust.join("front-proxy.kubeconfig")),
                arg("shards-kubeconfig", trust.join("front-proxy.kubeconfig")),
                arg("tls-cert-file", shard.join("shared/apiserver.crt")),
                arg("tls-private-key-file", shard.join("shared/apiserver.key")),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start kcp-front-proxy");
        FrontProxy { child }
    }
}

impl Drop for FrontProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shard_spec(listen: &str, shard: Value) -> Value {
    json!({
        "version": kcp_newer(),
        "store": { "type": "KineSqlite" },
        "front": { "type": "Tcp", "listen": listen },
        "shard": shard,
    })
}

fn blocked_by_root(o: &Value) -> Option<String> {
    let c = condition(o, "Degraded").or_else(|| condition(o, "Progressing"))?;
    let message = c["message"].as_str().unwrap_or_default();
    (c["reason"] == "RootShardNotReady").then(|| message.to_string())
}

async fn until_ok(config: &kube::Config, path: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match get_ok(config, path).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(format!("GET {path}: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Creates workspace `name` in root, scheduled by `spec.location.selector` onto the Shard labelled
/// `shard`, and waits for it to be Ready.
async fn workspace_on(config: &kube::Config, name: &str, shard: &str) -> Result<Duration, String> {
    let body = json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name },
        "spec": { "location": { "selector": { "matchLabels": { SHARD_LABEL: shard } } } },
    });
    let started = Instant::now();
    match once(config, http::Method::POST, WORKSPACES, Some(&body)).await {
        Ok((200 | 201, _)) => {}
        other => return Err(format!("create workspace {name}: {other:?}")),
    }
    let mut last = String::new();
    while started.elapsed() < READY_TIMEOUT {
        if let Ok((200, body)) = once(config, http::Method::GET, &format!("{WORKSPACES}/{name}"), None).await {
            let ws: Value = serde_json::from_str(&body).unwrap_or_default();
            if ws["status"]["phase"] == "Ready" {
                return Ok(started.elapsed());
            }
            last = ws["status"].to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("workspace {name} not Ready: {last}"))
}

/// Rolls `name` (a restart request) under the pollers and waits for the roll to complete: a new
/// kcp process serves, and status.lastRoll is a newer roll than before.
async fn roll(env: &Env, name: &str, pollers: Vec<Poller>, report: &mut Report) {
    let settled = settled(env, name, 1, ROLL_TIMEOUT).await;
    let before = settled["status"]["lastRoll"]["completedAt"].clone();
    let old_pids = slot_pids(&settled);
    let started = Instant::now();
    env.request_restart(name).await;
    env.until(name, ROLL_TIMEOUT, "the restart's roll complete", |o| {
        let done = o["status"]["lastRoll"]["completedAt"] != before && ready_now(o);
        let new_slot = !slot_pids(o).is_empty() && slot_pids(o).iter().all(|p| !old_pids.contains(p));
        (done && new_slot).then_some(())
    })
    .await;
    let took = started.elapsed();
    for (i, poller) in pollers.into_iter().enumerate() {
        let stats = poller.finish().await;
        report.add(format!(
            "roll of {name} ({took:.1?}): poller {i} through the front-proxy: {} polls, {} failed, {} asked again after Retry-After",
            stats.polls,
            stats.failures.len(),
            stats.retried_after
        ));
        if !stats.failures.is_empty() {
            env.fail(&format!(
                "the roll of {name}: {} of {} polls through the front-proxy failed:\n{}",
                stats.failures.len(),
                stats.polls,
                describe_failures(&stats)
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_root_and_a_second_shard_behind_kcp_front_proxy_serve_and_roll_without_a_failed_request() {
    let _serial = serial();
    require_components(&[&kcp_newer()]);
    let mut env = Env::start().await;
    let mut report = Report::default();
    let (root_front, second_front, proxy_port) = (test_port(), test_port(), test_port());
    let (root_listen, second_listen) = (format!("127.0.0.1:{root_front}"), format!("127.0.0.1:{second_front}"));
    let proxy_url = format!("https://127.0.0.1:{proxy_port}");

    // 1. A missing root, and a root that is not Ready yet.
    env.apply_spec(
        "orphan",
        shard_spec(
            &format!("127.0.0.1:{}", test_port()),
            json!({ "name": "shard-9", "rootShard": "nowhere" }),
        ),
    )
    .await;
    let message = env
        .until("orphan", Duration::from_secs(30), "RootShardNotReady", blocked_by_root)
        .await;
    assert!(
        message.contains("nowhere") && message.contains("does not exist"),
        "{message}"
    );
    env.apply_spec(
        "root",
        shard_spec(&root_listen, json!({ "name": "root", "externalURL": proxy_url })),
    )
    .await;
    env.apply_spec(
        "second",
        shard_spec(&second_listen, json!({ "name": "shard-2", "rootShard": "root" })),
    )
    .await;
    let message = env
        .until("second", Duration::from_secs(30), "RootShardNotReady", blocked_by_root)
        .await;
    assert!(message.contains("not Ready"), "{message}");
    assert!(
        env.status("second").await["slots"]
            .as_array()
            .is_none_or(|s| s.is_empty())
    );
    // A root that is not a root.
    env.patch("orphan", json!({ "spec": { "shard": { "rootShard": "second" } } }))
        .await;
    let not_a_root = env
        .until(
            "orphan",
            Duration::from_secs(30),
            "RootShardNotReady: not a root",
            |o| blocked_by_root(o).filter(|m| m.contains("is not a root shard")),
        )
        .await;
    assert!(
        env.status("orphan").await["slots"]
            .as_array()
            .is_none_or(|s| s.is_empty())
    );
    assert!(env.delete_and_wait("orphan", Duration::from_secs(30)).await);
    report.add(format!("RootShardNotReady: {message}"));
    report.add(format!("RootShardNotReady: {not_a_root}"));

    // 2. Both Ready, each with its role.
    let t = Instant::now();
    env.wait_ready("root", READY_TIMEOUT).await;
    report.add(format!("root Ready after {:.1?}", t.elapsed()));
    env.wait_ready("second", READY_TIMEOUT).await;
    report.add(format!("second Ready after {:.1?}", t.elapsed()));
    let (ok, table) = kubectl(&env.state.join("kubeconfig"), &["get", "ks"], "");
    assert!(ok, "{table}");
    let role_of = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_string)
    };
    assert_eq!(role_of("root").as_deref(), Some("root"), "{table}");
    assert_eq!(role_of("second").as_deref(), Some("shard-2"), "{table}");

    // 3. kcp-front-proxy in front of both; a workspace on each shard.
    let _proxy = FrontProxy::start(&env, "root", proxy_port);
    let through_proxy = config_for(&front_kubeconfig(&env, "root"), "base", &proxy_url).await;
    until_ok(
        &through_proxy,
        "/clusters/root/apis/core.kcp.io/v1alpha1/shards/shard-2",
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| {
        env.fail(&format!(
            "kcp-front-proxy: {e}\n{}",
            tail(&env.dir().join("front-proxy.log"), 30)
        ))
    });
    for (shard, label) in [("root", "root"), ("shard-2", "second")] {
        let body = json!({ "metadata": { "labels": { SHARD_LABEL: label } } });
        let path = format!("/clusters/root/apis/core.kcp.io/v1alpha1/shards/{shard}");
        let patched = patch_merge(&through_proxy, &path, &body).await;
        assert!(patched.is_ok(), "label Shard {shard}: {patched:?}");
    }
    for (ws, label) in [("on-root", "root"), ("on-second", "second")] {
        let took = workspace_on(&through_proxy, ws, label)
            .await
            .unwrap_or_else(|e| env.fail(&format!("{e}\n{}", tail(&env.dir().join("front-proxy.log"), 20))));
        report.add(format!("workspace {ws} Ready through the front-proxy in {took:.1?}"));
    }
    let ns = |ws: &str| format!("/clusters/root:{ws}/api/v1/namespaces/default");
    // A shard knows a workspace by its logical cluster (only the front-proxy resolves paths).
    let cluster = match once(
        &through_proxy,
        http::Method::GET,
        &format!("{WORKSPACES}/on-second"),
        None,
    )
    .await
    {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap()["spec"]["cluster"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        other => env.fail(&format!("GET workspace on-second: {other:?}")),
    };
    let in_cluster = format!("/clusters/{cluster}/api/v1/namespaces/default");
    let direct = |listen: &str| {
        let server = format!("https://{listen}");
        let kubeconfig = front_kubeconfig(&env, "root");
        async move { config_for(&kubeconfig, "base", &server).await }
    };
    until_ok(&direct(&second_listen).await, &in_cluster, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| env.fail(&format!("the second shard's own front does not serve on-second: {e}")));
    assert!(
        get_ok(&direct(&root_listen).await, &in_cluster).await.is_err(),
        "the root serves on-second itself"
    );
    report.add(format!(
        "on-second is logical cluster {cluster}, served by the second shard's front, not the root's"
    ));
    for ws in ["on-root", "on-second"] {
        until_ok(&through_proxy, &ns(ws), Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| env.fail(&format!("through the front-proxy: {e}")));
    }

    // 4. Each shard rolled in turn under pollers on both workspaces through the front-proxy.
    for shard in ["root", "second"] {
        let pollers = ["on-root", "on-second"]
            .iter()
            .map(|ws| Poller::get_like_client_go(through_proxy.clone(), &ns(ws), POLL_EVERY))
            .collect();
        roll(&env, shard, pollers, &mut report).await;
    }
    // The second shard's roll was proven by the controllers Lease its new slot holds.
    let probes: Vec<String> = env
        .events("second")
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ProbeSucceeded"))
        .filter_map(|e| e.message.clone())
        .collect();
    assert!(
        probes.iter().any(|m| m.contains("controllers Lease")),
        "no ProbeSucceeded by the Lease for the second shard: {probes:?}"
    );
    report.print("a sharded kcp behind kcp-front-proxy");
    drop(_proxy);
    let left = env.shutdown(&["second", "root"]).await;
    assert!(left.is_empty(), "left running after the deletes: {left:?}");
}

async fn patch_merge(config: &kube::Config, path: &str, body: &Value) -> Result<(), String> {
    let client = kube::Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    let request = http::Request::patch(path)
        .header("Content-Type", "application/merge-patch+json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    client
        .request_text(request)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
