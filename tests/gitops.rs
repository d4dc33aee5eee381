//! `kcpshard serve --manifests DIR` (GitOps), against a real `serve` with the API alone
//! (`--controller=false`): what a user sees through the API and the log when the files in DIR
//! change, including through git.
//!
//! - objects in DIR are applied at start (several files, several documents; hidden entries and
//!   other extensions are not read); editing a file applies it again;
//! - a commit in a real git repository used as DIR changes the object, made in place or pushed
//!   from another clone (`receive.denyCurrentBranch=updateInstead`);
//! - an invalid file (bad YAML; a KcpShard the API would refuse) is logged, gets a Warning event on
//!   the object it names when that exists, and applies nothing, while other files still apply;
//! - an unchanged DIR makes no write, whatever touches it;
//! - a field removed from a file is removed from the object (server-side apply); a removed file
//!   leaves its object with a Warning event, or with `--manifests-prune` deletes it;
//! - a missing DIR stops `serve` at start with a message that says so.
//!
//! Needs only the `git` binary (and the kcpshard binary cargo builds).
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::Value;

const APPLIED_WITHIN: Duration = Duration::from_secs(20);

fn shard_yaml(name: &str, version: &str, port: u16) -> String {
    format!(
        "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata:\n  name: {name}\nspec:\n  version: {version}\n  \
         store:\n    type: KineSqlite\n  front:\n    type: Tcp\n    listen: 127.0.0.1:{port}\n"
    )
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

async fn start(dir: &Path, extra: &[&str]) -> Serve {
    let dir = dir.to_str().unwrap();
    let mut args = vec!["--controller=false", "--manifests", dir];
    args.extend_from_slice(extra);
    Serve::start_with(&args).await
}

/// The object as JSON, or None when it does not exist.
async fn get(client: &Client, name: &str) -> Option<Value> {
    kcpshards(client)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("GET kcpshard {name}: {e}"))
        .map(|o| serde_json::to_value(o).unwrap())
}

async fn version_of(client: &Client, name: &str) -> Option<String> {
    get(client, name)
        .await
        .map(|o| o["spec"]["version"].as_str().unwrap().to_string())
}

