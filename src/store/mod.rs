//! The shard's store: where its data lives, started before the first slot and outliving every
//! slot (the first step of a roll, docs/architecture.md).
//!
//! Backends:
//! - KineSqlite: one kine over a sqlite file, dialed by every slot. For dev and single-host use; a
//!   kine restart is a store outage for both slots (docs/background.md section 7).
//! - KinePostgres: one kine per slot over one PostgreSQL database ([`postgres`]); the database is
//!   created if missing, and the first slot's kine creates kine's schema alone (two kines racing on
//!   a fresh database: docs/background.md section 7). Optionally on a PostgreSQL kcpshard runs ([`managed`]).
//! - Etcd: endpoints the user runs ([`etcd`]).
//!
//! A preflight runs a new kcp version on a copy of the data ([`copy`]), never on the store itself.
//!
//! The shard-wide part ([`StoreBackend::ensure`], [`StoreBackend::check`]) is separate from each
//! slot's part ([`StoreBackend::start_slot_store`], [`StoreBackend::slot_processes`]), which is
//! empty for the stores slots share.
pub mod copy;
pub mod disk;
pub mod etcd;
pub mod etcd_keys;
pub mod etcd_snapshot;
pub mod kine;
mod kine_address;
pub mod kine_read;
pub mod managed;
pub mod mirror;
pub mod postgres;
mod postgres_tls;
mod private;
pub mod snapshot;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::{StoreSpec, StoreType};
use crate::process::{ProcessError, ProcessRecord, Runtime, UnitName};
use snapshot::SnapshotFormat;

pub use etcd::{EtcdCluster, EtcdTls};
pub use kine::{Kine, KineSpec, KineStart, ensure_kine_sqlite, stop_kine_sqlite};
pub use managed::ManagedPostgres;
pub use postgres::PostgresServer;

/// Which store a shard uses, with what it needs to run it.
#[derive(Debug, Clone)]
pub enum StoreBackend {
    /// One kine over `<dir>/state.db`.
    KineSqlite { kine: KineSpec },
    /// One kine per slot on one PostgreSQL database.
    KinePostgres {
        server: PostgresServer,
        kine_binary: PathBuf,
        /// Set when kcpshard runs the PostgreSQL itself.
        managed: Option<ManagedPostgres>,
        /// Names each slot's kine in PostgreSQL (application_name) and in its argv.
        shard: String,
    },
    /// Etcd endpoints the user runs.
    Etcd(EtcdCluster),
}

/// What a store check found answering: the etcd-protocol endpoints slots dial (never a password),
/// and the pids of what kcpshard runs behind them (kines, a managed PostgreSQL's postmaster).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSeen {
    pub endpoints: Vec<String>,
    pub pids: Vec<u32>,
    /// The shard-wide kine kcpshard runs (KineSqlite), whose reads are checked.
    pub kines: Vec<Kine>,
}

impl StoreSeen {
    /// Adds a slot's own kine.
    pub fn add(&mut self, kine: &Kine) {
        self.endpoints.push(kine.endpoint());
        self.pids.push(kine.record.pid);
    }
}

/// Where one slot's kcp finds the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotStore {
    /// `--etcd-servers`.
    pub etcd_servers: String,
    pub tls: EtcdTls,
}

/// What [`StoreBackend::start_slot_store`] found or did.
#[derive(Debug, Clone)]
pub enum SlotStoreStart {
    /// The slot's store accepts: its kcp can start.
    Ready(SlotStore),
    /// The slot's own kine runs at `etcd_servers` and does not accept yet.
    Starting { pid: u32, etcd_servers: String },
}

/// Where a store's files live.
#[derive(Debug, Clone)]
pub struct StorePaths {
    /// The state dir (managed PostgreSQL makes the path down to its cluster searchable).
    pub state_dir: PathBuf,
    /// The shard's store directory.
    pub store_dir: PathBuf,
}

