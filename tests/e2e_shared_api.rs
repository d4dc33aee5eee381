//! End to end: `kcpshard serve --kubeconfig` against a shared API, a real kcp workspace, as a team
//! with several hosts would run it. One set-up, walked through in order:
//! - a real kcp shard, run the usual way (`kcpshard serve` with its local API); a workspace of it
//!   is the shared API: the CRD (`crds/`) and `manifests/rbac.yaml` are applied there with
//!   kubectl, and every serve below uses a token of the ServiceAccount that file binds, so the
//!   RBAC is proven to be enough;
//! - host `alpha` (a serve with its own state dir) runs KcpShard `alpha-1`, a second real kcp
//!   shard: Ready, a roll under a 20 ms `/readyz` poller through its front with 0 failures,
//!   status and events read with kubectl from the workspace (`kubectl get ks` shows the host);
//! - host `beta` (another serve, another state dir) runs `beta-1`, which it applies into the
//!   shared API from its `--manifests` directory, and only it, while `alpha` runs only `alpha-1`. A second real kcp would add nothing to that check, so `beta-1` runs the
//!   stand-in kcp (tests/support/stand_in_kcp.rs) with a real kine and front: what is checked is
//!   which serve starts, reports and finalizes what;
//! - a shard naming no host is nobody's on a shared API: no finalizer, no status, one log line
//!   in each serve;
//! - a second serve of host `alpha` on the same state dir waits: its `/readyz` and its log name
//!   the Lease and its holder; SIGKILL of the first makes it take over within the Lease's duration
//!   (6 s here), and it is the one that deletes `alpha-1` at the end; when its Lease is taken
//!   from it, it stops at its next renewal, exiting non-zero and saying why.
//!
//! Components come from bin/ (hack/install-deps.sh); a missing one fails, never skips. Run with
//! `flock /tmp/kcpshard-realkcp.lock cargo test --test e2e_shared_api -- --nocapture`.
mod e2e;
mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use chrono::Utc;
use e2e::*;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const LEASE_SECONDS: u64 = 6;

/// A `kcpshard serve --kubeconfig` of one host, with its own log; killed (and every process
/// naming its state dir swept) when it drops.
struct HostServe {
    host: String,
    state: PathBuf,
    log: PathBuf,
    probe: u16,
    child: Option<Child>,
}

