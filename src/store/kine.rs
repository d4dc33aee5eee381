//! kine: an etcd-protocol server over SQL. One kine process per [`KineSpec`]: for KineSqlite the one
//! shard-wide kine every slot dials (sqlite is one kine process only, docs/background.md section 7); for KinePostgres
//! one kine per slot, each with its own address, all on one database.
//!
//! Layout of a kine's directory (0700): `kine.json` (the [`ProcessRecord`]; the address is in its
//! argv, so the record is the one source of truth), `kine.log`, `kine.sock` (where it listens,
//! [`KineAddress`]), and for sqlite `state.db`.
//!
//! [`start_kine`] and [`ensure_kine`] are idempotent and crash-safe: they adopt the recorded kine
//! when it runs and accepts (or is still starting); they find a kine whose record was never written
//! (serve died right after the spawn) by its `--endpoint=` argument, which is unique per kine; they
//! stop extra kines on that endpoint; only then do they start one, at the recorded address when
//! there is one, so that a slot that dials a kine that died finds the new one at the same address.
//! `start_kine` returns once kine runs; `ensure_kine` waits for it to accept. kine accepting means
//! its schema is ready (kine creates its tables before it listens).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process::{ProcessRecord, ProcessSpec, Runtime, Termination, UnitName};

use super::StoreError;
pub use super::kine_address::KineAddress;

pub const RECORD_FILE: &str = "kine.json";
pub const LOG_FILE: &str = "kine.log";
pub const DB_FILE: &str = "state.db";

/// kine's own defaults for sqlite (`pkg/drivers/sqlite/sqlite.go` DefaultParams of v0.17.2, minus
/// the statement cache size): WAL, a 30 s busy timeout, immediate write locks.
pub const SQLITE_PARAMS: &str =
    "_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared";

/// What makes a kine's table hand out revisions above `$1` once a kine starts on it (a kine made
/// it, none runs on it now), with `$2` = `gap-<$1>`:
/// - a fill row at `$1`, the kind kine writes for a revision it skipped (kine
///   `pkg/drivers/generic/generic.go` `FillSQL`), since a kine takes its current revision from the
///   highest row when it starts (a running kine would fill every revision in between, a row each);
/// - its compact revision at `$1` (the `prev_revision` of `compact_rev_key`, generic.go
///   `CompactRevSQL`), so that a read or watch from an older revision is told it was compacted
///   (kine `pkg/logstructured/sqllog/sql.go` `After`, `List`): kube-apiserver answers a client
///   that resumes from an old resourceVersion 410 Gone, and it lists again.
pub const RAISE_REVISION_SQL: [&str; 2] = [
    "INSERT INTO kine(id, name, created, deleted, create_revision, prev_revision, lease, value, old_value) \
     VALUES ($1, $2, 0, 1, 0, 0, 0, NULL, NULL)",
    "UPDATE kine SET prev_revision = $1 WHERE name = 'compact_rev_key'",
];

/// [`RAISE_REVISION_SQL`] on the kine sqlite database `db` (a kine made it, none runs on it now);
/// kine's AUTOINCREMENT ids go on above the fill row.
pub async fn raise_sqlite_revision(db: &Path, above: i64) -> Result<(), StoreError> {
    let (db, shown) = (db.to_path_buf(), db.display().to_string());
    let raise = move || {
        let mut connection = rusqlite::Connection::open(&db)?;
        let transaction = connection.transaction()?;
        let [fill, compact] = RAISE_REVISION_SQL;
        transaction.execute(fill, rusqlite::params![above, format!("gap-{above}")])?;
        transaction.execute(compact, rusqlite::params![above])?;
        transaction.commit()
    };
    let message =
        |e: String| StoreError::Invalid(format!("cannot raise kine's revision in {shown} above {above}: {e}"));
    tokio::task::spawn_blocking(raise)
        .await
        .map_err(|e| message(e.to_string()))?
        .map_err(|e| message(e.to_string()))
}

/// How long a fresh kine may take to accept (an empty sqlite database takes well under a second).
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kine gets to exit after SIGTERM before SIGKILL; it exits in milliseconds.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
const START_ATTEMPTS: usize = 3;

