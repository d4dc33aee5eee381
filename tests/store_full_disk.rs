//! A full disk under a KineSqlite store (docs/reliability.md, "A full disk under the store"): the
//! pinned kine, with kcpshard's DSN and arguments, on an 8 MiB tmpfs that a file fills to within
//! 1 MiB; then creates and updates shaped as kcp's (etcd transactions: create if the key is absent;
//! update if the key is unchanged since the revision read, else read it) until the disk refuses
//! them.
//!
//! Checks: every create kine acknowledged is there with its value, and every key holds its last
//! acknowledged update, while the disk is full, once space is freed, and after a SIGKILL and a
//! restart of kine; every create kine did not acknowledge failed with an error the client saw
//! ("database or disk is full") and is absent; an update kine did not make answered "not
//! succeeded" (kcp's apiserver takes that as a conflict and tries again, never as a success).
//! The free-space verdict on the tmpfs says Full while it is full. kine v0.17.3 to v0.17.5 fail
//! here: they acknowledge creates they never wrote.
//!
//! The tmpfs needs root (CAP_SYS_ADMIN): without it the test fails and says so; it never skips.
mod support;
mod tmpfs;

use std::collections::BTreeMap;
use std::time::Instant;

use base64::Engine;
use kcpshard::store::disk::{Level, Watermark, free_space, verdict};
use support::Kine;
use tmpfs::{Tmpfs, fill};

/// Each value: large enough that the 1 MiB left fills within a few dozen writes.
const VALUE_BYTES: usize = 16 * 1024;
/// Creates written before the disk is filled (all must be acknowledged).
const BEFORE_FILL: usize = 4;
/// The test stops once this many creates in a row were refused.
const REFUSED_IN_A_ROW: usize = 6;
/// A bound on the writes after the fill, should the disk never refuse one.
const MAX_WRITES: usize = 300;
const FULL: &str = "database or disk is full";
const PREFIX: &str = "/registry/configmaps/default/";
/// The default watermark scaled down to the 8 MiB tmpfs (its floor alone is 64 MiB).
const TMPFS_WATERMARK: Watermark = Watermark {
    fraction: 0.10,
    floor: 2 << 20,
    ceiling: 1 << 30,
    full: 512 << 10,
};

#[derive(Debug)]
enum Outcome {
    /// The transaction succeeded: kcp would answer 201 or 200.
    Acked { revision: i64 },
    /// It answered "not succeeded": the compare failed.
    NotSucceeded,
    /// etcdctl failed, with what it printed.
    Failed(String),
}

fn txn(kine: &Kine, request: &str) -> Outcome {
    let out = kine.etcdctl_with_input(&["txn", "-w", "json"], Some(request.as_bytes()));
    if !out.status.success() {
        return Outcome::Failed(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("etcdctl txn answered {e}: {}", String::from_utf8_lossy(&out.stdout)));
    match answer["succeeded"].as_bool() {
        Some(true) => Outcome::Acked {
            revision: answer["header"]["revision"].as_i64().expect("a revision in the header"),
        },
        _ => Outcome::NotSucceeded,
    }
}

/// kcp's create: put the key if it does not exist.
fn create(kine: &Kine, key: &str, value: &str) -> Outcome {
    txn(kine, &format!("mod(\"{key}\") = \"0\"\n\nput {key} {value}\n\n\n"))
}

/// kcp's update: put the key if it is at `revision`, else read it.
fn update(kine: &Kine, key: &str, revision: i64, value: &str) -> Outcome {
    txn(
        kine,
        &format!("mod(\"{key}\") = \"{revision}\"\n\nput {key} {value}\n\nget {key}\n\n"),
    )
}

fn value_for(key: &str, version: usize) -> String {
    format!("{key}:v{version}:{}", "x".repeat(VALUE_BYTES))
}

/// Every key the test writes (under [`PREFIX`]; kine keeps keys of its own, `/registry/health`),
/// with its value.
fn read_all(kine: &Kine) -> BTreeMap<String, String> {
    let out = kine.etcdctl(&["get", "--prefix", PREFIX, "-w", "json"]);
    assert!(
        out.status.success(),
        "etcdctl get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let decode = |v: &serde_json::Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    answer["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| (decode(&kv["key"]), decode(&kv["value"])))
                .collect()
        })
        .unwrap_or_default()
}

/// What kine acknowledged, and what it refused.
#[derive(Default)]
struct Ledger {
    /// key -> (last acknowledged value, its revision)
    acked: BTreeMap<String, (String, i64)>,
    refused_creates: Vec<(String, String)>,
    acked_after_fill: usize,
    updates_acked: usize,
    updates_not_made: usize,
}

impl Ledger {
    fn check(&self, kine: &Kine, when: &str) {
        let seen = read_all(kine);
        for (key, (value, _)) in &self.acked {
            match seen.get(key) {
                None => panic!("{when}: {key} was acknowledged and is gone"),
                Some(v) if v != value => panic!(
                    "{when}: {key} holds {} instead of its last acknowledged value {}",
                    &v[..v.len().min(40)],
                    &value[..40]
                ),
                Some(_) => {}
            }
        }
        for (key, _) in &self.refused_creates {
            assert!(!seen.contains_key(key), "{when}: {key} was refused and is there");
        }
    }
}