impl StoreBackend {
    /// The backend the spec asks for. Reads a PostgreSQL password now: an unreadable one is an error
    /// the user sees as StoreReady=False.
    pub fn from_spec(
        spec: &StoreSpec,
        kine_binary: &Path,
        paths: &StorePaths,
        shard: &str,
    ) -> Result<StoreBackend, StoreError> {
        let missing =
            |what: &str| StoreError::Invalid(format!("spec.store.type is {what} but its settings are missing"));
        match spec.type_ {
            StoreType::KineSqlite => Ok(StoreBackend::KineSqlite {
                kine: KineSpec::sqlite(kine_binary, &paths.store_dir, shard)?,
            }),
            StoreType::KinePostgres => {
                let settings = spec.kine_postgres.as_ref().ok_or_else(|| missing("KinePostgres"))?;
                Ok(StoreBackend::KinePostgres {
                    server: PostgresServer::from_spec(settings)?,
                    kine_binary: kine_binary.to_path_buf(),
                    managed: settings.managed.then(|| ManagedPostgres {
                        dir: paths.store_dir.join("postgres"),
                        state_dir: paths.state_dir.clone(),
                        shard: shard.to_string(),
                    }),
                    shard: shard.to_string(),
                })
            }
            StoreType::Etcd => Ok(StoreBackend::Etcd(EtcdCluster::from_spec(
                spec.etcd.as_ref().ok_or_else(|| missing("Etcd"))?,
            ))),
        }
    }

    /// Whether the shard-wide part accepts: Ok with what slots share (nothing for KinePostgres,
    /// whose slots each have their own kine), or why not.
    pub async fn check(&self, runtime: &Runtime) -> Result<StoreSeen, String> {
        match self {
            StoreBackend::KineSqlite { kine } => match kine::running_kine(runtime, kine).await {
                Some(k) => {
                    let mut seen = StoreSeen::default();
                    seen.add(&k);
                    seen.kines.push(k);
                    Ok(seen)
                }
                None => Err("kine does not run or does not accept connections".into()),
            },
            StoreBackend::KinePostgres { server, managed, .. } => server
                .check()
                .await
                .map(|()| StoreSeen {
                    pids: managed.iter().filter_map(ManagedPostgres::postmaster_pid).collect(),
                    ..StoreSeen::default()
                })
                .map_err(|e| e.to_string()),
            StoreBackend::Etcd(cluster) => cluster.check().await.map(|()| StoreSeen {
                endpoints: cluster.endpoints.clone(),
                ..StoreSeen::default()
            }),
        }
    }

    /// The pid of the shard-wide process (KineSqlite's kine, a managed PostgreSQL) when it was
    /// started and does not accept yet, within its start timeout: a look waits for it rather than
    /// start another.
    pub async fn starting(&self, runtime: &Runtime) -> Option<u32> {
        match self {
            StoreBackend::KineSqlite { kine } => kine::starting_kine(runtime, kine).await.map(|rec| rec.pid),
            StoreBackend::KinePostgres {
                managed: Some(managed), ..
            } => managed.starting(runtime),
            StoreBackend::KinePostgres { managed: None, .. } | StoreBackend::Etcd(_) => None,
        }
    }

