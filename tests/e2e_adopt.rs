//! End to end on real kcp: a kcp a user runs from its own root directory taken over by a KcpShard
//! with spec.adopt (docs/how-to/adopt.md, "Adopt a running kcp"), in the two shapes users run it:
//! - with its embedded etcd behind caddy, adopted onto a managed PostgreSQL (caddy's upstream
//!   moved to the front) and then rolled to a newer release;
//! - on a kine over sqlite of its own, clients dialling kcp's address, adopted by `kcpshard adopt`
//!   (which writes the KcpShard and follows it) onto KineSqlite with
//!   the front taking that address over at the switch.
//!
//! Before: a workspace with a nested one and an APIBinding to an APIExport in root, a ConfigMap
//! and a Secret, a ServiceAccount with a legacy token Secret and a bound token. During, every 20 ms
//! with the old shard-admin token where clients dial: through caddy a `/readyz` poller (and a
//! ServiceAccount reading ConfigMaps), none failing but for a connect that caddy's own config
//! reload resets; at kcp's address a client reading ConfigMaps on a kept-alive connection.
//! Afterwards: every object is there with the same content, every
//! context of the old admin.kubeconfig and both ServiceAccount tokens work, a wrong token is 401,
//! the old kcp is gone and its root directory as it was; events tell the adoption.
//!
//! A missing component fails, never skips.
mod e2e;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::json;
use support::embedded_kcp::EmbeddedKcp;

const ADOPT_TIMEOUT: Duration = Duration::from_secs(300);
const ROLL_TIMEOUT: Duration = Duration::from_secs(420);

/// The files of a kcp root directory but for its embedded etcd's data, which kcp writes while it
/// runs.
fn material_of(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    support::files_under(root, &["etcd-server"])
}

/// The reasons of the events about KcpShard `shard`, oldest first.
/// Failures apart: connections reset while connecting to caddy (its listener re-bound at a config
/// reload), and the rest.
fn apart_caddy_reload_resets(stats: &PollStats) -> (usize, Vec<&(chrono::DateTime<chrono::Utc>, String)>) {
    let (resets, rest): (Vec<_>, Vec<_>) = stats
        .failures
        .iter()
        .partition(|(_, e)| e.contains("(Connect)") && e.contains("Connection reset by peer"));
    (resets.len(), rest)
}

async fn event_reasons(env: &Env, shard: &str) -> Vec<String> {
    env.events(shard)
        .await
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect()
}

/// A ServiceAccount `robot` in root's default namespace with a legacy token Secret and a bound
/// token: the two tokens, legacy first.
fn service_account_tokens(kcp: &EmbeddedKcp) -> (String, String) {
    let manifest = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: robot\n  namespace: default\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: robot-token\n  namespace: default\n  annotations:\n    kubernetes.io/service-account.name: robot\ntype: kubernetes.io/service-account-token\n";
    let (ok, out) = kubectl(&kcp.root.join("admin.kubeconfig"), &["apply", "-f", "-"], manifest);
    assert!(ok, "create the ServiceAccount: {out}");
    let legacy = support::poll(Duration::from_secs(60), Duration::from_millis(500), || {
        kcp.kubectl(&[
            "get",
            "secret",
            "robot-token",
            "--namespace=default",
            "--output=jsonpath={.data.token}",
        ])
        .filter(|t| !t.is_empty())
    })
    .unwrap_or_else(|| kcp.proc.fail("the legacy token Secret got no token within 60s"));
    let legacy =
        String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, legacy.trim()).unwrap())
            .unwrap();
    let bound = kcp
        .kubectl(&["create", "token", "robot", "--namespace=default", "--duration=2h"])
        .unwrap_or_else(|| kcp.proc.fail("kubectl create token failed"));
    (legacy, bound.trim().to_string())
}

/// What a token gets of `/clusters/root/api/v1/namespaces/default/configmaps` through `server`:
/// 200 and 403 both say the token authenticated; 401 says it did not.
async fn token_status(ca_kubeconfig: &Path, server: &str, token: &str) -> u16 {
    let mut config = config_for(ca_kubeconfig, "shard-base", server).await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    let (status, _) = once(
        &config,
        http::Method::GET,
        "/clusters/root/api/v1/namespaces/default/configmaps",
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("GET through {server}: {e}"));
    status
}

