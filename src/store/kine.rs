//! kine over sqlite: one kine process per shard, which every slot dials (research 3: sqlite is one
//! kine process only; a second kine on the same file is never started).
//!
//! Layout of the store directory (0700): `state.db` (+ WAL files), `kine.log`, `kine.json` (the
//! [`ProcessRecord`]; the port is in its argv, so the record is the one source of truth).
//!
//! [`ensure_kine_sqlite`] is idempotent and crash-safe: it adopts the recorded kine when it runs and
//! accepts; it finds a kine whose record was never written (serve died right after the spawn) by its
//! `--endpoint=` argument, which names the database file; it stops extra kines on the file; only
//! then does it start one. kine's port accepting means its schema is ready (DESIGN.md section 6).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process::{ProcessRecord, ProcessSpec, Runtime, Termination, free_port};

use super::StoreError;

pub const RECORD_FILE: &str = "kine.json";
pub const LOG_FILE: &str = "kine.log";
pub const DB_FILE: &str = "state.db";

/// kine's own defaults for sqlite (`pkg/drivers/sqlite/sqlite.go` DefaultParams of v0.17.5, minus
/// the statement cache size): WAL, a 30 s busy timeout, immediate write locks.
pub const SQLITE_PARAMS: &str =
    "_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared";

/// How long a fresh kine may take to accept (an empty sqlite database takes well under a second).
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(10);
const START_ATTEMPTS: usize = 3;

/// A running kine and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kine {
    /// `http://127.0.0.1:<port>`, for `--etcd-servers`.
    pub endpoint: String,
    pub port: u16,
    pub record: ProcessRecord,
    /// Found running (true) or started by this call (false).
    pub adopted: bool,
}

/// `sqlite://<dir>/state.db?<params>`.
pub fn sqlite_endpoint(dir: &Path) -> String {
    format!("sqlite://{}?{SQLITE_PARAMS}", dir.join(DB_FILE).display())
}

/// The argument that names the database: unique per store directory, so it finds the kine of a
/// store by its argv.
pub fn endpoint_arg(endpoint: &str) -> String {
    format!("--endpoint={endpoint}")
}

/// kine's arguments. `--metrics-bind-address=0` disables the metrics listener (its default :8080
/// collides between kines, and a bind failure is fatal); `--compact-interval=0` leaves compaction
/// to the apiserver.
pub fn kine_args(endpoint: &str, port: u16) -> Vec<String> {
    vec![
        endpoint_arg(endpoint),
        format!("--listen-address=127.0.0.1:{port}"),
        "--metrics-bind-address=0".to_string(),
        "--compact-interval=0".to_string(),
    ]
}

