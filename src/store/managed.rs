//! Managed PostgreSQL (spec.store.kinePostgres.managed: true): a PostgreSQL of the
//! shard's own, for hosts that run no PostgreSQL. kcpshard creates a cluster with `initdb` under the
//! shard's store directory and runs `postgres` itself through the process runtime (under systemd,
//! as the main process of `kcpshard-<shard>-postgres.service`), listening on spec host:port only.
//!
//! Layout of `<store>/postgres/` : `data/` (the cluster), `postgres.json` (its process record),
//! `postgres.log` (detached runtime), `socket/` (the unix socket; never /var/run/postgresql,
//! which another cluster owns).
//!
//! PostgreSQL refuses to run as root. When kcpshard runs as root, the cluster belongs to the
//! `postgres` system user (Debian's package creates it) and initdb and postgres run as that user;
//! the directories above the cluster get search permission for others (never read), so that user
//! can reach it. Key material stays in its own 0700 directories.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::StoreError;
use super::postgres::PostgresServer;
use crate::process::{ProcessRecord, ProcessSpec, RunAs, Runtime, UnitName};

/// How long a starting postmaster may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(30);
pub const RECORD_FILE: &str = "postgres.json";
/// The record of the initdb that makes the cluster, until its end is taken up.
const INITDB_RECORD_FILE: &str = "initdb.json";

/// What [`ManagedPostgres::ensure`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Postmaster {
    /// It accepts connections.
    Ready,
    /// The cluster is being made: initdb (`pid`) runs.
    MakingCluster { pid: u32 },
    /// It runs and does not accept connections yet: started now, or earlier and within its start
    /// timeout.
    Starting { pid: u32 },
}

/// How the recorded initdb ended.
enum InitdbEnd {
    Made,
    Failed(StoreError),
    /// Nobody saw how (it was not this serve's child, and no unit kept its status).
    Unseen,
}

/// A PostgreSQL cluster kcpshard runs for one shard.
#[derive(Debug, Clone)]
pub struct ManagedPostgres {
    /// `<store>/postgres`.
    pub dir: PathBuf,
    /// The directory the state dir starts at: the directories from here down to `dir` must be
    /// searchable by the cluster's owner.
    pub state_dir: PathBuf,
    /// The shard it serves (names its unit).
    pub shard: String,
}

impl ManagedPostgres {
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn record(&self) -> PathBuf {
        self.dir.join(RECORD_FILE)
    }

