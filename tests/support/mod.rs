//! Test support for the real components: kcp, kine, PostgreSQL, kubectl and etcdctl, all taken from
//! `bin/` (installed by `hack/install-deps.sh`; `KCPSHARD_BIN_DIR` overrides the directory).
//!
//! Rules:
//! - A missing component is a test failure with an install hint, never a skip (with or without
//!   `CI=true`).
//! - Every process is started in its own process group, with `PR_SET_PDEATHSIG=SIGKILL`, and is
//!   killed (the whole group) when its handle drops, so nothing outlives a failing test.
//! - Everything listens on 127.0.0.1 only: on a unix socket, a port it was given bound, or a port
//!   from outside the kernel's ephemeral range ([`ports`]).
//!
//! Use from an integration test with `mod support;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use kcpshard::process::PortReservation;
use kcpshard::store::kine::KineAddress;

pub use tempfile::TempDir;

pub mod alerts;
pub mod embedded_kcp;
mod kcp;
mod kine;
pub mod ports;
mod stores;

pub use ports::test_port;
// Each test binary uses a part of the helpers.
#[allow(unused_imports)]
pub use {kcp::*, kine::*, stores::*};

// ------------------------------------------------------------------------------------------------
// Locating components

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn bin_dir() -> PathBuf {
    std::env::var_os("KCPSHARD_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("bin"))
}

pub fn in_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A system program (on PATH or in /usr/sbin, /sbin), such as systemd-nspawn; panics with the
/// install hint when it is missing, never skips.
pub fn require_system(program: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
        .unwrap_or_else(|| {
            panic!(
                "required program `{program}` is missing. Install it with `hack/install-deps.sh` \
                 (hack/test.sh runs it first).{}",
                if in_ci() {
                    " (CI=true: a missing component is a failure, never a skip)"
                } else {
                    ""
                }
            )
        })
}

/// Path of `bin/<component>`; panics with the install hint when it is missing. Tests that need a
/// real component fail without it, whether `CI=true` or not: they never skip.
pub fn require(component: &str) -> PathBuf {
    let p = bin_dir().join(component);
    if is_executable(&p) {
        return p;
    }
    panic!(
        "required component `{component}` is missing: {} is not an executable file.\n\
         Install the pinned components with `hack/install-deps.sh` (hack/test.sh runs it first), \
         or point KCPSHARD_BIN_DIR at a directory that has them.{}",
        p.display(),
        if in_ci() {
            " (CI=true: a missing component is a failure, never a skip)"
        } else {
            ""
        }
    )
}

/// [`require`], with the link in `bin/` resolved: the `postgres` user runs it, and may not reach a
/// link in a checkout under another user's private directory (as kcpshard itself resolves it,
/// store/managed.rs).
fn require_as_postgres(component: &str) -> PathBuf {
    let link = require(component);
    fs::canonicalize(&link).unwrap_or(link)
}

/// Pins from hack/versions.env (KEY=VALUE lines, optional double quotes).
pub fn pins() -> &'static BTreeMap<String, String> {
    static PINS: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    PINS.get_or_init(|| {
        let path = repo_root().join("hack/versions.env");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.lines()
            .filter_map(|l| {
                let l = l.trim();
                if l.starts_with('#') {
                    return None;
                }
                let (k, v) = l.split_once('=')?;
                Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            })
            .collect()
    })
}

pub fn pin(key: &str) -> String {
    pins()
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("hack/versions.env has no {key}"))
}

/// The kcp release tests run by default.
pub fn kcp_newer() -> String {
    pin("KCP_VERSION_NEWER")
}

/// The older kcp release, for version-bump tests.
pub fn kcp_older() -> String {
    pin("KCP_VERSION_OLDER")
}

/// The kcp release of the minor line before `kcp_newer`'s, for minor-step tests.
pub fn kcp_older_minor() -> String {
    pin("KCP_VERSION_OLDER_MINOR")
}

/// Every kcp release hack/install-deps.sh builds.
pub fn kcp_versions() -> Vec<String> {
    pin("KCP_VERSIONS").split_whitespace().map(str::to_string).collect()
}

pub fn kcp_bin(version: &str) -> PathBuf {
    require(&format!("kcp-{version}"))
}

// ------------------------------------------------------------------------------------------------
// Ports

pub fn port_accepts(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Poll `f` every `every` until it returns Some or `timeout` passes.
pub fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(every);
    }
}

// ------------------------------------------------------------------------------------------------
// Processes

/// A child process in its own process group; the group is killed on drop.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    pub started: Instant,
    /// Signal sent to the group first on stop; SIGKILL follows after `grace`.
    pub stop_signal: i32,
    pub grace: Duration,
    exited: Option<ExitStatus>,
}

/// Starts `cmd` in a process group of its own, stdin closed, stdout and stderr appended to `log`,
/// and SIGKILLed (`PR_SET_PDEATHSIG`) when the thread that started it goes away (the test thread
/// ends, the test binary is killed): a second line of defence behind the tests' own cleanup.
///
/// Call it from the test's own thread (or one that lives as long as the process should): a
/// short-lived thread (e.g. tokio's `spawn_blocking` pool) would SIGKILL the child early.
pub fn spawn_tied(cmd: &mut Command, log: &Path) -> Child {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()))
}

