//! A kine process as kcpshard runs it, on a unix socket, killed on drop.
use super::*;

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
