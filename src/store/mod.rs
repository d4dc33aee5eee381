//! The shard's store: where its data lives, started before the first slot and outliving every
//! slot (DESIGN.md section 3, step 1).
//!
//! Backends:
//! - [`StoreBackend::KineSqlite`]: one kine over a sqlite file, dialed by every slot. For dev and
//!   single-host use; a kine restart is a store outage for both slots (research 3).
//! - Later: `KinePostgres` (one kine per slot over a shared database; the first kine must start
//!   alone, research 3's schema race) and `Etcd` (endpoints the user runs). Their slot-scoped
//!   processes fit [`StoreBackend::ensure`] taking a slot name; nothing here assumes sqlite
//!   beyond the variant itself.
pub mod kine;

use std::path::PathBuf;
use std::time::Duration;

use crate::process::{ProcessError, ProcessRecord, Runtime};

pub use kine::{Kine, ensure_kine_sqlite, stop_kine_sqlite};

/// Which store a shard uses, with what it needs to run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// One kine over `<dir>/state.db`.
    KineSqlite { kine_binary: PathBuf, dir: PathBuf },
}

/// A ready store, as slots see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEndpoint {
    /// `--etcd-servers` for the slots.
    pub etcd_servers: String,
    /// The processes kcpshard runs for this store (empty for an external store).
    pub processes: Vec<ProcessRecord>,
}

impl StoreBackend {
    /// Starts the store, or adopts it when it already runs; returns once it accepts.
    pub async fn ensure(&self, runtime: &Runtime) -> Result<StoreEndpoint, StoreError> {
        match self {
            StoreBackend::KineSqlite { kine_binary, dir } => {
                let k = ensure_kine_sqlite(runtime, kine_binary, dir).await?;
                Ok(StoreEndpoint {
                    etcd_servers: k.endpoint,
                    processes: vec![k.record],
                })
            }
        }
    }

    /// Stops the store's processes; the data stays.
    pub async fn stop(&self, runtime: &Runtime, grace: Duration) -> Result<(), StoreError> {
        match self {
            StoreBackend::KineSqlite { dir, .. } => stop_kine_sqlite(runtime, dir, grace).await.map(|_| ()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Invalid(String),
    #[error("kine runs but does not accept within {waited:?}; see {log}:\n{log_tail}")]
    NotReady {
        waited: Duration,
        log: PathBuf,
        log_tail: String,
    },
    #[error("kine exited during startup ({}); see {log}:\n{log_tail}", status.as_deref().unwrap_or("status unknown"))]
    Exited {
        status: Option<String>,
        log: PathBuf,
        log_tail: String,
    },
}