    /// The postmaster's pid, from the first line of `data/postmaster.pid` (written at its start,
    /// removed at a clean stop). It may name a process that died since: callers check.
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.postmaster_line(0)?.parse().ok()
    }

    /// Line `n` of `data/postmaster.pid`; line 7 is the status, `ready` once it accepts
    /// connections (what `pg_ctl start -w` waits for).
    fn postmaster_line(&self, n: usize) -> Option<String> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        Some(text.lines().nth(n)?.trim().to_string())
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    /// Creates the cluster if it does not exist, and starts it if it does not run, without waiting
    /// for it to accept connections: a later look finds it ready, or still starting
    /// ([`ManagedPostgres::starting`]). One that did not accept within its start timeout, or
    /// exited during its start, fails the step naming its log; one that exited is started again.
    pub async fn ensure(&self, runtime: &Runtime, server: &PostgresServer) -> Result<Postmaster, StoreError> {
        let this = self.clone();
        let owner = tokio::task::spawn_blocking(move || this.prepare())
            .await
            .map_err(|e| StoreError::Invalid(format!("managed PostgreSQL: {e}")))??;
        if let Some(pid) = self.make_cluster(runtime, &owner, server).await? {
            return Ok(Postmaster::MakingCluster { pid });
        }
        if let Some(record) = self.running(runtime)? {
            if self.accepts(&record) {
                return Ok(Postmaster::Ready);
            }
            if record.running_for() < START_TIMEOUT {
                return Ok(Postmaster::Starting { pid: record.pid });
            }
            return Err(self
                .failure(
                    runtime,
                    &record,
                    &format!("does not accept connections within {START_TIMEOUT:?}"),
                )
                .await);
        }
        // Failed during its start (a postmaster exits 1 on a FATAL error; 0 after a shutdown it
        // was asked for, SIGQUIT included): say why, and start it again.
        let exited = match Runtime::load(&self.record())? {
            Some(record)
                if record.running_for() < START_TIMEOUT
                    && runtime
                        .exit_status(&record)
                        .await
                        .and_then(|status| status.code())
                        .is_some_and(|code| code != 0) =>
            {
                Some(self.failure(runtime, &record, "exited during its start").await)
            }
            _ => None,
        };
        let mut spec = ProcessSpec::new(
            "postgres",
            UnitName::postgres(&self.shard),
            binary("postgres")?,
            vec![
                "-D".into(),
                self.data().display().to_string(),
                "-c".into(),
                format!("listen_addresses={}", server.host),
                "-p".into(),
                server.port.to_string(),
                "-k".into(),
                self.socket_dir().display().to_string(),
            ],
            self.log(),
            self.record(),
        );
        // Fast shutdown: open sessions (every kine's) are ended; SIGTERM would wait for them.
        spec.stop_signal = Signal::SIGINT;
        spec.run_as = owner.run_as;
        let record = runtime.start(&spec).await?;
        tracing::info!(data = %self.data().display(), port = server.port, pid = record.pid, "started the managed PostgreSQL");
        match exited {
            Some(exited) => Err(StoreError::StartedAgain {
                exited: Box::new(exited),
                pid: record.pid,
            }),
            None => Ok(Postmaster::Starting { pid: record.pid }),
        }
    }

    /// The recorded postmaster's pid when it runs, does not accept connections yet, and is within
    /// its start timeout: a look waits for it rather than start another.
    /// So is initdb's while it makes the cluster.
    pub fn starting(&self, runtime: &Runtime) -> Option<u32> {
        if let Some(initdb) = Runtime::load(&self.initdb_record()).ok().flatten()
            && runtime.is_running(&initdb)
            && initdb.running_for() < START_TIMEOUT
        {
            return Some(initdb.pid);
        }
        let record = Runtime::load(&self.record()).ok().flatten()?;
        (runtime.is_running(&record) && !self.accepts(&record) && record.running_for() < START_TIMEOUT)
            .then_some(record.pid)
    }

    /// Whether the postmaster `record` accepts connections: `postmaster.pid` names it and says
    /// `ready` (what `pg_ctl start -w` waits for).
    fn accepts(&self, record: &ProcessRecord) -> bool {
        self.postmaster_pid() == Some(record.pid) && self.postmaster_line(7).as_deref() == Some("ready")
    }

    /// Why the postmaster `record` failed its start, with its log's last lines.
    async fn failure(&self, runtime: &Runtime, record: &ProcessRecord, what: &str) -> StoreError {
        let tail = runtime.log_tail(record, 15).await.join("\n");
        StoreError::Invalid(format!(
            "the managed PostgreSQL {what}; see {}:\n{tail}",
            Runtime::log_location(record)
        ))
    }

    /// The cluster's directories, made the owner's.
    fn prepare(&self) -> Result<Owner, StoreError> {
        let owner = Owner::current()?;
        crate::fsutil::create_private_dir(&self.dir).map_err(StoreError::io(&self.dir))?;
        crate::fsutil::create_private_dir(&self.socket_dir()).map_err(StoreError::io(&self.socket_dir()))?;
        owner.give(&self.dir, &self.state_dir)?;
        owner.give(&self.socket_dir(), &self.state_dir)?;
        owner.can_reach(&self.dir, "its cluster")?;
        Ok(owner)
    }

    /// The postmaster of this cluster, if it runs: the recorded one, or one an earlier release
    /// started with pg_ctl (named by `postmaster.pid`, its argv naming this data directory), which
    /// is recorded and adopted.
    fn running(&self, runtime: &Runtime) -> Result<Option<ProcessRecord>, StoreError> {
        let Some((record, recorded)) = self.found(runtime)? else {
            return Ok(None);
        };
        if !recorded {
            tracing::info!(pid = record.pid, "adopting the running managed PostgreSQL");
            record.save(&self.record())?;
        }
        Ok(Some(record))
    }

    /// Whether a postmaster of this cluster runs (nothing is recorded).
    pub fn runs(&self, runtime: &Runtime) -> bool {
        self.found(runtime).is_ok_and(|found| found.is_some())
    }

    /// The running postmaster, and whether it is the recorded one.
    fn found(&self, runtime: &Runtime) -> Result<Option<(ProcessRecord, bool)>, StoreError> {
        if let Some(record) = Runtime::load(&self.record())?
            && runtime.is_running(&record)
        {
            return Ok(Some((record, true)));
        }
        let data = self.data().display().to_string();
        Ok(self
            .postmaster_pid()
            .and_then(Runtime::observe)
            .filter(|r| r.args.iter().any(|a| a == &data))
            .map(|found| {
                let record = ProcessRecord {
                    stop_signal: Some(Signal::SIGINT.as_str().to_string()),
                    ..found
                };
                (record, false)
            }))
    }

    fn initdb_record(&self) -> PathBuf {
        self.dir.join(INITDB_RECORD_FILE)
    }

    /// Makes the cluster with initdb, a process of its own (about a second, once per shard): starts
    /// it and returns its pid; later calls find it running (its pid again), or take up its end:
    /// made (None from then on), or failed (the error names its log, and the call after starts it
    /// again). One whose end nobody saw (serve restarted meanwhile) made a cluster no postmaster
    /// ran on yet: it is made again. None at once when the cluster exists.
    async fn make_cluster(
        &self,
        runtime: &Runtime,
        owner: &Owner,
        server: &PostgresServer,
    ) -> Result<Option<u32>, StoreError> {
        let record_path = self.initdb_record();
        let pwfile = self.dir.join(".pwfile");
        let recorded = Runtime::load(&record_path)?;
        if recorded.is_none() && self.data().join("PG_VERSION").is_file() {
            return Ok(None);
        }
        if let Some(record) = recorded {
            let running = runtime.is_running(&record);
            if running && record.running_for() < START_TIMEOUT {
                return Ok(Some(record.pid));
            }
            let end = if running {
                runtime.kill(&record).await?;
                let what =
                    format!("cluster could not be made: initdb did not finish within {START_TIMEOUT:?} and was killed");
                InitdbEnd::Failed(self.failure(runtime, &record, &what).await)
            } else {
                match runtime.exit_status(&record).await {
                    Some(status) if status.success() => InitdbEnd::Made,
                    Some(status) => {
                        let what = format!("cluster could not be made: initdb failed ({status})");
                        InitdbEnd::Failed(self.failure(runtime, &record, &what).await)
                    }
                    None => InitdbEnd::Unseen,
                }
            };
            // Under systemd its unit was kept for its exit status.
            runtime.stop_unit(&UnitName::postgres_initdb(&self.shard)).await;
            crate::fsutil::remove_if_there(&record_path).map_err(StoreError::io(&record_path))?;
            let _ = std::fs::remove_file(&pwfile);
            match end {
                InitdbEnd::Made => {
                    tracing::info!(data = %self.data().display(), "made the managed PostgreSQL cluster");
                    return Ok(None);
                }
                InitdbEnd::Failed(error) => return Err(error),
                InitdbEnd::Unseen => {}
            }
        }
        let data = self.data();
        // A half-made cluster from an interrupted initdb is removed; initdb wants an empty directory.
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(StoreError::io(&data))?;
        }
        let initdb = binary("initdb")?;
        owner.can_reach(&initdb, "initdb")?;
        let mut args: Vec<String> = vec![
            "-D".into(),
            data.display().to_string(),
            "-U".into(),
            server.user.clone(),
            "-E".into(),
            "UTF8".into(),
            "--auth-local=trust".into(),
        ];
        match &server.password {
            Some(password) => {
                crate::fsutil::write_atomically(&pwfile, password.expose().as_bytes())
                    .map_err(StoreError::io(&pwfile))?;
                owner.give(&pwfile, &self.state_dir)?;
                args.push("--auth-host=scram-sha-256".into());
                args.push(format!("--pwfile={}", pwfile.display()));
            }
            None => args.push("--auth-host=trust".into()),
        }
        let mut spec = ProcessSpec::new(
            "initdb",
            UnitName::postgres_initdb(&self.shard),
            initdb,
            args,
            self.dir.join("initdb.log"),
            record_path,
        );
        spec.run_as = owner.run_as.clone();
        spec.keep_exit_status = true;
        let record = runtime.start(&spec).await?;
        tracing::info!(data = %data.display(), pid = record.pid, "making the managed PostgreSQL cluster");
        Ok(Some(record.pid))
    }

    /// The running postmaster, whose stop signal is a fast shutdown (open sessions are ended).
    pub fn process(&self, runtime: &Runtime) -> Result<Option<ProcessRecord>, StoreError> {
        self.running(runtime)
    }
}

