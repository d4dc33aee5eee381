//! `kcpshard adopt ROOT_DIR --dry-run` on a real kcp that serves from its own root directory with
//! its embedded etcd, started as a user runs it (docs/how-to/adopt.md, "Adopt a running kcp"): the
//! report names the process, its release, its store with a key count read through the embedded
//! etcd's own client certificates (ECDSA P-521) and equal to etcdctl's count at the same revision,
//! the key material, the admin contexts and the fate of each flag; it refuses another release, a
//! store it cannot read and a root directory nothing serves from, with what to do; and it leaves
//! the root directory as it was.
//!
//! Needs `bin/kcp-<version>` of the newer pinned release, `bin/kubectl` and `bin/etcdctl`
//! (`hack/install-deps.sh`); without them the test fails, it never skips.
mod support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use support::embedded_kcp::EmbeddedKcp;
use support::{files_under, kcp_newer, kcp_older, require, run};

fn dry_run(root: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kcpshard"));
    cmd.arg("adopt")
        .arg(root)
        .args(["--name", "adopted", "--dry-run"])
        .args(extra);
    run(cmd, Duration::from_secs(60))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The key count and the revision the report gives for kcp's prefix.
fn keys_in(report: &str) -> (i64, i64) {
    let parse = || {
        let (before, after) = report.split_once(" keys under /registry/ at revision ")?;
        let count = before.rsplit(' ').next()?.parse().ok()?;
        let revision = after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
        Some((count, revision))
    };
    parse().unwrap_or_else(|| panic!("no key count in:\n{report}"))
}

/// How many keys kcp's embedded etcd held under /registry/ at `revision`, as etcdctl counts them.
fn etcdctl_count(root: &Path, etcd_port: u16, revision: i64) -> i64 {
    let secrets = root.join("etcd-server/secrets");
    let mut cmd = Command::new(require("etcdctl"));
    cmd.arg(format!("--endpoints=https://localhost:{etcd_port}"))
        .arg(format!("--cacert={}", secrets.join("ca/cert.pem").display()))
        .arg(format!("--cert={}", secrets.join("client/cert.pem").display()))
        .arg(format!("--key={}", secrets.join("client/key.pem").display()))
        .args(["get", "/registry/", "--prefix", "--count-only", "--write-out=fields"])
        .arg(format!("--rev={revision}"));
    let out = run(cmd, Duration::from_secs(30));
    let fields = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = fields
        .lines()
        .find_map(|l| l.strip_prefix("\"Count\" : "))
        .and_then(|n| n.trim().parse().ok());
    count.unwrap_or_else(|| {
        panic!(
            "etcdctl gave no count: {fields}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_dry_run_reports_a_running_kcp_and_refuses_what_it_cannot_adopt_without_changing_it() {
    let version = kcp_newer();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("kcp root");
    let mut kcp = EmbeddedKcp::start(&version, &root, &["--v=2"]);
    let (port, etcd_port) = (kcp.port, kcp.etcd_port);

    // The report, on a kcp that serves.
    let before = files_under(&root, &["etcd-server/member"]);
    let out = dry_run(&root, &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    let canonical = root.canonicalize().unwrap();
    for expected in [
        format!("kcp on {}", canonical.display()),
        format!(
            "pid {} (uid {}), kcp {version}",
            kcp.proc.pid(),
            fs::metadata("/proc/self").unwrap().uid()
        ),
        format!("serving https://127.0.0.1:{port}"),
        format!("its embedded etcd (https://localhost:{etcd_port}"),
        "apiserver.crt".to_string(),
        "sa.key".to_string(),
        "base (kcp-admin)".to_string(),
        "system:admin (shard-admin)".to_string(),
        "--v=2  kept".to_string(),
        "--bind-address=127.0.0.1  taken over".to_string(),
        format!("--embedded-etcd-client-port={etcd_port}  dropped"),
        format!("adoptable into a shard of kcp {version}"),
    ] {
        assert!(
            report.contains(&expected),
            "{expected:?} is not in the report:\n{report}"
        );
    }

    // The key count is the store's, as etcd's own client counts it at the same revision; and a new
    // object is counted.
    let (keys, revision) = keys_in(&report);
    assert!(keys > 100, "a kcp that served has its bootstrap objects: {report}");
    assert_eq!(etcdctl_count(&root, etcd_port, revision), keys);
    kcp.kubectl(&[
        "create",
        "configmap",
        "adopt-probe",
        "--namespace=default",
        "--from-literal=a=b",
    ])
    .unwrap_or_else(|| kcp.proc.fail("cannot create a ConfigMap"));
    let (after, at) = keys_in(&text(&dry_run(&root, &[])));
    assert_eq!(etcdctl_count(&root, etcd_port, at), after);
    assert!(
        after > keys,
        "the ConfigMap's key is counted: {keys} keys before, {after} after"
    );

    // Another release than the one running: refused, with the way to get there.
    let out = dry_run(&root, &["--version", &kcp_older()]);
    assert!(!out.status.success());
    let expected = format!(
        "kcp {version} runs on {}, and the shard is to run {}: adopt it at the release it runs (--version {version}), then roll",
        canonical.display(),
        kcp_older()
    );
    assert!(text(&out).contains(&expected), "{}", text(&out));

    // A store it cannot read: refused, naming the store and the cause.
    let key = root.join("etcd-server/secrets/client/key.pem");
    let aside = tmp.path().join("key.pem");
    fs::rename(&key, &aside).unwrap();
    let out = dry_run(&root, &[]);
    fs::rename(&aside, &key).unwrap();
    assert!(!out.status.success());
    let expected = format!("cannot read kcp's store, its embedded etcd (https://localhost:{etcd_port}");
    assert!(
        text(&out).contains(&expected) && text(&out).contains("client/key.pem"),
        "{}",
        text(&out)
    );

    assert_eq!(
        files_under(&root, &["etcd-server/member"]),
        before,
        "a dry run writes nothing into the root directory"
    );

    // Nothing serves from it any more: refused, saying to start it.
    kcp.proc.stop();
    let out = dry_run(&root, &[]);
    assert!(!out.status.success());
    let expected = format!("no kcp runs with the root directory {}", canonical.display());
    assert!(text(&out).contains(&expected), "{}", text(&out));
}

#[test]
fn a_directory_that_is_no_kcp_root_or_that_no_kcp_serves_from_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let out = dry_run(&empty, &[]);
    assert!(!out.status.success());
    let expected = format!(
        "{} is not a kcp root directory: it has no admin.kubeconfig or apiserver.crt (kcp writes it at its first start); name the directory kcp runs with (its --root-directory)",
        empty.canonicalize().unwrap().display()
    );
    assert!(text(&out).contains(&expected), "{}", text(&out));

    let stopped = tmp.path().join("stopped");
    fs::create_dir(&stopped).unwrap();
    for file in [
        "admin.kubeconfig",
        "apiserver.crt",
        "apiserver.key",
        "sa.key",
        ".admin-token-store",
    ] {
        fs::write(stopped.join(file), "").unwrap();
    }
    let out = dry_run(&stopped, &[]);
    assert!(!out.status.success());
    let expected = format!(
        "no kcp runs with the root directory {dir}: start it as it ran before (kcp start --root-directory={dir} ...)",
        dir = stopped.canonicalize().unwrap().display()
    );
    assert!(text(&out).contains(&expected), "{}", text(&out));

    // Without --dry-run: the same refusal, before any KcpShard is written.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kcpshard"));
    cmd.arg("adopt").arg(&stopped).args(["--name", "adopted"]);
    let out = run(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(text(&out).contains(&expected), "{}", text(&out));
}
