//! End to end on real kcp and kine: GitOps. `kcpshard serve --manifests`
//! points at a git repository holding a KcpShard at the older pinned kcp release; once the shard
//! is Ready, a commit that bumps spec.version to the newer release is pushed to that repository,
//! and with no other action the shard rolls: status.lastRoll completes on the newer version, the
//! active slot runs it, and the events tell the story (ManifestApplied, then RollComplete).
//!
//! The commit is made in a clone and pushed; the repository used as the manifests dir accepts
//! pushes to its checked-out branch and updates its files (`receive.denyCurrentBranch
//! updateInstead`), which is how a commit reaches a checkout that nobody pulls by hand. Commits
//! made in the checkout itself are covered, without kcp, by tests/gitops.rs.
//!
//! One roll only (each start of kcp costs seconds). Components come from bin/
//! (hack/install-deps.sh); a missing one fails, never skips. Needs the `git` binary.
mod e2e;
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chrono::Utc;
use e2e::*;
use serde_json::Value;

const SHARD: &str = "gitops";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const ROLL_TIMEOUT: Duration = Duration::from_secs(300);

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "e2e")
        .env("GIT_AUTHOR_EMAIL", "e2e@example.invalid")
        .env("GIT_COMMITTER_NAME", "e2e")
        .env("GIT_COMMITTER_EMAIL", "e2e@example.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("the git binary is needed for this test (apt-get install git): {e}"));
    assert!(
        out.status.success(),
        "git {} in {} failed: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn manifest(version: &str, front: &str) -> String {
    format!(
        "# The shard this host runs; a commit here rolls it.\n\
         apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata:\n  name: {SHARD}\nspec:\n  version: {version}\n  \
         store:\n    type: KineSqlite\n  front:\n    type: Tcp\n    listen: {front}\n"
    )
}

/// The version status.slots gives for the active slot.
fn active_version(object: &Value) -> Option<String> {
    let active = active_slot(object)?;
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == active.as_str())?["version"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_commit_that_bumps_spec_version_rolls_the_shard_with_no_other_action() {
    let (older, newer) = (kcp_older(), kcp_newer());
    require_components(&[&older, &newer]);

    // The repository serve reads, with the shard at the older release.
    let repos = tempfile::Builder::new().prefix("kcpshard-gitops-").tempdir().unwrap();
    let checkout = repos.path().join("manifests");
    std::fs::create_dir_all(checkout.join("shards")).unwrap();
    git(&checkout, &["init", "-q", "-b", "main"]);
    git(&checkout, &["config", "receive.denyCurrentBranch", "updateInstead"]);
    let front = format!("127.0.0.1:{}", free_port());
    std::fs::write(checkout.join("shards/gitops.yaml"), manifest(&older, &front)).unwrap();
    git(&checkout, &["add", "."]);
    git(&checkout, &["commit", "-q", "-m", &format!("{SHARD}: kcp {older}")]);

    let mut env = Env::start_with(&["--manifests", checkout.to_str().unwrap()]).await;
    env.log(&format!("serve --manifests {}", checkout.display()));
    let ready = env.wait_ready(SHARD, READY_TIMEOUT).await;
    assert_eq!(
        active_version(&ready).as_deref(),
        Some(older.as_str()),
        "{}",
        ready["status"]
    );
    env.log(&format!("{SHARD} Ready on {older} (slot {:?})", active_slot(&ready)));

    // The commit, in a clone, pushed; nothing else.
    let clone = repos.path().join("clone");
    git(
        repos.path(),
        &["clone", "-q", checkout.to_str().unwrap(), clone.to_str().unwrap()],
    );
    std::fs::write(clone.join("shards/gitops.yaml"), manifest(&newer, &front)).unwrap();
    git(
        &clone,
        &["commit", "-q", "-am", &format!("{SHARD}: kcp {older} -> {newer}")],
    );
    let requested = Utc::now();
    git(&clone, &["push", "-q", "origin", "main"]);
    env.log(&format!("pushed the commit {older} -> {newer}"));

    let done = env
        .until(
            SHARD,
            ROLL_TIMEOUT,
            &format!("the roll to {newer} to complete (lastRoll.completedAt, Ready=True, Progressing=False)"),
            |o| {
                (roll_phase(&o["status"]["lastRoll"], "completedAt", requested).is_some()
                    && ready_now(o)
                    && condition_is(o, "Progressing", "False"))
                .then(|| o.clone())
            },
        )
        .await;
    let last_roll = &done["status"]["lastRoll"];
    assert_eq!(last_roll["fromVersion"], older.as_str(), "{last_roll}");
    assert_eq!(last_roll["toVersion"], newer.as_str(), "{last_roll}");
    assert_eq!(done["spec"]["version"], newer.as_str());
    assert_eq!(
        active_version(&done).as_deref(),
        Some(newer.as_str()),
        "{}",
        done["status"]
    );
    assert_ne!(
        active_slot(&done),
        active_slot(&ready),
        "the active slot did not change"
    );
    let slots = done["status"]["slots"].as_array().cloned().unwrap_or_default();
    assert_eq!(slots.len(), 1, "status.slots after the roll: {slots:?}");
    let timings = roll_timings(last_roll).unwrap_or_else(|e| env.fail(&e));
    env.log(&format!(
        "roll {older} -> {newer} from a pushed commit completed; it started {:.2}s after the push:\n{}",
        (timings[0].1 - requested).num_milliseconds() as f64 / 1000.0,
        format_timings(&timings)
    ));

    for line in std::fs::read_to_string(env.serve_log())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("kcpshard::gitops") && !l.contains("DEBUG"))
    {
        env.log(&format!("serve: {line}"));
    }

    // What `kubectl describe` shows: the apply from the manifests dir, then the roll.
    let events = env.events(SHARD).await;
    let summary = summarize_events(&events);
    let applied = events.iter().position(|e| {
        e.reason.as_deref() == Some("ManifestApplied")
            && e.message.as_deref().is_some_and(|m| {
                m.contains("shards/gitops.yaml") && m.contains(&format!("spec.version {older} -> {newer}"))
            })
    });
    let completed = events.iter().rposition(|e| e.reason.as_deref() == Some("RollComplete"));
    assert!(
        applied.is_some() && completed.is_some() && applied < completed,
        "expected ManifestApplied (the commit) before RollComplete:\n{summary}"
    );
    assert!(
        !events.iter().any(|e| e.reason.as_deref() == Some("ManifestInvalid")),
        "a manifest was reported invalid:\n{summary}"
    );

    let left = env.shutdown(&[SHARD]).await;
    assert!(left.is_empty(), "processes left: {left:?}");
}