    /// Starts the shard-wide part, or adopts it, and returns what is up, for an event. A
    /// KineSqlite store's kine and a managed PostgreSQL are started and not waited for
    /// ([`StoreBackend::starting`]); the database is made once PostgreSQL accepts.
    /// Starts what kcpshard runs of the store that does not run (the kine over sqlite, a managed
    /// PostgreSQL): what it started or found, or None when the store is to be reached over the
    /// network next ([`StoreBackend::reach`]).
    pub async fn ensure(&self, runtime: &Runtime) -> Result<Option<String>, StoreError> {
        match self {
            StoreBackend::KineSqlite { kine } => Ok(Some(match kine::start_kine(runtime, kine).await? {
                kine::KineStart::Accepting(kine) => format!("kine accepts connections at {}", kine.endpoint()),
                kine::KineStart::Starting(kine) => format!(
                    "kine started at {} (pid {}); slots start once it accepts",
                    kine.endpoint(),
                    kine.record.pid
                ),
            })),
            StoreBackend::KinePostgres {
                server,
                managed: Some(managed),
                ..
            } => Ok(match managed.ensure(runtime, server).await? {
                managed::Postmaster::MakingCluster { pid } => Some(format!(
                    "making the managed PostgreSQL's cluster (initdb, pid {pid}); PostgreSQL starts once it is made"
                )),
                managed::Postmaster::Starting { pid } => Some(format!(
                    "the managed PostgreSQL started (pid {pid}); its database is made and slots start once it accepts"
                )),
                managed::Postmaster::Ready => None,
            }),
            StoreBackend::KinePostgres { managed: None, .. } | StoreBackend::Etcd(_) => Ok(None),
        }
    }

