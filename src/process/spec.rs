//! What a process kcpshard starts is (its spec), what is recorded of one that runs (its record),
//! and how starting, observing or stopping one fails.
use super::*;

/// Which back end starts new processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// Transient systemd units.
    Systemd,
    /// Detached processes (own session, log files).
    Process,
}

impl RuntimeKind {
    /// What `serve` runs with unless told: systemd when it is itself a systemd service on a host
    /// booted with systemd (`$INVOCATION_ID` or `$NOTIFY_SOCKET` set, `/run/systemd/system`
    /// present), else detached. A shell on a systemd host gets detached processes, as before.
    pub fn from_environment() -> RuntimeKind {
        let booted = Path::new("/run/systemd/system").is_dir();
        let a_service = std::env::var_os("INVOCATION_ID").is_some() || std::env::var_os("NOTIFY_SOCKET").is_some();
        if booted && a_service {
            RuntimeKind::Systemd
        } else {
            RuntimeKind::Process
        }
    }
}

/// Who restarts a process that exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restart {
    /// The controller (it decides what a crash means).
    #[default]
    Never,
    /// systemd, at once and with its stored descriptors (`Restart=always`); the detached runtime
    /// leaves it to the controller.
    Always,
}

/// A user to run as (PostgreSQL refuses to run as root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
}

/// What to start. [`ProcessSpec::new`] gives the usual defaults.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// A name for logs and errors (`slot-a`, `kine`).
    pub name: String,
    /// Its unit under systemd.
    pub unit: UnitName,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Added to (or overriding) the environment. A secret goes here, never into argv (where every
    /// local user can read it); a unit gets it from a 0600 file, not from its D-Bus properties.
    pub env: Vec<(String, String)>,
    /// The detached runtime appends stdout and stderr here (0600); a unit's go to the journal.
    /// The process's working directory is this file's directory.
    pub log: PathBuf,
    /// Where the [`ProcessRecord`] is written (atomically, 0600).
    pub record: PathBuf,
    /// What asks it to stop (SIGTERM; PostgreSQL's fast shutdown is SIGINT).
    pub stop_signal: Signal,
    pub restart: Restart,
    /// It speaks the notify protocol (`READY=1`, `FDSTORE=1`, `MAINPID=`): its unit is
    /// `Type=notify` with a file-descriptor store.
    pub notify: bool,
    /// A listening socket passed as its stdin (the front's: `serve` may bind ports that the
    /// front's unit could not).
    pub stdin: Option<Arc<TcpListener>>,
    pub run_as: Option<RunAs>,
    /// Its exit status is read after it exits (a job's): under systemd its unit stays loaded once
    /// the process has exited (RemainAfterExit), instead of being collected at once on success;
    /// whoever read the status stops the unit ([`Runtime::stop_unit`]).
    pub keep_exit_status: bool,
}

impl ProcessSpec {
    pub fn new(
        name: impl Into<String>,
        unit: UnitName,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        log: PathBuf,
        record: PathBuf,
    ) -> ProcessSpec {
        ProcessSpec {
            name: name.into(),
            unit,
            program: program.into(),
            args,
            env: Vec::new(),
            log,
            record,
            stop_signal: Signal::SIGTERM,
            restart: Restart::Never,
            notify: false,
            stdin: None,
            run_as: None,
            keep_exit_status: false,
        }
    }

    /// The directory the process works in: its log's.
    pub(super) fn work_dir(&self) -> &Path {
        self.log
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }
}

/// One started process, as recorded on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRecord {
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22 (clock ticks after boot): tells this process from a later one
    /// with the same pid.
    pub start_time: u64,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// The systemd unit it is the main process of; None for a detached process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The log file of a detached process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// When not SIGTERM: the signal that asks it to stop (`SIGINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

impl ProcessRecord {
    /// Writes the record atomically, mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), ProcessError> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a process record serialises");
        bytes.push(b'\n');
        fsutil::write_atomically(path, &bytes).map_err(|source| ProcessError::WriteRecord {
            path: path.to_path_buf(),
            source,
        })
    }

    /// How long ago it started (zero when its start time cannot be read).
    pub fn running_for(&self) -> std::time::Duration {
        self.started_at
            .parse::<chrono::DateTime<chrono::Utc>>()
            .ok()
            .and_then(|at| (chrono::Utc::now() - at).to_std().ok())
            .unwrap_or_default()
    }

    /// The unit it runs in, if it is one of kcpshard's units.
    pub fn unit(&self) -> Option<UnitName> {
        self.unit.as_deref().and_then(UnitName::parse)
    }

    pub(super) fn stop_signal(&self) -> Signal {
        self.stop_signal
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or(Signal::SIGTERM)
    }

    pub(super) fn for_spec(spec: &ProcessSpec, pid: u32, start_time: u64, unit: Option<&UnitName>) -> ProcessRecord {
        ProcessRecord {
            pid,
            start_time,
            program: spec.program.clone(),
            args: spec.args.clone(),
            started_at: now_rfc3339(),
            unit: unit.map(|u| u.to_string()),
            log: unit.is_none().then(|| spec.log.clone()),
            stop_signal: (spec.stop_signal != Signal::SIGTERM).then(|| spec.stop_signal.as_str().to_string()),
        }
    }
}

/// How a process ended under [`Runtime::terminate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// From the first signal (or the call, when it had already exited) to its exit.
    pub exited_after: Duration,
    /// The stop signal was not enough within the grace period; SIGKILL was sent.
    pub killed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot open the log {path} for {name}: {source}")]
    Log {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{name} (pid {pid}) vanished before its start time could be read")]
    Vanished { name: String, pid: u32 },
    #[error("cannot write the process record {path}: {source}")]
    WriteRecord { path: PathBuf, source: std::io::Error },
    #[error("cannot read the process record {path}: {source}")]
    ReadRecord { path: PathBuf, source: std::io::Error },
    #[error("the process record {path} is not valid JSON: {source}")]
    ParseRecord { path: PathBuf, source: serde_json::Error },
    #[error("cannot send {signal} to pid {pid}: {source}")]
    Signal {
        pid: u32,
        signal: Signal,
        source: nix::Error,
    },
    #[error("pid {pid} still runs {waited:?} after SIGKILL")]
    Unkillable { pid: u32, waited: Duration },
    #[error(
        "cannot reach the systemd manager through the bus at {socket}: {message}; for a user other than root, turn lingering on (`loginctl enable-linger USER`) and install dbus-user-session (docs/how-to/install.md, Install as a service), or pass --runtime process"
    )]
    Manager { socket: PathBuf, message: String },
    #[error("systemd refused {what} of {unit}: {message}")]
    Unit {
        what: &'static str,
        unit: String,
        message: String,
    },
    #[error("{unit} did not start: {message}{}", if log.is_empty() { String::new() } else { format!("; it printed:\n{}", log.join("\n")) })]
    UnitFailed {
        unit: String,
        message: String,
        log: Vec<String>,
    },
}

pub(super) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
