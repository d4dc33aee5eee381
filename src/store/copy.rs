//! Copies of a shard's data for a preflight (docs/how-to/upgrade.md, "The preflight"): the new
//! version runs on a copy, never on the shard's own store.
//!
//! - KineSqlite: `VACUUM INTO` (sqlite's consistent copy of a live database, taken in one read
//!   transaction while kine writes on; sqlite linked in through rusqlite, run as `kcpshard job
//!   sqlite-copy`) of `state.db` into the copy's directory, served by a kine of its own.
//! - KinePostgres: a pg_dump (the snapshot taken before the version change, or one taken for the
//!   preflight) restored with pg_restore into a scratch database on the same server, served by a
//!   kine of its own.
//!
//! The copy runs as the controller's jobs ([`StoreBackend::copy_run`]), never inside a step. The scratch database is dropped with the copy (`WITH (FORCE)`: its kine's
//!   connections go with it).
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::kine::{self, DB_FILE, KineSpec};
use super::postgres::PostgresServer;
use super::snapshot::ClientRun;
use super::{StoreBackend, StoreError};
use crate::process::{ProcessRecord, Runtime, UnitName};

/// The next process of a copy, run as a job.
pub enum CopyRun {
    /// pg_dump of the store into `dump` (written beside it until it succeeded); the copy follows.
    Dump { run: ClientRun, dump: PathBuf },
    /// The copy itself: pg_restore of the dump into the scratch database, or sqlite's VACUUM INTO.
    Copy(ClientRun),
}

/// Where a copy lives: `dir` (removed with it), and for KinePostgres the scratch database.
#[derive(Debug, Clone)]
pub struct CopyPlace {
    pub dir: PathBuf,
    pub scratch_database: Option<String>,
    /// The shard, for the kine's unit and application name.
    pub shard: String,
}

/// The scratch database of a shard's preflight: the shard's database name with `_preflight`
/// (within PostgreSQL's 63 bytes).
pub fn scratch_database(database: &str) -> String {
    let mut base = database.to_string();
    while base.len() > 63 - "_preflight".len() {
        base.pop();
    }
    format!("{base}_preflight")
}

impl StoreBackend {
    /// Whether a preflight can copy this store (Etcd: no).
    pub fn copies(&self) -> bool {
        !matches!(self, StoreBackend::Etcd(_))
    }

    /// The scratch database a preflight restores into, for stores that have one.
    pub fn scratch_database(&self) -> Option<String> {
        match self {
            StoreBackend::KinePostgres { server, .. } => Some(scratch_database(&server.database)),
            _ => None,
        }
    }

    fn copy_kine(&self, place: &CopyPlace) -> Result<Option<KineSpec>, StoreError> {
        Ok(match self {
            StoreBackend::KineSqlite { kine } => {
                let mut spec = KineSpec::sqlite(&kine.binary, &place.dir.join("store"), &place.shard)?;
                spec.unit = UnitName::preflight_kine(&place.shard);
                Some(spec)
            }
            StoreBackend::KinePostgres {
                server, kine_binary, ..
            } => {
                let Some(database) = &place.scratch_database else {
                    return Err(StoreError::Invalid(
                        "a preflight copy on PostgreSQL needs a scratch database".into(),
                    ));
                };
                let scratch = PostgresServer {
                    database: database.clone(),
                    ..server.clone()
                };
                Some(scratch.slot_kine(
                    kine_binary,
                    place.dir.join("kine"),
                    &format!("kcpshard-{}-preflight", place.shard),
                    UnitName::preflight_kine(&place.shard),
                ))
            }
            StoreBackend::Etcd(_) => None,
        })
    }