/// The port in a kine's `--listen-address=<host>:<port>` argument.
pub fn listen_port(args: &[String]) -> Option<u16> {
    args.iter()
        .find_map(|a| a.strip_prefix("--listen-address="))
        .and_then(|addr| addr.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
}

/// Makes sure the kine of the sqlite store in `dir` runs and accepts, adopting a running one.
pub async fn ensure_kine_sqlite(runtime: &Runtime, kine_binary: &Path, dir: &Path) -> Result<Kine, StoreError> {
    ensure_kine_sqlite_within(runtime, kine_binary, dir, READY_TIMEOUT).await
}

/// [`ensure_kine_sqlite`] with a bound on how long a kine may take to accept.
pub async fn ensure_kine_sqlite_within(
    runtime: &Runtime,
    kine_binary: &Path,
    dir: &Path,
    ready_timeout: Duration,
) -> Result<Kine, StoreError> {
    let dir = absolute_private_dir(dir)?;
    if dir.to_string_lossy().contains(['?', '#']) {
        return Err(StoreError::Invalid(format!(
            "store directory {} has ? or # in its path, which a sqlite DSN cannot hold",
            dir.display()
        )));
    }
    let endpoint = sqlite_endpoint(&dir);
    let record_path = dir.join(RECORD_FILE);

    // Every kine on this database: the recorded one first, then any unrecorded ones.
    let mut candidates: Vec<ProcessRecord> = Vec::new();
    if let Some(rec) = Runtime::load(&record_path)?
        && runtime.is_running(&rec)
    {
        candidates.push(rec);
    }
    for pid in Runtime::find_by_argument(&endpoint_arg(&endpoint)) {
        if !candidates.iter().any(|c| c.pid == pid)
            && let Some(rec) = Runtime::observe(pid)
        {
            candidates.push(rec);
        }
    }

    let mut adopted: Option<Kine> = None;
    for rec in candidates {
        if adopted.is_none()
            && let Some(port) = listen_port(&rec.args)
            && wait_accepting(runtime, &rec, port, ready_timeout).await
        {
            if Runtime::load(&record_path)?.as_ref() != Some(&rec) {
                rec.save(&record_path)?;
            }
            tracing::info!(pid = rec.pid, port, "adopted the running kine");
            adopted = Some(Kine {
                endpoint: format!("http://127.0.0.1:{port}"),
                port,
                record: rec,
                adopted: true,
            });
            continue;
        }
        // sqlite takes one kine: stop one that does not accept or is one too many.
        tracing::warn!(
            pid = rec.pid,
            "stopping a kine on {} that is not the one in use",
            dir.display()
        );
        runtime.terminate(&rec, STOP_GRACE).await?;
    }
    if let Some(kine) = adopted {
        return Ok(kine);
    }

    let mut last_error = None;
    for _ in 0..START_ATTEMPTS {
        let port = free_port().map_err(|e| StoreError::Io {
            path: dir.clone(),
            source: e,
        })?;
        let spec = ProcessSpec {
            name: "kine".to_string(),
            program: kine_binary.to_path_buf(),
            args: kine_args(&endpoint, port),
            env: Vec::new(),
            log: dir.join(LOG_FILE),
            record: record_path.clone(),
        };
        let rec = runtime.start(&spec)?;
        let started = Instant::now();
        if wait_accepting(runtime, &rec, port, ready_timeout).await {
            tracing::info!(pid = rec.pid, port, ready_in = ?started.elapsed(), "kine accepts");
            return Ok(Kine {
                endpoint: format!("http://127.0.0.1:{port}"),
                port,
                record: rec,
                adopted: false,
            });
        }
        let running = runtime.is_running(&rec);
        runtime.terminate(&rec, STOP_GRACE).await?;
        let error = if running {
            StoreError::NotReady {
                waited: ready_timeout,
                log: spec.log.clone(),
                log_tail: log_tail(&spec.log),
            }
        } else {
            // Most likely the port was taken between our probe and kine's bind: try another.
            StoreError::Exited {
                status: runtime.exit_status(&rec).map(|s| s.to_string()),
                log: spec.log.clone(),
                log_tail: log_tail(&spec.log),
            }
        };
        tracing::warn!(error = %error, "kine did not come up");
        let retry = matches!(error, StoreError::Exited { .. });
        last_error = Some(error);
        if !retry {
            break;
        }
    }
    Err(last_error.expect("at least one attempt"))
}

/// Stops the kine of the sqlite store in `dir` (and any unrecorded kine on the same database), and
/// removes its record. Returns how the recorded one ended; None when none ran.
pub async fn stop_kine_sqlite(
    runtime: &Runtime,
    dir: &Path,
    grace: Duration,
) -> Result<Option<Termination>, StoreError> {
    let dir = std::path::absolute(dir).map_err(|e| StoreError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let record_path = dir.join(RECORD_FILE);
    let mut result = None;
    if let Some(rec) = Runtime::load(&record_path)?
        && runtime.is_running(&rec)
    {
        result = Some(runtime.terminate(&rec, grace).await?);
    }
    for pid in Runtime::find_by_argument(&endpoint_arg(&sqlite_endpoint(&dir))) {
        if let Some(rec) = Runtime::observe(pid) {
            runtime.terminate(&rec, grace).await?;
        }
    }
    match std::fs::remove_file(&record_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(StoreError::Io {
                path: record_path,
                source: e,
            });
        }
    }
    Ok(result)
}

/// Waits until `port` accepts while the process runs; false when it exits or `timeout` passes.
async fn wait_accepting(runtime: &Runtime, rec: &ProcessRecord, port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !runtime.is_running(rec) {
            return false;
        }
        if port_accepts(port).await {
            // The process may have died right after an unrelated program took the port.
            return runtime.is_running(rec);
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A TCP connection to 127.0.0.1:`port` succeeds within 200 ms.
pub async fn port_accepts(port: u16) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(("127.0.0.1", port))
        )
        .await,
        Ok(Ok(_))
    )
}

fn absolute_private_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    let io = |e| StoreError::Io {
        path: dir.to_path_buf(),
        source: e,
    };
    crate::fsutil::create_private_dir(dir).map_err(io)?;
    std::path::absolute(dir).map_err(io)
}

/// The last lines of a log, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_names_the_database_and_kine_defaults() {
        let e = sqlite_endpoint(Path::new("/state/shards/dev/store"));
        assert_eq!(
            e,
            "sqlite:///state/shards/dev/store/state.db?_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared"
        );
    }

    #[test]
    fn kine_runs_on_loopback_without_metrics_or_its_own_compaction() {
        let args = kine_args("sqlite:///x/state.db", 23790);
        assert_eq!(
            args,
            [
                "--endpoint=sqlite:///x/state.db",
                "--listen-address=127.0.0.1:23790",
                "--metrics-bind-address=0",
                "--compact-interval=0"
            ]
        );
        assert_eq!(listen_port(&args), Some(23790));
        assert_eq!(listen_port(&["--endpoint=x".to_string()]), None);
    }
}