/// Waits until KcpShard `name` has spec.version `version`; returns the object.
async fn until_version(serve: &Serve, client: &Client, name: &str, version: &str) -> Value {
    let what = format!("KcpShard {name} at spec.version {version}");
    let deadline = std::time::Instant::now() + APPLIED_WITHIN;
    loop {
        if let Some(object) = get(client, name).await
            && object["spec"]["version"] == version
        {
            return object;
        }
        if std::time::Instant::now() > deadline {
            serve.fail(&format!(
                "timed out after {APPLIED_WITHIN:?} waiting for {what}; it is {:?}",
                version_of(client, name).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The resourceVersion of the whole store: any write (an object, an event) moves it.
async fn store_version(client: &Client) -> String {
    let list = kcpshards(client).list(&ListParams::default()).await.unwrap();
    list.metadata.resource_version.unwrap()
}

async fn events_for(client: &Client, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&params).await.unwrap().items
}

fn warnings_with_reason(events: &[Event], reason: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
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
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn objects_are_applied_at_start_and_an_edited_file_is_applied_again() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path();
    write(m, "dev.yaml", &shard_yaml("dev", "v0.31.0", 16443));
    write(
        m,
        "team/more.yml",
        &format!(
            "{}---\n{}",
            shard_yaml("a", "v0.31.1", 16444),
            shard_yaml("b", "v0.31.2", 16445)
        ),
    );
    // Not read: a hidden file, a file under .git, another extension.
    write(m, ".hidden.yaml", &shard_yaml("hidden", "v0.31.0", 16446));
    write(m, ".git/stray.yaml", &shard_yaml("stray", "v0.31.0", 16447));
    write(m, "notes.json", "{}");

    let serve = start(m, &[]).await;
    let client = serve.client().await;
    let dev = until_version(&serve, &client, "dev", "v0.31.0").await;
    until_version(&serve, &client, "a", "v0.31.1").await;
    until_version(&serve, &client, "b", "v0.31.2").await;
    assert!(get(&client, "hidden").await.is_none(), "a hidden file was applied");
    assert!(get(&client, "stray").await.is_none(), "a file under .git was applied");
    assert!(
        serve
            .log_text()
            .contains("applied KcpShard dev from dev.yaml: created, resourceVersion"),
        "no log line for the applied object:\n{}",
        serve.log_tail()
    );

    // Edit in place: the object follows, with a log line giving the resourceVersion change.
    write(m, "dev.yaml", &shard_yaml("dev", "v0.31.2", 16443));
    let edited = until_version(&serve, &client, "dev", "v0.31.2").await;
    let (before, after) = (
        dev["metadata"]["resourceVersion"].as_str().unwrap(),
        edited["metadata"]["resourceVersion"].as_str().unwrap(),
    );
    assert_ne!(before, after);
    assert_eq!(edited["metadata"]["generation"], 2);
    let line = format!("applied KcpShard dev from dev.yaml: resourceVersion {before} -> {after}");
    eventually(Duration::from_secs(5), &line, || async {
        serve.log_text().contains(&line).then_some(())
    })
    .await;
    let applied: Vec<String> = events_for(&client, "dev")
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ManifestApplied"))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    assert!(
        applied.iter().any(|m| m.contains("spec.version v0.31.0 -> v0.31.2")),
        "no ManifestApplied event naming the version change: {applied:?}"
    );

    // Replaced by rename, as editors and git do.
    write(m, "dev.yaml.tmp", &shard_yaml("dev", "v0.31.1", 16443));
    std::fs::rename(m.join("dev.yaml.tmp"), m.join("dev.yaml")).unwrap();
    until_version(&serve, &client, "dev", "v0.31.1").await;

    // A new file in a new directory.
    write(m, "later/c.yaml", &shard_yaml("c", "v0.31.0", 16448));
    until_version(&serve, &client, "c", "v0.31.0").await;

    // Deleting a file deletes nothing, and a Warning event on the object says so.
    std::fs::remove_file(m.join("later/c.yaml")).unwrap();
    let warning = eventually(Duration::from_secs(10), "a ManifestRemoved warning on c", || async {
        warnings_with_reason(&events_for(&client, "c").await, "ManifestRemoved").pop()
    })
    .await;
    assert!(
        warning.contains("holds KcpShard c any more; it is left as it is") && warning.contains("--manifests-prune"),
        "{warning}"
    );
    assert!(
        get(&client, "c").await.is_some(),
        "deleting the file deleted the object"
    );
}

#[tokio::test]
async fn a_field_removed_from_a_file_goes_and_a_removed_file_is_pruned_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    git(repo, &["init", "-q", "-b", "main"]);
    let gated = format!(
        "{}  rollout:\n    allowMinorVersionChange: true\n  kcp:\n    extraArgs: [\"--v=4\"]\n",
        shard_yaml("dev", "v0.31.0", 16443)
    );
    write(repo, "dev.yaml", &gated);
    write(repo, "gone.yaml", &shard_yaml("gone", "v0.31.0", 16444));
    git(repo, &["add", "."]);
    git(repo, &["commit", "-q", "-m", "dev with a gate and extra args"]);
    let serve = start(repo, &["--manifests-prune"]).await;
    let client = serve.client().await;
    let dev = until_version(&serve, &client, "dev", "v0.31.0").await;
    assert_eq!(dev["spec"]["rollout"]["allowMinorVersionChange"], true);
    assert_eq!(dev["spec"]["kcp"]["extraArgs"], serde_json::json!(["--v=4"]));
    until_version(&serve, &client, "gone", "v0.31.0").await;
    // Someone else's KcpShard, not from DIR: never pruned.
    let mut theirs = dev_manifest();
    theirs["metadata"]["name"] = "theirs".into();
    theirs["spec"]["front"]["listen"] = "127.0.0.1:16445".into();
    let output = serve.kubectl_with(&["create", "-f", "-"], Some(&theirs.to_string()), &[]);
    assert!(output.status.success(), "{output:?}");

    // A commit that drops the gate and the extra args: both leave the object.
    write(repo, "dev.yaml", &shard_yaml("dev", "v0.31.0", 16443));
    git(repo, &["commit", "-q", "-am", "drop the gate and the extra args"]);
    let dev = eventually(APPLIED_WITHIN, "extraArgs gone from dev", || async {
        get(&client, "dev")
            .await
            .filter(|d| d["spec"]["kcp"]["extraArgs"].is_null())
    })
    .await;
    assert_eq!(
        dev["spec"]["rollout"]["allowMinorVersionChange"], false,
        "the gate is back at its default: {dev}"
    );

    // A commit that removes a file: its object is deleted, with a Warning event first.
    git(repo, &["rm", "-q", "gone.yaml"]);
    git(repo, &["commit", "-q", "-m", "retire gone"]);
    eventually(APPLIED_WITHIN, "gone pruned", || async {
        get(&client, "gone").await.is_none().then_some(())
    })
    .await;
    let pruned = warnings_with_reason(&events_for(&client, "gone").await, "ManifestPruned");
    assert!(
        pruned.iter().any(|m| m.contains("deleting it (--manifests-prune)")),
        "{pruned:?}"
    );
    assert!(get(&client, "dev").await.is_some());
    assert!(
        get(&client, "theirs").await.is_some(),
        "an object kcpshard-gitops did not create was pruned"
    );
}

#[tokio::test]
async fn a_commit_in_a_git_repository_changes_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("manifests");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "receive.denyCurrentBranch", "updateInstead"]);
    write(&repo, "shards/dev.yaml", &shard_yaml("dev", "v0.31.0", 16443));
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "dev at v0.31.0"]);

    let serve = start(&repo, &[]).await;
    let client = serve.client().await;
    until_version(&serve, &client, "dev", "v0.31.0").await;

    // A commit made in the checkout itself.
    write(&repo, "shards/dev.yaml", &shard_yaml("dev", "v0.31.1", 16443));
    git(&repo, &["commit", "-q", "-am", "dev to v0.31.1"]);
    until_version(&serve, &client, "dev", "v0.31.1").await;

    // A commit made elsewhere and pushed: git updates the checkout (updateInstead), file by file.
    let clone = dir.path().join("clone");
    git(
        dir.path(),
        &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()],
    );
    write(&clone, "shards/dev.yaml", &shard_yaml("dev", "v0.31.2", 16443));
    git(&clone, &["commit", "-q", "-am", "dev to v0.31.2"]);
    git(&clone, &["push", "-q", "origin", "main"]);
    assert!(
        std::fs::read_to_string(repo.join("shards/dev.yaml"))
            .unwrap()
            .contains("v0.31.2"),
        "the push did not update the checkout"
    );
    until_version(&serve, &client, "dev", "v0.31.2").await;

    // And back, with git revert in the clone.
    git(&clone, &["revert", "--no-edit", "HEAD"]);
    git(&clone, &["push", "-q", "origin", "main"]);
    until_version(&serve, &client, "dev", "v0.31.1").await;
}