    /// Reaches a store over the network once [`StoreBackend::ensure`] found all of it running:
    /// makes the shard's database where it is missing (KinePostgres) and checks that the store
    /// answers. A request, which the controller makes beside its reconcile.
    pub fn reach(&self) -> impl std::future::Future<Output = Result<String, StoreError>> + Send + 'static {
        let store = self.clone();
        async move {
            match &store {
                // Its kine is a process: ensure() says how it runs, nothing is reached over a network.
                StoreBackend::KineSqlite { .. } => Ok(format!("kine runs over {}", store.describe_server())),
                StoreBackend::KinePostgres { server, .. } => {
                    let created = server.ensure_database().await?;
                    server.check().await?;
                    Ok(format!(
                        "PostgreSQL accepts connections at {}{}",
                        server.describe(),
                        if created { " (database created)" } else { "" }
                    ))
                }
                StoreBackend::Etcd(cluster) => {
                    cluster.check().await.map_err(StoreError::Invalid)?;
                    Ok(format!("etcd accepts connections at {}", cluster.etcd_servers()))
                }
            }
        }
    }

    /// The kine a slot runs for itself (KinePostgres only), kept in `slot_dir`.
    fn slot_kine(&self, slot_dir: &Path, slot: &str) -> Option<KineSpec> {
        match self {
            StoreBackend::KinePostgres {
                server,
                kine_binary,
                shard,
                ..
            } => Some(server.slot_kine(
                kine_binary,
                slot_dir.to_path_buf(),
                &format!("kcpshard-{shard}-{slot}"),
                UnitName::slot_kine(shard, slot),
            )),
            _ => None,
        }
    }

    /// Makes sure what slot `slot` dials runs (its own kine for KinePostgres, at the address it had
    /// if it ran before), without waiting for a kine it starts: [`SlotStoreStart::Starting`] until
    /// a later look finds it accepting ([`StoreBackend::starting_slot_kine`]).
    pub async fn start_slot_store(
        &self,
        runtime: &Runtime,
        slot_dir: &Path,
        slot: &str,
    ) -> Result<SlotStoreStart, StoreError> {
        let kine = match self {
            StoreBackend::KineSqlite { kine } => kine::start_kine(runtime, kine).await?,
            StoreBackend::KinePostgres { .. } => {
                let spec = self.slot_kine(slot_dir, slot).expect("KinePostgres has slot kines");
                kine::start_kine(runtime, &spec).await?
            }
            StoreBackend::Etcd(cluster) => {
                return Ok(SlotStoreStart::Ready(SlotStore {
                    etcd_servers: cluster.etcd_servers(),
                    tls: cluster.tls.clone(),
                }));
            }
        };
        Ok(match kine {
            KineStart::Accepting(kine) => SlotStoreStart::Ready(SlotStore {
                etcd_servers: kine.endpoint(),
                tls: EtcdTls::default(),
            }),
            KineStart::Starting(kine) => SlotStoreStart::Starting {
                pid: kine.record.pid,
                etcd_servers: kine.endpoint(),
            },
        })
    }

    /// The pid of slot `slot`'s own kine (KinePostgres) when it was started and does not accept
    /// yet, within its ready timeout: a look waits for it rather than start another.
    pub async fn starting_slot_kine(&self, runtime: &Runtime, slot_dir: &Path, slot: &str) -> Option<u32> {
        let spec = self.slot_kine(slot_dir, slot)?;
        kine::starting_kine(runtime, &spec).await.map(|rec| rec.pid)
    }

    /// The slot's own kine: Some(Some) when it runs and accepts, None when it does not, and
    /// Some(None) for stores the slots share.
    pub async fn running_slot_kine(&self, runtime: &Runtime, slot_dir: &Path, slot: &str) -> Option<Option<Kine>> {
        match self.slot_kine(slot_dir, slot) {
            None => Some(None),
            Some(spec) => kine::running_kine(runtime, &spec).await.map(Some),
        }
    }

    /// The running processes only slot `slot` used (its kine, for KinePostgres), each with how
    /// long it gets to exit after its stop signal before SIGKILL.
    pub fn slot_processes(
        &self,
        runtime: &Runtime,
        slot_dir: &Path,
        slot: &str,
    ) -> Result<Vec<(ProcessRecord, Duration)>, StoreError> {
        match self.slot_kine(slot_dir, slot) {
            Some(spec) => Ok(with_grace(kine::kine_processes(runtime, &spec)?, kine::STOP_GRACE)),
            None => Ok(Vec::new()),
        }
    }

    /// The running shard-wide processes kcpshard runs (a KineSqlite store's kine, a managed
    /// PostgreSQL), each with how long it gets to exit after its stop signal before SIGKILL.
    pub fn processes(&self, runtime: &Runtime) -> Result<Vec<(ProcessRecord, Duration)>, StoreError> {
        match self {
            StoreBackend::KineSqlite { kine } => Ok(with_grace(kine::kine_processes(runtime, kine)?, kine::STOP_GRACE)),
            StoreBackend::KinePostgres {
                managed: Some(managed), ..
            } => Ok(with_grace(
                managed.process(runtime)?.into_iter().collect(),
                managed::STOP_GRACE,
            )),
            StoreBackend::KinePostgres { managed: None, .. } | StoreBackend::Etcd(_) => Ok(Vec::new()),
        }
    }

    /// Where a snapshot taken now of data `from` served goes in `dir` (before a roll to `to`, or
    /// on request or on schedule): a pg_dump of a KinePostgres database, a sqlite copy of a
    /// KineSqlite `state.db`, an etcd snapshot of an Etcd store.
    pub fn snapshot_path(&self, dir: &Path, from: &str, to: Option<&str>) -> Result<PathBuf, StoreError> {
        let now = chrono::Utc::now();
        match self {
            StoreBackend::KinePostgres { server, .. } => Ok(snapshot::snapshot_path(
                SnapshotFormat::PgDump,
                &server.database,
                dir,
                from,
                to,
                now,
            )),
            StoreBackend::KineSqlite { .. } => Ok(snapshot::snapshot_path(
                SnapshotFormat::Sqlite,
                "state",
                dir,
                from,
                to,
                now,
            )),
            StoreBackend::Etcd(_) => Ok(snapshot::snapshot_path(
                SnapshotFormat::Etcd,
                "etcd",
                dir,
                from,
                to,
                now,
            )),
        }
    }

    /// The job that writes a snapshot of the store into `partial` while it serves (pg_dump, or
    /// `kcpshard job sqlite-copy` or `etcd-snapshot` run by `kcpshard`); [`snapshot::keep_dump`]
    /// keeps it.
    pub fn snapshot_run(&self, partial: &Path, kcpshard: &Path) -> Result<snapshot::ClientRun, StoreError> {
        match self {
            StoreBackend::KinePostgres { server, .. } => snapshot::dump_run(server, partial),
            StoreBackend::KineSqlite { kine } => {
                copy::sqlite_copy_run(kcpshard, &kine.dir.join(kine::DB_FILE), partial)
            }
            StoreBackend::Etcd(cluster) => {
                etcd_snapshot::job_run(kcpshard, "etcd-snapshot", "--into", partial, cluster)
            }
        }
    }

    /// The job that puts a snapshot [`StoreBackend::snapshot_run`] took back into the store's data,
    /// with nothing using it (every slot's kine, and a KineSqlite store's own, stopped): pg_restore
    /// in one transaction, a sqlite copy put in place of `state.db` once complete, or an etcd
    /// snapshot's keys put back through the cluster's API.
    pub fn restore_run(&self, path: &Path, kcpshard: &Path) -> Result<snapshot::ClientRun, StoreError> {
        match self {
            StoreBackend::KinePostgres { server, .. } => snapshot::restore_run(server, path),
            StoreBackend::KineSqlite { kine } => copy::sqlite_copy_run(kcpshard, path, &kine.dir.join(kine::DB_FILE)),
            StoreBackend::Etcd(cluster) => etcd_snapshot::restore_run(kcpshard, path, cluster),
        }
    }

    /// Who the store's server is, for messages.
    pub fn describe_server(&self) -> String {
        match self {
            StoreBackend::KinePostgres { server, .. } => server.describe(),
            StoreBackend::KineSqlite { kine } => kine.dir.display().to_string(),
            StoreBackend::Etcd(cluster) => cluster.etcd_servers(),
        }
    }

    /// Whether a shard-wide process kcpshard runs for the store (see [`StoreBackend::processes`])
    /// runs, answering or not.
    pub fn processes_running(&self, runtime: &Runtime) -> bool {
        match self {
            StoreBackend::KineSqlite { kine } => kine::kine_processes(runtime, kine).is_ok_and(|p| !p.is_empty()),
            StoreBackend::KinePostgres {
                managed: Some(managed), ..
            } => managed.runs(runtime),
            StoreBackend::KinePostgres { managed: None, .. } | StoreBackend::Etcd(_) => false,
        }
    }

    /// The local directory that holds the store's data (the sqlite database, a managed
    /// PostgreSQL's cluster), whose filesystem [`disk::free_space`] watches; None when the data
    /// lives on a server kcpshard does not run.
    pub fn data_dir(&self) -> Option<&Path> {
        match self {
            StoreBackend::KineSqlite { kine } => Some(&kine.dir),
            StoreBackend::KinePostgres { managed, .. } => managed.as_ref().map(|m| m.dir.as_path()),
            StoreBackend::Etcd(_) => None,
        }
    }
}

