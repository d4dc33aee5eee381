//! Managed PostgreSQL (spec.store.kinePostgres.managed: true): a PostgreSQL of the
//! shard's own, for hosts that run no PostgreSQL. kcpshard creates a cluster with `initdb` under the
//! shard's store directory and runs it with `pg_ctl`, listening on spec host:port only.
//!
//! Layout of `<store>/postgres/` : `data/` (the cluster), `postgres.log`, `socket/` (the unix
//! socket; never /var/run/postgresql, which another cluster owns).
//!
//! PostgreSQL refuses to run as root. When kcpshard runs as root, the cluster belongs to the
//! `postgres` system user (Debian's package creates it) and initdb/pg_ctl run as that user; the
//! directories above the cluster get search permission for others (never read), so that user can
//! reach it. Key material stays in its own 0700 directories.
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::StoreError;
use super::postgres::PostgresServer;

/// How long `pg_ctl start` may wait for the server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A PostgreSQL cluster kcpshard runs for one shard.
#[derive(Debug, Clone)]
pub struct ManagedPostgres {
    /// `<store>/postgres`.
    pub dir: PathBuf,
    /// The directory the state dir starts at: the directories from here down to `dir` must be
    /// searchable by the cluster's owner.
    pub state_dir: PathBuf,
}

impl ManagedPostgres {
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// The postmaster's pid, from the first line of `data/postmaster.pid` (written at its start,
    /// removed at a clean stop). It may name a process that died since: callers check.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    /// Creates the cluster if it does not exist, and starts it if it does not run.
    pub async fn ensure(&self, server: &PostgresServer) -> Result<(), StoreError> {
        let this = self.clone();
        let server = server.clone();
        tokio::task::spawn_blocking(move || this.ensure_blocking(&server))
            .await
            .map_err(|e| StoreError::Invalid(format!("managed PostgreSQL: {e}")))?
    }

    fn ensure_blocking(&self, server: &PostgresServer) -> Result<(), StoreError> {
        let owner = Owner::current()?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { path, source }
        };
        crate::fsutil::create_private_dir(&self.dir).map_err(io(&self.dir))?;
        crate::fsutil::create_private_dir(&self.socket_dir()).map_err(io(&self.socket_dir()))?;
        owner.give(&self.dir, &self.state_dir)?;
        owner.give(&self.socket_dir(), &self.state_dir)?;
        if !self.data().join("PG_VERSION").is_file() {
            self.initdb(&owner, server)?;
        }
        if self.running(&owner)? {
            return Ok(());
        }
        let options = format!(
            "-c listen_addresses='{}' -p {} -k {}",
            server.host,
            server.port,
            self.socket_dir().display()
        );
        let mut cmd = owner.command(&binary("pg_ctl")?);
        cmd.arg("start")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log())
            .arg("-w")
            .arg("-t")
            .arg(START_TIMEOUT.as_secs().to_string())
            .arg("-o")
            .arg(options);
        run(cmd, "pg_ctl start", &self.log())?;
        tracing::info!(data = %self.data().display(), port = server.port, "started the managed PostgreSQL");
        Ok(())
    }

    fn initdb(&self, owner: &Owner, server: &PostgresServer) -> Result<(), StoreError> {
        let data = self.data();
        // A half-made cluster from an interrupted initdb is removed; initdb wants an empty directory.
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(|source| StoreError::Io {
                path: data.clone(),
                source,
            })?;
        }
        let mut cmd = owner.command(&binary("initdb")?);
        cmd.arg("-D")
            .arg(&data)
            .arg("-U")
            .arg(&server.user)
            .arg("-E")
            .arg("UTF8")
            .arg("--auth-local=trust");
        let pwfile = self.dir.join(".pwfile");
        match &server.password {
            Some(password) => {
                crate::fsutil::write_atomically(&pwfile, password.expose().as_bytes()).map_err(|source| {
                    StoreError::Io {
                        path: pwfile.clone(),
                        source,
                    }
                })?;
                owner.give(&pwfile, &self.state_dir)?;
                cmd.arg("--auth-host=scram-sha-256")
                    .arg(format!("--pwfile={}", pwfile.display()));
            }
            None => {
                cmd.arg("--auth-host=trust");
            }
        }
        let result = run(cmd, "initdb", &self.dir.join("initdb.log"));
        let _ = std::fs::remove_file(&pwfile);
        result?;
        tracing::info!(data = %data.display(), "created the managed PostgreSQL cluster");
        Ok(())
    }

    fn running(&self, owner: &Owner) -> Result<bool, StoreError> {
        let mut cmd = owner.command(&binary("pg_ctl")?);
        cmd.arg("status").arg("-D").arg(self.data());
        let out = cmd
            .output()
            .map_err(|e| StoreError::Invalid(format!("pg_ctl status: {e}")))?;
        Ok(out.status.success())
    }

    /// Stops the cluster (fast shutdown: open sessions are ended); the data stays.
    pub async fn stop(&self) -> Result<(), StoreError> {
        if !self.data().join("postmaster.pid").exists() {
            return Ok(());
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let owner = Owner::current()?;
            let mut cmd = owner.command(&binary("pg_ctl")?);
            cmd.arg("stop")
                .arg("-D")
                .arg(this.data())
                .arg("-m")
                .arg("fast")
                .arg("-w");
            run(cmd, "pg_ctl stop", &this.log())
        })
        .await
        .map_err(|e| StoreError::Invalid(format!("managed PostgreSQL: {e}")))?
    }
}

