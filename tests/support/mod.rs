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

pub mod embedded_kcp;
pub mod ports;
pub use ports::test_port;

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

// ------------------------------------------------------------------------------------------------
// PostgreSQL

/// A throwaway PostgreSQL cluster: initdb in a temp dir, `postgres` on a free port on 127.0.0.1,
/// trust auth, user `postgres`. Killed and removed on drop.
///
/// The postmaster runs as our direct child (not daemonised by `pg_ctl start`) so that its process
/// group dies with the handle. As root, it runs as the `postgres` user (Debian's package creates
/// it), or `nobody`, because PostgreSQL refuses to run as root.
pub struct Postgres {
    pub port: u16,
    pub proc: Proc,
    pub ready_in: Duration,
    ids: Option<(u32, u32)>,
    dir: TempDir,
}

fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() > 3 && f[0] == user {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    })
}

/// A one-member etcd (bin/etcd) on loopback ports, its data under `dir`.
pub struct Etcd {
    /// Its client URL.
    pub endpoint: String,
    pub proc: Proc,
}

impl Etcd {
    /// Starts etcd; its client port accepts connections when this returns.
    pub fn start(dir: &Path) -> Etcd {
        let etcd = require("etcd");
        let (client_port, peer_port) = (test_port(), test_port());
        let mut cmd = Command::new(etcd);
        cmd.arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client_port}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client_port}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"));
        let mut proc = Proc::spawn("etcd", cmd, &dir.join("etcd.log"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", client_port)).is_err() {
            if let Some(status) = proc.exited() {
                proc.fail(&format!("etcd exited during startup: {status}"));
            }
            if Instant::now() > deadline {
                proc.fail("etcd did not accept connections within 30s");
            }
            thread::sleep(Duration::from_millis(50));
        }
        Etcd {
            endpoint: format!("http://127.0.0.1:{client_port}"),
            proc,
        }
    }
}

/// A server certificate for PostgreSQL: PEM of the certificate and of its key.
pub struct ServerTls {
    pub cert: String,
    pub key: String,
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// A server that also takes TLS connections (`ssl=on`) with this certificate.
    pub fn start_with_tls(tls: &ServerTls) -> Postgres {
        Postgres::start_with(Some(tls))
    }

    fn start_with(tls: Option<&ServerTls>) -> Postgres {
        let initdb = require_as_postgres("initdb");
        require("postgres");
        require("psql");
        let dir = tempfile::Builder::new().prefix("kcpshard-pg-").tempdir().unwrap();
        let data = dir.path().join("data");
        let sock = dir.path().join("sock");
        fs::create_dir(&sock).unwrap();
        // SAFETY: plain syscall.
        let as_root = unsafe { libc::geteuid() } == 0;
        let ids = if as_root {
            Some(
                user_ids("postgres")
                    .or_else(|| user_ids("nobody"))
                    .expect("no postgres or nobody user"),
            )
        } else {
            None
        };
        if let Some((uid, gid)) = ids {
            for p in [dir.path(), sock.as_path()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
            }
        }
        let as_user = |cmd: &mut Command| {
            if let Some((uid, gid)) = ids {
                cmd.uid(uid).gid(gid);
            }
        };

        let mut cmd = Command::new(&initdb);
        cmd.args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .current_dir(dir.path());
        as_user(&mut cmd);
        let out = run(cmd, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "initdb failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        if let Some(tls) = tls {
            // In the data directory, under PostgreSQL's default names; the key only its owner's.
            for (name, pem) in [("server.crt", &tls.cert), ("server.key", &tls.key)] {
                let path = data.join(name);
                fs::write(&path, pem).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
                if let Some((uid, gid)) = ids {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
                }
            }
        }
        let port = test_port();
        let log = dir.path().join("postgres.log");
        File::create(&log).unwrap();
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid)).unwrap();
        }
        let proc = Postgres::launch(dir.path(), port, ids);
        let mut pg = Postgres {
            port,
            ready_in: Duration::ZERO,
            proc,
            ids,
            dir,
        };
        pg.wait_accepting();
        pg.ready_in = pg.proc.started.elapsed();
        pg
    }

    /// The postmaster on `port`, over `<dir>/data`.
    fn launch(dir: &Path, port: u16, ids: Option<(u32, u32)>) -> Proc {
        let mut cmd = Command::new(require_as_postgres("postgres"));
        cmd.arg("-D")
            .arg(dir.join("data"))
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.join("sock"))
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ])
            .current_dir(dir);
        if dir.join("data/server.crt").exists() {
            cmd.args(["-c", "ssl=on"]);
        }
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        let mut proc = Proc::spawn("postgres", cmd, &dir.join("postgres.log"));
        proc.stop_signal = libc::SIGQUIT; // immediate shutdown: throwaway data
        proc.grace = Duration::from_secs(5);
        proc
    }

    fn wait_accepting(&mut self) {
        let ok = poll(Duration::from_secs(60), Duration::from_millis(100), || {
            if !self.proc.is_running() {
                self.proc.fail("exited during startup");
            }
            self.try_psql("postgres", "select 1").ok().filter(|s| s.trim() == "1")
        });
        if ok.is_none() {
            self.proc.fail("not ready within 60s");
        }
    }

    /// Stops the server as an administrator would (fast shutdown: sessions are ended), keeping
    /// its data for [`Postgres::restart`].
    pub fn stop_fast(&mut self) {
        self.proc.stop_signal = libc::SIGINT;
        self.proc.stop();
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.proc = Postgres::launch(self.dir.path(), self.port, self.ids);
        self.wait_accepting();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kine endpoint for database `db` (kine creates it when missing).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new(require("psql"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            db,
        ])
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql]);
        let out = run(cmd, Duration::from_secs(30));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.try_psql(db, sql).unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }
}

