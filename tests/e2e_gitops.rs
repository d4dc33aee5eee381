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
//! Before that, on the same shard: the real kubectl's server-side dry runs (an apply of the newer
//! version, a patch, a delete) change nothing: the object keeps its spec and generation and the slot
//! keeps running, with no roll. Then a commit that only drops `kcp.extraArgs` from the file takes
//! them off the object (server-side apply under `kcpshard-gitops`), and the controller rolls to a
//! slot whose kcp runs without them.
//!
//! Two rolls (each start of kcp costs seconds). Components come from bin/ (hack/install-deps.sh);
//! a missing one fails, never skips. Needs the `git` binary.
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

/// The log verbosity flag the first commit gives kcp, and the second takes away.
const EXTRA_ARG: &str = "--v=3";

fn manifest(version: &str, front: &str, extra_args: bool) -> String {
    let kcp = if extra_args {
        format!("  kcp:\n    extraArgs: [\"{EXTRA_ARG}\"]\n")
    } else {
        String::new()
    };
    format!(
        "# The shard this host runs; a commit here rolls it.\n\
         apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata:\n  name: {SHARD}\nspec:\n  version: {version}\n  \
         store:\n    type: KineSqlite\n  front:\n    type: Tcp\n    listen: {front}\n{kcp}"
    )
}

