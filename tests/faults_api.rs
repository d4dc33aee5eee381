//! Faults of the API's own storage (docs/reliability.md, "Fault matrix"), against a real
//! `kcpshard serve --controller=false`; no kcp is needed, so these run in seconds.
//!
//! - `a_full_state_dir_refuses_writes_with_507_and_loses_nothing`: the state dir on a 2 MiB tmpfs,
//!   filled to the last page. Creates, updates and deletes answer 507 with "no space left" and
//!   what to do; nothing acknowledged is lost, nothing half-written is served or left on disk;
//!   once space is freed, writes work again, and all of it survives a restart of `serve`.
//! - `a_corrupt_object_file_stops_serve_with_its_name_until_it_is_moved_aside`: garbage in one
//!   KcpShard's file. `serve` refuses to start, naming the file and what to do (it used to move the
//!   file aside and serve without the object, which then vanished from the API with only a log
//!   line); the file is left as it was; moved aside by the operator, `serve` starts with the rest.
//!
//! - `a_corrupt_controller_or_kine_record_is_reported_and_recovers_once_moved_aside`: with the
//!   controller, on a shard that needs no kcp (its version has no binary: Degraded BinaryMissing,
//!   but its kine and front run). Garbage in `controller.json`, then in the kine's process record
//!   `store/kine.json`: Degraded=True, reason StateFileUnreadable, naming the file and what to do;
//!   moved aside, the shard is back where it was and the same kine serves (adopted, not restarted).
//!   The same path on real kcp, with a slot record too, is in e2e_faults.rs.
//! - `a_killed_kine_or_front_wakes_the_controller_at_once`: on such a shard, SIGKILL of its kine,
//!   then of its front: each runs again within 1 s, and `/metrics` counts the exits.
//!
//! The tmpfs needs root (CAP_SYS_ADMIN): without it the test fails and says so; it never skips.
mod common;
mod tmpfs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{Serve, Sweep, kcpshard_names, kcpshards};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tmpfs::{Tmpfs, fill};

fn shard(name: &str, version: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": { "name": name },
        "spec": {
            "version": version,
            "store": { "type": "KineSqlite" },
            // Each shard its own front address: the API refuses a second shard on one.
            "front": { "type": "Tcp", "listen": format!("127.0.0.1:{}", 20000 + name.bytes().map(u16::from).sum::<u16>()) },
        },
    }))
    .unwrap()
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_ending(&path, suffix));
        } else if path.to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
    found
}