// ------------------------------------------------------------------------------------------------
// kine

/// A kine process serving the etcd v3 API on a unix socket in its own temp dir, as kcpshard runs
/// it (`kcpshard::store::kine::kine_args`): metrics off, `--compact-interval=0` (the apiserver
/// compacts). Killed on drop.
pub struct Kine {
    pub address: KineAddress,
    pub endpoint: String,
    pub proc: Proc,
    pub ready_in: Option<Duration>,
    dir: TempDir,
}

impl Kine {
    /// A sqlite database in a fresh temp dir; waits until ready.
    pub fn sqlite() -> Kine {
        let dir = tempfile::Builder::new().prefix("kcpshard-kine-").tempdir().unwrap();
        let db = dir.path().join("state.db");
        let endpoint = format!(
            "sqlite://{}?_journal=WAL&cache=shared&_busy_timeout=30000",
            db.display()
        );
        let mut k = Kine::spawn_in(dir, &endpoint);
        k.wait_ready(Duration::from_secs(60))
            .unwrap_or_else(|e| k.proc.fail(&e));
        k
    }

    /// kine on `endpoint` (e.g. `Postgres::url`); waits until ready.
    pub fn start(endpoint: &str) -> Kine {
        let mut k = Kine::spawn(endpoint);
        k.wait_ready(Duration::from_secs(60))
            .unwrap_or_else(|e| k.proc.fail(&e));
        k
    }

    /// Start kine without waiting.
    pub fn spawn(endpoint: &str) -> Kine {
        let dir = tempfile::Builder::new().prefix("kcpshard-kine-").tempdir().unwrap();
        Kine::spawn_in(dir, endpoint)
    }

    /// kine as kcpshard runs a KineSqlite shard's: its DSN over `<store>/state.db`; waits until
    /// ready. Its log and socket are kept outside `store`.
    pub fn kcpshard_sqlite(store: &Path) -> Kine {
        let dir = tempfile::Builder::new().prefix("kcpshard-kine-").tempdir().unwrap();
        let mut k = Kine::spawn_in(dir, &kcpshard::store::kine::sqlite_endpoint(store));
        k.wait_ready(Duration::from_secs(60))
            .unwrap_or_else(|e| k.proc.fail(&e));
        k
    }

    /// kine with the arguments kcpshard gives it (`kcpshard::store::kine::kine_args`).
    fn spawn_in(dir: TempDir, endpoint: &str) -> Kine {
        let kine = require("kine");
        let address = KineAddress::for_new_kine(dir.path()).unwrap();
        let mut cmd = Command::new(kine);
        cmd.args(kcpshard::store::kine::kine_args(endpoint, &address))
            .current_dir(dir.path());
        let proc = Proc::spawn("kine", cmd, &dir.path().join("kine.log"));
        Kine {
            address,
            endpoint: endpoint.to_string(),
            proc,
            ready_in: None,
            dir,
        }
    }