    /// The request that makes `place`'s scratch database anew (KinePostgres), before a restore
    /// into it ([`StoreBackend::copy_run`] with a dump); None for a store that has none.
    pub fn recreate_scratch(
        &self,
        place: &CopyPlace,
    ) -> Option<impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.scratch(place)
            .map(|(server, database)| async move { server.recreate_database(&database).await })
    }

    /// The request that drops `place`'s scratch database (KinePostgres), once its kine is gone;
    /// None for a store that has none.
    pub fn drop_scratch(
        &self,
        place: &CopyPlace,
    ) -> Option<impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.scratch(place)
            .map(|(server, database)| async move { server.drop_database(&database).await })
    }

    fn scratch(&self, place: &CopyPlace) -> Option<(PostgresServer, String)> {
        match (self, &place.scratch_database) {
            (StoreBackend::KinePostgres { server, .. }, Some(database)) => Some((server.clone(), database.clone())),
            _ => None,
        }
    }

    /// The next process that copies the data into `place`, as a job. `dump` is a pg_dump of the
    /// data taken for this version change, if there is one (KinePostgres); without one, a dump
    /// into `place.dir` comes first. A restore goes into the scratch database, which
    /// [`StoreBackend::recreate_scratch`] made anew first. `kcpshard` is this binary, whose
    /// `kcpshard job sqlite-copy` copies a sqlite database.
    pub fn copy_run(&self, place: &CopyPlace, dump: Option<&Path>, kcpshard: &Path) -> Result<CopyRun, StoreError> {
        crate::fsutil::create_private_dir(&place.dir).map_err(StoreError::io(&place.dir))?;
        match self {
            StoreBackend::KineSqlite { kine } => {
                let into = place.dir.join("store");
                crate::fsutil::create_private_dir(&into).map_err(StoreError::io(&into))?;
                Ok(CopyRun::Copy(sqlite_copy_run(
                    kcpshard,
                    &kine.dir.join(DB_FILE),
                    &into.join(DB_FILE),
                )?))
            }
            StoreBackend::KinePostgres { server, .. } => {
                let Some(dump) = dump else {
                    let dir = std::path::absolute(&place.dir).map_err(StoreError::io(&place.dir))?;
                    let dump = super::snapshot::snapshot_path(
                        super::snapshot::SnapshotFormat::PgDump,
                        &server.database,
                        &dir,
                        "serving",
                        Some("preflight"),
                        chrono::Utc::now(),
                    );
                    let run = super::snapshot::dump_run(server, &super::snapshot::partial_of(&dump))?;
                    return Ok(CopyRun::Dump { run, dump });
                };
                let database = place.scratch_database.as_deref().ok_or_else(|| {
                    StoreError::Invalid("a preflight copy on PostgreSQL needs a scratch database".into())
                })?;
                let scratch = PostgresServer {
                    database: database.to_string(),
                    ..server.clone()
                };
                Ok(CopyRun::Copy(super::snapshot::restore_run(&scratch, dump)?))
            }
            StoreBackend::Etcd(_) => Err(StoreError::Invalid("an Etcd store is not copied".into())),
        }
    }

    /// Starts (or adopts) the kine that serves the copy in `place`, without waiting for it to
    /// accept ([`StoreBackend::copy_starting`] says when it still starts).
    pub async fn serve_copy(&self, runtime: &Runtime, place: &CopyPlace) -> Result<kine::KineStart, StoreError> {
        let spec = self
            .copy_kine(place)?
            .ok_or_else(|| StoreError::Invalid("an Etcd store is not copied".into()))?;
        kine::start_kine(runtime, &spec).await
    }

    /// The kine over the copy in `place` was started and does not accept yet (within its ready
    /// timeout).
    pub async fn copy_starting(&self, runtime: &Runtime, place: &CopyPlace) -> bool {
        match self.copy_kine(place) {
            Ok(Some(spec)) => kine::starting_kine(runtime, &spec).await.is_some(),
            _ => false,
        }
    }

    /// The kine over the copy in `place` and any other on its endpoint, while they run.
    pub fn copy_processes(&self, runtime: &Runtime, place: &CopyPlace) -> Result<Vec<ProcessRecord>, StoreError> {
        match self.copy_kine(place)? {
            Some(spec) => kine::kine_processes(runtime, &spec),
            None => Ok(Vec::new()),
        }
    }

    /// Once the copy's kine is gone ([`StoreBackend::copy_processes`]) and its scratch database
    /// dropped ([`StoreBackend::drop_scratch`]): removes the kine's record and `place.dir`;
    /// idempotent.
    pub fn remove_copy(&self, place: &CopyPlace) -> Result<(), StoreError> {
        if let Some(spec) = self.copy_kine(place)? {
            let record = spec.record_path();
            crate::fsutil::remove_if_there(&record).map_err(StoreError::io(record))?;
        }
        match std::fs::remove_dir_all(&place.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io(&place.dir)(e)),
            _ => Ok(()),
        }
    }
}

/// `kcpshard job sqlite-copy` ([`vacuum_into`]) of the database `from` into `into`, as a job (with
/// absolute paths: a job runs in a directory of its own); `kcpshard` is this binary.
pub fn sqlite_copy_run(kcpshard: &Path, from: &Path, into: &Path) -> Result<ClientRun, StoreError> {
    let arg = super::snapshot::absolute_arg;
    Ok(ClientRun {
        program: kcpshard.to_path_buf(),
        args: vec![
            "job".into(),
            "sqlite-copy".into(),
            "--from".into(),
            arg(from)?,
            "--into".into(),
            arg(into)?,
        ],
        env: Vec::new(),
    })
}