#[tokio::test]
async fn an_invalid_file_is_reported_and_applies_nothing_while_other_files_apply() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path();
    write(m, "dev.yaml", &shard_yaml("dev", "v0.31.0", 16443));
    write(m, "other.yaml", &shard_yaml("other", "v0.31.0", 16444));
    let serve = start(m, &[]).await;
    let client = serve.client().await;
    until_version(&serve, &client, "dev", "v0.31.0").await;
    until_version(&serve, &client, "other", "v0.31.0").await;

    // Bad YAML in dev.yaml, and a change to other.yaml in the same burst.
    write(
        m,
        "dev.yaml",
        "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: dev\nspec: [\n",
    );
    write(m, "other.yaml", &shard_yaml("other", "v0.31.1", 16444));
    until_version(&serve, &client, "other", "v0.31.1").await;
    let line = "manifest dev.yaml is invalid, nothing from it is applied: document 1 is not valid YAML";
    eventually(APPLIED_WITHIN, line, || async {
        serve.log_text().contains(line).then_some(())
    })
    .await;
    let warnings = eventually(APPLIED_WITHIN, "a ManifestInvalid event on dev", || async {
        let found = warnings_with_reason(&events_for(&client, "dev").await, "ManifestInvalid");
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(
        warnings[0].starts_with("dev.yaml: document 1 is not valid YAML"),
        "{warnings:?}"
    );
    assert_eq!(version_of(&client, "dev").await.as_deref(), Some("v0.31.0"));

    // A KcpShard the API refuses (version "latest"), beside a valid one in the same file: neither
    // is applied.
    write(
        m,
        "dev.yaml",
        &format!(
            "{}---\n{}",
            shard_yaml("dev", "latest", 16443),
            shard_yaml("extra", "v0.31.0", 16449)
        ),
    );
    let warnings = eventually(APPLIED_WITHIN, "a second ManifestInvalid event on dev", || async {
        let found = warnings_with_reason(&events_for(&client, "dev").await, "ManifestInvalid");
        (found.len() >= 2).then_some(found)
    })
    .await;
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("spec.version") && w.contains("latest")),
        "the event does not say what is wrong: {warnings:?}"
    );
    assert!(
        serve
            .log_text()
            .contains("manifest dev.yaml is invalid, nothing from it is applied: document 1: KcpShard.kcpshard.io \"dev\" is invalid: spec.version"),
        "no log line for the invalid spec:\n{}",
        serve.log_tail()
    );
    assert_eq!(version_of(&client, "dev").await.as_deref(), Some("v0.31.0"));
    assert!(
        get(&client, "extra").await.is_none(),
        "a document of the invalid file was applied"
    );

    // An invalid file about an object that does not exist: a log line, no object, no event.
    write(m, "new.yaml", &shard_yaml("brandnew", "v0.31", 16450));
    let line = "manifest new.yaml is invalid";
    eventually(APPLIED_WITHIN, line, || async {
        serve.log_text().contains(line).then_some(())
    })
    .await;
    assert!(get(&client, "brandnew").await.is_none());
    assert!(events_for(&client, "brandnew").await.is_empty());

    // Fixed: it applies.
    write(m, "dev.yaml", &shard_yaml("dev", "v0.31.2", 16443));
    until_version(&serve, &client, "dev", "v0.31.2").await;
    // The invalid content was reported once, not on every pass.
    let reports = serve.log_text().matches("manifest dev.yaml is invalid").count();
    assert_eq!(
        reports,
        2,
        "each invalid content is reported once:\n{}",
        serve.log_tail()
    );
}

