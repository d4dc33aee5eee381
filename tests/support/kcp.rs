//! A real kcp process on kine, as a slot runs it, killed on drop.
use super::*;

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
