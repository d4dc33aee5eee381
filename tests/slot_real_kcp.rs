//! Two real kcp slots on one real kine, started and stopped by the process runtime: the slot
//! argv, the shared material, readiness on each slot's own port, the shard-admin token across
//! slots, whether a slot serves kcp's own APIs, kcpshard's admin identity on both slots at once
//! (behind a round-robin forwarder: every request accepted, whichever slot it reaches; kcp sees the
//! same user as its own kcp-admin; its workspaces reach Ready with it as their owner), the lease
//! hand-over and the workspace probe; and the store migration's warm-up and switch: a slot on a store
//! mirrored from the serving one (`kcpshard job store-mirror`) follows, then leads once the old one
//! has exited and the mirror has caught up.
//!
//! The first test's kine is over PostgreSQL, and slot b's first start loses the store at root
//! phase 0 of kcp's bootstrap (PostgreSQL stopped the moment kcp logs it, back 3 s later; kine
//! stays up and answers with PostgreSQL's errors): that kcp answers `/readyz` ok and 404 for
//! tenancy.kcp.io, which `serves_kcp_apis` must call broken (docs/reliability.md, "A slot that
//! answers /readyz but not kcp's APIs"); slot b started again must serve. The second test's kine
//! is over sqlite.
//!
//! Needs `bin/kcp-<version>` for both kcp versions pinned in hack/versions.env, `bin/kine` and
//! PostgreSQL (`hack/install-deps.sh`); without them the test fails, it never skips. Every process
//! it starts is SIGKILLed at the end, pass or fail.
//!
//! Longer than 600 lines on purpose: two real kcp slots on one kine, and what kcpshard relies on of
//! them, set up once per test the same way. Each tests/*.rs file is a test binary of its own (40-60
//! MB, linked again on every change of the crate): one concern, one file.
mod support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kcpshard::process::{PortReservation, ProcessRecord, ProcessSpec, Runtime, UnitName, procfs};
use kcpshard::slot::identity::{self, FrontKubeconfig, Identity};
use kcpshard::slot::{self, NotServingKind, SlotLaunch};
use kcpshard::store::{self, kine::KineSpec};
use support::{pin, require};

/// What kcp logs when root phase 0 of its bootstrap begins, and how it ends
/// (`pkg/server/server.go:488`, `:528`, `:531` of v0.31.2).
const PHASE0_BEGINS: &str = "bootstrapping root workspace phase 0";
const PHASE0_FAILED: &str = "failed to bootstrap root workspace phase 0";
const PHASE0_DONE: &str = "bootstrapped root workspace phase 0";
const SERVING_TIMEOUT: Duration = Duration::from_secs(5);

/// SIGKILLs every process it was given (and its group) when dropped, and prints their log tails
/// when the test is failing.
struct Reaper {
    procs: Vec<(ProcessRecord, PathBuf)>,
}