impl Proc {
    /// Spawn `cmd` with stdout and stderr appended to `log` ([`spawn_tied`]).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let started = Instant::now();
        let child = spawn_tied(&mut cmd, log);
        Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            started,
            stop_signal: libc::SIGTERM,
            grace: Duration::from_secs(10),
            exited: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    pub fn is_running(&mut self) -> bool {
        self.exited().is_none()
    }

    /// Resident set size of the process (not its children), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let mut f = match File::open(&self.log) {
            Ok(f) => f,
            Err(e) => return format!("(no log {}: {e})", self.log.display()),
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: plain syscall; the group id is the child's pid (process_group(0)).
        unsafe {
            libc::kill(-(self.pid() as i32), sig);
        }
    }

    /// Stop the whole process group: `stop_signal`, then SIGKILL after `grace`. Idempotent.
    pub fn stop(&mut self) {
        if self.exited().is_none() {
            self.signal_group(self.stop_signal);
            let deadline = Instant::now() + self.grace;
            while self.exited().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
        // Always SIGKILL the group: children may outlive the leader.
        self.signal_group(libc::SIGKILL);
        if self.exited.is_none() {
            self.exited = self.child.wait().ok();
        }
    }

    /// Panic with `msg` and the last lines of the log.
    pub fn fail(&self, msg: &str) -> ! {
        panic!("{}", self.report(msg))
    }

    /// `msg` with the last lines of the log, whose whole is kept in target/tmp/failed-test-logs.
    pub fn report(&self, msg: &str) -> String {
        let kept = match self.keep_log() {
            Some(copy) => format!(", full log kept at {}", copy.display()),
            None => String::new(),
        };
        format!(
            "{}: {msg}\n--- last lines of {}{kept} ---\n{}\n---",
            self.name,
            self.log.display(),
            self.log_tail(60)
        )
    }

    /// Copy the log out of the (temporary) directory it is in, for the post-mortem.
    fn keep_log(&self) -> Option<PathBuf> {
        let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("failed-test-logs");
        let copy = keep.join(format!("{}-{}.log", self.name, self.pid()));
        fs::create_dir_all(&keep)
            .and_then(|_| fs::copy(&self.log, &copy))
            .ok()?;
        Some(copy)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if thread::panicking() {
            // The log usually sits in a TempDir that goes next: keep a copy for the post-mortem.
            eprintln!(
                "--- {} (pid {}) last lines of {}{} ---\n{}\n---",
                self.name,
                self.pid(),
                self.log.display(),
                match self.keep_log() {
                    Some(copy) => format!(", full log kept at {}", copy.display()),
                    None => String::new(),
                },
                self.log_tail(25)
            );
        }
    }
}

/// Run a short command to completion, with a timeout (its group is killed past it).
pub fn run(cmd: Command, timeout: Duration) -> Output {
    run_with_input(cmd, None, timeout)
}

/// [`run`], with `input` on the command's stdin (none: /dev/null).
pub fn run_with_input(mut cmd: Command, input: Option<&[u8]>, timeout: Duration) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (tmp.path().join("out"), tmp.path().join("err"));
    let stdin = match input {
        Some(bytes) => {
            let in_path = tmp.path().join("in");
            fs::write(&in_path, bytes).unwrap();
            Stdio::from(File::open(&in_path).unwrap())
        }
        None => Stdio::null(),
    };
    cmd.stdin(stdin)
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .process_group(0);
    let program = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {program}: {e}"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            // SAFETY: plain kill(2) of the process group the child leads (process_group(0)).
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("{program} did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: fs::read(&out_path).unwrap(),
        stderr: fs::read(&err_path).unwrap(),
    }
}

/// Makes the until file of a `kcpshard job store-mirror` and waits for the job to end: its progress,
/// which must say Done, its stdout, and how long it took after the until file.
pub async fn finish_mirror(
    job: Child,
    until: &Path,
    progress: &Path,
) -> (kcpshard::store::mirror::MirrorProgress, String, Duration) {
    use kcpshard::store::mirror::{MirrorPhase, MirrorProgress};
    let named_at = Instant::now();
    fs::write(until, "").unwrap();
    let out = tokio::task::spawn_blocking(move || job.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = MirrorProgress::load(progress).unwrap().unwrap();
    assert_eq!(done.phase, MirrorPhase::Done, "{done:?}");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (done, stdout, named_at.elapsed())
}

/// Every file under `dir` but those under the directories named `skip` (relative to `dir`), with
/// its bytes: what a test compares to show that nothing was written there.
pub fn files_under(dir: &Path, skip: &[&str]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(next) = dirs.pop() {
        for entry in fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            if skip.contains(&name.as_str()) {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.insert(name, fs::read(&path).unwrap());
            }
        }
    }
    files
}
