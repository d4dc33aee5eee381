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

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub async fn api_client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config =
        Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig)?, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

pub fn event_time(e: &Event) -> String {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))
        .unwrap_or_default()
}

/// How many times an event happened (a series counts more than once).
pub fn event_count(e: &Event) -> i32 {
    e.count.unwrap_or(1).max(1)
}

pub fn summarize_events(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {} x{}: {}",
                event_time(e),
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                event_count(e),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------------------------------------------------------
// Status

pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub fn condition_is(object: &Value, type_: &str, status: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == status)
}

/// status.lastRoll is a completed roll to `version` that started after `after` (RFC 3339), and the
/// shard is Ready.
pub fn completed_roll_to(object: &Value, version: &str, after: &str) -> bool {
    let roll = &object["status"]["lastRoll"];
    roll["toVersion"] == version
        && roll["completedAt"].is_string()
        && roll["startedAt"].as_str().is_some_and(|t| t > after)
        && ready_now(object)
}

/// Ready=True, observed at the object's current generation.
pub fn ready_now(object: &Value) -> bool {
    let generation = &object["metadata"]["generation"];
    condition(object, "Ready").is_some_and(|c| c["status"] == "True" && &c["observedGeneration"] == generation)
        && &object["status"]["observedGeneration"] == generation
}

pub fn active_slot(object: &Value) -> Option<String> {
    object["status"]["activeSlot"].as_str().map(str::to_string)
}

/// The pid of the active slot, from status.slots.
pub fn active_pid(object: &Value) -> Option<i32> {
    let active = active_slot(object)?;
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == active.as_str())?["pid"]
        .as_i64()
        .map(|p| p as i32)
}

/// The slots the front serves from, as status says.
pub fn serving(object: &Value) -> Vec<String> {
    object["status"]["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["serving"] == true)
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// The slot status names as the controllers' Lease holder, with its pid.
pub fn leader(object: &Value) -> Option<(String, i32)> {
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["leader"] == true && s["pid"].is_number())
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["pid"].as_i64().unwrap() as i32,
            )
        })
}

/// The pid of slot `name`, from status.slots.
pub fn slot_pid(object: &Value, name: &str) -> Option<i32> {
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
        .and_then(|s| s["pid"].as_i64())
        .map(|p| p as i32)
}

