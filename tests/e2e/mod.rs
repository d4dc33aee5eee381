//! End-to-end helpers: a real `kcpshard serve` (with its controller) on a throwaway state dir that
//! can be killed and restarted on the same dir, KcpShards applied through its API, clients that
//! reach kcp THROUGH THE FRONT, a `/readyz` poller, and a sweep of every process that names the
//! state dir in its argv (slots, kine, front) so that nothing outlives a test, pass or fail.
//!
//! Rules:
//! - Components come from `bin/` (`KCPSHARD_BIN_DIR` overrides). A missing one is a failure with
//!   the hint `run hack/install-deps.sh`, never a skip (and never with `CI=true`).
//! - kcp versions come from hack/versions.env at run time (KCP_VERSION_OLDER / KCP_VERSION_NEWER).
//! - `serve` runs with the repo root as its working directory, so `bin/kcp-{version}` and
//!   `bin/kine` resolve as they do for a user.
//!
//! Use with `mod e2e;` from a tests/e2e_*.rs file.
#![allow(dead_code)]

pub mod machine;
mod poller;
mod postgres;
mod scenarios;
mod status;
mod through_front;

// Each test binary uses a part of the helpers.
#[allow(unused_imports)]
pub use {poller::*, postgres::*, scenarios::*, status::*, through_front::*};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Event;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};

// Locating components and pins is shared with the other real-component tests.
pub use crate::support::{bin_dir, pin, repo_root, require, test_port};

pub fn kcp_older() -> String {
    pin("KCP_VERSION_OLDER")
}

pub fn kcp_newer() -> String {
    pin("KCP_VERSION_NEWER")
}

/// The release of the older minor line (v0.30.0 beside v0.31.x): a real minor step.
pub fn kcp_older_minor() -> String {
    pin("KCP_VERSION_OLDER_MINOR")
}

/// Fails (with the install hint) unless kine and the kcp binaries of `versions` exist.
pub fn require_components(versions: &[&str]) {
    require("kine");
    for version in versions {
        require(&format!("kcp-{version}"));
    }
}

/// A loopback port that was free a moment ago.
/// Real-kcp scenarios run one at a time (kcp is heavy): hold this for the whole test.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Seconds since the test started, for progress lines.
pub fn stamp(start: Instant) -> String {
    format!("[{:7.2}s]", start.elapsed().as_secs_f64())
}

// ------------------------------------------------------------------------------------------------
// Processes by argv

/// Every process (other than this one) whose argv contains `needle`: (pid, argv joined by spaces).
pub fn processes_with(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if raw.is_empty() || is_zombie(pid) {
            continue;
        }
        let argv = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        if argv.contains(needle) {
            found.push((pid, argv.trim().to_string()));
        }
    }
    found
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

pub fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid)
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, sig) };
}

/// SIGTERM every process naming `needle` in its argv or working in a directory under it (a
/// KinePostgres slot's kine names only its database, but runs in its slot's directory), then
/// SIGKILL what is left after `grace`.
pub fn sweep(needle: &str, grace: Duration) -> Vec<(i32, String)> {
    let mut found = processes_with(needle);
    for (pid, argv) in processes_with("") {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cwd.starts_with(needle) && found.iter().all(|(p, _)| *p != pid) {
            found.push((pid, argv));
        }
    }
    for (pid, _) in &found {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && found.iter().any(|(pid, _)| alive(*pid)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (pid, _) in &found {
        if alive(*pid) {
            signal(*pid, libc::SIGKILL);
        }
    }
    found
}

// ------------------------------------------------------------------------------------------------
// serve

/// The kcpshard binary under test: cargo's, or `$KCPSHARD_E2E_BIN` (a copy that a concurrent
/// rebuild of the shared target dir cannot replace under a long run).
pub fn kcpshard_bin() -> PathBuf {
    std::env::var_os("KCPSHARD_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kcpshard")))
}

/// The KcpShard resource for dynamic clients.
pub fn kcpshard_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kcpshard.io", "v1alpha1", "KcpShard"),
        "kcpshards",
    )
}

/// A state dir and the `kcpshard serve` running on it (restartable).
pub struct Env {
    dir: tempfile::TempDir,
    pub state: PathBuf,
    serve: Option<Child>,
    pub serve_starts: u32,
    pub client: Option<Client>,
    pub started: Instant,
    /// Flags after `--kine-binary`, given to every start of `serve`.
    serve_args: Vec<String>,
    /// The `--kine-binary` of every start of `serve`.
    kine_binary: PathBuf,
    /// The kcpshard binary the next start of `serve` runs (the front it starts runs it too).
    pub serve_binary: PathBuf,
    /// Environment variables every start of `serve` gets (e.g. a PATH with a wrapper first).
    serve_env: Vec<(String, String)>,
}

impl Env {
    pub async fn start() -> Env {
        Env::start_with(&[]).await
    }

    /// Starts `serve` with these flags too (e.g. `--manifests DIR`), on this and every restart.
    pub async fn start_with(serve_args: &[&str]) -> Env {
        Env::start_with_kine(serve_args, bin_dir().join("kine")).await
    }