impl StoreError {
    /// For `map_err`: an I/O failure on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { path, source }
    }
}

fn with_grace(processes: Vec<ProcessRecord>, grace: Duration) -> Vec<(ProcessRecord, Duration)> {
    processes.into_iter().map(|p| (p, grace)).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Invalid(String),
    #[error("PostgreSQL at {server}: {message}")]
    Postgres { server: String, message: String },
    #[error("kine runs but does not accept within {waited:?}; see {log}:\n{log_tail}")]
    NotReady {
        waited: Duration,
        /// Where its output is (a file, or the journal command).
        log: String,
        log_tail: String,
    },
    #[error(
        "kine's port {port}, which the running slots dial, is taken by {}: stop that process and kine comes back on it (on another port the slots would dial nothing)",
        holder.as_deref().unwrap_or("a process this user cannot see")
    )]
    PortTaken { port: u16, holder: Option<String> },
    #[error("kine exited during startup ({}); see {log}:\n{log_tail}", status.as_deref().unwrap_or("status unknown"))]
    Exited {
        status: Option<String>,
        log: String,
        log_tail: String,
    },
    /// The kine started last exited on its own before it accepted; another one was started, and
    /// the step reports the exit so that a kine that keeps failing is retried at the pace of the
    /// controller's backoff, with its cause in status.
    #[error("{exited}; started another (pid {pid})")]
    StartedAgain { exited: Box<StoreError>, pid: u32 },
}