/// A running kine and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kine {
    pub address: KineAddress,
    pub record: ProcessRecord,
    /// Found running (true) or started by this call (false).
    pub adopted: bool,
}

impl Kine {
    fn at(address: KineAddress, record: ProcessRecord, adopted: bool) -> Kine {
        Kine {
            address,
            record,
            adopted,
        }
    }

    /// `unix://<dir>/kine.sock` (or `http://127.0.0.1:<port>`), for `--etcd-servers`.
    pub fn endpoint(&self) -> String {
        self.address.url()
    }
}

/// `sqlite://<dir>/state.db?<params>`.
pub fn sqlite_endpoint(dir: &Path) -> String {
    format!("sqlite://{}?{SQLITE_PARAMS}", dir.join(DB_FILE).display())
}

/// The argument that names the database: unique per kine, so it finds a kine by its argv.
pub fn endpoint_arg(endpoint: &str) -> String {
    format!("--endpoint={endpoint}")
}

/// kine's arguments. `--metrics-bind-address=0` disables the metrics listener (its default :8080
/// collides between kines, and a bind failure is fatal); `--compact-interval=0` leaves compaction
/// to the apiserver.
pub fn kine_args(endpoint: &str, address: &KineAddress) -> Vec<String> {
    vec![
        endpoint_arg(endpoint),
        address.listen_arg(),
        "--metrics-bind-address=0".to_string(),
        "--compact-interval=0".to_string(),
    ]
}

/// One kine: what it serves and where it keeps its record and log.
#[derive(Clone)]
pub struct KineSpec {
    pub binary: PathBuf,
    /// kine's `--endpoint`; unique per kine (it identifies an unrecorded kine by its argv).
    pub endpoint: String,
    /// Holds `kine.json` and `kine.log` (and the sqlite database).
    pub dir: PathBuf,
    /// Added to kine's environment, e.g. PGPASSWORD: a secret never goes into argv, where every
    /// local user can read it.
    pub env: Vec<(String, String)>,
    pub ready_timeout: Duration,
    /// Its unit under systemd.
    pub unit: UnitName,
}

impl std::fmt::Debug for KineSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KineSpec")
            .field("endpoint", &self.endpoint)
            .field("unit", &self.unit)
            .field("dir", &self.dir)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl KineSpec {
    /// The kine of shard `shard` over `<dir>/state.db`.
    pub fn sqlite(binary: &Path, dir: &Path, shard: &str) -> Result<KineSpec, StoreError> {
        let dir = absolute_private_dir(dir)?;
        if dir.to_string_lossy().contains(['?', '#']) {
            return Err(StoreError::Invalid(format!(
                "store directory {} has ? or # in its path, which a sqlite DSN cannot hold",
                dir.display()
            )));
        }
        Ok(KineSpec {
            binary: binary.to_path_buf(),
            endpoint: sqlite_endpoint(&dir),
            dir,
            env: Vec::new(),
            ready_timeout: READY_TIMEOUT,
            unit: UnitName::shard_kine(shard),
        })
    }

    pub(super) fn record_path(&self) -> PathBuf {
        self.dir.join(RECORD_FILE)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }
}

/// Makes sure the kine of shard `shard`'s sqlite store in `dir` runs and accepts, adopting a
/// running one.
pub async fn ensure_kine_sqlite(
    runtime: &Runtime,
    kine_binary: &Path,
    dir: &Path,
    shard: &str,
) -> Result<Kine, StoreError> {
    ensure_kine(runtime, &KineSpec::sqlite(kine_binary, dir, shard)?).await
}

/// Stops the kine of shard `shard`'s sqlite store in `dir`; see [`stop_kine`].
pub async fn stop_kine_sqlite(
    runtime: &Runtime,
    dir: &Path,
    shard: &str,
    grace: Duration,
) -> Result<Option<Termination>, StoreError> {
    stop_kine(runtime, &KineSpec::sqlite(Path::new("kine"), dir, shard)?, grace).await
}