/// Every object `kept` (read from the old kcp at `old_url`) reads the same through `via`: a
/// workspace's URL is the shard's base URL, now the front's, `front_url` (its spec changes with
/// it, and its phase reads Unavailable until kcp's controllers have taken the change up).
async fn assert_kept_through(
    env: &Env,
    old_kubeconfig: &Path,
    (old_url, front_url): (&str, &str),
    via: &str,
    kept: &Kept,
) {
    let admin = config_for(old_kubeconfig, "base", via).await;
    let without_generation = |mut object: serde_json::Value| {
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("generation");
        }
        object
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    for (path, before) in kept {
        let before = without_generation(serde_json::from_str(&before.to_string().replace(old_url, front_url)).unwrap());
        loop {
            let now = without_generation(read(&admin, path).await);
            if now == before {
                break;
            }
            if Instant::now() > deadline {
                env.fail(&format!("{path} changed:\nbefore {before:#}\nafter  {now:#}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    export_served(&admin, KEPT, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&e));
}

/// Through `via`: every context of the old admin.kubeconfig (its server `old_url` pointed at
/// `via`, as its users hold it), each ServiceAccount token of `tokens`; and a wrong token is 401.
async fn assert_old_credentials_work(env: &Env, old_kubeconfig: &Path, old_url: &str, via: &str, tokens: &[&str]) {
    let moved = env.dir().join("old-admin-moved.kubeconfig");
    std::fs::write(
        &moved,
        std::fs::read_to_string(old_kubeconfig).unwrap().replace(old_url, via),
    )
    .unwrap();
    for (context, args) in [
        ("root", vec!["get", "namespaces"]),
        ("system:admin", vec!["get", "namespaces"]),
        ("base", vec!["get", "--raw", "/clusters/root/api/v1/namespaces"]),
        ("shard-base", vec!["get", "--raw", "/clusters/root/api/v1/namespaces"]),
    ] {
        let mut with_context = vec!["--context", context];
        with_context.extend(args);
        let (ok, out) = kubectl(&moved, &with_context, "");
        assert!(ok, "context {context} of the old admin.kubeconfig through {via}: {out}");
    }
    for token in tokens {
        let status = token_status(old_kubeconfig, via, token).await;
        assert!(
            status == 200 || status == 403,
            "a ServiceAccount token through {via}: {status}"
        );
    }
    assert_eq!(token_status(old_kubeconfig, via, "not-a-token").await, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_kcp_on_kine_that_clients_dial_directly_is_adopted_and_the_front_takes_its_address() {
    let _serial = serial();
    require_components(&[&kcp_newer()]);
    let mut env = Env::start().await;
    // kcp as its second shape runs: on a kine over sqlite of its own, on TCP.
    let kine_port = test_port();
    let kine_dir = env.dir().join("old-kine");
    std::fs::create_dir_all(&kine_dir).unwrap();
    let mut kine_cmd = std::process::Command::new(support::require("kine"));
    kine_cmd
        .arg(format!("--endpoint=sqlite://{}/kine.db", kine_dir.display()))
        .arg(format!("--listen-address=127.0.0.1:{kine_port}"))
        .current_dir(&kine_dir);
    let mut kine = support::Proc::spawn("kine", kine_cmd, &kine_dir.join("kine.log"));
    if support::poll(Duration::from_secs(60), Duration::from_millis(100), || {
        std::net::TcpStream::connect(("127.0.0.1", kine_port)).ok()
    })
    .is_none()
    {
        kine.fail("kine does not accept within 60 s");
    }
    let root = env.dir().join("old-kcp");
    let etcd_servers = format!("--etcd-servers=http://127.0.0.1:{kine_port}");
    let mut kcp = EmbeddedKcp::start(&kcp_newer(), &root, &[&etcd_servers]);
    let old_url = format!("https://127.0.0.1:{}", kcp.port);
    let old_kubeconfig = root.join("admin.kubeconfig");
    let old_admin = config_for(&old_kubeconfig, "base", &old_url).await;
    let kept = make_objects(&env, &old_admin).await;
    let (legacy, bound) = service_account_tokens(&kcp);
    let material_before = material_of(&root);
    let old_pid = kcp.proc.pid();

    // Clients dial kcp's own address all along, reading ConfigMaps as the shard admin; after the
    // switch the front answers there. They keep connections alive and ask again as client-go
    // does, which is no failure: on a new connection when kcp closed the kept-alive one as it
    // stopped (Go's transport, for a GET), and a second later when kcp answered a request that
    // reached it after SIGTERM with 503 "apiserver is shutting down" and Retry-After: 1.
    let poller = Poller::kept_alive_get(
        patient(config_for(&old_kubeconfig, "shard-base", &old_url).await),
        "/clusters/root/api/v1/namespaces/default/configmaps",
        Duration::from_millis(20),
    );
    // A KcpShard of another release is refused, saying what to do, and touches nothing.
    env.apply_spec(
        "refused",
        json!({
            "version": kcp_older(),
            "store": { "type": "KineSqlite" },
            "front": { "type": "Tcp", "listen": format!("127.0.0.1:{}", test_port()) },
            "adopt": { "rootDirectory": root.display().to_string() },
        }),
    )
    .await;
    let refused = env
        .until("refused", Duration::from_secs(60), "the adoption to be refused", |o| {
            condition(o, "Degraded")
                .filter(|c| c["reason"] == "AdoptionFailed")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(
        refused.contains(&format!("adopt it at the release it runs (--version {})", kcp_newer())),
        "{refused}"
    );
    let object = env.get("refused").await.unwrap();
    assert_eq!(
        object["status"]["adoption"]["phase"], "Failed",
        "{:#}",
        object["status"]
    );
    assert!(
        serving(&object).is_empty() && slot_pids(&object).is_empty(),
        "{:#}",
        object["status"]
    );
    assert!(env.delete_and_wait("refused", Duration::from_secs(60)).await);
    assert!(kcp.proc.is_running(), "a refused adoption stopped the kcp");

    let shard = "bare";
    let front = format!("127.0.0.1:{}", kcp.port);
    // As a user who writes no YAML: `kcpshard adopt` writes the KcpShard and follows it.
    let started = Instant::now();
    let said = env
        .cli_ok(&[
            "adopt",
            root.to_str().unwrap(),
            "--name",
            shard,
            "--store",
            "KineSqlite",
            "--front",
            &front,
            "--timeout",
            "300",
        ])
        .await;
    assert!(said.contains(&format!("kcpshard \"{shard}\" adopted")), "{said}");
    let object = env.get(shard).await.unwrap();
    assert_eq!(object["spec"]["version"], kcp_newer(), "the version of the running kcp");
    assert_eq!(object["status"]["adoption"]["phase"], "Complete");
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = poller.finish().await;
    let status = &object["status"];
    let reasons = event_reasons(&env, shard).await;
    env.log(&format!(
        "MEASURE bare adoption: {:.1}s, status.adoption {}, status.migration {}; polls {} failed {} (refused {}) asked again on a new connection {} asked again after Retry-After {} slowest {:?}; events {reasons:?}",
        took.as_secs_f64(),
        status["adoption"],
        status["migration"],
        stats.polls,
        stats.failures.len(),
        stats.refused(),
        stats.retried,
        stats.retried_after,
        stats.slowest,
    ));
    for reason in [
        "AdoptionStarted",
        "AdoptionLeaseHeld",
        "MigrationStarted",
        "FrontStarted",
        "AdoptionSwitched",
        "AdoptionComplete",
    ] {
        assert!(reasons.iter().any(|r| r == reason), "no {reason} event: {reasons:?}");
    }
    assert!(stats.failures.is_empty(), "failed polls: {:?}", stats.failures);
    assert_eq!(status["store"]["type"], "KineSqlite", "{status:#}");

    // The old kcp is gone, its kine left alone, and its root directory is as it was.
    assert!(
        support::poll(Duration::from_secs(10), Duration::from_millis(100), || kcp
            .proc
            .exited())
        .is_some(),
        "the old kcp (pid {old_pid}) still runs"
    );
    assert!(kine.is_running(), "the old kcp's kine was stopped");
    assert!(
        material_of(&root) == material_before,
        "the old kcp's root directory changed"
    );

    // At the old address, now the front's: every object, every context, both tokens.
    assert_kept_through(&env, &old_kubeconfig, (&old_url, &old_url), &old_url, &kept).await;
    assert_old_credentials_work(&env, &old_kubeconfig, &old_url, &old_url, &[&legacy, &bound]).await;
    let admin = config_for(&old_kubeconfig, "base", &old_url).await;
    create_workspace_ready(&admin, "after-adoption", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));

    // The way back: the shard gone, the old kcp started again as it ran serves the data it had
    // up to the switch (what was written after it is in the shard's store only).
    assert!(
        env.delete_and_wait(shard, Duration::from_secs(120)).await,
        "the shard was not deleted"
    );
    let again = EmbeddedKcp::start(&kcp_newer(), &root, &[&etcd_servers]);
    let workspaces = again.kubectl(&["get", "workspaces"]).unwrap_or_default();
    assert!(
        workspaces.contains(KEPT),
        "the old kcp started again lacks {KEPT}: {workspaces}"
    );
    assert!(!workspaces.contains("after-adoption"), "{workspaces}");
    drop(again);
    kine.stop();
    env.shutdown(&[shard]).await;
}

/// A caddy as users run it in front of kcp: TLS with kcp's own certificate to clients, and on to
/// kcp re-encrypted, pinning kcp's certificate as the CA (the files of the old root directory).
struct UserCaddy {
    proc: support::Proc,
    admin: String,
    address: String,
}

fn user_caddy(env: &Env, root: &Path, kcp: &str) -> UserCaddy {
    let dir = env.dir().join("caddy");
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let (admin, address) = (
        format!("127.0.0.1:{}", test_port()),
        format!("127.0.0.1:{}", test_port()),
    );
    let (cert, key) = (root.join("apiserver.crt"), root.join("apiserver.key"));
    let config = json!({
        "admin": { "listen": admin },
        "storage": { "module": "file_system", "root": dir.join("storage") },
        "apps": {
            "pki": { "certificate_authorities": { "local": { "install_trust": false } } },
            "tls": { "certificates": { "load_files": [{ "certificate": cert, "key": key, "tags": ["kcp"] }] } },
            "http": { "servers": { "kcp": {
                "listen": [address],
                "protocols": ["h1", "h2"],
                "automatic_https": { "disable": true },
                "tls_connection_policies": [{ "certificate_selection": { "any_tag": ["kcp"] } }],
                "routes": [{ "handle": [{
                    "handler": "reverse_proxy",
                    "transport": { "protocol": "http", "versions": ["1.1"],
                                   "tls": { "root_ca_pem_files": [cert], "server_name": "127.0.0.1" } },
                    "upstreams": [{ "dial": kcp }],
                }] }],
            } } },
        },
    });
    let file = dir.join("caddy.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let mut cmd = std::process::Command::new(support::require("caddy"));
    cmd.arg("run")
        .arg("--config")
        .arg(&file)
        .env("HOME", dir.join("home"))
        .env("XDG_CONFIG_HOME", dir.join("home/.config"))
        .env("XDG_DATA_HOME", dir.join("home/.local/share"))
        .current_dir(&dir);
    let mut proc = support::Proc::spawn("caddy", cmd, &dir.join("caddy.log"));
    proc.grace = Duration::from_secs(3);
    let up = support::poll(Duration::from_secs(20), Duration::from_millis(100), || {
        std::net::TcpStream::connect(&address).ok()
    });
    if up.is_none() {
        proc.fail("caddy does not accept within 20 s");
    }
    UserCaddy { proc, admin, address }
}

/// Lets ServiceAccount `robot` read ConfigMaps in root's default namespace.
fn robot_reads_configmaps(kcp: &EmbeddedKcp) {
    let manifest = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: configmap-reader\n  namespace: default\nrules:\n- apiGroups: [\"\"]\n  resources: [configmaps]\n  verbs: [get, list]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: robot-reads-configmaps\n  namespace: default\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: configmap-reader\nsubjects:\n- kind: ServiceAccount\n  name: robot\n  namespace: default\n";
    let (ok, out) = kubectl(&kcp.root.join("admin.kubeconfig"), &["apply", "-f", "-"], manifest);
    assert!(ok, "give robot a Role: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn a_kcp_behind_caddy_is_adopted_onto_postgres_and_rolled_with_no_request_failed() {
    let _serial = serial();
    require_components(&[&kcp_older(), &kcp_newer()]);
    support::require("etcd");
    support::require("caddy");
    support::require("initdb");
    let mut env = Env::start().await;
    let root = env.dir().join("old-kcp");
    let mut kcp = EmbeddedKcp::start(&kcp_older(), &root, &[]);
    let old_address = format!("127.0.0.1:{}", kcp.port);
    let old_kubeconfig = root.join("admin.kubeconfig");
    let old_admin = config_for(&old_kubeconfig, "base", &format!("https://{old_address}")).await;
    let kept = make_objects(&env, &old_admin).await;
    let (legacy, bound) = service_account_tokens(&kcp);
    robot_reads_configmaps(&kcp);
    let material_before = material_of(&root);
    let mut caddy = user_caddy(&env, &root, &old_address);
    let via_caddy = format!("https://{}", caddy.address);

    // Clients of caddy all along: the shard admin's /readyz every 20 ms, and the ServiceAccount
    // reading ConfigMaps with its bound token.
    let admin_poller = Poller::start_every(
        patient(config_for(&old_kubeconfig, "shard-base", &via_caddy).await),
        Duration::from_millis(20),
    );
    let mut robot = config_for(&old_kubeconfig, "shard-base", &via_caddy).await;
    robot.auth_info = kube::config::AuthInfo {
        token: Some(bound.clone().into()),
        ..Default::default()
    };
    let robot_poller = Poller::get(patient(robot), "/clusters/root/api/v1/namespaces/default/configmaps");

    let shard = "behind-caddy";
    let front = format!("127.0.0.1:{}", test_port());
    let password_file = env.dir().join("pgpass");
    std::fs::write(&password_file, "kcpshard-e2e-adopt\n").unwrap();
    env.apply_spec(
        shard,
        json!({
            "version": kcp_older(),
            "store": managed_postgres_store(test_port(), &password_file),
            "front": { "type": "Tcp", "listen": front },
            "adopt": { "rootDirectory": root.display().to_string(), "caddyAdminAddress": caddy.admin },
        }),
    )
    .await;
    let started = Instant::now();
    let object = env
        .until(shard, ADOPT_TIMEOUT, "the adoption to complete", |o| {
            (o["status"]["adoption"]["phase"] == "Complete").then(|| o.clone())
        })
        .await;
    env.log(&format!(
        "adopted in {:.1}s: status.adoption {}, status.migration {}",
        started.elapsed().as_secs_f64(),
        object["status"]["adoption"],
        object["status"]["migration"]
    ));
    assert!(
        support::poll(Duration::from_secs(10), Duration::from_millis(100), || kcp
            .proc
            .exited())
        .is_some(),
        "the old kcp still runs"
    );
    // From its exit on, nothing writes into its root directory, its etcd's data included.
    let root_after_exit = support::files_under(&root, &[]);
    // The mirror checked every key of the old store, as of its last change, in the new one.
    let verified = object["status"]["migration"]["verifiedKeys"].as_u64().unwrap_or(0);
    assert!(
        verified > 100,
        "the mirror checked {verified} keys: {:#}",
        object["status"]
    );
    let upstreams = kcpshard::front::caddy::CaddyAdmin::new(caddy.admin.as_str())
        .dialling(&front)
        .await
        .unwrap();
    assert_eq!(upstreams, 1, "caddy does not send to the front");

    // Then a version roll, the clients still going.
    let before_roll = chrono::Utc::now().to_rfc3339();
    env.patch(shard, json!({ "spec": { "version": kcp_newer() } })).await;
    env.until(shard, ROLL_TIMEOUT, "the roll to the newer release", |o| {
        completed_roll_to(o, &kcp_newer(), &before_roll).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (admin_stats, robot_stats) = (admin_poller.finish().await, robot_poller.finish().await);
    let reasons = event_reasons(&env, shard).await;
    env.log(&format!(
        "through caddy: shard admin {} polls, {} failed, slowest {:?}; robot {} polls, {} failed, slowest {:?}; events {reasons:?}",
        admin_stats.polls,
        admin_stats.failures.len(),
        admin_stats.slowest,
        robot_stats.polls,
        robot_stats.failures.len(),
        robot_stats.slowest
    ));
    assert!(reasons.iter().any(|r| r == "AdoptionProxyMoved"), "{reasons:?}");
    // caddy's own part: every admin change reloads its config, and caddy 2.6 binds the new
    // listener beside the old one with SO_REUSEPORT (listen_unix.go) and closes the old one,
    // whose accept queue the kernel resets. A connection that landed in it in that instant is
    // reset before its TLS handshake (docs/how-to/adopt.md, step 3); nothing else may fail.
    let (admin_resets, admin_failed) = apart_caddy_reload_resets(&admin_stats);
    let (robot_resets, robot_failed) = apart_caddy_reload_resets(&robot_stats);
    assert!(admin_failed.is_empty(), "failed polls: {admin_failed:?}");
    assert!(robot_failed.is_empty(), "failed reads: {robot_failed:?}");
    assert!(
        admin_resets + robot_resets <= 2,
        "more connections reset at caddy's one reload than its accept queue holds in an instant: {:?} {:?}",
        admin_stats.failures,
        robot_stats.failures
    );

    // Through caddy, as before: the objects, every context of the old kubeconfig, both tokens.
    let urls = (format!("https://{old_address}"), format!("https://{front}"));
    assert_kept_through(&env, &old_kubeconfig, (&urls.0, &urls.1), &via_caddy, &kept).await;
    assert_old_credentials_work(
        &env,
        &old_kubeconfig,
        &format!("https://{old_address}"),
        &via_caddy,
        &[&legacy, &bound],
    )
    .await;
    assert!(
        material_of(&root) == material_before,
        "the old kcp's root directory changed"
    );
    assert!(
        support::files_under(&root, &[]) == root_after_exit,
        "the old kcp's root directory changed after it exited"
    );
    caddy.proc.stop();
    env.shutdown(&[shard]).await;
}
