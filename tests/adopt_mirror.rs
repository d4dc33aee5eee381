//! The store half of adopting a running kcp (docs/how-to/adopt.md, "Adopt a running kcp"): `kcpshard
//! job store-mirror` copies a real kcp's embedded etcd, through the client certificate kcp made for
//! it, into a KineSqlite store while kcp serves and takes writes; follows it until kcp exits (and
//! its etcd with it); then reads the last changes from a copy of the etcd's data directory, opened
//! by an etcd of the job's own. Every object kcp acknowledged is in the new store, the job checked
//! every key of the old store as of its last change, and the kcp root directory is unchanged.
//!
//! Needs `bin/kcp-<version>` of the newer pinned release, `bin/kubectl`, `bin/kine` and
//! `bin/etcd` (`hack/install-deps.sh`); without them the test fails, it never skips.
mod support;

use std::fs;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::GetOptions;
use kcpshard::adopt::OldStore;
use kcpshard::store::etcd_keys::{self, KCP_PREFIX};
use kcpshard::store::mirror::{MirrorPhase, MirrorProgress};
use support::embedded_kcp::EmbeddedKcp;
use support::{Kine, files_under, kcp_newer, poll, require, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kcps_embedded_etcd_is_mirrored_while_kcp_serves_and_to_its_last_change_after_kcp_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let mut kcp = EmbeddedKcp::start(&kcp_newer(), &root, &[]);
    let found = kcpshard::adopt::inspect(&root).await.unwrap();
    let OldStore::Embedded { directory, cluster } = found.store.clone() else {
        panic!(
            "kcp started without --etcd-servers runs its embedded etcd: {:?}",
            found.store
        )
    };

    // A client creating ConfigMaps all along; the names kcp acknowledged are what must not be lost.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, kubeconfig) = (stop.clone(), root.join("admin.kubeconfig"));
        std::thread::spawn(move || {
            let mut acknowledged = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("adopt-{i:04}");
                let mut cmd = Command::new(require("kubectl"));
                cmd.arg("--kubeconfig").arg(&kubeconfig).args([
                    "create",
                    "configmap",
                    &name,
                    "--namespace=default",
                    "--from-literal=a=b",
                ]);
                if run(cmd, Duration::from_secs(30)).status.success() {
                    acknowledged.push(name);
                }
                i += 1;
            }
            acknowledged
        })
    };

    let (job_dir, store_dir) = (tmp.path().join("job"), tmp.path().join("store"));
    fs::create_dir(&job_dir).unwrap();
    fs::create_dir(&store_dir).unwrap();
    let tls = &cluster.tls;
    let job = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["job", "store-mirror", "--from-endpoint", &cluster.endpoints[0]])
        .arg("--from-cacert")
        .arg(tls.ca_file.as_ref().unwrap())
        .arg("--from-cert")
        .arg(tls.cert_file.as_ref().unwrap())
        .arg("--from-key")
        .arg(tls.key_file.as_ref().unwrap())
        .arg("--from-data-dir")
        .arg(&directory)
        .arg("--etcd-binary")
        .arg(require("etcd"))
        .args(["--to-store", r#"{"type":"KineSqlite"}"#])
        .arg("--to-store-dir")
        .arg(&store_dir)
        .arg("--kine-binary")
        .arg(require("kine"))
        .arg("--progress")
        .arg(job_dir.join("progress.json"))
        .arg("--until")
        .arg(job_dir.join("until"))
        .current_dir(&job_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let progress = job_dir.join("progress.json");
    let following = poll(Duration::from_secs(60), Duration::from_millis(50), || {
        MirrorProgress::load(&progress)
            .unwrap()
            .filter(|p| p.phase == MirrorPhase::Following)
    })
    .unwrap_or_else(|| kcp.proc.fail("the mirror did not report following within 60 s"));
    println!(
        "MEASURE copied {} keys of kcp's embedded etcd at revision {:?}",
        following.copied_keys, following.copy_revision
    );

    // kcp goes on taking writes for 2 s, then stops (SIGTERM) while the client still writes.
    std::thread::sleep(Duration::from_secs(2));
    kcp.proc.stop();
    stop.store(true, Ordering::SeqCst);
    let acknowledged = writer.join().unwrap();
    assert!(!acknowledged.is_empty(), "kcp acknowledged no write");
    let root_before = files_under(&root, &[]);

    // kcp has exited: the job reads the rest from a copy of its etcd's data.
    let (done, stdout, took) = support::finish_mirror(job, &job_dir.join("until"), &progress).await;
    assert!(
        done.applied_changes > 0,
        "nothing was written while it followed: {done:?}"
    );
    println!(
        "MEASURE {} ConfigMaps acknowledged; {} changes applied after the copy; done {:.2}s after the until file ({})",
        acknowledged.len(),
        done.applied_changes,
        took.as_secs_f64(),
        stdout
    );
    assert_eq!(
        files_under(&root, &[]),
        root_before,
        "the job changed kcp's root directory"
    );

    // Every acknowledged ConfigMap is in the new store, and the job checked every key it holds.
    let kine = Kine::kcpshard_sqlite(&store_dir);
    let target = etcd_keys::connect(&[kine.url()], None).await.unwrap();
    // Its latest keys (a read at a revision could be ahead of what this new kine has polled).
    let latest = target
        .kv_client()
        .get(KCP_PREFIX, Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    let keys: Vec<String> = latest
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .filter(|k| k != "/registry/health")
        .collect();
    let configmaps: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains("/configmaps/") && k.contains("/default/adopt-"))
        .collect();
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|name| !configmaps.iter().any(|k| k.ends_with(&format!("/default/{name}"))))
        .collect();
    assert!(missing.is_empty(), "acknowledged but not in the new store: {missing:?}");
    assert_eq!(done.verified_keys, Some(keys.len() as u64), "{done:?}");
}