    /// As [`Env::start_with`], with serve running `kine` for the shards' kines.
    pub async fn start_with_kine(serve_args: &[&str], kine: PathBuf) -> Env {
        Env::start_with_kine_and_env(serve_args, kine, &[]).await
    }

    /// As [`Env::start_with_kine`], with these environment variables for every start of serve.
    pub async fn start_with_kine_and_env(serve_args: &[&str], kine: PathBuf, serve_env: &[(&str, &str)]) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("kcpshard-e2e-")
            .tempdir()
            .expect("temp dir");
        let state = dir.path().join("state");
        let mut env = Env {
            dir,
            state,
            serve: None,
            serve_starts: 0,
            client: None,
            started: Instant::now(),
            serve_args: serve_args.iter().map(|a| a.to_string()).collect(),
            kine_binary: kine,
            serve_binary: kcpshard_bin(),
            serve_env: serve_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        env.start_serve().await;
        env
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn serve_log(&self) -> PathBuf {
        self.dir.path().join("serve.log")
    }

    pub fn log(&self, line: &str) {
        println!("{} {line}", stamp(self.started));
    }

    /// Starts `serve` on the state dir (again); returns once its API answers /readyz.
    pub async fn start_serve(&mut self) {
        assert!(self.serve.is_none(), "serve already runs");
        let mut command = Command::new(&self.serve_binary);
        command
            .arg("serve")
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--api-listen", "127.0.0.1:0"])
            .arg("--kine-binary")
            .arg(&self.kine_binary)
            .args(&self.serve_args)
            .current_dir(repo_root())
            .env("RUST_LOG", "info,kcpshard=debug")
            .env_remove("KCPSHARD_STATE_DIR")
            .env_remove("KCPSHARD_KINE")
            .envs(self.serve_env.iter().map(|(k, v)| (k, v)));
        let child = crate::support::spawn_tied(&mut command, &self.serve_log());
        self.serve = Some(child);
        self.serve_starts += 1;
        self.client = None;
        let kubeconfig = self.state.join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("no kubeconfig yet");
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.serve.as_mut().map(|c| c.try_wait()) {
                self.fail(&format!("kcpshard serve exited early ({status})"));
            }
            if kubeconfig.is_file() {
                match api_client(&kubeconfig).await {
                    Ok(client) => {
                        let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
                        match tokio::time::timeout(Duration::from_secs(2), client.request_text(request)).await {
                            Ok(Ok(body)) if body.trim() == "ok" => {
                                self.client = Some(client);
                                return;
                            }
                            other => last = format!("/readyz: {other:?}"),
                        }
                    }
                    Err(e) => last = format!("kubeconfig not usable yet: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.fail(&format!("kcpshard serve did not answer within 60s: {last}"));
    }

    pub fn serve_pid(&self) -> Option<i32> {
        self.serve.as_ref().map(|c| c.id() as i32)
    }

    /// SIGKILL `serve` (its process group: serve alone; slots, kine and the front are detached).
    pub fn kill_serve(&mut self) {
        if let Some(mut child) = self.serve.take() {
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
        self.client = None;
    }

    /// SIGTERM `serve`, SIGKILL after 15 s.
    pub fn stop_serve(&mut self) {
        if let Some(mut child) = self.serve.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
        self.client = None;
    }

    /// kcpshard's CLI against this env's API, its output captured.
    pub fn cli(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(kcpshard_bin());
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(self.state.join("kubeconfig"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs kcpshard's CLI against this env's API; its stdout, or the test fails with what it
    /// printed.
    pub async fn cli_ok(&self, args: &[&str]) -> String {
        let output = self.cli(args).output().await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            self.fail(&format!(
                "kcpshard {}: {}\n{stdout}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        stdout
    }

    pub fn client(&self) -> Client {
        self.client.clone().unwrap_or_else(|| self.fail("serve is not running"))
    }

    pub fn shards(&self) -> Api<DynamicObject> {
        Api::all_with(self.client(), &kcpshard_resource())
    }

    pub fn shard_dir(&self, name: &str) -> PathBuf {
        self.state.join("shards").join(name)
    }

    /// Creates a KcpShard (KineSqlite store, Tcp front on `listen`).
    pub async fn apply(&self, name: &str, version: &str, listen: &str) -> DynamicObject {
        self.apply_on(name, version, listen, json!({ "type": "KineSqlite" }))
            .await
    }

    /// [`Env::apply`] with spec.store `store`.
    pub async fn apply_on(&self, name: &str, version: &str, listen: &str, store: Value) -> DynamicObject {
        let spec = json!({
            "version": version,
            "store": store,
            "front": { "type": "Tcp", "listen": listen },
        });
        self.apply_spec(name, spec).await
    }

    /// Creates a KcpShard with this spec.
    pub async fn apply_spec(&self, name: &str, spec: Value) -> DynamicObject {
        let object = json!({
            "apiVersion": "kcpshard.io/v1alpha1",
            "kind": "KcpShard",
            "metadata": { "name": name },
            "spec": spec,
        });
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        match self.shards().create(&PostParams::default(), &object).await {
            Ok(created) => created,
            Err(e) => self.fail(&format!("create KcpShard {name}: {e}")),
        }
    }

    pub async fn patch(&self, name: &str, patch: Value) -> DynamicObject {
        match self
            .shards()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(o) => o,
            Err(e) => self.fail(&format!("patch KcpShard {name} with {patch}: {e}")),
        }
    }

    /// What `kubectl rollout restart` does: a new `kcpshard.io/restartedAt`.
    pub async fn request_restart(&self, name: &str) -> DynamicObject {
        let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        self.patch(
            name,
            json!({ "metadata": { "annotations": { "kcpshard.io/restartedAt": at } } }),
        )
        .await
    }

    /// The object as JSON (metadata and status), or None when it does not exist.
    pub async fn get(&self, name: &str) -> Option<Value> {
        for _ in 0..20 {
            match self.shards().get_opt(name).await {
                Ok(o) => return o.map(|o| serde_json::to_value(o).unwrap()),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        self.fail(&format!("cannot read KcpShard {name}"))
    }

    pub async fn status(&self, name: &str) -> Value {
        self.get(name).await.map(|o| o["status"].clone()).unwrap_or(Value::Null)
    }

    /// Polls until `check` on the whole object returns Some, or fails after `timeout`.
    pub async fn until<T>(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&Value) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut last = Value::Null;
        loop {
            if let Some(object) = self.get(name).await {
                if let Some(v) = check(&object) {
                    return v;
                }
                last = object;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "timed out after {timeout:?} waiting for {what}; KcpShard {name} status:\n{}",
                    serde_json::to_string_pretty(&last["status"]).unwrap()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// kubectl-wait: Ready=True at the object's current generation.
    pub async fn wait_ready(&self, name: &str, timeout: Duration) -> Value {
        self.until(name, timeout, "Ready=True at the current generation", |o| {
            ready_now(o).then(|| o.clone())
        })
        .await
    }

    /// Events about KcpShard `name`, oldest first.
    pub async fn events(&self, name: &str) -> Vec<Event> {
        let api: Api<Event> = Api::all(self.client());
        let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let mut events = match api.list(&params).await {
            Ok(list) => list.items,
            Err(e) => self.fail(&format!("list events: {e}")),
        };
        events.retain(|e| e.involved_object.name.as_deref() == Some(name));
        events.sort_by_key(event_time);
        events
    }

    /// Deletes KcpShard `name` and waits (bounded) until it is gone (the finalizer stopped its
    /// processes).
    pub async fn delete_and_wait(&self, name: &str, timeout: Duration) -> bool {
        if self.client.is_none() {
            return false;
        }
        let _ = self.shards().delete(name, &DeleteParams::default()).await;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(None) = self.shards().get_opt(name).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// The end of serve's log, for failure messages.
    pub fn serve_log_tail(&self, lines: usize) -> String {
        tail(&self.serve_log(), lines)
    }

    pub fn fail(&self, message: &str) -> ! {
        panic!(
            "{message}\n--- last lines of kcpshard serve's log ({}) ---\n{}",
            self.serve_log().display(),
            self.serve_log_tail(40)
        )
    }

    /// Orderly end: delete the shards, wait for them to go, SIGTERM serve; then report anything
    /// still running with the state dir in its argv (and kill it).
    pub async fn shutdown(&mut self, shards: &[&str]) -> Vec<(i32, String)> {
        for name in shards {
            if !self.delete_and_wait(name, Duration::from_secs(90)).await {
                self.log(&format!("KcpShard {name} did not disappear within 90s of its delete"));
            }
        }
        self.stop_serve();
        let needle = self.state.display().to_string();
        let left = processes_with(&needle);
        sweep(&needle, Duration::from_secs(10));
        left
    }

    /// Copies the logs of a state dir next to the target dir (for a failed run's post-mortem).
    pub fn keep_logs(&self) -> PathBuf {
        let keep = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("e2e-logs")
            .join(self.dir.path().file_name().unwrap());
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(self.serve_log(), keep.join("serve.log"));
        if let Ok(shards) = std::fs::read_dir(self.state.join("shards")) {
            for shard in shards.flatten() {
                let name = shard.file_name().to_string_lossy().into_owned();
                for rel in [
                    "slots/a/kcp.log",
                    "slots/b/kcp.log",
                    "store/kine.log",
                    "front/front.log",
                    "controller.json",
                ] {
                    let from = shard.path().join(rel);
                    if from.is_file() {
                        let to = keep.join(format!("{name}-{}", rel.replace('/', "-")));
                        let _ = std::fs::copy(from, to);
                    }
                }
            }
        }
        keep
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let kept = self.keep_logs();
            eprintln!("logs of the failed test kept in {}", kept.display());
        }
        self.kill_serve();
        let left = sweep(&self.state.display().to_string(), Duration::from_secs(10));
        if !left.is_empty() {
            eprintln!(
                "killed {} process(es) left with the state dir in argv or as working directory: {:?}",
                left.len(),
                left.iter().map(|(p, _)| p).collect::<Vec<_>>()
            );
        }
    }
}