/// The recorded kine when it runs and accepts; nothing is started.
pub async fn running_kine(runtime: &Runtime, spec: &KineSpec) -> Option<Kine> {
    let record = Runtime::load(&spec.record_path()).ok().flatten()?;
    let address = KineAddress::from_args(&record.args)?;
    (runtime.is_running(&record) && address.accepts().await).then(|| Kine::at(address, record, true))
}

/// The recorded kine of `spec` when it runs, does not accept yet, and is still within its ready
/// timeout: a start in progress, which a look waits for instead of starting another.
pub async fn starting_kine(runtime: &Runtime, spec: &KineSpec) -> Option<ProcessRecord> {
    let record = Runtime::load(&spec.record_path()).ok().flatten()?;
    let address = KineAddress::from_args(&record.args)?;
    (runtime.is_running(&record) && !address.accepts().await && record.running_for() < spec.ready_timeout)
        .then_some(record)
}

/// What [`start_kine`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KineStart {
    /// A kine accepts at its endpoint.
    Accepting(Kine),
    /// A kine runs and does not accept yet (its schema is being made): started now, or earlier and
    /// still within its ready timeout.
    Starting(Kine),
}

/// What runs on a kine's endpoint before anything is started.
enum Found {
    Accepting(Kine),
    Starting(Kine),
    /// The recorded kine runs and did not accept within its ready timeout.
    TimedOut(Kine),
}

/// Adopts the kine of `spec` that runs, or starts one, and returns without waiting for it to
/// accept: a later look finds it accepting ([`running_kine`]) or still starting ([`starting_kine`]).
/// One that ran its ready timeout without accepting is stopped and the step fails naming its log
/// (the next attempt starts another); one that exited on its own during its start is started
/// again and the step fails naming why it exited ([`StoreError::StartedAgain`]).
pub async fn start_kine(runtime: &Runtime, spec: &KineSpec) -> Result<KineStart, StoreError> {
    match adopt(runtime, spec).await? {
        Some(Found::Accepting(kine)) => return Ok(KineStart::Accepting(kine)),
        Some(Found::Starting(kine)) => return Ok(KineStart::Starting(kine)),
        Some(Found::TimedOut(kine)) => return Err(failure(runtime, &kine.record, spec).await?),
        None => {}
    }
    let recorded = Runtime::load(&spec.record_path())?;
    // Failed during its start: kine exits 1 on a fatal error, and 0 only after a stop it was
    // asked for (SIGTERM), which is no failure.
    let exited = match &recorded {
        Some(rec)
            if rec.running_for() < spec.ready_timeout
                && runtime
                    .exit_status(rec)
                    .await
                    .and_then(|status| status.code())
                    .is_some_and(|code| code != 0) =>
        {
            Some(failure(runtime, rec, spec).await?)
        }
        _ => None,
    };
    let kine = spawn(runtime, spec, recorded.as_ref()).await?;
    match exited {
        Some(exited) => Err(StoreError::StartedAgain {
            exited: Box::new(exited),
            pid: kine.record.pid,
        }),
        None => Ok(KineStart::Starting(kine)),
    }
}

/// Makes sure the kine of `spec` runs and accepts, adopting a running one, and waits for it (up
/// to its ready timeout, three attempts): for callers that may wait, such as tools and tests. The
/// controller's steps use [`start_kine`] and let later looks see kine accept.
pub async fn ensure_kine(runtime: &Runtime, spec: &KineSpec) -> Result<Kine, StoreError> {
    let mut last_error = None;
    for _ in 0..START_ATTEMPTS {
        let kine = match adopt(runtime, spec).await? {
            Some(Found::Accepting(kine)) => return Ok(kine),
            Some(Found::Starting(kine) | Found::TimedOut(kine)) => kine,
            None => spawn(runtime, spec, Runtime::load(&spec.record_path())?.as_ref()).await?,
        };
        let started = Instant::now();
        let left = spec.ready_timeout.saturating_sub(kine.record.running_for());
        if wait_accepting(runtime, &kine.record, &kine.address, left).await {
            tracing::info!(pid = kine.record.pid, address = %kine.address, ready_in = ?started.elapsed(), "kine accepts");
            return Ok(kine);
        }
        let error = failure(runtime, &kine.record, spec).await?;
        tracing::warn!(error = %error, "kine did not come up");
        // A port was taken between our probe and kine's bind, or two kines raced to create the
        // schema on a fresh PostgreSQL database (docs/background.md section 7): try again.
        let retry = matches!(error, StoreError::Exited { .. });
        last_error = Some(error);
        if !retry {
            break;
        }
    }
    Err(last_error.expect("at least one attempt"))
}