#[test]
fn a_full_disk_under_kine_refuses_writes_and_loses_none_it_acknowledged() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let tmpfs = Tmpfs::mount(&store, "8m");
    let mut kine = Kine::kcpshard_sqlite(&store);
    let mut ledger = Ledger::default();

    let spaces = free_space(&[&store]).unwrap();
    assert_eq!(spaces.len(), 1, "{spaces:?}");
    assert_eq!(
        (spaces[0].mount_point.as_path(), spaces[0].total),
        (tmpfs.at.as_path(), 8 << 20)
    );
    assert_eq!(
        verdict(&spaces, &TMPFS_WATERMARK),
        None,
        "an empty store has room: {spaces:?}"
    );

    for i in 0..BEFORE_FILL {
        let key = format!("{PREFIX}before-{i}");
        let value = value_for(&key, 0);
        match create(&kine, &key, &value) {
            Outcome::Acked { revision } => ledger.acked.insert(key, (value, revision)),
            other => panic!("a create with room on the disk answered {other:?}"),
        };
    }

    let filler = fill(&store, 1 << 20);
    let mut refused_in_a_row = 0;
    for i in 0..MAX_WRITES {
        if refused_in_a_row == REFUSED_IN_A_ROW {
            break;
        }
        let key = format!("{PREFIX}cm-{i}");
        let value = value_for(&key, 0);
        match create(&kine, &key, &value) {
            Outcome::Acked { revision } => {
                ledger.acked.insert(key, (value, revision));
                ledger.acked_after_fill += 1;
                refused_in_a_row = 0;
            }
            Outcome::Failed(error) => {
                ledger.refused_creates.push((key, error));
                refused_in_a_row += 1;
            }
            Outcome::NotSucceeded => panic!("a create of the new key {key} answered \"not succeeded\""),
        }
        // Every third write also updates an earlier key, as kcp's controllers do.
        if i % 3 == 0 {
            let (key, (_, revision)) = ledger
                .acked
                .iter()
                .nth(i / 3 % ledger.acked.len())
                .map(|(k, v)| (k.clone(), v.clone()))
                .unwrap();
            let value = value_for(&key, i + 1);
            match update(&kine, &key, revision, &value) {
                Outcome::Acked { revision } => {
                    ledger.acked.insert(key, (value, revision));
                    ledger.updates_acked += 1;
                }
                Outcome::NotSucceeded | Outcome::Failed(_) => ledger.updates_not_made += 1,
            }
        }
    }
    println!(
        "MEASURE full disk under kine: {} creates acknowledged after the fill, {} refused; updates {} acknowledged, {} not made; {:.1}s",
        ledger.acked_after_fill,
        ledger.refused_creates.len(),
        ledger.updates_acked,
        ledger.updates_not_made,
        started.elapsed().as_secs_f64()
    );
    ledger.check(&kine, "while the disk is full");
    assert_eq!(
        refused_in_a_row, REFUSED_IN_A_ROW,
        "the disk never refused {REFUSED_IN_A_ROW} creates in a row within {MAX_WRITES} writes"
    );
    assert!(
        ledger.acked_after_fill > 0,
        "no create was acknowledged in the 1 MiB left: the test proves nothing"
    );
    for (key, error) in &ledger.refused_creates {
        assert!(
            error.contains(FULL),
            "the create of {key} failed with {error:?}, not {FULL:?}"
        );
    }
    let problem = verdict(&free_space(&[&store]).unwrap(), &TMPFS_WATERMARK).expect("a full tmpfs is a problem");
    assert_eq!(problem.level, Level::Full, "{}", problem.message);
    assert!(
        problem.message.contains(&store.display().to_string()),
        "{}",
        problem.message
    );

    std::fs::remove_file(&filler).unwrap();
    ledger.check(&kine, "once space is freed");
    assert_eq!(verdict(&free_space(&[&store]).unwrap(), &TMPFS_WATERMARK), None);
    let key = format!("{PREFIX}after");
    let value = value_for(&key, 0);
    match create(&kine, &key, &value) {
        Outcome::Acked { revision } => ledger.acked.insert(key, (value, revision)),
        other => panic!("a create after space was freed answered {other:?}"),
    };

    kine.proc.stop_signal = libc::SIGKILL;
    kine.proc.stop();
    let kine = Kine::kcpshard_sqlite(&store);
    ledger.check(&kine, "after a SIGKILL and a restart of kine");
    let unexpected: Vec<String> = read_all(&kine)
        .into_keys()
        .filter(|k| !ledger.acked.contains_key(k))
        .collect();
    assert!(unexpected.is_empty(), "keys never acknowledged: {unexpected:?}");
    println!("MEASURE full-disk test took {:.1}s", started.elapsed().as_secs_f64());
}