impl HostServe {
    fn start(dir: &Path, label: &str, host: &str, state: &Path, kubeconfig: &Path, extra: &[&str]) -> HostServe {
        let log = dir.join(format!("serve-{label}.log"));
        let probe = test_port();
        let mut command = Command::new(kcpshard_bin());
        command
            .arg("serve")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--host-name", host])
            .arg("--state-dir")
            .arg(state)
            .arg("--kine-binary")
            .arg(bin_dir().join("kine"))
            .args(["--probe-listen", &format!("127.0.0.1:{probe}")])
            .args(["--lease-duration", &format!("{LEASE_SECONDS}s")])
            .args(extra)
            .current_dir(repo_root())
            .env("RUST_LOG", "info,kcpshard=debug")
            .env_remove("KCPSHARD_STATE_DIR")
            .env_remove("KCPSHARD_HOST_NAME");
        let child = support::spawn_tied(&mut command, &log);
        HostServe {
            host: host.to_string(),
            state: state.to_path_buf(),
            log,
            probe,
            child: Some(child),
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or_default()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/readyz` on the probe listener: status and body, or None while nothing answers.
    fn readyz(&self) -> Option<(u16, String)> {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", self.probe)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        tcp.write_all(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).ok()?;
        let status = answer.split_whitespace().nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n")?.1.to_string();
        Some((status, body))
    }

    fn fail(&self, message: &str) -> ! {
        panic!(
            "{message}\n--- last lines of host {}'s serve ({}) ---\n{}",
            self.host,
            self.log.display(),
            tail(&self.log, 40)
        )
    }

    /// Waits until `/readyz` answers as `check` wants; fails after `within`.
    fn until_readyz(&self, within: Duration, what: &str, check: impl Fn(u16, &str) -> bool) -> (u16, String) {
        let found = support::poll(within, Duration::from_millis(100), || {
            self.readyz().filter(|(status, body)| check(*status, body))
        });
        found.unwrap_or_else(|| {
            self.fail(&format!(
                "/readyz of host {} never said {what}: {:?}",
                self.host,
                self.readyz()
            ))
        })
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let _ = support::poll(Duration::from_secs(15), Duration::from_millis(50), || {
                child.try_wait().ok().flatten()
            });
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Drop for HostServe {
    fn drop(&mut self) {
        self.kill();
        sweep(&self.state.display().to_string(), Duration::from_secs(10));
    }
}

/// A kubeconfig for the workspace at `server` with `token`, trusting the CA of the shard's
/// kubeconfig through the front (`admin`).
fn workspace_kubeconfig(admin: &Path, server: &str, token: &str, out: &Path) {
    let text = std::fs::read_to_string(admin).unwrap();
    let kubeconfig: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let ca = kubeconfig["clusters"]
        .as_sequence()
        .and_then(|c| c.iter().find(|c| c["name"] == "root"))
        .and_then(|c| c["cluster"]["certificate-authority-data"].as_str())
        .expect("the shard's kubeconfig has the root cluster's CA")
        .to_string();
    let written = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "shared", "cluster": { "server": server, "certificate-authority-data": ca } }],
        "users": [{ "name": "user", "user": { "token": token } }],
        "contexts": [{ "name": "shared", "context": { "cluster": "shared", "user": "user" } }],
        "current-context": "shared",
    });
    std::fs::write(out, serde_yaml::to_string(&written).unwrap()).unwrap();
}

fn admin_token(admin: &Path) -> String {
    let kubeconfig: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    kubeconfig["users"]
        .as_sequence()
        .and_then(|u| u.iter().find(|u| u["name"] == "kcp-admin"))
        .and_then(|u| u["user"]["token"].as_str())
        .expect("the shard's kubeconfig has kcp-admin's token")
        .to_string()
}

fn kubectl_ok(kubeconfig: &Path, args: &[&str], stdin: &str) -> String {
    let (ok, out) = kubectl(kubeconfig, args, stdin);
    assert!(ok, "kubectl {} failed:\n{out}", args.join(" "));
    out
}

/// Polls KcpShard `name` in the shared API until `check` holds; fails after `timeout` with the
/// object and `serve`'s log.
async fn until(
    shards: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
    what: &str,
    serve: &HostServe,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(Some(object)) = shards.get_opt(name).await {
            let object = serde_json::to_value(object).unwrap();
            if check(&object) {
                return object;
            }
            last = object;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    serve.fail(&format!(
        "KcpShard {name}: no {what} within {timeout:?}; last seen:\n{}",
        serde_json::to_string_pretty(&last).unwrap()
    ))
}

fn shard(name: &str, host: Option<&str>, spec: Value) -> DynamicObject {
    let mut spec = spec;
    if let Some(host) = host {
        spec["host"] = json!(host);
    }
    serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn serves_of_several_hosts_share_a_kcp_workspace_each_running_its_own_shards() {
    let _serial = serial();
    let newer = kcp_newer();
    require_components(&[&newer]);
    let started = Instant::now();
    let mut timings = Report::default();

    // The shared API: a workspace of a kcp shard run the usual way.
    let mut env = Env::start().await;
    let api_front = format!("127.0.0.1:{}", test_port());
    env.apply("api", &newer, &api_front).await;
    env.wait_ready("api", READY_TIMEOUT).await;
    let admin = front_admin(&env, "api", &api_front).await;
    create_workspace_ready(&admin, "shared", Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    let workspace = format!("https://{api_front}/clusters/root:shared");
    let as_admin = env.dir().join("shared-admin.kubeconfig");
    workspace_kubeconfig(
        &front_kubeconfig(&env, "api"),
        &workspace,
        &admin_token(&front_kubeconfig(&env, "api")),
        &as_admin,
    );
    // kcp takes the CRD as it is: no error, and no warning either.
    let applied = kubectl_ok(
        &as_admin,
        &["apply", "-f", &repo_root().join("crds").display().to_string()],
        "",
    );
    assert!(
        !applied.to_lowercase().contains("warning"),
        "kubectl apply of the CRD warned: {applied}"
    );
    // Not `kubectl wait --for=condition=Established`: it fails at once ("<nil> is of the type
    // <nil>") while the CRD has no conditions yet, as kcp's controller has not looked at it.
    let established = support::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let (_, out) = kubectl(
            &as_admin,
            &[
                "get",
                "crd/kcpshards.kcpshard.io",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
            ],
            "",
        );
        (out.trim() == "True").then_some(())
    });
    assert!(
        established.is_some(),
        "kcp did not establish the KcpShard CRD within 60 s"
    );
    kubectl_ok(
        &as_admin,
        &[
            "apply",
            "-f",
            &repo_root().join("manifests/rbac.yaml").display().to_string(),
        ],
        "",
    );
    let token = kubectl_ok(
        &as_admin,
        &["-n", "kcpshard-system", "create", "token", "kcpshard", "--duration=2h"],
        "",
    );
    let as_kcpshard = env.dir().join("shared-kcpshard.kubeconfig");
    workspace_kubeconfig(&front_kubeconfig(&env, "api"), &workspace, token.trim(), &as_kcpshard);
    timings.add(format!(
        "{} the shared API (a kcp shard, a workspace, the CRD and RBAC) is ready",
        stamp(started)
    ));

    let alpha_front = format!("127.0.0.1:{}", test_port());
    let beta_front = format!("127.0.0.1:{}", test_port());
    let stand_in = env!("CARGO_BIN_EXE_stand-in-kcp");
    let spec = |front: &str| json!({ "version": newer, "store": { "type": "KineSqlite" }, "front": { "type": "Tcp", "listen": front } });
    let mut stand_in_spec = spec(&beta_front);
    stand_in_spec["kcp"] = json!({ "binary": stand_in });
    let mut nobody_spec = spec(&format!("127.0.0.1:{}", test_port()));
    nobody_spec["kcp"] = json!({ "binary": stand_in });
    // Host beta's shard comes from its GitOps directory, applied into the shared API.
    let beta_manifests = env.dir().join("beta-manifests");
    std::fs::create_dir(&beta_manifests).unwrap();
    let beta_yaml = serde_yaml::to_string(&shard("beta-1", Some("beta"), stand_in_spec)).unwrap();
    std::fs::write(beta_manifests.join("beta-1.yaml"), beta_yaml).unwrap();

    // Two hosts, each a serve with its own state dir, as the ServiceAccount of manifests/rbac.yaml.
    let state_alpha = env.dir().join("alpha");
    let state_beta = env.dir().join("beta");
    let mut alpha = HostServe::start(env.dir(), "alpha", "alpha", &state_alpha, &as_kcpshard, &[]);
    let manifests_flag = beta_manifests.display().to_string();
    let mut beta = HostServe::start(
        env.dir(),
        "beta",
        "beta",
        &state_beta,
        &as_kcpshard,
        &["--manifests", &manifests_flag],
    );
    alpha.until_readyz(Duration::from_secs(30), "ok", |status, _| status == 200);
    beta.until_readyz(Duration::from_secs(30), "ok", |status, _| status == 200);

    let client = api_client(&as_admin).await.expect("a client of the workspace");
    let shards: Api<DynamicObject> = Api::all_with(client, &kcpshard_resource());
    for object in [
        shard("alpha-1", Some("alpha"), spec(&alpha_front)),
        shard("nobody", None, nobody_spec),
    ] {
        shards
            .create(&PostParams::default(), &object)
            .await
            .expect("create a KcpShard");
    }
    until(&shards, "beta-1", READY_TIMEOUT, "Ready", &beta, ready_now).await;
    until(&shards, "alpha-1", READY_TIMEOUT, "Ready", &alpha, ready_now).await;
    timings.add(format!(
        "{} alpha-1 (real kcp) and beta-1 (stand-in) Ready",
        stamp(started)
    ));

    // Each host runs its own shard and nothing else.
    let dirs = |state: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(state.join("shards"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(dirs(&state_alpha), ["alpha-1"], "host alpha runs alpha-1 only");
    assert_eq!(dirs(&state_beta), ["beta-1"], "host beta runs beta-1 only");
    let beta_1 = serde_json::to_value(shards.get("beta-1").await.unwrap()).unwrap();
    assert_eq!(
        beta_1["metadata"]["annotations"]["kcpshard.io/created-by"], "kcpshard-gitops",
        "beta-1 was applied from host beta's --manifests"
    );
    let nobody = serde_json::to_value(shards.get("nobody").await.unwrap()).unwrap();
    assert!(
        nobody["metadata"]["finalizers"].is_null() && nobody["status"].is_null(),
        "a shard that names no host is nobody's on a shared API: {nobody}"
    );
    for serve in [&alpha, &beta] {
        let told = serve.log_text().matches("KcpShard nobody names no spec.host").count();
        assert_eq!(told, 1, "host {} says once that nobody names no host", serve.host);
    }
    let table = kubectl_ok(&as_admin, &["get", "ks"], "");
    println!("kubectl get ks against the workspace:\n{table}");
    // By the column's offset in the header: an empty cell (ROLE, for a kcp of one shard) leaves
    // no word to count.
    let host_of = |name: &str| -> String {
        let column = table.lines().next().unwrap().find("HOST").expect("a HOST column");
        let row = table.lines().find(|l| l.starts_with(name)).expect("a row");
        row.get(column..)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!((host_of("alpha-1"), host_of("beta-1")), ("alpha".into(), "beta".into()));

    // A roll of alpha-1 under a 20 ms poller through its front: 0 failed.
    let shard_admin = config_for(
        &state_alpha.join("shards/alpha-1/shared/admin.kubeconfig"),
        "shard-base",
        &format!("https://{alpha_front}"),
    )
    .await;
    let poller = Poller::start_every(shard_admin, Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let requested = Utc::now();
    let restarted = json!({ "metadata": { "annotations": { "kcpshard.io/restartedAt": requested.to_rfc3339() } } });
    shards
        .patch("alpha-1", &PatchParams::default(), &Patch::Merge(&restarted))
        .await
        .expect("request a restart");
    let rolled = until(&shards, "alpha-1", READY_TIMEOUT, "completed roll", &alpha, |o| {
        ready_now(o) && roll_phase(&o["status"]["lastRoll"], "completedAt", requested).is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let polls = poller.finish().await;
    let roll = roll_timings(&rolled["status"]["lastRoll"]).unwrap_or_else(|e| alpha.fail(&e));
    timings.add(format!(
        "{} alpha-1 rolled: {} polls every 20 ms, {} failed; the roll took {:.1}s",
        stamp(started),
        polls.polls,
        polls.failures.len(),
        (roll.last().unwrap().1 - roll[0].1).num_milliseconds() as f64 / 1e3
    ));
    assert!(
        polls.failures.is_empty(),
        "{} of {} polls through alpha-1's front failed during the roll:\n{}",
        polls.failures.len(),
        polls.polls,
        describe_failures(&polls)
    );

    // Status and events as kubectl shows them in the workspace, written by the host that runs
    // the shard.
    let ready = kubectl_ok(
        &as_admin,
        &[
            "get",
            "ks",
            "alpha-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "",
    );
    assert_eq!(ready.trim(), "True");
    for (name, host) in [("alpha-1", "alpha"), ("beta-1", "beta")] {
        let events = kubectl_ok(
            &as_admin,
            &["get", "events.events.k8s.io", "-n", "default", "-o", "json"],
            "",
        );
        let events: Value = serde_json::from_str(&events).unwrap();
        let items: Vec<Value> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == name)
            .cloned()
            .collect();
        assert!(!items.is_empty(), "no events about {name} in the workspace");
        assert!(
            items.iter().all(|e| e["reportingInstance"] == host),
            "every event about {name} comes from host {host}: {items:?}"
        );
        if name == "alpha-1" {
            assert!(
                items.iter().any(|e| e["reason"] == "RollComplete"),
                "the roll of alpha-1 is told as an event: {items:?}"
            );
        }
    }
    let described = kubectl_ok(&as_admin, &["describe", "ks", "alpha-1"], "");
    assert!(
        described.contains("RollComplete"),
        "kubectl describe shows the events:\n{described}"
    );

    // A second serve of host alpha on the same state dir waits for the host's Lease, and says so.
    let mut standby = HostServe::start(env.dir(), "alpha-standby", "alpha", &state_alpha, &as_kcpshard, &[]);
    let holder = format!("alpha_{}_", alpha.pid());
    let (_, waiting) = standby.until_readyz(
        Duration::from_secs(30),
        "that it waits for the Lease",
        |status, body| status == 503 && body.contains("waiting for the Lease kcpshard-system/kcpshard-host-alpha"),
    );
    assert!(
        waiting.contains(&holder),
        "/readyz names the holder {holder}: {waiting}"
    );
    assert!(
        standby
            .log_text()
            .contains("waiting for the Lease kcpshard-system/kcpshard-host-alpha"),
        "the standby's log says it waits"
    );
    assert_eq!(alpha.readyz().map(|(s, _)| s), Some(200), "the holder stays ready");

    // SIGKILL the holder: the standby takes over once the Lease expires.
    alpha.kill();
    let killed = Instant::now();
    standby.until_readyz(
        Duration::from_secs(LEASE_SECONDS + 5),
        "ok after the holder was killed",
        |status, _| status == 200,
    );
    let took = killed.elapsed();
    timings.add(format!(
        "{} the standby of host alpha took over {:.1}s after the holder's SIGKILL (Lease {LEASE_SECONDS}s)",
        stamp(started),
        took.as_secs_f64()
    ));
    assert!(standby.log_text().contains("holding the host's Lease"));

    // The standby acts: it deletes alpha-1 (its finalizer stops the shard's processes).
    shards.delete("alpha-1", &DeleteParams::default()).await.unwrap();
    shards.delete("beta-1", &DeleteParams::default()).await.unwrap();
    for (name, serve) in [("alpha-1", &standby), ("beta-1", &beta)] {
        let gone = support::poll(Duration::from_secs(90), Duration::from_millis(200), || {
            let probe = shards.get_opt(name);
            let found = tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(probe));
            matches!(found, Ok(None)).then_some(())
        });
        if gone.is_none() {
            serve.fail(&format!("{name} was not deleted within 90s"));
        }
    }
    let left = processes_with(&state_alpha.join("shards/alpha-1").display().to_string());
    assert!(left.is_empty(), "alpha-1's processes outlived its delete: {left:?}");
    timings.add(format!("{} both shards deleted by their hosts", stamp(started)));

    // A holder that finds another identity in its Lease (taken by force here) stops acting at
    // once: it exits non-zero, saying why, at its next renewal.
    let now = Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let taken = json!({ "spec": { "holderIdentity": "intruder", "renewTime": now } }).to_string();
    kubectl_ok(
        &as_admin,
        &[
            "-n",
            "kcpshard-system",
            "patch",
            "lease",
            "kcpshard-host-alpha",
            "--type",
            "merge",
            "-p",
            &taken,
        ],
        "",
    );
    let exited = support::poll(
        Duration::from_secs(LEASE_SECONDS + 5),
        Duration::from_millis(100),
        || standby.child.as_mut().and_then(|c| c.try_wait().ok().flatten()),
    );
    match exited {
        Some(status) => assert!(!status.success(), "a serve that lost its Lease exits non-zero"),
        None => standby.fail("the holder went on after its Lease was taken"),
    }
    assert!(
        standby
            .log_text()
            .contains("lost the Lease kcpshard-system/kcpshard-host-alpha"),
        "the holder says it lost the Lease"
    );
    timings.add(format!("{} a holder whose Lease was taken exited", stamp(started)));
    standby.stop();
    beta.stop();
    let _ = shards.delete("nobody", &DeleteParams::default()).await;
    let left = env.shutdown(&["api"]).await;
    assert!(left.is_empty(), "processes left after the shutdown: {left:?}");
    timings.print("e2e_shared_api");
}