    /// Wait until kine accepts connections (its schema is ready by then), or it exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.proc.exited() {
                return Err(format!("kine exited during startup: {status}"));
            }
            if self.accepts() {
                let d = self.proc.started.elapsed();
                self.ready_in = Some(d);
                return Ok(d);
            }
            if Instant::now() >= deadline {
                return Err(format!("kine did not accept at {} within {timeout:?}", self.address));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Whether a connection to it succeeds.
    fn accepts(&self) -> bool {
        match &self.address {
            KineAddress::Unix(path) => std::os::unix::net::UnixStream::connect(path).is_ok(),
            KineAddress::Tcp(port) => port_accepts(*port),
        }
    }

    /// `unix://<its socket>`, for `--etcd-servers` and etcdctl.
    pub fn url(&self) -> String {
        self.address.url()
    }

    /// Run `bin/etcdctl --endpoints <this kine> <args>`.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_with_input(args, None)
    }

    /// [`Kine::etcdctl`] with `input` on its stdin (`etcdctl txn` reads its request there).
    pub fn etcdctl_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(require("etcdctl"));
        cmd.arg(format!("--endpoints={}", self.url()))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s")
            .args(args)
            .env("ETCDCTL_API", "3");
        run_with_input(cmd, input, Duration::from_secs(20))
    }

    pub fn put(&self, key: &str, value: &str) {
        let out = self.etcdctl(&["put", key, value]);
        assert!(
            out.status.success(),
            "etcdctl put {key} via {}: {}",
            self.url(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The value of `key`, or None when absent.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = self.etcdctl(&["get", key, "--print-value-only"]);
        assert!(
            out.status.success(),
            "etcdctl get {key} via {}: {}",
            self.url(),
            String::from_utf8_lossy(&out.stderr)
        );
        let s = String::from_utf8_lossy(&out.stdout).trim_end_matches('\n').to_string();
        (!s.is_empty()).then_some(s)
    }
}

// ------------------------------------------------------------------------------------------------
// kcp

pub struct KcpOptions {
    pub version: String,
    pub root_dir: PathBuf,
    /// Held until the kcp stops; kcp binds it beside the reservation (`--permit-port-sharing`).
    pub port: PortReservation,
    /// `--etcd-servers`, e.g. `Kine::url()`.
    pub etcd_servers: String,
    pub extra_flags: Vec<String>,
    pub ready_timeout: Duration,
}

impl KcpOptions {
    pub fn new(root_dir: &Path, etcd_servers: &str) -> KcpOptions {
        KcpOptions {
            version: kcp_newer(),
            root_dir: root_dir.to_path_buf(),
            port: PortReservation::new().unwrap(),
            etcd_servers: etcd_servers.to_string(),
            extra_flags: Vec::new(),
            ready_timeout: Duration::from_secs(300),
        }
    }
}

/// A real kcp (`kcp start`) on 127.0.0.1. Killed on drop.
pub struct Kcp {
    pub version: String,
    pub port: u16,
    _port_held: PortReservation,
    pub root_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub proc: Proc,
    /// Start to the first `/readyz` = ok.
    pub ready_in: Duration,
}

impl Kcp {
    /// Start kcp and wait for `/readyz`; panics (with the log tail) when it does not get there.
    pub fn start(opts: KcpOptions) -> Kcp {
        Kcp::try_start(opts).unwrap_or_else(|why| panic!("{why}"))
    }

    /// Start kcp and wait for `/readyz`; when it does not get there, stop it, keep its log (in
    /// target/tmp/failed-test-logs) and say why, with the log's last lines.
    pub fn try_start(opts: KcpOptions) -> Result<Kcp, String> {
        let bin = kcp_bin(&opts.version);
        require("kubectl");
        fs::create_dir_all(&opts.root_dir).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("start")
            .arg(format!("--root-directory={}", opts.root_dir.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", opts.port.port()))
            .arg("--permit-port-sharing")
            .arg(format!("--etcd-servers={}", opts.etcd_servers))
            .args(&opts.extra_flags)
            .current_dir(&opts.root_dir);
        let mut proc = Proc::spawn("kcp", cmd, &opts.root_dir.join("kcp.log"));
        proc.grace = Duration::from_secs(15);
        let mut kcp = Kcp {
            version: opts.version,
            port: opts.port.port(),
            _port_held: opts.port,
            kubeconfig: opts.root_dir.join("admin.kubeconfig"),
            root_dir: opts.root_dir,
            proc,
            ready_in: Duration::ZERO,
        };
        let outcome = poll(opts.ready_timeout, Duration::from_millis(250), || {
            if let Some(status) = kcp.proc.exited() {
                return Some(Err(format!("exited during startup: {status}")));
            }
            if !kcp.kubeconfig.exists() {
                return None;
            }
            kcp.get_raw("/readyz").ok().filter(|s| s.trim() == "ok").map(Ok)
        });
        let failure = match outcome {
            Some(Ok(_)) => None,
            Some(Err(why)) => Some(why),
            None => {
                let why = kcp.get_raw("/readyz?verbose").unwrap_or_else(|e| e);
                Some(format!("/readyz not ok within {:?}:\n{why}", opts.ready_timeout))
            }
        };
        if let Some(why) = failure {
            kcp.proc.stop();
            return Err(kcp.proc.report(&why));
        }
        kcp.ready_in = kcp.proc.started.elapsed();
        Ok(kcp)
    }

    /// `bin/kubectl --kubeconfig admin.kubeconfig --context shard-base <args>` (the shard admin,
    /// whose token persists across restarts; base URL without /clusters).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl_as("shard-base", args, stdin)
    }

    /// kubectl with another admin.kubeconfig context: `base` is kcp-admin (not system:masters; its
    /// token is new on every kcp start), `shard-base` the shard admin (system:masters, persistent).
    pub fn kubectl_as(&self, context: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(require("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--context={context}"))
            .arg("--request-timeout=10s")
            .args(args);
        if let Some(input) = stdin {
            let f = tempfile::NamedTempFile::new().unwrap();
            fs::write(f.path(), input).unwrap();
            // `-f <file>` form keeps run() free of stdin plumbing.
            let path = f.into_temp_path().keep().unwrap();
            cmd.arg("-f").arg(&path);
            let out = run(cmd, Duration::from_secs(30));
            let _ = fs::remove_file(path);
            return out;
        }
        run(cmd, Duration::from_secs(30))
    }

    /// `kubectl get --raw <path>`: Ok(body) on success, Err(stderr) otherwise.
    pub fn get_raw(&self, path: &str) -> Result<String, String> {
        let out = self.kubectl(&["get", "--raw", path]);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Create workspace `name` in root through kcp and wait for phase Ready; returns how long it took.
    pub fn create_workspace(&self, name: &str) -> Duration {
        let kcp = self;
        let t = Instant::now();
        let body = serde_json::json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1",
            "kind": "Workspace",
            "metadata": { "name": name },
        })
        .to_string();
        let path = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
        // The tenancy API can lag /readyz by a moment: retry the create briefly.
        let created = poll(Duration::from_secs(60), Duration::from_millis(500), || {
            match kcp.create_raw_as("base", path, &body) {
                Ok(_) => Some(Ok(())),
                Err(e) if e.contains("AlreadyExists") || e.contains("already exists") => Some(Ok(())),
                Err(e) if e.contains("NotFound") || e.contains("the server could not find") => None,
                Err(e) if e.contains("connection refused") || e.contains("ServiceUnavailable") => None,
                Err(e) => Some(Err(e)),
            }
        });
        match created {
            Some(Ok(())) => {}
            Some(Err(e)) => kcp.proc.fail(&format!("creating workspace {name}: {e}")),
            None => kcp
                .proc
                .fail(&format!("creating workspace {name}: tenancy API not served within 60s")),
        }
        let mut last = String::new();
        let ready = poll(Duration::from_secs(180), Duration::from_millis(500), || {
            let body = kcp.get_raw(&format!("{path}/{name}")).ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let phase = v["status"]["phase"].as_str().unwrap_or("").to_string();
            last = body;
            (phase == "Ready").then_some(())
        });
        if ready.is_none() {
            kcp.proc
                .fail(&format!("workspace {name} not Ready within 180s; last seen:\n{last}"));
        }
        t.elapsed()
    }

    /// `kubectl create --raw <path> -f <body>` as the shard admin.
    pub fn create_raw(&self, path: &str, body: &str) -> Result<String, String> {
        self.create_raw_as("shard-base", path, body)
    }

    /// `kubectl create --raw <path> -f <body>` with `context`. Create workspaces as `base`
    /// (kcp-admin): the workspace admission records no owner for system:masters users, and the
    /// apibinding initializer then fails ("LogicalCluster ... had no createdBy recorded"), leaving
    /// the workspace in phase Initializing for ever.
    pub fn create_raw_as(&self, context: &str, path: &str, body: &str) -> Result<String, String> {
        let out = self.kubectl_as(context, &["create", "--raw", path], Some(body));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
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