/// The API's answer to a write that must fail for lack of space: 507, the reason, what to do.
fn assert_no_space(what: &str, result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            println!("{what}: {} {}: {}", status.code, status.reason, status.message);
            assert_eq!(status.code, 507, "{what}: {status:?}");
            assert!(
                status.message.contains("no space left") && status.message.contains("Free space"),
                "{what}: the message does not say what is wrong and what to do: {}",
                status.message
            );
            status.message
        }
        other => panic!("{what} on a full disk: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_dir_refuses_writes_with_507_and_loses_nothing() {
    let mut serve = Serve::start().await;
    let state = serve.state_dir();
    let api = kcpshards(&serve.client().await);
    api.create(&PostParams::default(), &shard("before", "v0.31.0"))
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create before: {e}")));

    // Move the state dir onto a small tmpfs: serve stops, its files go onto the tmpfs mounted
    // over the same path, serve starts again there.
    serve.kill();
    let copy = tempfile::tempdir().unwrap();
    let cp = |from: &Path, to: &Path| {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", from.display()))
            .arg(to)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cp -a {} {}", from.display(), to.display());
    };
    cp(&state, copy.path());
    let _tmpfs = Tmpfs::mount(&state, "2m");
    cp(copy.path(), &state);
    serve.restart().await;
    let api = kcpshards(&serve.client().await);

    let filler = fill(&state, 0);
    let started = Instant::now();
    println!(
        "filled {} with {} bytes",
        state.display(),
        std::fs::metadata(&filler).unwrap().len()
    );

    // Every kind of write is refused with 507 and what to do; none is half done.
    let message = assert_no_space(
        "create",
        api.create(&PostParams::default(), &shard("during", "v0.31.0")).await,
    );
    assert!(
        message.contains(&state.display().to_string()),
        "the message names the file: {message}"
    );
    assert_no_space(
        "patch",
        api.patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "version": "v0.31.2" } })),
        )
        .await,
    );
    assert_no_space("delete", api.delete("before", &DeleteParams::default()).await);
    let kubectl = serve.kubectl_err(&["annotate", "ks", "before", "note=full"]);
    println!("kubectl annotate on a full disk: {}", kubectl.trim());
    assert!(kubectl.contains("no space left"), "what kubectl prints: {kubectl}");

    // Reads still work and show only what was acknowledged.
    let before = api
        .get("before")
        .await
        .unwrap_or_else(|e| serve.fail(&format!("get before: {e}")));
    assert_eq!(before.data["spec"]["version"], "v0.31.0", "a refused patch was applied");
    assert!(before.metadata.annotations.is_none_or(|a| !a.contains_key("note")));
    assert!(before.metadata.deletion_timestamp.is_none());
    assert!(
        api.get_opt("during").await.unwrap().is_none(),
        "a refused create is served"
    );
    let leftovers = files_ending(&state.join("objects"), ".tmp");
    assert!(leftovers.is_empty(), "half-written files left: {leftovers:?}");

    // Space freed: writes work again at once.
    std::fs::remove_file(&filler).unwrap();
    api.create(&PostParams::default(), &shard("after", "v0.31.0"))
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create after space was freed: {e}")));
    api.patch(
        "before",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "version": "v0.31.2" } })),
    )
    .await
    .unwrap_or_else(|e| serve.fail(&format!("patch after space was freed: {e}")));
    println!(
        "writes work again {:.2}s after the disk was filled (as soon as space is freed)",
        started.elapsed().as_secs_f64()
    );

    // Everything acknowledged survives a restart; nothing refused appears.
    serve.kill();
    serve.restart().await;
    let api = kcpshards(&serve.client().await);
    assert_eq!(
        kcpshard_names(&api).await,
        ["after", "before"],
        "objects after a restart"
    );
    assert_eq!(api.get("before").await.unwrap().data["spec"]["version"], "v0.31.2");
    drop(serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_object_file_stops_serve_with_its_name_until_it_is_moved_aside() {
    let mut serve = Serve::start().await;
    let api = kcpshards(&serve.client().await);
    for name in ["good", "bad"] {
        api.create(&PostParams::default(), &shard(name, "v0.31.2"))
            .await
            .unwrap_or_else(|e| serve.fail(&format!("create {name}: {e}")));
    }
    serve.kill();
    let state = serve.state_dir();
    let bad = state.join("objects/kcpshards/_cluster/bad.json");
    let garbage = b"{\"apiVersion\": \"kcpshard.io/v1alpha1\", \"kind\": \"KcpSh\0\0\0\0";
    std::fs::write(&bad, garbage).unwrap();

    // serve refuses to start and says which file and what to do.
    let out = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .arg("serve")
        .arg("--state-dir")
        .arg(&state)
        .args(["--api-listen", "127.0.0.1:0", "--controller=false"])
        .env_remove("KCPSHARD_STATE_DIR")
        .output()
        .expect("run kcpshard serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("serve with a corrupt object file: {}\n{}", out.status, stderr.trim());
    assert!(!out.status.success(), "serve started with a corrupt object file");
    assert!(
        stderr.contains(&bad.display().to_string()),
        "the error does not name the file: {stderr}"
    );
    assert!(
        stderr.contains("move it out of the state directory") && stderr.contains("Repair it"),
        "the error does not say what to do: {stderr}"
    );
    assert_eq!(
        std::fs::read(&bad).unwrap(),
        garbage,
        "the file is left as it was, for repair"
    );

    // The operator moves it aside: serve starts with the rest.
    let aside = serve.state_dir().parent().unwrap().join("bad.json.bad");
    std::fs::rename(&bad, &aside).unwrap();
    serve.restart().await;
    let api = kcpshards(&serve.client().await);
    assert!(
        api.get_opt("good").await.unwrap().is_some(),
        "the good object is served"
    );
    assert!(api.get_opt("bad").await.unwrap().is_none());
}

/// Ends (by pid) every process whose argv names `dir`: the kine and front a shard's controller
/// started, which run in sessions of their own and outlive `serve`.
/// Creates KcpShard `dev` on a version that has no kcp binary, its front on a free port, and
/// waits for Degraded BinaryMissing: its kine and its front run, no slot does.
async fn create_dev_without_kcp(serve: &Serve, api: &kube::Api<DynamicObject>) {
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut dev = shard("dev", "v0.31.99");
    dev.data["spec"]["front"]["listen"] = json!(front.to_string());
    api.create(&PostParams::default(), &dev)
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create dev: {e}")));
    degraded_reason(api, "dev", "BinaryMissing").await;
}

async fn degraded_reason(api: &kube::Api<DynamicObject>, name: &str, reason: &str) -> String {
    common::eventually(
        std::time::Duration::from_secs(60),
        &format!("Degraded={reason}"),
        || async {
            let object = serde_json::to_value(api.get(name).await.ok()?).unwrap();
            object["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Degraded" && c["status"] == "True" && c["reason"] == reason)
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_controller_or_kine_record_is_reported_and_recovers_once_moved_aside() {
    let serve = Serve::start_with_controller().await;
    let sweep = Sweep(serve.state_dir());
    let api = kcpshards(&serve.client().await);
    create_dev_without_kcp(&serve, &api).await;
    let shard_dir = serve.state_dir().join("shards/dev");
    let kine_pids = |sweep: &Sweep| sweep.pids_with("--endpoint=sqlite://");
    let kine_before = kine_pids(&sweep);
    assert_eq!(kine_before.len(), 1, "one kine runs for the shard: {:?}", sweep.pids());

    for file in [shard_dir.join("controller.json"), shard_dir.join("store/kine.json")] {
        std::fs::write(&file, b"{\"pid\": 12, \0\0 garbage").unwrap();
        let message = degraded_reason(&api, "dev", "StateFileUnreadable").await;
        println!("garbage in {}: Degraded: {message}", file.display());
        assert!(
            message.contains(&file.display().to_string()) && message.contains("Move it aside"),
            "the message does not name {} and what to do: {message}",
            file.display()
        );
        std::fs::rename(&file, file.with_extension("json.bad")).unwrap();
        degraded_reason(&api, "dev", "BinaryMissing").await;
        assert_eq!(kine_pids(&sweep), kine_before, "the kine was replaced, not adopted");
    }

    api.delete("dev", &DeleteParams::default()).await.unwrap();
    common::eventually(
        std::time::Duration::from_secs(60),
        "the shard to be deleted",
        || async { api.get_opt("dev").await.ok()?.is_none().then_some(()) },
    )
    .await;
    assert!(
        sweep.pids().iter().all(|(_, argv)| argv.contains(" serve ")),
        "processes left: {:?}",
        sweep.pids()
    );
}

/// A kine or front that dies wakes the controller at once (`process::exits`): it runs again within
/// its own start-up. The controller's idle look alone, every 2 s, found it up to 2 s later
/// (docs/reliability.md). `/metrics` counts the exits that woke it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_kine_or_front_wakes_the_controller_at_once() {
    let serve = Serve::start_with_controller().await;
    let sweep = Sweep(serve.state_dir());
    let client = serve.client().await;
    let api = kcpshards(&client);
    create_dev_without_kcp(&serve, &api).await;
    // Past the first looks, which start the kine and the front: a notice, not a step still under
    // way, must be what brings them back.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    for (what, marker) in [("kine", "--endpoint=sqlite://"), ("front", " front ")] {
        let running = |sweep: &Sweep| sweep.pids_with(marker);
        let old = running(&sweep);
        assert_eq!(old.len(), 1, "one {what} runs for the shard: {:?}", sweep.pids());
        let killed = Instant::now();
        // SAFETY: kill(2) of a process this test's serve started (its argv names our temp dir).
        unsafe { libc::kill(old[0], libc::SIGKILL) };
        let new = common::eventually(std::time::Duration::from_secs(30), &format!("a new {what}"), || async {
            let now = running(&sweep);
            (now.len() == 1 && now != old).then(|| now[0])
        })
        .await;
        let took = killed.elapsed();
        println!(
            "{what} SIGKILLed (pid {}): a new one (pid {new}) after {took:.2?}",
            old[0]
        );
        assert!(
            took < std::time::Duration::from_secs(1),
            "the {what} was started again {took:?} after it was killed: the controller was not woken by its exit"
        );
    }

    let metrics = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| serve.fail(&format!("GET /metrics: {e}")));
    let exits = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"kcpshard_controller_process_exits_total{shard="dev"} "#))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| serve.fail(&format!("no process_exits_total for dev in /metrics:\n{metrics}")));
    assert!(
        exits >= 2,
        "/metrics counts {exits} exits, not the kine's and the front's"
    );
}