/// Who the cluster's processes run as: this process's user, or `postgres` when that is root.
struct Owner {
    ids: Option<(u32, u32)>,
}

impl Owner {
    fn current() -> Result<Owner, StoreError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(Owner { ids: None });
        }
        let user = nix::unistd::User::from_name("postgres").ok().flatten().ok_or_else(|| {
            StoreError::Invalid(
                "kcpshard runs as root and PostgreSQL refuses to: a managed PostgreSQL needs the `postgres` system user (apt-get install postgresql creates it), or run kcpshard as another user".into(),
            )
        })?;
        Ok(Owner {
            ids: Some((user.uid.as_raw(), user.gid.as_raw())),
        })
    }

    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid).env_remove("HOME");
        }
        cmd
    }

    /// Makes `path` the owner's, and every directory from `top` down to it searchable by the owner.
    fn give(&self, path: &Path, top: &Path) -> Result<(), StoreError> {
        let Some((uid, gid)) = self.ids else {
            return Ok(());
        };
        let io = |p: &Path, source| StoreError::Io {
            path: p.to_path_buf(),
            source,
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| io(path, e))?;
        let mut parent = path.parent();
        while let Some(dir) = parent {
            if !dir.starts_with(top) {
                break;
            }
            let meta = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
            let mode = meta.permissions().mode();
            if mode & 0o001 == 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001)).map_err(|e| io(dir, e))?;
            }
            if dir == top {
                break;
            }
            parent = dir.parent();
        }
        Ok(())
    }
}

/// A PostgreSQL server program: on PATH, else in the newest /usr/lib/postgresql/<version>/bin
/// (Debian does not put initdb and pg_ctl on PATH).
pub fn binary(name: &str) -> Result<PathBuf, StoreError> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|e| e.path().join("bin").join(name)).collect())
        .unwrap_or_default();
    debian.sort_by_key(|p| {
        p.components()
            .nth(4)
            .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    on_path
        .into_iter()
        .chain(debian.into_iter().rev())
        .find(|p| p.is_file())
        .ok_or_else(|| {
            StoreError::Invalid(format!(
                "no {name} on PATH or under /usr/lib/postgresql/*/bin: install the PostgreSQL server (apt-get install postgresql) for a managed store"
            ))
        })
}

fn run(mut cmd: Command, what: &str, log: &Path) -> Result<(), StoreError> {
    let out = cmd
        .output()
        .map_err(|e| StoreError::Invalid(format!("cannot run {what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Err(StoreError::Invalid(format!(
        "{what} failed ({}): {}; see {}",
        out.status,
        output.trim(),
        log.display()
    )))
}
