//! The `kcpshard` client commands (for machines without kubectl) against `kcpshard serve`: they
//! print what kubectl prints, interoperate with kubectl, and say what to do when the API is not
//! there.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{Serve, dev_manifest, kcpshards, manifest, next_patch_version};
use kube::Resource;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::{Value, json};

fn dev_yaml() -> String {
    manifest("dev.yaml").display().to_string()
}

fn ok(serve: &Serve, args: &[&str]) -> String {
    let output = serve.kcpshard(args);
    checked(serve, args, output)
}

fn checked(serve: &Serve, args: &[&str], output: Output) -> String {
    if !output.status.success() {
        serve.fail(&format!(
            "kcpshard {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn kcpshard_with_stdin(serve: &Serve, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&serve.kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kcpshard");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_then_says_unchanged_then_configured() {
    let serve = Serve::start().await;
    assert_eq!(
        ok(&serve, &["apply", "-f", &dev_yaml()]).trim(),
        "kcpshard.kcpshard.io/dev created"
    );
    assert_eq!(
        ok(&serve, &["apply", "-f", &dev_yaml()]).trim(),
        "kcpshard.kcpshard.io/dev unchanged"
    );
    let mut edited = dev_manifest();
    edited["spec"]["version"] = json!(next_patch_version());
    let output = kcpshard_with_stdin(&serve, &["apply", "-f", "-"], &edited.to_string());
    let out = checked(&serve, &["apply", "-f", "-"], output);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev configured");
    let client = serve.client().await;
    let dev = kcpshards(&client).get("dev").await.unwrap();
    assert_eq!(dev.data["spec"]["version"], next_patch_version());
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_shares_kubectls_last_applied_annotation() {
    let serve = Serve::start().await;
    ok(&serve, &["apply", "-f", &dev_yaml()]);
    let out = serve.kubectl_ok(&["apply", "-f", &dev_yaml()]);
    assert_eq!(
        out.trim(),
        "kcpshard.kcpshard.io/dev unchanged",
        "kubectl agrees nothing changed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_server_side_creates_then_updates() {
    let serve = Serve::start().await;
    let out = ok(&serve, &["apply", "--server-side", "-f", &dev_yaml()]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev serverside-applied");
    let mut edited = dev_manifest();
    edited["spec"]["version"] = json!(next_patch_version());
    let args = ["apply", "--server-side", "-f", "-"];
    let out = checked(&serve, &args, kcpshard_with_stdin(&serve, &args, &edited.to_string()));
    assert_eq!(out.trim(), "kcpshard.kcpshard.io/dev serverside-applied");
    let client = serve.client().await;
    let dev = kcpshards(&client).get("dev").await.unwrap();
    assert_eq!(dev.data["spec"]["version"], next_patch_version());
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_refuses_other_kinds_before_changing_anything() {
    let serve = Serve::start().await;
    let text = format!(
        "{}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        std::fs::read_to_string(dev_yaml()).unwrap()
    );
    let output = kcpshard_with_stdin(&serve, &["apply", "-f", "-"], &text);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("only handles"), "{stderr}");
    let client = serve.client().await;
    assert!(
        kcpshards(&client).get_opt("dev").await.unwrap().is_none(),
        "nothing applied"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn get_prints_the_printer_columns_and_yaml_and_json() {
    let serve = Serve::start().await;
    ok(&serve, &["apply", "-f", &dev_yaml()]);
    let out = ok(&serve, &["get"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ROLE", "VERSION", "ACTIVE", "PHASE", "READY", "HOST", "AGE"],
        "{out}"
    );
    // Without a controller nothing serves: VERSION (status.version) is empty; -o wide adds DESIRED.
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.len(), 2, "{out}");
    let wide = ok(&serve, &["get", "-o", "wide"]);
    let header: Vec<&str> = wide.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "ROLE", "VERSION", "DESIRED", "ACTIVE", "PHASE", "READY", "HOST", "AGE"
        ],
        "{wide}"
    );
    assert!(
        wide.lines()
            .nth(1)
            .is_some_and(|row| row.contains(dev_manifest()["spec"]["version"].as_str().unwrap())),
        "{wide}"
    );

    let yaml: Value = serde_yaml::from_str(&ok(&serve, &["get", "dev", "-o", "yaml"])).unwrap();
    assert_eq!(yaml["metadata"]["name"], "dev");
    assert_eq!(yaml["kind"], "KcpShard");
    let json: Value = serde_json::from_str(&ok(&serve, &["get", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "List");
    assert_eq!(json["items"][0]["metadata"]["name"], "dev");
    assert_eq!(json["items"][0]["kind"], "KcpShard");
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_prints_a_change_made_by_another_client() {
    let serve = Serve::start().await;
    ok(&serve, &["apply", "-f", &dev_yaml()]);
    let mut watch = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["get", "-w", "--kubeconfig"])
        .arg(&serve.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next_dev = |what: &str| loop {
        match lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.starts_with("dev ") => return line,
            Ok(_) => {}
            Err(_) => serve.fail(&format!("kcpshard get -w printed no row for {what}")),
        }
    };
    next_dev("the existing object");
    let client = serve.client().await;
    let status = json!({"status": {"phase": "Progressing"}});
    kcpshards(&client)
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let changed = next_dev("the status change");
    assert!(changed.contains("Progressing"), "{changed}");
    let _ = watch.kill();
    let _ = watch.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_and_events_show_recorded_events_and_conditions() {
    let serve = Serve::start().await;
    ok(&serve, &["apply", "-f", &dev_yaml()]);
    let client = serve.client().await;
    let api = kcpshards(&client);
    let status = json!({"status": {"phase": "Ready", "conditions": [{
        "type": "Ready", "status": "True", "reason": "FrontServes", "message": "slot blue answers /readyz",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1,
    }]}});
    api.patch_status("dev", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let dev = api.get("dev").await.unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("kcpshard-test"));
    let event = Event {
        type_: EventType::Normal,
        reason: "SlotStarted".into(),
        note: Some("Started slot blue".into()),
        action: "StartSlot".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &dev.object_ref(&common::kcpshard_resource()))
        .await
        .unwrap();

    let out = ok(&serve, &["describe", "dev"]);
    for expected in [
        "Name:",
        "API Version:  kcpshard.io/v1alpha1",
        "Kind:         KcpShard",
        "Spec:",
        "Store:",
        "Conditions:",
        "FrontServes",
        "slot blue answers /readyz",
        "Events:",
        "SlotStarted",
        "kcpshard-test",
        "Started slot blue",
    ] {
        assert!(out.contains(expected), "describe shows {expected:?}:\n{out}");
    }

    let out = ok(&serve, &["events", "--for", "kcpshard/dev"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{out}");
    assert!(
        out.contains("SlotStarted") && out.contains("KcpShard/dev") && out.contains("Started slot blue"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_waits_until_the_finalizer_is_removed() {
    let serve = Serve::start().await;
    ok(&serve, &["apply", "-f", &dev_yaml()]);
    let client = serve.client().await;
    let api = kcpshards(&client);
    let hold = json!({"metadata": {"finalizers": ["test.kcpshard.io/hold"]}});
    api.patch("dev", &PatchParams::default(), &Patch::Merge(hold))
        .await
        .unwrap();

    let out = ok(&serve, &["delete", "dev", "--wait=false"]);
    assert_eq!(out.trim(), "kcpshard.kcpshard.io \"dev\" deleted");
    let still = api.get("dev").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());

    let mut waiting = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["delete", "dev", "--kubeconfig"])
        .arg(&serve.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "delete waits while a finalizer holds the object"
    );
    let release = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
    api.patch(
        "dev",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(release).unwrap()),
    )
    .await
    .unwrap();
    let done = tokio::task::spawn_blocking(move || waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("test.kcpshard.io/hold"),
        "it said what it waited for"
    );
    assert!(api.get_opt("dev").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_gets_a_message_that_says_to_start_serve() {
    let serve = Serve::start().await;
    let elsewhere = tempfile::tempdir().unwrap();
    let kept = elsewhere.path().join("kubeconfig");
    std::fs::copy(&serve.kubeconfig, &kept).unwrap();
    drop(serve);
    let output = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["get", "--kubeconfig"])
        .arg(&kept)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot reach the kcpshard API at https://127.0.0.1:")
            && stderr.contains("is `kcpshard serve` running?"),
        "{stderr}"
    );
}

#[test]
fn a_missing_kubeconfig_gets_a_message_that_says_how_to_make_one() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .arg("get")
        .current_dir(dir.path())
        .env_remove("KUBECONFIG")
        .env_remove("KCPSHARD_STATE_DIR")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no kubeconfig at .kcpshard/kubeconfig") && stderr.contains("kcpshard serve"),
        "{stderr}"
    );
}

#[test]
fn crd_prints_the_checked_in_crd_byte_for_byte() {
    let output = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let checked_in = std::fs::read(common::repo_root().join("crds/kcpshards.kcpshard.io.yaml")).unwrap();
    assert!(
        output.stdout == checked_in,
        "`kcpshard crd` differs from crds/kcpshards.kcpshard.io.yaml; regenerate it with \
         `cargo run -- crd > crds/kcpshards.kcpshard.io.yaml`"
    );
}