/// The pids of every running slot, from status.slots.
pub fn slot_pids(object: &Value) -> Vec<i32> {
    object["status"]["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// Ready, nothing in progress, and `n` slots, every one serving.
pub async fn settled(env: &Env, name: &str, n: usize, timeout: Duration) -> Value {
    env.until(name, timeout, &format!("{n} slots serving, the roll done"), |o| {
        let idle = condition(o, "Progressing").is_some_and(|c| c["status"] == "False");
        (ready_now(o) && idle && serving(o).len() == n && o["status"]["slots"].as_array()?.len() == n)
            .then(|| o.clone())
    })
    .await
}

/// Events about the shard since `since` (lastTimestamp has whole seconds: one second of slack),
/// as (type, reason, message).
pub async fn events_since(env: &Env, shard: &str, since: DateTime<Utc>) -> Vec<(String, String, String)> {
    env.events(shard)
        .await
        .into_iter()
        .filter(|e| {
            event_time(e)
                .parse::<DateTime<Utc>>()
                .is_ok_and(|t| t >= since - chrono::Duration::seconds(1))
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

pub fn render_events(events: &[(String, String, String)]) -> String {
    events
        .iter()
        .map(|(t, r, m)| format!("    {t} {r}: {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the shard's front says of itself (kcpshard's front): its serving set and, per slot, the
/// connections it gave each slot (the numbers of its `/metrics`).
pub async fn front_status(env: &Env, shard: &str) -> kcpshard::front::FrontStatus {
    let dir = env.shard_dir(shard).join("front");
    let front = kcpshard::front::FrontClient::connect(&dir)
        .await
        .unwrap_or_else(|e| env.fail(&format!("the front of {shard}: {e}")));
    front
        .status()
        .await
        .unwrap_or_else(|e| env.fail(&format!("status of the front of {shard}: {e}")))
}

/// serve's `/metrics`.
pub async fn serve_metrics(env: &Env) -> String {
    env.client()
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| env.fail(&format!("GET /metrics: {e}")))
}

/// The longest a step may take in the real-kcp tests (a bucket of [`slow_steps`]). Every step
/// starts its work and returns: a request to kcp or PostgreSQL it does not have the answer to
/// within 50 ms runs on beside the reconcile (controller/requests.rs), a process or a copy is
/// observed later. What is left is the step's own work (records written and fsynced, a process
/// spawned), under 0.1 s on a quiet 2-core machine and more with CI's build beside it.
pub const STEP_BOUND: &str = "0.25";

/// The steps the controller took for `shard` that took longer than `over` seconds to act (a bucket
/// of serve's `kcpshard_controller_step_duration_seconds`: "0.1", "0.25", "0.5", "1.0"): per step,
/// how many of how many.
pub async fn slow_steps(env: &Env, shard: &str, over: &str) -> Vec<(String, u64, u64)> {
    steps_over(&serve_metrics(env).await, shard, over).unwrap_or_else(|e| env.fail(&e))
}

/// [`slow_steps`] in the text of serve's `/metrics`.
pub fn steps_over(metrics: &str, shard: &str, over: &str) -> Result<Vec<(String, u64, u64)>, String> {
    let series = |prefix: &str, step: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(&format!("{prefix}{step}\"}} "))?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    let mut slow = Vec::new();
    let count_prefix = format!("kcpshard_controller_step_duration_seconds_count{{shard=\"{shard}\",step=\"");
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&count_prefix) else {
            continue;
        };
        let Some((step, count)) = rest.split_once("\"} ") else {
            continue;
        };
        let count: u64 = count.trim().parse().unwrap_or(0);
        let bucket =
            format!("kcpshard_controller_step_duration_seconds_bucket{{le=\"{over}\",shard=\"{shard}\",step=\"");
        let fast = series(&bucket, step).ok_or_else(|| format!("no {over} s bucket for {step}:\n{metrics}"))?;
        if fast < count {
            slow.push((step.to_string(), count - fast, count));
        }
    }
    Ok(slow)
}

pub fn parse_time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()?.parse().ok()
}

/// The phases of status.lastRoll, in the order they must happen. The old slot's exit is not among
/// them: it drains while the Lease is handed over and the probe runs, so it may come before or after
/// those (see [`roll_timings`]).
pub const ROLL_PHASES: [&str; 8] = [
    "startedAt",
    "newSlotStartedAt",
    "newSlotReadyAt",
    "frontSwitchedAt",
    "oldSlotStoppedListeningAt",
    "leaseReleasedAt",
    "probeSucceededAt",
    "completedAt",
];

/// The timings of a completed roll, each phase relative to startedAt, and a check that each is
/// set and in order, and that the old slot exited after it stopped listening and before the roll
/// completed. Err names what is missing or out of order. Sorted by time.
pub fn roll_timings(last_roll: &Value) -> Result<Vec<(&'static str, DateTime<Utc>)>, String> {
    let at = |phase: &'static str| {
        parse_time(&last_roll[phase]).ok_or_else(|| format!("status.lastRoll.{phase} is not set: {last_roll}"))
    };
    let mut times = Vec::new();
    for phase in ROLL_PHASES {
        let t = at(phase)?;
        if let Some((before, previous)) = times.last()
            && t < *previous
        {
            return Err(format!(
                "status.lastRoll.{phase} ({t}) is before {before} ({previous}): {last_roll}"
            ));
        }
        times.push((phase, t));
    }
    let exited = at("oldSlotExitedAt")?;
    if exited < at("oldSlotStoppedListeningAt")? || exited > at("completedAt")? {
        return Err(format!(
            "status.lastRoll.oldSlotExitedAt ({exited}) is not between oldSlotStoppedListeningAt and completedAt: {last_roll}"
        ));
    }
    times.push(("oldSlotExitedAt", exited));
    times.sort_by_key(|(_, t)| *t);
    Ok(times)
}

/// status.lastRoll's `phase` when it belongs to the roll started at or after `since`: set, and
/// not before that roll's startedAt (a value left from an earlier roll would be).
pub fn roll_phase(last_roll: &Value, phase: &str, since: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let started = parse_time(&last_roll["startedAt"]).filter(|t| *t >= since - chrono::Duration::milliseconds(5))?;
    parse_time(&last_roll[phase]).filter(|t| *t >= started)
}

/// Phases of status.lastRoll stamped before its startedAt: left over from an earlier roll.
pub fn stale_phases(last_roll: &Value) -> Vec<String> {
    let Some(started) = parse_time(&last_roll["startedAt"]) else {
        return vec![];
    };
    ROLL_PHASES
        .iter()
        .chain(&["oldSlotExitedAt"])
        .filter(|p| parse_time(&last_roll[**p]).is_some_and(|t| t < started))
        .map(|p| format!("{p}={}", last_roll[*p]))
        .collect()
}

/// One line per phase: its offset from startedAt and from the phase before.
pub fn format_timings(times: &[(&'static str, DateTime<Utc>)]) -> String {
    let start = times[0].1;
    let mut out = String::new();
    let mut previous = start;
    for (phase, t) in times {
        out.push_str(&format!(
            "    {phase:<18} +{:>7.3}s  (step {:>6.3}s)\n",
            (*t - start).num_microseconds().unwrap() as f64 / 1e6,
            (*t - previous).num_microseconds().unwrap() as f64 / 1e6
        ));
        previous = *t;
    }
    out
}

// ------------------------------------------------------------------------------------------------
// kcp through the front

/// A kube config for `context` of `kubeconfig`, dialing `server` instead of the kubeconfig's.
pub async fn config_for(kubeconfig: &Path, context: &str, server: &str) -> Config {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("read {}: {e}", kubeconfig.display()));
    let options = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(kc, &options)
        .await
        .unwrap_or_else(|e| panic!("{} context {context}: {e}", kubeconfig.display()));
    config.cluster_url = server.parse().unwrap();
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(10));
    config
}

/// The shard admin (persistent token, valid on every slot) dialing the front.
pub async fn front_shard_admin(env: &Env, shard: &str, front: &str) -> Config {
    config_for(
        &env.shard_dir(shard).join("shared/admin.kubeconfig"),
        "shard-base",
        &format!("https://{front}"),
    )
    .await
}

/// The kubeconfig users are given for kcp through the front: kcpshard's admin identity (kcp-admin
/// on every slot) in contexts root and base.
pub fn front_kubeconfig(env: &Env, shard: &str) -> PathBuf {
    env.shard_dir(shard).join("admin.kubeconfig")
}

/// kcpshard's admin identity (the `base` context of the shard's kubeconfig through the front),
/// from `kubeconfig` (the shard's, or a copy of it), dialing the front.
pub async fn front_admin_of(kubeconfig: &Path, front: &str) -> Config {
    config_for(kubeconfig, "base", &format!("https://{front}")).await
}

/// kcpshard's admin identity from the shard's kubeconfig through the front, dialing the front.
pub async fn front_admin(env: &Env, shard: &str, front: &str) -> Config {
    front_admin_of(&front_kubeconfig(env, shard), front).await
}

/// A copy of the shard's kubeconfig through the front, as a user would take one, under the test's
/// temp dir.
pub fn copy_front_kubeconfig(env: &Env, shard: &str, label: &str) -> PathBuf {
    let copy = env.dir().join(format!("{shard}-{label}.kubeconfig"));
    std::fs::copy(front_kubeconfig(env, shard), &copy)
        .unwrap_or_else(|e| env.fail(&format!("copy the front kubeconfig of {shard}: {e}")));
    copy
}

/// `kubectl --kubeconfig KUBECONFIG ARGS...` (bin/kubectl), with `stdin`: its exit status and
/// output.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(require("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// With `kubeconfig`, as a user would: `kubectl --context root get workspaces` works, and a
/// workspace created with `kubectl --context root create` reaches Ready. Err says which failed.
pub async fn kubectl_works(kubeconfig: &Path, name: &str, timeout: Duration) -> Result<Duration, String> {
    let (ok, out) = kubectl(kubeconfig, &["--context", "root", "get", "workspaces"], "");
    if !ok {
        return Err(format!("kubectl --context root get workspaces: {out}"));
    }
    let manifest = format!("apiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata:\n  name: {name}\n");
    let started = Instant::now();
    let (ok, out) = kubectl(kubeconfig, &["--context", "root", "create", "-f", "-"], &manifest);
    if !ok {
        return Err(format!("kubectl --context root create workspace {name}: {out}"));
    }
    let mut phase = String::new();
    while started.elapsed() < timeout {
        let (ok, out) = kubectl(
            kubeconfig,
            &[
                "--context",
                "root",
                "get",
                "workspace",
                name,
                "-o",
                "jsonpath={.status.phase}",
            ],
            "",
        );
        if ok && out.trim() == "Ready" {
            return Ok(started.elapsed());
        }
        phase = out.trim().to_string();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "workspace {name} (created with kubectl) not Ready within {timeout:?}: {phase:?}"
    ))
}

/// One request on a NEW connection (a fresh client): status and body, or the transport error.
pub async fn once(
    config: &Config,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let client = Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    request(&client, method, path, body).await
}

pub async fn request(
    client: &Client,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    exchange(client, method, path, body).await.map(|a| (a.status, a.body))
}

/// An answer: its status, its `Retry-After` in seconds if it had one, its body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub body: String,
}

/// One request on `client`: the whole answer, or the transport error.
pub async fn exchange(
    client: &Client,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Answer, String> {
    use http_body_util::BodyExt;
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .body(kube::client::Body::from(bytes))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.send(request))
        .await
        .map_err(|_| "timed out".to_string())?
        // With its causes: "client error (SendRequest)" alone does not say the connection closed.
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `/readyz` through the front on a new connection answers 200 `ok`.
pub async fn readyz_ok(config: &Config) -> Result<(), String> {
    // kube retries 429, 503 and 504 answers up to 15 times by default: a poll that met a slot
    // shutting down ("apiserver is shutting down", 503) would pass unseen.
    let mut config = config.clone();
    config.default_retry = false;
    match once(&config, http::Method::GET, "/readyz", None).await {
        Ok((200, body)) if body.trim() == "ok" => Ok(()),
        Ok((status, body)) => Err(format!("{status}: {}", body.trim())),
        Err(e) => Err(e),
    }
}

pub const WORKSPACES: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";

/// The tokens of the shard's admin identities (`shared/admin-identities.json`), to search for.
pub fn admin_tokens(env: &Env, shard: &str) -> Vec<String> {
    let path = env.shard_dir(shard).join("shared/admin-identities.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
        .unwrap_or_else(|e| env.fail(&format!("{}: {e}", path.display())));
    record["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["token"].as_str().map(str::to_string))
        .collect()
}

/// No admin token (nor a 16-character part of one) in the shard's status and events, serve's log,
/// any log under the state dir, or the argv of any process that names the state dir. Returns how
/// many places were searched.
pub async fn assert_no_token_leaked(env: &Env, shard: &str, tokens: &[String]) -> usize {
    let mut places: Vec<(String, String)> = vec![
        (
            "the KcpShard".into(),
            env.get(shard).await.map(|o| o.to_string()).unwrap_or_default(),
        ),
        ("its events".into(), summarize_events(&env.events(shard).await)),
        (
            "serve's log".into(),
            std::fs::read_to_string(env.serve_log()).unwrap_or_default(),
        ),
    ];
    let mut dirs = vec![env.state.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                places.push((
                    path.display().to_string(),
                    std::fs::read_to_string(&path).unwrap_or_default(),
                ));
            }
        }
    }
    for (pid, argv) in processes_with(&env.state.display().to_string()) {
        places.push((format!("argv of pid {pid}"), argv));
    }
    for token in tokens {
        let chars: Vec<char> = token.chars().collect();
        for part in chars.windows(16.min(chars.len())).map(|w| w.iter().collect::<String>()) {
            for (place, text) in &places {
                assert!(
                    !text.contains(&part),
                    "{place} holds a part of an admin token ({part:?})"
                );
            }
        }
    }
    places.len()
}

/// `GET path` on a new connection answers 200 (kube's retries off, as in [`readyz_ok`]).
pub async fn get_ok(config: &Config, path: &str) -> Result<(), String> {
    answered_ok(get_answer(config, path).await)
}

/// `GET path` on a new connection (kube's retries off, as in [`readyz_ok`]): the whole answer.
pub async fn get_answer(config: &Config, path: &str) -> Result<Answer, String> {
    let mut config = config.clone();
    config.default_retry = false;
    let client = Client::try_from(config).map_err(|e| e.to_string())?;
    exchange(&client, http::Method::GET, path, None).await
}

fn answered_ok(answer: Result<Answer, String>) -> Result<(), String> {
    match answer {
        Ok(a) if a.status == 200 => Ok(()),
        Ok(a) => Err(format!("{}: {}", a.status, a.body.trim())),
        Err(e) => Err(e),
    }
}

/// How often client-go asks again after an answer that says when to (rest/with_retry.go:309,
/// `checkWait`: a 429 or any status from 500 up with `Retry-After`; rest/request.go:167,
/// `maxRetries: 10`).
const CLIENT_GO_RETRIES: u64 = 10;

/// `GET path` on a new connection as client-go asks it: a 429 or 500-and-up answer with `Retry-After`
/// is asked again after that many seconds, up to [`CLIENT_GO_RETRIES`] times; each such retry
/// is counted in `retried_after`, only the last outcome is the poll's.
async fn get_like_client_go(config: &Config, path: &str, retried_after: &mut u64) -> Result<(), String> {
    let mut answer = get_answer(config, path).await;
    for _ in 0..CLIENT_GO_RETRIES {
        let wait = match &answer {
            Ok(a) if a.status == 429 || a.status >= 500 => a.retry_after,
            _ => None,
        };
        let Some(seconds) = wait else { break };
        *retried_after += 1;
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        answer = get_answer(config, path).await;
    }
    answered_ok(answer)
}

/// Creates workspace `name` in root (as whoever `config` is) and waits for phase Ready; returns
/// the time from the create to Ready, or Err with the last phase seen.
pub async fn create_workspace_ready(config: &Config, name: &str, timeout: Duration) -> Result<Duration, String> {
    create_workspace_ready_in(config, "root", name, timeout).await
}

/// [`create_workspace_ready`] in the workspace `parent` (e.g. `root:team`): a nested workspace.
pub async fn create_workspace_ready_in(
    config: &Config,
    parent: &str,
    name: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let workspaces = format!("/clusters/{parent}/apis/tenancy.kcp.io/v1alpha1/workspaces");
    let body = json!({ "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name } });
    let started = Instant::now();
    loop {
        match once(config, http::Method::POST, &workspaces, Some(&body)).await {
            Ok((201 | 200, _)) => break,
            // A parent that just got Ready may not be resolved by its path yet (kcp indexes
            // workspaces by path from its informers): "404 page not found" for a moment.
            Ok((404, _)) if started.elapsed() < timeout => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok((status, body)) => return Err(format!("create workspace {name}: {status} {body}")),
            Err(e) => return Err(format!("create workspace {name}: {e}")),
        }
    }
    let client = Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    let mut phase = String::new();
    while started.elapsed() < timeout {
        if let Ok((200, body)) = request(&client, http::Method::GET, &format!("{workspaces}/{name}"), None).await {
            let ws: Value = serde_json::from_str(&body).unwrap_or_default();
            phase = ws["status"]["phase"].as_str().unwrap_or_default().to_string();
            if phase == "Ready" {
                return Ok(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "workspace {name} not Ready within {timeout:?} (phase {phase:?})"
    ))
}

/// SIGSTOPs the one process of the shard's state dir whose argv contains `marker` (its kine:
/// `--endpoint=sqlite://`; its front: ` front `) and waits until another process with that marker
/// runs, the stopped one is gone and `/readyz` through the front answers `ok` again, failing after
/// `within`. Returns how long that took. A stopped process still there at the end is killed, so
/// that nothing is left behind.
pub async fn stop_and_await_replacement(
    env: &Env,
    readyz: &Config,
    what: &str,
    marker: &str,
    within: Duration,
) -> Duration {
    let needle = env.state.display().to_string();
    let pid = processes_with(&needle)
        .into_iter()
        .find(|(_, argv)| argv.contains(marker))
        .unwrap_or_else(|| env.fail(&format!("no {what} runs")))
        .0;
    signal(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let deadline = stopped + within;
    let outcome = loop {
        let replaced = !alive(pid)
            && processes_with(&needle)
                .iter()
                .any(|(p, argv)| argv.contains(marker) && *p != pid);
        if replaced && readyz_ok(readyz).await.is_ok() {
            break Ok(stopped.elapsed());
        }
        if Instant::now() >= deadline {
            break Err(format!(
                "the shard does not serve {within:?} after its {what} (pid {pid}) was SIGSTOPped: {}",
                if alive(pid) {
                    "the stopped one still runs"
                } else {
                    "it is gone"
                }
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if alive(pid) {
        signal(pid, libc::SIGKILL);
        signal(pid, libc::SIGCONT);
    }
    outcome.unwrap_or_else(|e| env.fail(&e))
}

// ------------------------------------------------------------------------------------------------
// KinePostgres shards

/// A KinePostgres shard on `pg` (database kcp_e2e, user postgres, the password in `password_file`).
pub fn postgres_spec(
    version: &str,
    front: &str,
    pg: &crate::support::Postgres,
    password_file: &std::path::Path,
) -> Value {
    json!({
        "version": version,
        "store": {
            "type": "KinePostgres",
            "kinePostgres": {
                "host": "127.0.0.1",
                "port": pg.port,
                "database": "kcp_e2e",
                "user": "postgres",
                "passwordFrom": { "file": password_file.display().to_string() },
            },
        },
        "front": { "type": "Tcp", "listen": front },
    })
}

/// spec.store of a managed PostgreSQL on `port` (user kcp, database kcp), its password in
/// `password_file`.
pub fn managed_postgres_store(port: u16, password_file: &std::path::Path) -> Value {
    json!({
        "type": "KinePostgres",
        "kinePostgres": {
            "host": "127.0.0.1",
            "port": port,
            "database": "kcp",
            "user": "kcp",
            "passwordFrom": { "file": password_file.display().to_string() },
            "managed": true,
        },
    })
}

/// Live kine processes of this shard's slots on this PostgreSQL (their endpoint names both).
pub fn slot_kines(pg: &crate::support::Postgres, shard: &str) -> Vec<(i32, String)> {
    processes_with(&format!("@127.0.0.1:{}/", pg.port))
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(&format!("application_name=kcpshard-{shard}-")))
        // A preflight's kine serves a scratch copy, not a slot.
        .filter(|(_, cmdline)| !cmdline.contains(&format!("application_name=kcpshard-{shard}-preflight")))
        .collect()
}

/// Waits up to 15 s until `n` slot kines of the shard run on `pg` (an old slot's kine stops after
/// its slot); fails naming those that run.
pub fn await_slot_kines(pg: &crate::support::Postgres, shard: &str, n: usize) {
    let settled = crate::support::poll(Duration::from_secs(15), Duration::from_millis(100), || {
        (slot_kines(pg, shard).len() == n).then_some(())
    });
    assert!(
        settled.is_some(),
        "want {n} slot kines, an old slot's kine still runs: {:?}",
        slot_kines(pg, shard)
    );
}

/// Slot kines have no state dir in their argv, which is what the e2e sweep looks for: sweep
/// them by their PostgreSQL's port, however the test ends.
pub struct SweepKines(pub u16);

impl Drop for SweepKines {
    fn drop(&mut self) {
        sweep(&format!("@127.0.0.1:{}/", self.0), Duration::from_secs(5));
    }
}

// ------------------------------------------------------------------------------------------------
// A /readyz poller through the front

#[derive(Debug, Default, Clone)]
pub struct PollStats {
    pub polls: u64,
    pub failures: Vec<(DateTime<Utc>, String)>,
    /// When each poll that succeeded was sent.
    pub succeeded: Vec<DateTime<Utc>>,
    /// Kept-alive polls asked again because their pooled connection closed before an answer (see
    /// [`Poller::kept_alive`]); not failures.
    pub retried: u64,
    /// Polls asked again after an answer with `Retry-After` (see [`Poller::get_like_client_go`]);
    /// not failures.
    pub retried_after: u64,
    /// The longest a poll took: while the store is down a request hangs before it fails, and a
    /// user waits that long.
    pub slowest: Duration,
    /// Polls that failed or took over a second: (when each was sent, when it ended).
    pub disrupted: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl PollStats {
    /// Failures whose connection was refused (nothing accepted it), as opposed to ones cut or
    /// answered with an error.
    pub fn refused(&self) -> usize {
        self.failures
            .iter()
            .filter(|(_, e)| e.to_lowercase().contains("connection refused"))
            .count()
    }

    /// Polls sent in `[from, to]` that succeeded.
    pub fn succeeded_between(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        self.succeeded.iter().filter(|t| (from..=to).contains(*t)).count()
    }
}

/// What a poller asks.
#[derive(Clone)]
enum Poll {
    /// `/readyz` on a new connection.
    Readyz,
    /// `GET path` on a new connection.
    Get(String),
    /// `GET path` on a new connection, asked again when the answer says when (as client-go does).
    GetLikeClientGo(String),
    /// `GET path` on one client's kept-alive connection (`/readyz`: answered `ok`).
    KeptAlive(String),
}

/// Polls through the front: each poll on a new connection (as `curl` does), `/readyz` every 50 ms
/// (or as given) or an authenticated GET from two clients every 25 ms each ([`Poller::get`]); or
/// `/readyz` on a kept-alive connection ([`Poller::kept_alive`]).
pub struct Poller {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<PollStats>>,
}

/// How often a kept-alive poll is asked again after its pooled connection closed before an answer.
const POOL_RETRIES: u64 = 4;

impl Poller {
    pub fn start(config: Config) -> Poller {
        Poller::run(config, Poll::Readyz, Duration::from_millis(50), 1)
    }

    /// `/readyz` every `every`.
    pub fn start_every(config: Config, every: Duration) -> Poller {
        Poller::run(config, Poll::Readyz, every, 1)
    }

    /// `GET path` as whoever `config` is, answered 200 (a 401 or 403 is a refused identity).
    pub fn get(config: Config, path: &str) -> Poller {
        Poller::run(config, Poll::Get(path.to_string()), Duration::from_millis(25), 2)
    }

    /// `GET path` as whoever `config` is, from one client every `every`, asked as client-go asks
    /// it: an answer that says when to ask again (a 429 or 500-and-up with `Retry-After`, such as kcp's
    /// own 503 "apiserver is shutting down" to a request that crossed its GOAWAY) is asked again
    /// after that delay, up to 10 times. Those retries are counted apart, in `retried_after`;
    /// every other answer but 200 is a failure.
    pub fn get_like_client_go(config: Config, path: &str, every: Duration) -> Poller {
        Poller::run(config, Poll::GetLikeClientGo(path.to_string()), every, 1)
    }

    /// `/readyz` every `every` from one client that keeps its connection alive between polls, as
    /// client-go does. When the kept-alive connection turns out closed or reset before any answer
    /// (the front closes one to a slot that left its serving set at its next request; a killed
    /// slot's close races the next request), the poll is asked again at once on a new connection,
    /// as Go's net/http transport does for an idempotent request on a reused connection; an answer
    /// that says when to ask again (kcp's 503 "apiserver is shutting down" with `Retry-After: 1`
    /// to a request that reached it after SIGTERM) is asked again then, as client-go does. Such
    /// retries are counted apart (`retried`, `retried_after`), only the last outcome is the
    /// poll's.
    pub fn kept_alive(config: Config, every: Duration) -> Poller {
        Poller::run(config, Poll::KeptAlive("/readyz".into()), every, 1)
    }

    /// As [`Poller::kept_alive`], `GET path` answered 200: an API request, which a kcp that is
    /// stopping still answers (its `/readyz` then says it is not ready, by design).
    pub fn kept_alive_get(config: Config, path: &str, every: Duration) -> Poller {
        Poller::run(config, Poll::KeptAlive(path.to_string()), every, 1)
    }

    fn run(config: Config, poll: Poll, every: Duration, clients: usize) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|_| Poller::client(config.clone(), poll.clone(), every, stop.clone()))
            .collect();
        Poller { stop, tasks }
    }

    fn client(
        config: Config,
        poll: Poll,
        every: Duration,
        flag: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<PollStats> {
        tokio::spawn(async move {
            let mut stats = PollStats::default();
            let mut config = config;
            config.default_retry = false;
            let kept = Client::try_from(config.clone()).expect("a client");
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                stats.polls += 1;
                let (sent, started) = (Utc::now(), Instant::now());
                let outcome = match &poll {
                    Poll::Readyz => readyz_ok(&config).await,
                    Poll::Get(path) => get_ok(&config, path).await,
                    Poll::GetLikeClientGo(path) => get_like_client_go(&config, path, &mut stats.retried_after).await,
                    Poll::KeptAlive(path) => {
                        let mut answer = exchange(&kept, http::Method::GET, path, None).await;
                        let (mut lost, mut told) = (0, 0);
                        loop {
                            match &answer {
                                Err(e) if connection_lost(e) && lost < POOL_RETRIES => {
                                    lost += 1;
                                    stats.retried += 1;
                                }
                                Ok(a) if (a.status == 429 || a.status >= 500) && told < CLIENT_GO_RETRIES => {
                                    let Some(seconds) = a.retry_after else { break };
                                    told += 1;
                                    stats.retried_after += 1;
                                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                                }
                                _ => break,
                            }
                            answer = exchange(&kept, http::Method::GET, path, None).await;
                        }
                        kept_answer_ok(path, answer)
                    }
                };
                let took = started.elapsed();
                stats.slowest = stats.slowest.max(took);
                if outcome.is_err() || took > Duration::from_secs(1) {
                    stats.disrupted.push((sent, Utc::now()));
                }
                match outcome {
                    Ok(()) => stats.succeeded.push(sent),
                    Err(e) => stats.failures.push((sent, e)),
                }
            }
            stats
        })
    }

    pub async fn finish(self) -> PollStats {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = PollStats::default();
        for task in self.tasks {
            let stats = task.await.expect("poller task");
            all.polls += stats.polls;
            all.retried += stats.retried;
            all.retried_after += stats.retried_after;
            all.failures.extend(stats.failures);
            all.succeeded.extend(stats.succeeded);
            all.slowest = all.slowest.max(stats.slowest);
            all.disrupted.extend(stats.disrupted);
        }
        all.failures.sort_by_key(|(t, _)| *t);
        all.succeeded.sort();
        all.disrupted.sort();
        all
    }
}

/// `GET path` answered 200 (`/readyz`: `ok`).
fn kept_answer_ok(path: &str, answer: Result<Answer, String>) -> Result<(), String> {
    match answer {
        Ok(a) if a.status == 200 && (path != "/readyz" || a.body.trim() == "ok") => Ok(()),
        Ok(a) => Err(format!("{}: {}", a.status, a.body.trim())),
        Err(e) => Err(e),
    }
}

/// An error that says the connection closed or was reset before an answer came.
fn connection_lost(error: &str) -> bool {
    let e = error.to_lowercase();
    e.contains("closed") || e.contains("reset") || e.contains("broken pipe")
}

pub fn describe_failures(stats: &PollStats) -> String {
    stats
        .failures
        .iter()
        .take(20)
        .map(|(t, e)| format!("  {t}: {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Figures collected by a test, printed at its end for docs/benchmarks.md.
#[derive(Default)]
pub struct Report {
    pub lines: BTreeMap<usize, String>,
}

impl Report {
    pub fn add(&mut self, line: impl Into<String>) {
        let n = self.lines.len();
        let line = line.into();
        println!("{line}");
        self.lines.insert(n, line);
    }

    pub fn print(&self, title: &str) {
        println!("==== {title} ====");
        for line in self.lines.values() {
            println!("{line}");
        }
        println!("====");
    }
}

/// An APIResourceSchema and an APIExport of it in root, and an APIBinding to it in workspace
/// `workspace` (which must exist), as a user makes them: `Ok` once the binding is Bound and its
/// resource is served in the workspace.
pub async fn bind_an_export(config: &Config, workspace: &str, timeout: Duration) -> Result<(), String> {
    let schema = json!({
        "apiVersion": "apis.kcp.io/v1alpha1",
        "kind": "APIResourceSchema",
        "metadata": { "name": "v1.widgets.e2e.kcpshard.io" },
        "spec": {
            "group": "e2e.kcpshard.io",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "scope": "Cluster",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            }],
        },
    });
    let export = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": { "name": "e2e-widgets" },
        "spec": { "resources": [{
            "group": "e2e.kcpshard.io", "name": "widgets",
            "schema": "v1.widgets.e2e.kcpshard.io", "storage": { "crd": {} },
        }] },
    });
    let binding = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBinding",
        "metadata": { "name": "e2e-widgets" },
        "spec": { "reference": { "export": { "path": "root", "name": "e2e-widgets" } } },
    });
    for (path, body) in [
        (
            "/clusters/root/apis/apis.kcp.io/v1alpha1/apiresourceschemas".to_string(),
            schema,
        ),
        (
            "/clusters/root/apis/apis.kcp.io/v1alpha2/apiexports".to_string(),
            export,
        ),
        (
            format!("/clusters/root:{workspace}/apis/apis.kcp.io/v1alpha2/apibindings"),
            binding,
        ),
    ] {
        match once(config, http::Method::POST, &path, Some(&body)).await {
            Ok((200 | 201, _)) => {}
            Ok((status, body)) => return Err(format!("POST {path}: {status} {body}")),
            Err(e) => return Err(format!("POST {path}: {e}")),
        }
    }
    export_served(config, workspace, timeout).await
}

/// The binding [`bind_an_export`] made is Bound and its resource is served in `workspace`.
pub async fn export_served(config: &Config, workspace: &str, timeout: Duration) -> Result<(), String> {
    let binding = format!("/clusters/root:{workspace}/apis/apis.kcp.io/v1alpha2/apibindings/e2e-widgets");
    let widgets = format!("/clusters/root:{workspace}/apis/e2e.kcpshard.io/v1/widgets");
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        match once(config, http::Method::GET, &binding, None).await {
            Ok((200, body)) => {
                let b: Value = serde_json::from_str(&body).unwrap_or_default();
                let phase = b["status"]["phase"].as_str().unwrap_or_default().to_string();
                match once(config, http::Method::GET, &widgets, None).await {
                    Ok((200, _)) if phase == "Bound" => return Ok(()),
                    Ok((status, _)) => last = format!("binding phase {phase:?}, GET widgets: {status}"),
                    Err(e) => last = e,
                }
            }
            Ok((status, body)) => last = format!("GET {binding}: {status} {body}"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "the APIBinding in {workspace} is not served within {timeout:?}: {last}"
    ))
}

/// A preflight's status once it has a result for `version` (started after `after`, RFC 3339).
pub fn preflight_done<'a>(object: &'a Value, version: &str, after: &str) -> Option<&'a Value> {
    let p = &object["status"]["preflight"];
    (p["version"] == version && p["result"].is_string() && p["startedAt"].as_str().is_some_and(|t| t > after))
        .then_some(p)
}

/// What a preflight may leave: processes whose argv names the shard's preflight directory, and
/// the directory of its copy.
pub fn preflight_leftovers(env: &Env, shard: &str) -> Vec<String> {
    let dir = env.shard_dir(shard).join("preflight");
    let mut left: Vec<String> = processes_with(&dir.display().to_string())
        .into_iter()
        .chain(processes_with(&format!("kcpshard-{shard}-preflight")))
        .map(|(pid, argv)| format!("pid {pid}: {argv}"))
        .collect();
    if dir.join("copy").exists() {
        left.push(format!("{} exists", dir.join("copy").display()));
    }
    left
}

/// After a roll to `version` that began at `after` (RFC 3339): the preflight ran first, passed,
/// was told as events (PreflightStarted, PreflightLaunched, PreflightPassed), finished before the roll's first new
/// slot started and left nothing behind. Returns its status.
pub async fn check_preflight_before_roll(env: &Env, shard: &str, version: &str, after: &str) -> Value {
    let object = env.get(shard).await.unwrap();
    let Some(preflight) = preflight_done(&object, version, after).cloned() else {
        env.fail(&format!("no status.preflight of {version}: {:#}", object["status"]));
    };
    env.log(&format!("preflight of {version}: {preflight:#}"));
    let result = preflight["result"].as_str().unwrap_or_default();
    assert!(
        result == "Compatible" || result == "SchemaChanged",
        "the preflight passed: {preflight:#}"
    );
    let completed = parse_time(&preflight["completedAt"]).expect("completedAt");
    let new_slot = parse_time(&object["status"]["lastRoll"]["newSlotStartedAt"]).expect("newSlotStartedAt");
    let started = parse_time(&preflight["startedAt"]).expect("startedAt");
    env.log(&format!(
        "preflight of {version}: {result} {:.1}s after its start, removed and the new slot started {:.1}s after it",
        (completed - started).num_milliseconds() as f64 / 1000.0,
        (new_slot - started).num_milliseconds() as f64 / 1000.0
    ));
    assert!(
        completed < new_slot,
        "the preflight ended ({completed}) before the new slot started ({new_slot})"
    );
    let events = env.events(shard).await;
    for e in events
        .iter()
        .filter(|e| matches!(e.reason.as_deref(), Some("PreflightStarted" | "PreflightLaunched")))
    {
        env.log(&format!(
            "{}: {}",
            e.reason.as_deref().unwrap_or_default(),
            e.message.as_deref().unwrap_or_default()
        ));
    }
    for reason in ["PreflightStarted", "PreflightLaunched", "PreflightPassed"] {
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(version))),
            "no {reason} event for {version}:\n{}",
            summarize_events(&events)
        );
    }
    let left = preflight_leftovers(env, shard);
    assert!(left.is_empty(), "the preflight left: {left:?}");
    preflight
}

/// The workspace with an APIBinding, a ConfigMap and a Secret that [`make_objects`] makes.
pub const KEPT: &str = "before-move";
/// The workspace [`make_objects`] makes inside [`KEPT`].
pub const NESTED: &str = "inner";

/// What a test made before a move or an adoption, as read then, by path.
pub type Kept = BTreeMap<String, Value>;

/// Workspace [`KEPT`] with a workspace [`NESTED`] in it, an APIBinding to an APIExport in root, a
/// ConfigMap and a Secret.
pub async fn make_objects(env: &Env, admin: &Config) -> Kept {
    create_workspace_ready(admin, KEPT, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    create_workspace_ready_in(admin, &format!("root:{KEPT}"), NESTED, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    bind_an_export(admin, KEPT, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    let namespace = format!("/clusters/root:{KEPT}/api/v1/namespaces/default");
    let objects = [
        (
            format!("{namespace}/configmaps"),
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "kept", "labels": { "e2e": "kept" } },
                    "data": { "settings.yaml": "replicas: 3\nregion: eu\n" } }),
        ),
        (
            format!("{namespace}/secrets"),
            json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "kept" },
                    "type": "Opaque", "stringData": { "token": "s3cr3t-before-the-move" } }),
        ),
    ];
    for (path, body) in &objects {
        let (status, answer) = once(admin, http::Method::POST, path, Some(body)).await.unwrap();
        assert_eq!(status, 201, "POST {path}: {answer}");
    }
    let mut kept = Kept::new();
    for path in [
        format!("{namespace}/configmaps/kept"),
        format!("{namespace}/secrets/kept"),
        "/clusters/root/apis/apis.kcp.io/v1alpha2/apiexports/e2e-widgets".to_string(),
        format!("/clusters/root:{KEPT}/apis/apis.kcp.io/v1alpha2/apibindings/e2e-widgets"),
        format!("{WORKSPACES}/{KEPT}"),
        format!("/clusters/root:{KEPT}/apis/tenancy.kcp.io/v1alpha1/workspaces/{NESTED}"),
    ] {
        kept.insert(path.clone(), read(admin, &path).await);
    }
    kept
}

/// `path` as the API serves it now, without what a move may change: its resourceVersion, and the
/// status controllers keep writing (a binding's and a workspace's conditions carry times).
pub async fn read(admin: &Config, path: &str) -> Value {
    let (status, body) = once(admin, http::Method::GET, path, None).await.unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    let mut object: Value = serde_json::from_str(&body).unwrap();
    let meta = object["metadata"].as_object_mut().unwrap();
    meta.remove("resourceVersion");
    meta.remove("managedFields");
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("conditions");
    }
    object
}

/// Every object made before is there, with the same uid, content and (where it has one) phase.
pub async fn assert_objects_kept(env: &Env, admin: &Config, kept: &Kept) {
    for (path, before) in kept {
        let now = read(admin, path).await;
        if &now != before {
            env.fail(&format!("{path} changed:\nbefore {before:#}\nafter  {now:#}"));
        }
    }
    export_served(admin, KEPT, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&e));
}

/// Clients with client-go's patience: its TLS handshake may take 10 s (a new connection in the
/// switch waits in the front until the new store's slot takes it).
pub fn patient(mut config: Config) -> Config {
    config.connect_timeout = Some(Duration::from_secs(10));
    config
}
