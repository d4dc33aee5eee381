//! Throwaway stores: a PostgreSQL cluster and a one-member etcd, killed and removed on drop.
use super::*;

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