/// Who the cluster's processes run as: this process's user, or `postgres` when that is root.
struct Owner {
    run_as: Option<RunAs>,
}

impl Owner {
    fn current() -> Result<Owner, StoreError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(Owner { run_as: None });
        }
        let user = nix::unistd::User::from_name("postgres").ok().flatten().ok_or_else(|| {
            StoreError::Invalid(
                "kcpshard runs as root and PostgreSQL refuses to: a managed PostgreSQL needs the `postgres` system user (apt-get install postgresql creates it), or run kcpshard as another user".into(),
            )
        })?;
        Ok(Owner {
            run_as: Some(RunAs {
                user: user.name,
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            }),
        })
    }

    /// An error naming the directory that keeps the owner from `path` (what it is for in `what`),
    /// if one does: a directory on the way that the owner may not search (a checkout or state dir
    /// under a 0700 directory of another user).
    fn can_reach(&self, path: &Path, what: &str) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        let Some(RunAs { user, uid, gid }) = &self.run_as else {
            return Ok(());
        };
        for dir in path.ancestors().skip(1).collect::<Vec<_>>().into_iter().rev() {
            let Ok(meta) = std::fs::metadata(dir) else {
                continue;
            };
            let mode = meta.mode();
            let search = match (meta.uid() == *uid, meta.gid() == *gid) {
                (true, _) => mode & 0o100,
                (false, true) => mode & 0o010,
                (false, false) => mode & 0o001,
            };
            if search == 0 {
                return Err(StoreError::Invalid(format!(
                    "the managed PostgreSQL runs as user {user}, which cannot reach {what} at {}: {} (mode {:o}, owner uid {}) is not searchable by {user}; make it searchable (chmod o+x {}) or keep kcpshard's state dir and binaries out of it",
                    path.display(),
                    dir.display(),
                    mode & 0o7777,
                    meta.uid(),
                    dir.display()
                )));
            }
        }
        Ok(())
    }

    /// Makes `path` the owner's, and every directory from `top` down to it searchable by the owner.
    fn give(&self, path: &Path, top: &Path) -> Result<(), StoreError> {
        let Some(RunAs { uid, gid, .. }) = self.run_as else {
            return Ok(());
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(StoreError::io(path))?;
        let mut parent = path.parent();
        while let Some(dir) = parent {
            if !dir.starts_with(top) {
                break;
            }
            let meta = std::fs::metadata(dir).map_err(StoreError::io(dir))?;
            let mode = meta.permissions().mode();
            if mode & 0o001 == 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001))
                    .map_err(StoreError::io(dir))?;
            }
            if dir == top {
                break;
            }
            parent = dir.parent();
        }
        Ok(())
    }
}

