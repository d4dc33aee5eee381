//! Two real kcp slots on one real kine (sqlite), started and stopped by the process runtime: the
//! slot argv, the shared material, readiness on each slot's own port, the shard-admin token
//! across slots, the lease hand-over and the workspace probe.
//!
//! Needs `bin/kcp-<version>` for both kcp versions pinned in hack/versions.env and `bin/kine`
//! (`hack/install-deps.sh`); without them the test fails,
//! it never skips. Every process it starts is SIGKILLed at the end, pass or fail.
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kcpshard::process::{ProcessRecord, ProcessSpec, Runtime, UnitName, free_port, procfs};
use kcpshard::slot::{self, SlotLaunch};
use kcpshard::store;

/// A pin from hack/versions.env (`KCP_VERSION_NEWER`, `KCP_VERSION_OLDER`): the kcp releases
/// `hack/install-deps.sh` builds into `bin/kcp-<version>`.
fn pin(key: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/versions.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("{} has no {key}", path.display()))
}

fn bin_dir() -> PathBuf {
    std::env::var_os("KCPSHARD_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("bin"))
}

fn require(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    if !p.is_file() {
        panic!(
            "{} is missing: run hack/install-deps.sh (a missing component fails this test, it never skips{})",
            p.display(),
            if std::env::var("CI").as_deref() == Ok("true") {
                "; CI=true"
            } else {
                ""
            }
        );
    }
    p
}

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
    root: PathBuf,
    log: PathBuf,
    record: ProcessRecord,
    started: Instant,
}

async fn start_slot(
    runtime: &Runtime,
    reaper: &mut Reaper,
    base: &Path,
    name: &str,
    version: &str,
    etcd: &str,
    front: &str,
) -> Slot {
    let kcp = require(&format!("kcp-{version}"));
    let dir = base.join(format!("slot-{name}"));
    let root = dir.join("root");
    let port = free_port().unwrap();
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
        extra_args: Vec::new(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slots_share_a_store_material_and_the_shard_admin_and_hand_over_the_lease() {
    let newer = pin("KCP_VERSION_NEWER");
    hand_over(&newer, &newer).await;
}

/// The same hand-over from the older pinned kcp to the newer one (a version roll's slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_bump_hands_over_from_the_older_kcp_to_the_newer() {
    hand_over(&pin("KCP_VERSION_OLDER"), &pin("KCP_VERSION_NEWER")).await;
}

async fn hand_over(version_a: &str, version_b: &str) {
    require(&format!("kcp-{version_a}"));
    require(&format!("kcp-{version_b}"));
    let kine = require("kine");
    let tmp = tempfile::Builder::new().prefix("kcpshard-slots-").tempdir().unwrap();
    let base = tmp.path();
    let shared = base.join("shared");
    let runtime = Runtime::new();
    let mut reaper = Reaper { procs: Vec::new() };
    // The front is not part of this test; its URL only has to be what every slot advertises.
    let front = format!("https://127.0.0.1:{}", free_port().unwrap());

    let t = Instant::now();
    let k = store::ensure_kine_sqlite(&runtime, &kine, &base.join("store"), "real")
        .await
        .unwrap();
    reaper.add(&k.record, &base.join("store").join(store::kine::LOG_FILE));
    let kine_ready = t.elapsed();
    assert!(!k.adopted);
    // A second call adopts the same kine instead of starting another on the sqlite file.
    let again = store::ensure_kine_sqlite(&runtime, &kine, &base.join("store"), "real")
        .await
        .unwrap();
    assert!(again.adopted);
    assert_eq!(again.record, k.record);

    // Slot a: the first slot makes the shard's material.
    let root_a = base.join("slot-a").join("root");
    assert!(!slot::seed_root(&shared, &root_a).unwrap());
    let a = start_slot(&runtime, &mut reaper, base, "a", version_a, &k.endpoint, &front).await;
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

    // Slot b: seeded from the shard's material, same store.
    let root_b = base.join("slot-b").join("root");
    assert!(slot::seed_root(&shared, &root_b).unwrap());
    let b = start_slot(&runtime, &mut reaper, base, "b", version_b, &k.endpoint, &front).await;
    let b_ready = wait_ready(&runtime, &b, Duration::from_secs(180)).await;
    slot::capture_shared(&b.root, &shared).unwrap();

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
    // The probe needs a real identity: b's own kcp-admin (the shard admin's workspaces stay in
    // Initializing: "no createdBy recorded").
    let kcp_admin_b = slot::kcp_admin_client(&b.root.join("admin.kubeconfig"), &slot::slot_url(b.port))
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
    let stop_kine = store::stop_kine_sqlite(&runtime, &base.join("store"), "real", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(stop_kine.is_some());
    assert!(!runtime.is_running(&k.record));

    eprintln!(
        "TIMINGS {version_a}->{version_b}: kine start->accepting {kine_ready:?}; slot a start->ready {a_ready:?} (fresh store); slot b start->ready {b_ready:?} (existing store); \
         a SIGTERM->exit {:?} (shutdown delay 1s); lease release->new leader {release_to_leader:?}, ->probe Ready {release_to_ready:?} (probe create->Ready {probe:?}); \
         b SIGTERM->exit {:?}; kcp-admin token of b accepted by a: {kcp_admin_ok}; lease holder {holder_before:?} -> {holder_after:?}",
        stop.exited_after, stop_b.exited_after
    );
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
    assert!(store::kine::port_accepts(first.port).await);
    assert!(dir.join(store::kine::DB_FILE).exists());

    // A restarted serve (a new runtime) adopts it from its record.
    let restarted = Runtime::new();
    let adopted = store::ensure_kine_sqlite(&restarted, &kine, &dir, "real")
        .await
        .unwrap();
    assert!(adopted.adopted);
    assert_eq!(adopted.record, first.record);
    assert_eq!(adopted.endpoint, first.endpoint);

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
    let extra_port = free_port().unwrap();
    let extra = runtime
        .start(&ProcessSpec::new(
            "extra-kine",
            UnitName::other("extra-kine"),
            kine.clone(),
            store::kine::kine_args(
                &store::kine::sqlite_endpoint(&std::path::absolute(&dir).unwrap()),
                extra_port,
                None,
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