#[tokio::test]
async fn an_unchanged_directory_makes_no_write() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path();
    let text = shard_yaml("dev", "v0.31.0", 16443);
    write(m, "dev.yaml", &text);
    let serve = start(m, &["--manifests-interval", "1s"]).await;
    let client = serve.client().await;
    until_version(&serve, &client, "dev", "v0.31.0").await;
    // Let the first passes settle (the create's event is a write too).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = store_version(&client).await;
    let passes = || serve.log_text().matches("manifests pass").count();

    // Quiet: the periodic passes only. A pass reads every file, and reading must not wake the
    // next pass.
    let start_count = passes();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let quiet = passes() - start_count;
    assert!(
        (2..=5).contains(&quiet),
        "{quiet} passes in 3.5 s of quiet with a 1 s interval:\n{}",
        serve.log_tail()
    );

    // The same bytes written again, and the file renamed away and back: passes, no write.
    let start_count = passes();
    write(m, "dev.yaml", &text);
    std::fs::rename(m.join("dev.yaml"), m.join("dev.yaml.x")).unwrap();
    std::fs::rename(m.join("dev.yaml.x"), m.join("dev.yaml")).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let touched = passes() - start_count;
    assert!(
        touched >= 2,
        "only {touched} passes in 2 s after the file was rewritten"
    );
    assert_eq!(
        store_version(&client).await,
        before,
        "an unchanged manifests dir wrote to the API over {} passes",
        quiet + touched
    );
}

#[tokio::test]
async fn a_missing_directory_stops_serve_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let out = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .arg("serve")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--api-listen", "127.0.0.1:0", "--controller=false", "--manifests"])
        .arg(&missing)
        .env_remove("KCPSHARD_STATE_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started without its manifests dir");
    assert!(
        stderr.contains(&format!("--manifests {}: no such directory", missing.display())),
        "{stderr}"
    );
    assert!(
        !dir.path().join("state/kubeconfig").exists(),
        "serve served before it failed"
    );
}