/// A PostgreSQL program: on PATH, else in the newest /usr/lib/postgresql/<version>/bin (Debian does
/// not put initdb and postgres on PATH). Links are resolved (see [`runnable`]).
pub fn binary(name: &str) -> Result<PathBuf, StoreError> {
    let on_path = which::which(name).ok();
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
        .map(runnable)
        .ok_or_else(|| {
            StoreError::Invalid(format!(
                "no {name} on PATH or under /usr/lib/postgresql/*/bin: install the PostgreSQL server (apt-get install postgresql) for a managed store"
            ))
        })
}

/// The program a link leads to, when it has the link's name: the `postgres` user runs it, and may
/// not reach a link in a checkout's `bin/` under another user's private directory. A link to a
/// program of another name is kept: that program reads the name it was run by (Debian's
/// `/usr/bin/pg_dump` and `/usr/bin/pg_restore` lead to `pg_wrapper`, which run as itself says
/// "You must install at least one postgresql-client-<version> package").
fn runnable(path: PathBuf) -> PathBuf {
    match std::fs::canonicalize(&path) {
        Ok(target) if target.file_name() == path.file_name() => target,
        _ => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_followed_to_a_program_of_its_name_but_not_to_a_wrapper_that_reads_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let versioned = dir.path().join("15/bin");
        std::fs::create_dir_all(&versioned).unwrap();
        std::fs::write(versioned.join("pg_dump"), "").unwrap();
        std::fs::write(dir.path().join("pg_wrapper"), "").unwrap();
        let checkout = dir.path().join("checkout-bin");
        std::fs::create_dir_all(&checkout).unwrap();
        std::os::unix::fs::symlink(versioned.join("pg_dump"), checkout.join("pg_dump")).unwrap();
        let usr_bin = dir.path().join("usr-bin");
        std::fs::create_dir_all(&usr_bin).unwrap();
        std::os::unix::fs::symlink(dir.path().join("pg_wrapper"), usr_bin.join("pg_dump")).unwrap();

        let real = std::fs::canonicalize(versioned.join("pg_dump")).unwrap();
        assert_eq!(runnable(checkout.join("pg_dump")), real);
        assert_eq!(runnable(usr_bin.join("pg_dump")), usr_bin.join("pg_dump"));
        assert_eq!(runnable(real.clone()), real);
    }

    #[test]
    fn a_directory_the_owner_cannot_search_is_named_with_what_to_do() {
        let top = tempfile::tempdir().unwrap();
        let mode = |path: &Path, mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        mode(top.path(), 0o755);
        let private = top.path().join("checkout");
        let cluster = private.join("state/postgres");
        std::fs::create_dir_all(&cluster).unwrap();
        mode(&private, 0o700);
        // Another user than the directories' owner (the tests run as root, or as one user).
        let owner = Owner {
            run_as: Some(RunAs {
                user: "nobody".into(),
                uid: 65534,
                gid: 65534,
            }),
        };
        let err = owner.can_reach(&cluster, "its cluster").unwrap_err().to_string();
        for needed in [
            "runs as user nobody",
            &format!("{} (mode 700", private.display()),
            "chmod o+x",
            "its cluster",
        ] {
            assert!(err.contains(needed), "{needed:?} not in {err}");
        }
        mode(&private, 0o711);
        owner.can_reach(&cluster, "its cluster").unwrap();
        assert!(Owner { run_as: None }.can_reach(&cluster, "its cluster").is_ok());
    }
}