/// Every kine on the endpoint of `spec`, the recorded one first, then any unrecorded ones (serve
/// died right after a spawn): the first that accepts is adopted (and recorded), the recorded one
/// still within its ready timeout is waited for, and every other one is stopped (one kine per
/// endpoint).
async fn adopt(runtime: &Runtime, spec: &KineSpec) -> Result<Option<Found>, StoreError> {
    let record_path = spec.record_path();
    let recorded = Runtime::load(&record_path)?;
    let mut candidates: Vec<ProcessRecord> = Vec::new();
    if let Some(rec) = &recorded
        && runtime.is_running(rec)
    {
        candidates.push(rec.clone());
    }
    for pid in Runtime::find_by_argument(&endpoint_arg(&spec.endpoint)) {
        if !candidates.iter().any(|c| c.pid == pid)
            && let Some(rec) = Runtime::observe(pid)
        {
            candidates.push(rec);
        }
    }

    let mut found: Option<Found> = None;
    for rec in candidates {
        if found.is_none()
            && let Some(address) = KineAddress::from_args(&rec.args)
        {
            if address.accepts().await && runtime.is_running(&rec) {
                if Runtime::load(&record_path)?.as_ref() != Some(&rec) {
                    rec.save(&record_path)?;
                }
                tracing::info!(pid = rec.pid, %address, "adopted the running kine");
                found = Some(Found::Accepting(Kine::at(address, rec, true)));
                continue;
            }
            if recorded.as_ref() == Some(&rec) {
                let kine = Kine::at(address, rec, true);
                found = Some(if kine.record.running_for() < spec.ready_timeout {
                    Found::Starting(kine)
                } else {
                    Found::TimedOut(kine)
                });
                continue;
            }
        }
        tracing::warn!(pid = rec.pid, dir = %spec.dir.display(), "stopping a kine that is not the one in use");
        runtime.terminate(&rec, STOP_GRACE).await?;
    }
    Ok(found)
}

/// Starts a kine for `spec`. One that died comes back at its recorded address: slots dial it.
/// Every kine on this endpoint was adopted or stopped before, so whatever accepts on a recorded
/// port is another program (kine itself replaces a stale socket file).
async fn spawn(runtime: &Runtime, spec: &KineSpec, recorded: Option<&ProcessRecord>) -> Result<Kine, StoreError> {
    let address = match recorded.and_then(|r| Some((r, KineAddress::from_args(&r.args)?))) {
        Some((rec, KineAddress::Tcp(port))) if !port_let_go(port, rec).await => {
            return Err(StoreError::PortTaken {
                port,
                holder: crate::process::procfs::listener_pid(port).map(crate::process::procfs::describe),
            });
        }
        Some((_, address)) => address,
        None => KineAddress::for_new_kine(&spec.dir).map_err(StoreError::io(&spec.dir))?,
    };
    let mut process = ProcessSpec::new(
        "kine",
        spec.unit.clone(),
        &spec.binary,
        kine_args(&spec.endpoint, &address),
        spec.log_path(),
        spec.record_path(),
    );
    process.env = spec.env.clone();
    let rec = runtime.start(&process).await?;
    tracing::info!(pid = rec.pid, %address, "kine started");
    Ok(Kine::at(address, rec, false))
}