/// sqlite's `VACUUM INTO`: a consistent copy of a database another process writes to (one read
/// transaction; the source is opened read-only and waited on for up to 30 s when busy), put in
/// place of `into` only once it is complete and on disk. So a copy that fails or is killed leaves
/// `into` as it was, which is what a restore over a store's `state.db` needs. The write-ahead log
/// and shared-memory files of the database it replaces go first: sqlite would otherwise replay
/// that log into the copy on the next open.
pub async fn vacuum_into(from: &Path, into: &Path) -> Result<(), StoreError> {
    let (from, into) = (from.to_path_buf(), into.to_path_buf());
    tokio::task::spawn_blocking(move || vacuum_into_blocking(&from, &into))
        .await
        .map_err(|e| StoreError::Invalid(format!("the sqlite copy's task ended: {e}")))?
}

fn vacuum_into_blocking(from: &Path, into: &Path) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| {
        StoreError::Invalid(format!(
            "copying the sqlite database {} into {} (VACUUM INTO) failed: {e}",
            from.display(),
            into.display()
        ))
    };
    let copying = sibling(into, ".copying");
    crate::fsutil::remove_if_there(&copying).map_err(StoreError::io(&copying))?;
    let source =
        rusqlite::Connection::open_with_flags(from, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(failed)?;
    source.busy_timeout(Duration::from_secs(30)).map_err(failed)?;
    source
        .execute("VACUUM INTO ?1", [copying.display().to_string()])
        .map_err(failed)?;
    std::fs::File::open(&copying)
        .and_then(|f| f.sync_all())
        .map_err(StoreError::io(&copying))?;
    for stale in [sibling(into, "-wal"), sibling(into, "-shm")] {
        crate::fsutil::remove_if_there(&stale).map_err(StoreError::io(&stale))?;
    }
    std::fs::rename(&copying, into).map_err(StoreError::io(into))?;
    let dir = into
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::fsutil::sync_dir(dir).map_err(StoreError::io(dir))
}

/// `path` with `suffix` appended to its file name (`state.db` -> `state.db-wal`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_database_is_named_after_the_shards_within_postgres_limits() {
        assert_eq!(scratch_database("kcp"), "kcp_preflight");
        let long = "d".repeat(70);
        assert_eq!(scratch_database(&long).len(), 63);
        assert!(scratch_database(&long).ends_with("_preflight"));
    }

    /// The names in kine's table of the sqlite database at `path`.
    fn names_in(path: &Path) -> Vec<String> {
        let db = rusqlite::Connection::open(path).unwrap();
        db.prepare("SELECT name FROM kine ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// A connection to a new database at `path` in WAL mode, as kine's, that never checkpoints,
    /// holding kine's table with `name` in it.
    fn kine_writer(path: &Path, name: &str) -> rusqlite::Connection {
        let writer = rusqlite::Connection::open(path).unwrap();
        writer
            .execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE kine (name TEXT);")
            .unwrap();
        writer.execute("INSERT INTO kine VALUES (?1)", [name]).unwrap();
        writer
    }

    #[tokio::test]
    async fn vacuum_into_copies_a_sqlite_database_that_another_connection_writes_to() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("state.db");
        let writer = kine_writer(&from, "/registry/x");
        // A write transaction still open while the copy is taken: the copy has what was committed.
        writer
            .execute_batch("BEGIN; INSERT INTO kine VALUES ('/registry/uncommitted');")
            .unwrap();
        let into = dir.path().join("copy.db");
        vacuum_into(&from, &into).await.unwrap();
        assert_eq!(names_in(&into), ["/registry/x"]);
        writer.execute_batch("COMMIT").unwrap();
    }

    /// A restore copies a snapshot over a store's database: the old database's write-ahead log
    /// must not be replayed into the copy, and a copy that fails leaves the old database whole.
    #[tokio::test]
    async fn a_copy_over_a_database_replaces_it_and_its_log_or_leaves_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = dir.path().join("snapshot.db");
        rusqlite::Connection::open(&snapshot)
            .unwrap()
            .execute_batch("CREATE TABLE kine (name TEXT); INSERT INTO kine VALUES ('/registry/snapshot');")
            .unwrap();
        let store = dir.path().join("state.db");
        let writer = kine_writer(&store, "/registry/later");
        // A writer that died without a checkpoint: its commits are only in state.db-wal.
        std::mem::forget(writer);
        assert!(sibling(&store, "-wal").metadata().unwrap().len() > 0);

        let missing = dir.path().join("missing.db");
        vacuum_into(&missing, &store).await.unwrap_err();
        assert_eq!(
            names_in(&store),
            ["/registry/later"],
            "a failed copy changed the database"
        );

        let store_copy = dir.path().join("store-copy.db");
        std::fs::copy(&store, &store_copy).unwrap();
        std::fs::copy(sibling(&store, "-wal"), sibling(&store_copy, "-wal")).unwrap();
        vacuum_into(&snapshot, &store_copy).await.unwrap();
        assert!(!sibling(&store_copy, "-wal").exists());
        assert_eq!(names_in(&store_copy), ["/registry/snapshot"]);
    }
}