impl Reaper {
    fn add(&mut self, rec: &ProcessRecord, log: &Path) {
        self.procs.push((rec.clone(), log.to_path_buf()));
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for (rec, log) in &self.procs {
            if std::thread::panicking() {
                eprintln!(
                    "--- {} (pid {}) {} ---\n{}",
                    rec.program.display(),
                    rec.pid,
                    log.display(),
                    kcpshard::process::detached::file_tail(log, 15).join("\n")
                );
            }
            let same = procfs::stat(rec.pid).is_some_and(|s| s.start_time == rec.start_time);
            if same {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(-(rec.pid as i32)),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(rec.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

struct Slot {
    port: u16,
    /// Held while the slot runs, as the controller holds a new slot's port.
    _port_held: PortReservation,
    root: PathBuf,
    log: PathBuf,
    record: ProcessRecord,
    started: Instant,
}

/// What every slot of the test's shard shares: its directory, store and front URL.
struct Shard<'a> {
    base: &'a Path,
    etcd: &'a str,
    front: &'a str,
}

async fn start_slot(
    runtime: &Runtime,
    reaper: &mut Reaper,
    shard: &Shard<'_>,
    name: &str,
    version: &str,
    accepts: &[&Identity],
) -> Slot {
    let Shard { base, etcd, front } = *shard;
    let kcp = &require(&format!("kcp-{version}"));
    let dir = base.join(format!("slot-{name}"));
    let root = dir.join("root");
    let reservation = PortReservation::new().unwrap();
    let port = reservation.port();
    let token_auth_file = dir.join("admin-tokens.csv");
    identity::write_token_file(&token_auth_file, accepts, "").unwrap();
    let launch = SlotLaunch {
        name: name.to_string(),
        version: version.to_string(),
        binary: kcp.clone(),
        root_dir: root.clone(),
        bind_address: IpAddr::from([127, 0, 0, 1]),
        port,
        etcd_servers: etcd.to_string(),
        etcd_tls: Default::default(),
        front_url: front.to_string(),
        shutdown_delay: Duration::from_secs(1),
        token_auth_file,
        extra_args: Vec::new(),
        sharded: None,
    };
    let args = slot::kcp_args(&launch).unwrap();
    let spec = ProcessSpec::new(
        format!("slot-{name}"),
        UnitName::slot("real", name),
        kcp.clone(),
        args,
        dir.join("kcp.log"),
        dir.join("process.json"),
    );
    let started = Instant::now();
    let record = runtime.start(&spec).await.unwrap();
    reaper.add(&record, &spec.log);
    assert_eq!(Runtime::load(&spec.record).unwrap().as_ref(), Some(&record));
    Slot {
        port,
        _port_held: reservation,
        root,
        log: spec.log,
        record,
        started,
    }
}

/// Polls /readyz on the slot's own port with the shard-admin token of its root's kubeconfig.
async fn wait_ready(runtime: &Runtime, slot: &Slot, timeout: Duration) -> Duration {
    let deadline = Instant::now() + timeout;
    loop {
        assert!(
            runtime.is_running(&slot.record),
            "slot exited during startup:\n{}",
            kcpshard::process::detached::file_tail(&slot.log, 15).join("\n")
        );
        if slot::slot_ready(&slot.root, slot.port).await.unwrap() {
            return slot.started.elapsed();
        }
        assert!(Instant::now() < deadline, "slot not ready within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The log of the process that started at byte `from` of `log` (the runtime appends).
fn log_since(log: &Path, from: usize) -> Vec<u8> {
    let mut text = std::fs::read(log).unwrap_or_default();
    text.drain(..from.min(text.len()));
    text
}

/// Waits (polling every 2 ms) until `log` has, after byte `from`, a line with `marker`; the time
/// it took.
async fn wait_for_line(log: &Path, from: usize, marker: &str, timeout: Duration) -> Duration {
    let begun = Instant::now();
    let mut seen: usize = 0;
    loop {
        let text = log_since(log, from);
        // Search from a little before the last end, so that a line split across reads is found.
        let start = seen.saturating_sub(marker.len()).min(text.len());
        if memchr::memmem::find(&text[start..], marker.as_bytes()).is_some() {
            return begun.elapsed();
        }
        seen = text.len();
        assert!(
            begun.elapsed() < timeout,
            "no {marker:?} in {} within {timeout:?}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A client of `slot` as the shard admin, on its own port.
async fn shard_admin(slot: &Slot) -> kube::Client {
    slot::shard_admin_client(&slot.root.join("admin.kubeconfig"), &slot::slot_url(slot.port))
        .await
        .unwrap()
}

/// The kine of the shard in a test.
enum Backend {
    Sqlite,
    /// Over a throwaway PostgreSQL; slot b's first start loses it at root phase 0.
    PostgresLostAtPhase0,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slots_share_a_store_material_and_the_shard_admin_and_hand_over_the_lease() {
    let newer = pin("KCP_VERSION_NEWER");
    hand_over(&newer, &newer, Backend::PostgresLostAtPhase0).await;
}

/// The same hand-over from the older pinned kcp to the newer one (a version roll's slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_bump_hands_over_from_the_older_kcp_to_the_newer() {
    hand_over(&pin("KCP_VERSION_OLDER"), &pin("KCP_VERSION_NEWER"), Backend::Sqlite).await;
}

/// Starts slot b and stops PostgreSQL (fast shutdown, as an administrator would) the moment b's
/// kcp begins root phase 0, starts it again 3 s later, and checks what [`slot::serves_kcp_apis`]
/// says once b's `/readyz` is ok: broken (404 for tenancy.kcp.io) when kcp logged that phase 0
/// failed, serving when it logged that it finished (the outage came after phase 0 had bound kcp's
/// APIs, which takes tens of milliseconds: 2 of 9 times in hack/faults/store-outage-during-start.sh;
/// then b is started again, at most 5 times in all). Returns b, broken, for the caller to stop.
async fn start_slot_losing_phase0(
    runtime: &Runtime,
    reaper: &mut Reaper,
    shard: &Shard<'_>,
    pg: &mut support::Postgres,
    version: &str,
    accepts: &[&Identity],
) -> Slot {
    for attempt in 1..=5 {
        let from = std::fs::metadata(shard.base.join("slot-b").join("kcp.log")).map_or(0, |m| m.len() as usize);
        let b = start_slot(runtime, reaper, shard, "b", version, accepts).await;
        let waited = wait_for_line(&b.log, from, PHASE0_BEGINS, Duration::from_secs(180)).await;
        pg.stop_fast();
        let down = b.started.elapsed();
        tokio::time::sleep(Duration::from_secs(3)).await;
        pg.restart();
        let up = b.started.elapsed();
        let ready = wait_ready(runtime, &b, Duration::from_secs(180)).await;
        let log = String::from_utf8_lossy(&log_since(&b.log, from)).into_owned();
        let client = shard_admin(&b).await;
        let verdict = slot::serves_kcp_apis(&client, slot::serving::Request::KcpApi, SERVING_TIMEOUT).await;
        eprintln!(
            "PHASE0 OUTAGE attempt {attempt}: PostgreSQL down {down:?}-{up:?} after b's start (phase 0 began {waited:?} into the wait for it), b ready {ready:?}: {verdict:?}"
        );
        if log.contains(PHASE0_FAILED) {
            let e = verdict.expect_err("phase 0 failed, yet kcp's APIs are served");
            assert_eq!(e.kind(), NotServingKind::Broken, "{e}");
            assert_eq!(
                e.to_string(),
                "GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1: HTTP 404: 404 page not found"
            );
            // Nothing in the process redoes phase 0: still broken seconds later.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let again = slot::serves_kcp_apis(&client, slot::serving::Request::KcpApi, SERVING_TIMEOUT)
                .await
                .unwrap_err();
            assert_eq!(again.kind(), NotServingKind::Broken, "{again}");
            return b;
        }
        assert!(log.contains(PHASE0_DONE), "kcp logged neither outcome of phase 0");
        verdict.unwrap_or_else(|e| panic!("phase 0 finished, yet {e}"));
        runtime.terminate(&b.record, Duration::from_secs(30)).await.unwrap();
    }
    panic!("PostgreSQL stopped after kcp's phase 0 had bound its APIs, 5 times");
}

async fn hand_over(version_a: &str, version_b: &str, backend: Backend) {
    require(&format!("kcp-{version_a}"));
    require(&format!("kcp-{version_b}"));
    let kine = require("kine");
    let tmp = tempfile::Builder::new().prefix("kcpshard-slots-").tempdir().unwrap();
    let base = tmp.path();
    let shared = base.join("shared");
    let runtime = Runtime::new();
    let mut reaper = Reaper { procs: Vec::new() };
    // The front is not part of this test; its URL only has to be what every slot advertises.
    let front = format!("https://127.0.0.1:{}", support::test_port());

    let mut pg = matches!(backend, Backend::PostgresLostAtPhase0).then(support::Postgres::start);
    let store_dir = base.join("store");
    let spec = match &pg {
        None => KineSpec::sqlite(&kine, &store_dir, "real").unwrap(),
        Some(pg) => {
            std::fs::create_dir_all(&store_dir).unwrap();
            KineSpec {
                binary: kine.clone(),
                endpoint: pg.url("kcp"),
                dir: store_dir.clone(),
                env: Vec::new(),
                ready_timeout: Duration::from_secs(60),
                unit: UnitName::shard_kine("real"),
            }
        }
    };
    let t = Instant::now();
    let k = store::kine::ensure_kine(&runtime, &spec).await.unwrap();
    reaper.add(&k.record, &store_dir.join(store::kine::LOG_FILE));
    let kine_ready = t.elapsed();
    assert!(!k.adopted);
    // A second call adopts the same kine instead of starting another on the same database.
    let again = store::kine::ensure_kine(&runtime, &spec).await.unwrap();
    assert!(again.adopted);
    assert_eq!(again.record, k.record);

    // Slot a: the first slot makes the shard's material.
    let root_a = base.join("slot-a").join("root");
    assert!(!slot::seed_root(&shared, &root_a).unwrap());
    // kcpshard's admin identity, which both slots accept; `old` only slot a (a rotation's first
    // half: a slot that still accepts the identity being replaced beside one that does not).
    let admin = Identity::issue(chrono::Utc::now()).unwrap();
    let old = Identity::issue(chrono::Utc::now()).unwrap();
    let shard = Shard {
        base,
        etcd: &k.endpoint(),
        front: &front,
    };
    let a = start_slot(&runtime, &mut reaper, &shard, "a", version_a, &[&old, &admin]).await;
    assert_ne!(
        procfs::stat(a.record.pid).unwrap().session,
        procfs::stat(std::process::id()).unwrap().session,
        "a slot runs in its own session"
    );
    let a_ready = wait_ready(&runtime, &a, Duration::from_secs(180)).await;
    slot::capture_shared(&a.root, &shared).unwrap();
    for f in slot::SHARED_FILES {
        assert!(shared.join(f).is_file(), "{f} captured");
    }

    // The kubeconfig names the front (the shard URL), not the slot's port.
    let kc = std::fs::read_to_string(a.root.join("admin.kubeconfig")).unwrap();
    assert!(kc.contains(&front), "admin.kubeconfig server is the front:\n{kc}");
    for ctx in ["root", "base", "system:admin", "shard-base"] {
        assert!(
            kc.contains(&format!("name: {ctx}")),
            "context {ctx} in admin.kubeconfig"
        );
    }

    let client_a = shard_admin(&a).await;
    slot::serves_kcp_apis(&client_a, slot::serving::Request::KcpApi, SERVING_TIMEOUT)
        .await
        .unwrap();

    // Slot b: seeded from the shard's material, same store.
    let root_b = base.join("slot-b").join("root");
    assert!(slot::seed_root(&shared, &root_b).unwrap());
    if let Some(pg) = pg.as_mut() {
        let broken = start_slot_losing_phase0(&runtime, &mut reaper, &shard, pg, version_b, &[&admin]).await;
        // Restarted (as the controller does with a broken slot), b serves.
        runtime
            .terminate(&broken.record, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(slot::seed_root(&shared, &root_b).unwrap());
        // a lived through the outage: it serves again once its store is back.
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = slot::serves_kcp_apis(&client_a, slot::serving::Request::KcpApi, SERVING_TIMEOUT).await {
            assert_eq!(e.kind(), NotServingKind::Slow, "{e}");
            assert!(Instant::now() < deadline, "slot a does not serve after the outage: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let b = start_slot(&runtime, &mut reaper, &shard, "b", version_b, &[&admin]).await;
    let b_ready = wait_ready(&runtime, &b, Duration::from_secs(180)).await;
    slot::capture_shared(&b.root, &shared).unwrap();
    slot::serves_kcp_apis(&shard_admin(&b).await, slot::serving::Request::KcpApi, SERVING_TIMEOUT)
        .await
        .unwrap();

    // b's shard-admin token (and CA) work on a: one identity for the shard.
    let b_on_a = slot::shard_admin_client(&b.root.join("admin.kubeconfig"), &slot::slot_url(a.port))
        .await
        .unwrap();
    assert!(slot::readyz(&b_on_a).await.unwrap(), "b's shard-admin token works on a");
    // ...whereas the kcp-admin token is per process (docs/background.md section 2): b's is rejected by a.
    let b_kcp_admin_on_a = slot::client_for_context(
        &b.root.join("admin.kubeconfig"),
        slot::access::KCP_ADMIN_CONTEXT,
        &slot::slot_url(a.port),
    )
    .await
    .unwrap();
    let kcp_admin_ok = slot::readyz(&b_kcp_admin_on_a).await.unwrap_or(false);

    // Both slots serve: the admin identity, through a front that sends each connection to the
    // other slot, is accepted every time; kcp sees it as its own kcp-admin.
    let front_kubeconfig = write_front_kubeconfig(base, &shared, &front, &admin);
    let both = both_slots_at_once(&front, &front_kubeconfig, &a, &b).await;

    let client_b = slot::shard_admin_client(&b.root.join("admin.kubeconfig"), &slot::slot_url(b.port))
        .await
        .unwrap();
    let holder_before = slot::controllers_lease_holder(&client_b).await.unwrap();
    assert!(holder_before.is_some(), "a leads the controllers");

    // Hand over: stop a, delete the lease, prove b leads with a workspace.
    let stop = runtime.terminate(&a.record, Duration::from_secs(30)).await.unwrap();
    assert!(!stop.killed, "kcp exits on SIGTERM");
    assert!(!runtime.is_running(&a.record));
    let released_at = Instant::now();
    assert!(
        slot::release_controllers_lease(&client_b).await.unwrap(),
        "a's lease was there to delete"
    );
    // The probe needs a real identity: kcpshard's admin identity, as the controller probes (the
    // shard admin's workspaces stay in Initializing: no owner is recorded).
    let kcp_admin_b = slot::admin_client(&front_kubeconfig, &slot::slot_url(b.port))
        .await
        .unwrap();
    // While the probe runs, watch for b taking the lease.
    let new_leader = async {
        loop {
            let holder = slot::controllers_lease_holder(&client_b).await.unwrap();
            if holder.is_some() && holder != holder_before {
                return (holder, released_at.elapsed());
            }
            assert!(released_at.elapsed() < Duration::from_secs(15), "no new leader");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (probe, (holder_after, release_to_leader)) = tokio::join!(
        async {
            slot::probe_workspace(&kcp_admin_b, Duration::from_secs(10))
                .await
                .unwrap()
        },
        new_leader
    );
    let release_to_ready = released_at.elapsed();
    assert!(slot::readyz(&client_b).await.unwrap());

    let stop_b = runtime.terminate(&b.record, Duration::from_secs(30)).await.unwrap();
    let stop_kine = store::kine::stop_kine(&runtime, &spec, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(stop_kine.is_some());
    assert!(!runtime.is_running(&k.record));

    eprintln!(
        "TIMINGS {version_a}->{version_b}: kine start->accepting {kine_ready:?}; slot a start->ready {a_ready:?} (fresh store); slot b start->ready {b_ready:?} (existing store); \
         a SIGTERM->exit {:?} (shutdown delay 1s); lease release->new leader {release_to_leader:?}, ->probe Ready {release_to_ready:?} (probe create->Ready {probe:?}); \
         b SIGTERM->exit {:?}; kcp-admin token of b accepted by a: {kcp_admin_ok}; lease holder {holder_before:?} -> {holder_after:?}; {both}",
        stop.exited_after, stop_b.exited_after
    );
}

/// The kubeconfig through the front for kcpshard's admin `identity`, as the controller writes it
/// from the shard's material in `shared`: in `base`.
fn write_front_kubeconfig(base: &Path, shared: &Path, front: &str, identity: &Identity) -> PathBuf {
    let path = base.join("admin.kubeconfig");
    let shard_admin_token =
        identity::shard_admin_token(&std::fs::read(shared.join("admin.kubeconfig")).unwrap()).unwrap();
    let rendered = FrontKubeconfig {
        front_url: front,
        ca_pem: &std::fs::read(shared.join("apiserver.crt")).unwrap(),
        identity,
        shard_admin_token: &shard_admin_token,
    }
    .render();
    std::fs::write(&path, rendered).unwrap();
    path
}

/// `GET`/`POST path` with `client`: the status and body.
async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, String) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default())
        .unwrap();
    let response = client.send(request.map(kube::client::Body::from)).await.unwrap();
    let status = response.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The user kcp sees for `client` (a SelfSubjectReview): name and groups.
async fn who(client: &kube::Client) -> (String, Vec<String>) {
    let (status, body) = send(
        client,
        http::Method::POST,
        "/clusters/root/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(serde_json::json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview" })),
    )
    .await;
    assert_eq!(status, 201, "SelfSubjectReview: {body}");
    let review: serde_json::Value = serde_json::from_str(&body).unwrap();
    let user = &review["status"]["userInfo"];
    let groups = user["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect();
    (user["username"].as_str().unwrap().to_string(), groups)
}

const WORKSPACES: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";

/// With slots a and b both serving, behind a forwarder on the front's address that sends each new
/// connection to the other slot: 200 requests with kcpshard's admin identity (`kubeconfig`), each
/// on a new connection, are all accepted; kcp sees the same user and groups as its own kcp-admin;
/// a workspace it creates reaches Ready with kcp-admin recorded as its owner; an identity that
/// only slot a accepts is refused by b. Returns a summary for the TIMINGS line.
async fn both_slots_at_once(front: &str, kubeconfig: &Path, a: &Slot, b: &Slot) -> String {
    let listen: std::net::SocketAddr = front.trim_start_matches("https://").parse().unwrap();
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    let counts = std::sync::Arc::new([
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    ]);
    let ports = [a.port, b.port];
    let seen = counts.clone();
    let forwarder = tokio::spawn(async move {
        for n in 0usize.. {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            seen[n % 2].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let port = ports[n % 2];
            tokio::spawn(async move {
                if let Ok(mut slot) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut slot).await;
                }
            });
        }
    });
    let started = Instant::now();
    // Each on a new client: a new connection, so the forwarder alternates slots; four at a time.
    let refused: Vec<String> = futures::stream::iter(0..200)
        .map(|_| async {
            let client = slot::admin_client(kubeconfig, front).await.unwrap();
            send(&client, http::Method::GET, &format!("{WORKSPACES}?limit=1"), None).await
        })
        .buffer_unordered(4)
        .filter_map(|(status, body)| async move { (status != 200).then(|| format!("{status}: {body}")) })
        .collect()
        .await;
    let took = started.elapsed();
    let (to_a, to_b) = (
        counts[0].load(std::sync::atomic::Ordering::SeqCst),
        counts[1].load(std::sync::atomic::Ordering::SeqCst),
    );
    assert!(
        refused.is_empty(),
        "{} of 200 requests with the admin identity refused: {refused:?}",
        refused.len()
    );
    assert!(
        to_a >= 100 && to_b >= 100,
        "the requests did not reach both slots: {to_a} to a, {to_b} to b"
    );

    // kcp's view of the identity: its own kcp-admin's name and groups (the uid differs).
    let admin = slot::admin_client(kubeconfig, front).await.unwrap();
    let kcp_admin_a = slot::client_for_context(&a.root.join("admin.kubeconfig"), "base", &slot::slot_url(a.port))
        .await
        .unwrap();
    let (ours, theirs) = (who(&admin).await, who(&kcp_admin_a).await);
    assert_eq!(ours, theirs, "kcpshard's admin identity and kcp's own kcp-admin differ");
    assert_eq!(ours.0, identity::USER);
    assert!(ours.1.iter().any(|g| g == identity::GROUP), "{ours:?}");

    // A real user: its workspace reaches Ready, with kcp-admin recorded as the owner.
    let name = format!("identity-{}", std::process::id());
    let body = serde_json::json!({ "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name } });
    let (status, created) = send(&admin, http::Method::POST, WORKSPACES, Some(body)).await;
    assert_eq!(status, 201, "create workspace: {created}");
    let ready = Instant::now();
    let workspace = loop {
        let (_, body) = send(&admin, http::Method::GET, &format!("{WORKSPACES}/{name}"), None).await;
        let ws: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if ws["status"]["phase"] == "Ready" {
            break ws;
        }
        assert!(
            ready.elapsed() < Duration::from_secs(60),
            "workspace {name} not Ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let owner = workspace["metadata"]["annotations"]["experimental.tenancy.kcp.io/owner"]
        .as_str()
        .unwrap_or_default();
    assert!(
        owner.contains("\"username\":\"kcp-admin\""),
        "owner of {name}: {owner:?}"
    );

    // Each slot accepts what its own token file names, and nothing else.
    let mut old_kubeconfig = std::fs::read_to_string(kubeconfig).unwrap();
    let a_only = std::fs::read_to_string(a.root.parent().unwrap().join("admin-tokens.csv")).unwrap();
    let old_token = a_only.lines().next().unwrap().split(',').next().unwrap().to_string();
    let admin_token = a_only.lines().nth(1).unwrap().split(',').next().unwrap().to_string();
    old_kubeconfig = old_kubeconfig.replace(&admin_token, &old_token);
    let old_path = kubeconfig.with_file_name("old.kubeconfig");
    std::fs::write(&old_path, old_kubeconfig).unwrap();
    let old_on = |port| {
        let path = old_path.clone();
        async move {
            let client = slot::admin_client(&path, &slot::slot_url(port)).await.unwrap();
            send(&client, http::Method::GET, &format!("{WORKSPACES}?limit=1"), None)
                .await
                .0
        }
    };
    assert_eq!(
        old_on(a.port).await,
        200,
        "slot a accepts the identity its token file names first"
    );
    assert_eq!(
        old_on(b.port).await,
        401,
        "slot b refuses an identity its token file does not name"
    );
    forwarder.abort();
    format!(
        "both slots serving: 200 requests with the admin identity through a round-robin forwarder ({to_a} connections to a, {to_b} to b) in {took:?}, 0 refused; kcp sees {ours:?} as for its own kcp-admin; workspace owner {owner}"
    )
}

#[tokio::test]
async fn kine_sqlite_is_adopted_by_record_or_argv_restarted_when_dead_and_never_doubled() {
    let kine = require("kine");
    let tmp = tempfile::Builder::new().prefix("kcpshard-kine-").tempdir().unwrap();
    let dir = tmp.path().join("store");
    let log = dir.join(store::kine::LOG_FILE);
    let mut reaper = Reaper { procs: Vec::new() };
    let runtime = Runtime::new();

    let first = store::ensure_kine_sqlite(&runtime, &kine, &dir, "real").await.unwrap();
    reaper.add(&first.record, &log);
    assert!(!first.adopted);
    assert!(first.address.accepts().await);
    assert!(dir.join(store::kine::DB_FILE).exists());

    // A restarted serve (a new runtime) adopts it from its record.
    let restarted = Runtime::new();
    let adopted = store::ensure_kine_sqlite(&restarted, &kine, &dir, "real")
        .await
        .unwrap();
    assert!(adopted.adopted);
    assert_eq!(adopted.record, first.record);
    assert_eq!(adopted.endpoint(), first.endpoint());

    // The record was lost (serve died between the spawn and the write): found by its argv.
    std::fs::remove_file(dir.join(store::kine::RECORD_FILE)).unwrap();
    let found = store::ensure_kine_sqlite(&restarted, &kine, &dir, "real")
        .await
        .unwrap();
    assert!(found.adopted);
    assert_eq!(
        (found.record.pid, found.record.start_time),
        (first.record.pid, first.record.start_time)
    );
    assert_eq!(
        Runtime::load(&dir.join(store::kine::RECORD_FILE)).unwrap().unwrap().pid,
        first.record.pid
    );

    // A second kine on the same sqlite file (never ours to keep): stopped, the first stays.
    let extra = runtime
        .start(&ProcessSpec::new(
            "extra-kine",
            UnitName::other("extra-kine"),
            kine.clone(),
            store::kine::kine_args(
                &store::kine::sqlite_endpoint(&std::path::absolute(&dir).unwrap()),
                &store::kine::KineAddress::Unix(tmp.path().join("extra-kine.sock")),
            ),
            tmp.path().join("extra.log"),
            tmp.path().join("extra.json"),
        ))
        .await
        .unwrap();
    reaper.add(&extra, &tmp.path().join("extra.log"));
    let one = store::ensure_kine_sqlite(&restarted, &kine, &dir, "real")
        .await
        .unwrap();
    assert_eq!(one.record.pid, first.record.pid);
    assert!(
        !runtime.is_running(&extra),
        "the extra kine on the same database was stopped"
    );

    // kine died: a new one starts on the same database.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.record.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while runtime.is_running(&first.record) {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = store::ensure_kine_sqlite(&restarted, &kine, &dir, "real")
        .await
        .unwrap();
    reaper.add(&second.record, &log);
    assert!(!second.adopted);
    assert_ne!(second.record.pid, first.record.pid);

    let stopped = store::stop_kine_sqlite(&restarted, &dir, "real", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(stopped.is_some_and(|t| !t.killed));
    assert!(!dir.join(store::kine::RECORD_FILE).exists());
    let endpoint = store::kine::sqlite_endpoint(&std::path::absolute(&dir).unwrap());
    assert!(Runtime::find_by_argument(&store::kine::endpoint_arg(&endpoint)).is_empty());
    // Stopping again is a no-op.
    assert!(
        store::stop_kine_sqlite(&restarted, &dir, "real", Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
}

/// A kine asked to stop (SIGTERM) exits 0: the next start on its endpoint is no failure. Only an
/// exit of its own during its start is (kine exits 1 on a fatal error), reported with its log.
#[tokio::test]
async fn a_kine_that_was_asked_to_stop_starts_again_without_a_failure() {
    let kine = require("kine");
    let tmp = tempfile::Builder::new().prefix("kcpshard-kine-").tempdir().unwrap();
    let dir = tmp.path().join("store");
    let log = dir.join(store::kine::LOG_FILE);
    let mut reaper = Reaper { procs: Vec::new() };
    let runtime = Runtime::new();
    let spec = KineSpec::sqlite(&kine, &dir, "real").unwrap();
    let started = |start: store::KineStart| match start {
        store::KineStart::Accepting(kine) | store::KineStart::Starting(kine) => kine,
    };

    let first = started(store::kine::start_kine(&runtime, &spec).await.unwrap());
    reaper.add(&first.record, &log);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !first.address.accepts().await {
        assert!(Instant::now() < deadline, "kine never accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runtime.send_stop(&first.record).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime.is_running(&first.record) {
        assert!(Instant::now() < deadline, "kine did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        runtime.exit_status(&first.record).await.and_then(|s| s.code()),
        Some(0),
        "kine asked to stop exits 0"
    );

    let again = store::kine::start_kine(&runtime, &spec)
        .await
        .expect("a kine that was asked to stop starts again without a failure");
    let again = started(again);
    reaper.add(&again.record, &log);
    assert_ne!(again.record.pid, first.record.pid);
}

/// The store migration's warm-up and switch on two real kcp slots. Slot a serves on a kine over
/// sqlite; `kcpshard job store-mirror` copies kcp's keys into a kine over PostgreSQL whose
/// revisions were raised above a's, and follows a's changes; slot b starts on that kine. While a
/// runs, b does not lead (the mirrored controllers Lease is renewed by a, so b's elector sees it
/// held) and sees what a writes. The switch: a gets SIGTERM and exits, the mirror applies the
/// source's last revision and ends, the Lease (its holder gone) is deleted, and b leads: a new
/// workspace reaches Ready through b, every workspace made through a is there, and a watch from a
/// resourceVersion a handed out is answered 410 Gone (the client lists again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_on_a_mirrored_store_follows_while_the_old_leads_and_takes_over_after_the_switch() {
    use kcpshard::store::etcd_keys;
    use kcpshard::store::mirror::{MirrorPhase, MirrorProgress};
    let version = pin("KCP_VERSION_NEWER");
    let kine = require("kine");
    let tmp = tempfile::Builder::new().prefix("kcpshard-migrate-").tempdir().unwrap();
    let base = tmp.path();
    let shared = base.join("shared");
    let runtime = Runtime::new();
    let mut reaper = Reaper { procs: Vec::new() };
    let front = format!("https://127.0.0.1:{}", support::test_port());

    let store_dir = base.join("store");
    let spec = KineSpec::sqlite(&kine, &store_dir, "real").unwrap();
    let source = store::kine::ensure_kine(&runtime, &spec).await.unwrap();
    reaper.add(&source.record, &store_dir.join(store::kine::LOG_FILE));
    let admin = Identity::issue(chrono::Utc::now()).unwrap();
    assert!(!slot::seed_root(&shared, &base.join("slot-a").join("root")).unwrap());
    let on_source = Shard {
        base,
        etcd: &source.endpoint(),
        front: &front,
    };
    let a = start_slot(&runtime, &mut reaper, &on_source, "a", &version, &[&admin]).await;
    wait_ready(&runtime, &a, Duration::from_secs(180)).await;
    slot::capture_shared(&a.root, &shared).unwrap();
    let front_kubeconfig = write_front_kubeconfig(base, &shared, &front, &admin);
    let kcp_admin_a = slot::admin_client(&front_kubeconfig, &slot::slot_url(a.port))
        .await
        .unwrap();
    let made_before_copy = slot::access::create_probe_workspace(&kcp_admin_a).await.unwrap();

    // The target: a new database on PostgreSQL; the job makes kine's table there and raises its
    // revisions above the source's.
    let pg = support::Postgres::start();
    let source_client = etcd_keys::connect(&[source.endpoint()], None).await.unwrap();
    let job_dir = base.join("mirror");
    std::fs::create_dir_all(&job_dir).unwrap();
    let to = serde_json::json!({
        "type": "KinePostgres",
        "kinePostgres": { "host": "127.0.0.1", "port": pg.port, "database": "target", "user": "postgres" },
    });
    let mut mirror_cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kcpshard"));
    mirror_cmd
        .args(["job", "store-mirror", "--from-endpoint", &source.endpoint()])
        .args(["--to-store", &to.to_string()])
        .arg("--kine-binary")
        .arg(&kine)
        .arg("--progress")
        .arg(job_dir.join("progress.json"))
        .arg("--until")
        .arg(job_dir.join("until"))
        .current_dir(&job_dir);
    let copy_started = Instant::now();
    let mut mirror = support::Proc::spawn("store-mirror", mirror_cmd, &job_dir.join("job.log"));
    let progress = job_dir.join("progress.json");
    let following = loop {
        if let Some(p) = MirrorProgress::load(&progress)
            .unwrap()
            .filter(|p| p.phase == MirrorPhase::Following)
        {
            break p;
        }
        assert!(mirror.is_running(), "{}", mirror.report("the mirror ended"));
        assert!(copy_started.elapsed() < Duration::from_secs(60), "no copy within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let copied_in = copy_started.elapsed();

    // Slot b, on the target (a kine of its own, as a KinePostgres slot has), out of any front.
    let target = support::Kine::start(&pg.url("target"));
    assert!(slot::seed_root(&shared, &base.join("slot-b").join("root")).unwrap());
    let target_url = target.url();
    let on_target = Shard {
        base,
        etcd: &target_url,
        front: &front,
    };
    let b = start_slot(&runtime, &mut reaper, &on_target, "b", &version, &[&admin]).await;
    let b_ready = wait_ready(&runtime, &b, Duration::from_secs(180)).await;
    let (client_a, client_b) = (shard_admin(&a).await, shard_admin(&b).await);
    let kcp_admin_b = slot::admin_client(&front_kubeconfig, &slot::slot_url(b.port))
        .await
        .unwrap();
    let leader = slot::controllers_lease_holder(&client_a).await.unwrap();
    assert!(leader.is_some(), "a leads");

    // While a serves: b sees what a writes, and never leads (longer than a Lease lasts).
    let made_while_warm = slot::access::create_probe_workspace(&kcp_admin_a).await.unwrap();
    let written = Instant::now();
    let path = format!("{WORKSPACES}/{made_while_warm}");
    while send(&kcp_admin_b, http::Method::GET, &path, None).await.0 != 200 {
        assert!(written.elapsed() < Duration::from_secs(10), "b does not see a's write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen_after = written.elapsed();
    let (_, listed) = send(&kcp_admin_a, http::Method::GET, WORKSPACES, None).await;
    let old_version = serde_json::from_str::<serde_json::Value>(&listed).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(20) {
        assert_eq!(
            slot::controllers_lease_holder(&client_b).await.unwrap(),
            leader,
            "b took the Lease"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let b_log = String::from_utf8_lossy(&std::fs::read(&b.log).unwrap()).into_owned();
    assert!(!b_log.contains("Successfully acquired lease"), "b led while a ran");
    let lag = MirrorProgress::load(&progress).unwrap().unwrap();

    // The switch.
    let switch = Instant::now();
    let stop = runtime.terminate(&a.record, Duration::from_secs(30)).await.unwrap();
    let last = kcpshard::store::etcd_keys::revision(&source_client).await.unwrap();
    std::fs::write(job_dir.join("until"), "").unwrap();
    while mirror.is_running() {
        assert!(switch.elapsed() < Duration::from_secs(30), "the mirror did not end");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        mirror.exited().unwrap().success(),
        "{}",
        mirror.report("the mirror failed")
    );
    let done = MirrorProgress::load(&progress).unwrap().unwrap();
    assert!(
        done.applied_revision >= last,
        "the mirror ended at {done:?}, before a's last revision {last}"
    );
    let caught_up = switch.elapsed();
    assert!(slot::release_controllers_lease(&client_b).await.unwrap());
    let released = switch.elapsed();
    let probe = slot::probe_workspace(&kcp_admin_b, Duration::from_secs(60))
        .await
        .unwrap();
    let led = switch.elapsed();
    for name in [&made_before_copy, &made_while_warm] {
        let (status, body) = send(&kcp_admin_b, http::Method::GET, &format!("{WORKSPACES}/{name}"), None).await;
        assert_eq!(status, 200, "{name} is not on b: {body}");
    }
    let (status, body) = send(
        &kcp_admin_b,
        http::Method::GET,
        &format!("{WORKSPACES}?watch=true&timeoutSeconds=2&resourceVersion={old_version}"),
        None,
    )
    .await;
    assert!(
        status == 410 || body.contains("\"code\":410"),
        "a watch from a's resourceVersion {old_version} was not told to relist: {status} {body}"
    );
    eprintln!(
        "TIMINGS migration: copy of {} keys {copied_in:?}; b start->ready {b_ready:?}; a's write seen on b after {seen_after:?}; lag while warm {} revisions; \
         switch: a SIGTERM->exit {:?}, mirror caught up {caught_up:?}, Lease released {released:?}, probe Ready {led:?} (create->Ready {probe:?}); old watch: {status} {}",
        following.copied_keys,
        lag.lag(),
        stop.exited_after,
        body.chars().take(200).collect::<String>()
    );
}