/// Whether `port`, on which the kine recorded as `rec` listened, is free. A kine killed a moment
/// ago can still hold it: its main thread is a zombie (so it no longer counts as running) while its
/// other threads exit and the last one closes its sockets; that takes milliseconds, and is given
/// up to a second.
async fn port_let_go(port: u16, rec: &ProcessRecord) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    while KineAddress::Tcp(port).accepts().await {
        let exiting = crate::process::procfs::stat(rec.pid).is_some_and(|s| s.start_time == rec.start_time);
        if !exiting || Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Why the kine recorded as `rec` did not come up, with the end of its log; one that still runs
/// (it did not accept within its ready timeout) is stopped.
async fn failure(runtime: &Runtime, rec: &ProcessRecord, spec: &KineSpec) -> Result<StoreError, StoreError> {
    let running = runtime.is_running(rec);
    if running {
        runtime.terminate(rec, STOP_GRACE).await?;
    }
    let log = Runtime::log_location(rec);
    let log_tail = runtime.log_tail(rec, LOG_TAIL_LINES).await.join("\n");
    Ok(if running {
        StoreError::NotReady {
            waited: spec.ready_timeout,
            log,
            log_tail,
        }
    } else {
        StoreError::Exited {
            status: runtime.exit_status(rec).await.map(|s| s.to_string()),
            log,
            log_tail,
        }
    })
}

/// The running kines of `spec`: the recorded one first, then any unrecorded kine on the same
/// endpoint.
pub fn kine_processes(runtime: &Runtime, spec: &KineSpec) -> Result<Vec<ProcessRecord>, StoreError> {
    let mut running: Vec<ProcessRecord> = Runtime::load(&spec.record_path())?
        .filter(|rec| runtime.is_running(rec))
        .into_iter()
        .collect();
    for pid in Runtime::find_by_argument(&endpoint_arg(&spec.endpoint)) {
        if !running.iter().any(|r| r.pid == pid)
            && let Some(rec) = Runtime::observe(pid)
        {
            running.push(rec);
        }
    }
    Ok(running)
}

/// Stops the kine of `spec` (and any unrecorded kine on the same endpoint) and waits for them,
/// then removes its record. Returns how the recorded one ended; None when none ran.
pub async fn stop_kine(runtime: &Runtime, spec: &KineSpec, grace: Duration) -> Result<Option<Termination>, StoreError> {
    let record_path = spec.record_path();
    let recorded = Runtime::load(&record_path)?;
    let mut result = None;
    for rec in kine_processes(runtime, spec)? {
        let ended = runtime.terminate(&rec, grace).await?;
        if recorded.as_ref() == Some(&rec) {
            result = Some(ended);
        }
    }
    crate::fsutil::remove_if_there(&record_path).map_err(StoreError::io(record_path))?;
    Ok(result)
}

/// Waits until `address` accepts while the process runs; false when it exits or `timeout` passes.
async fn wait_accepting(runtime: &Runtime, rec: &ProcessRecord, address: &KineAddress, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !runtime.is_running(rec) {
            return false;
        }
        if address.accepts().await {
            // The process may have died right after an unrelated program took the port.
            return runtime.is_running(rec);
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn absolute_private_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    crate::fsutil::create_private_dir(dir).map_err(StoreError::io(dir))?;
    std::path::absolute(dir).map_err(StoreError::io(dir))
}

/// How many lines of a kine's output an error quotes.
const LOG_TAIL_LINES: usize = 15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_names_the_database_and_kine_defaults() {
        let e = sqlite_endpoint(Path::new("/state/shards/dev/store"));
        let spec = KineSpec::sqlite(Path::new("kine"), &std::env::temp_dir(), "dev").unwrap();
        assert_eq!(spec.unit, UnitName::shard_kine("dev"));
        assert_eq!(
            e,
            "sqlite:///state/shards/dev/store/state.db?_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared"
        );
    }

    #[test]
    fn kine_listens_on_its_socket_without_metrics_or_its_own_compaction() {
        let address = KineAddress::Unix("/x/kine.sock".into());
        let args = kine_args("sqlite:///x/state.db", &address);
        assert_eq!(
            args,
            [
                "--endpoint=sqlite:///x/state.db",
                "--listen-address=unix:///x/kine.sock",
                "--metrics-bind-address=0",
                "--compact-interval=0"
            ]
        );
        assert_eq!(KineAddress::from_args(&args), Some(address));
    }
}