/// The argv of a process.
fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The real kubectl against serve's API, with `stdin`; fails the test unless it succeeds.
fn kubectl(env: &Env, args: &[&str], stdin: Option<&str>) -> String {
    let mut command = Command::new(support::require("kubectl"));
    command
        .arg(format!("--kubeconfig={}", env.state.join("kubeconfig").display()))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("run kubectl");
    {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        env.fail(&format!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let front = format!("127.0.0.1:{}", test_port());
    std::fs::write(checkout.join("shards/gitops.yaml"), manifest(&older, &front, true)).unwrap();
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
    let first_pid = active_pid(&ready).expect("the active slot has a pid");
    assert!(
        cmdline(first_pid).iter().any(|a| a == EXTRA_ARG),
        "{:?}",
        cmdline(first_pid)
    );

    // Server-side dry runs of an upgrade and of a delete: answered, and nothing happens.
    // (The controller may still write status meanwhile; what a dry run must not touch is the spec,
    // its generation and the processes. tests/kubectl.rs checks the resourceVersion, without a
    // controller.)
    let (generation, spec) = (ready["metadata"]["generation"].clone(), ready["spec"].clone());
    let upgrade = manifest(&newer, &front, true);
    let out = kubectl(
        &env,
        &[
            "apply",
            "--server-side",
            "--field-manager=kcpshard-gitops",
            "--dry-run=server",
            "-o",
            "jsonpath={.spec.version}",
            "-f",
            "-",
        ],
        Some(&upgrade),
    );
    assert_eq!(out, newer, "the dry run answers the upgraded object");
    let patch = format!(r#"{{"spec":{{"version":"{newer}"}}}}"#);
    kubectl(
        &env,
        &["patch", "ks", SHARD, "--type=merge", "--dry-run=server", "-p", &patch],
        None,
    );
    let out = kubectl(&env, &["delete", "ks", SHARD, "--dry-run=server"], None);
    assert!(out.contains("deleted (server dry run)"), "{out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = env.get(SHARD).await.expect("the shard is still there");
    assert_eq!(
        after["metadata"]["generation"], generation,
        "a dry run was stored: {after}"
    );
    assert_eq!(after["spec"], spec, "a dry run was stored: {after}");
    assert!(after["metadata"]["deletionTimestamp"].is_null(), "{after}");
    assert_eq!(active_pid(&after), Some(first_pid), "{}", after["status"]);
    assert!(alive(first_pid), "the slot's kcp stopped after the dry runs");
    env.log("dry runs of apply, patch and delete: same spec and generation, same slot process, no roll");

    // A commit that only drops the extra arguments: they leave the object, and the shard rolls.
    let clone = repos.path().join("clone");
    git(
        repos.path(),
        &["clone", "-q", checkout.to_str().unwrap(), clone.to_str().unwrap()],
    );
    let dropped_at = push(
        &clone,
        &manifest(&older, &front, false),
        &format!("{SHARD}: no extra kcp arguments"),
    );
    let rolled = env
        .until(
            SHARD,
            ROLL_TIMEOUT,
            "extraArgs gone from the object and a roll to a slot without them",
            |o| {
                (o["spec"]["kcp"]["extraArgs"].as_array().is_none_or(Vec::is_empty)
                    && roll_phase(&o["status"]["lastRoll"], "completedAt", dropped_at).is_some()
                    && ready_now(o))
                .then(|| o.clone())
            },
        )
        .await;
    let second_pid = active_pid(&rolled).expect("the active slot has a pid");
    assert_ne!(second_pid, first_pid);
    assert!(
        !cmdline(second_pid).iter().any(|a| a == EXTRA_ARG),
        "the new slot still runs with {EXTRA_ARG}: {:?}",
        cmdline(second_pid)
    );
    env.log(&format!(
        "extraArgs dropped in git: rolled to slot {:?} without {EXTRA_ARG}",
        active_slot(&rolled)
    ));
    let ready = rolled;

    // The version bump, in the clone, pushed; nothing else.
    let requested = push(
        &clone,
        &manifest(&newer, &front, false),
        &format!("{SHARD}: kcp {older} -> {newer}"),
    );
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

    data_version_guard(&mut env, &clone, &front, &older, &newer).await;

    let left = env.shutdown(&[SHARD]).await;
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// Commits `contents` as the shard's file in `clone` and pushes it; returns when it was pushed.
fn push(clone: &Path, contents: &str, message: &str) -> chrono::DateTime<Utc> {
    std::fs::write(clone.join("shards/gitops.yaml"), contents).unwrap();
    git(clone, &["commit", "-q", "-am", message]);
    let pushed = Utc::now();
    git(clone, &["push", "-q", "origin", "main"]);
    pushed
}

/// The data remembers the version that served it. With the newer release serving: a commit back
/// to the older one is refused while the newer slot serves on; the shard deleted by hand and serve
/// restarted, GitOps re-creates it from that file over data the newer release served: refused
/// again, before any kcp starts; a commit that allows the downgrade runs the older release's
/// preflight on a copy first, while an interim slot of the newer one serves the data it last
/// served, then rolls to the older release.
async fn data_version_guard(env: &mut Env, clone: &Path, front: &str, older: &str, newer: &str) {
    let slot_roots = format!("--root-directory={}/slots/", env.shard_dir(SHARD).display());
    let serving = active_pid(&env.get(SHARD).await.expect("the shard")).expect("a slot serves");
    push(
        clone,
        &manifest(older, front, false),
        &format!("{SHARD}: back to kcp {older}"),
    );
    let message = degraded_with(env, "VersionChangeRefused").await;
    assert!(
        message.contains("allowDowngrade") && message.contains("running slots keep serving"),
        "{message}"
    );
    assert!(alive(serving), "the serving slot stopped after a refused downgrade");
    env.log(&format!(
        "commit back to {older} while {newer} serves: refused: {message}"
    ));

    assert!(
        env.delete_and_wait(SHARD, ROLL_TIMEOUT).await,
        "the shard was not deleted"
    );
    assert!(processes_with(&slot_roots).is_empty(), "a slot runs after the deletion");
    env.stop_serve();
    env.start_serve().await;
    let message = degraded_with(env, "VersionChangeRefused").await;
    assert!(
        message.contains(&format!("no slot runs, and kcp {newer} last served this shard's data"))
            && message.contains("allowDowngrade"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = processes_with(&slot_roots);
    assert!(started.is_empty(), "a kcp started on data {newer} served: {started:?}");
    env.log(&format!(
        "deleted by hand, serve restarted, re-created from the file at {older}: refused, no kcp: {message}"
    ));

    let allowed = format!(
        "{}  rollout:\n    allowDowngrade: true\n",
        manifest(older, front, false)
    );
    let allowed_at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    push(clone, &allowed, &format!("{SHARD}: allow the downgrade to {older}"));
    let back = env
        .until(
            SHARD,
            READY_TIMEOUT + ROLL_TIMEOUT,
            &format!("a roll to {older}"),
            |o| completed_roll_to(o, older, &allowed_at).then(|| o.clone()),
        )
        .await;
    assert_eq!(active_version(&back).as_deref(), Some(older), "{}", back["status"]);
    check_preflight_before_roll(env, SHARD, older, &allowed_at).await;
    let events = env.events(SHARD).await;
    let interim = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("InterimSlotStarting"))
        .filter_map(|e| e.message.clone())
        .find(|m| m.contains(&format!("kcp {newer}")))
        .unwrap_or_else(|| {
            env.fail(&format!(
                "no InterimSlotStarting of {newer}:\n{}",
                summarize_events(&events)
            ))
        });
    env.log(&format!("allowDowngrade committed: {interim}; then Ready on {older}"));
}

/// Waits for Degraded=True with `reason`; returns the condition's message.
async fn degraded_with(env: &Env, reason: &str) -> String {
    env.until(SHARD, READY_TIMEOUT, &format!("Degraded=True {reason}"), |o| {
        condition(o, "Degraded")
            .filter(|c| c["status"] == "True" && c["reason"] == reason)
            .map(|c| c["message"].as_str().unwrap_or_default().to_string())
    })
    .await
}
