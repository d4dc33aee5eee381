//! The systemd back end: every process a transient service unit of its own, started with the
//! manager's `StartTransientUnit` over D-Bus, output in the journal.
//!
//! Which manager: the one that runs this user's units. For root, the system manager; for any
//! other user (the shipped unit runs `serve` as `kcpshard`), that user's own manager, kept running
//! at boot by `loginctl enable-linger`. systemd 252 asks polkit whether a non-root caller may start
//! a transient unit on the system manager without saying which unit, so a rule that lets `serve`
//! start its own units would let every process of that user (every kcp) start any unit as root;
//! the user's own manager can only run processes as that user. The system manager is reached on
//! the system bus, a user's on that user's bus (`$XDG_RUNTIME_DIR/bus`, Debian's package
//! dbus-user-session): their private sockets speak a D-Bus dialect (a well-known name as the
//! sender) that zbus refuses.
//!
//! Units are transient (gone once stopped), not bound to `serve` (not in its cgroup, so
//! `systemctl restart kcpshard` leaves them running), and named by [`super::units`]. A failed unit
//! stays listed with its main process's exit status until it is started again or stopped, so
//! `systemctl --failed` shows a crashed slot.
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use zbus::proxy::CacheProperties;
use zbus::{OwnedVariant, Variant};
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};

use super::{ProcessError, ProcessRecord, ProcessSpec, Restart, UnitName, procfs};

/// How long a unit may take from its start job to a main process.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the manager gives a unit stopped by hand (`systemctl stop`) before SIGKILL;
/// kcpshard's own stops escalate at their own grace.
const STOP_TIMEOUT_USEC: u64 = 10 * 60 * 1_000_000;
/// How long a start waits for an ended unit of the same name to be unloaded.
const UNLOAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Up to this many descriptors in a unit's store (the front keeps one: its listening socket).
const FD_STORE_MAX: u32 = 4;

/// Which manager runs the units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    System,
    /// The manager of this (non-root) user.
    User,
}

/// A connection to the manager that runs this user's units.
#[derive(Clone)]
pub struct Systemd {
    connection: zbus::Connection,
    scope: Scope,
    /// The manager's runtime dir (`/run/systemd`, `/run/user/<uid>/systemd`).
    dir: PathBuf,
}

impl Systemd {
    /// Connects to this user's manager through the system bus (root) or this user's bus.
    pub async fn connect() -> Result<Systemd, ProcessError> {
        let (scope, dir, socket) = if nix::unistd::geteuid().is_root() {
            (
                Scope::System,
                PathBuf::from("/run/systemd"),
                PathBuf::from("/run/dbus/system_bus_socket"),
            )
        } else {
            let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", nix::unistd::geteuid())));
            (Scope::User, runtime_dir.join("systemd"), runtime_dir.join("bus"))
        };
        let failed = |message: String| ProcessError::Manager {
            socket: socket.clone(),
            message,
        };
        let address = format!("unix:path={}", socket.display());
        let connection = zbus::connection::Builder::address(address.as_str())
            .build()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let systemd = Systemd { connection, scope, dir };
        let version = systemd
            .manager()
            .await
            .map_err(|e| failed(e.to_string()))?
            .version()
            .await
            .map_err(|e| failed(e.to_string()))?;
        tracing::info!(socket = %socket.display(), %version, "processes start as systemd units");
        Ok(systemd)
    }

    async fn manager(&self) -> zbus::Result<ManagerProxy<'static>> {
        ManagerProxy::builder(&self.connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    async fn unit_path(&self, unit: &UnitName) -> Option<zbus::OwnedObjectPath> {
        self.manager().await.ok()?.get_unit(unit.to_string()).await.ok()
    }

    async fn unit(&self, path: &zbus::OwnedObjectPath) -> zbus::Result<UnitProxy<'static>> {
        UnitProxy::builder(&self.connection)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    async fn service(&self, path: &zbus::OwnedObjectPath) -> zbus::Result<ServiceProxy<'static>> {
        ServiceProxy::builder(&self.connection)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    /// Starts `spec` as a transient unit and waits (briefly) for its main process; the record is
    /// the caller's to write.
    pub async fn start(&self, spec: &ProcessSpec) -> Result<ProcessRecord, ProcessError> {
        let name = spec.unit.to_string();
        let refused = |what: &'static str| {
            let unit = name.clone();
            move |e: zbus::Error| ProcessError::Unit {
                what,
                unit: unit.clone(),
                message: e.to_string(),
            }
        };
        let program = resolve(&spec.program).map_err(|source| ProcessError::Spawn {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source,
        })?;
        let log_err = |source| ProcessError::Log {
            name: spec.name.clone(),
            path: spec.log.clone(),
            source,
        };
        crate::fsutil::create_private_dir(spec.work_dir()).map_err(log_err)?;
        if let Some(path) = self.unit_path(&spec.unit).await {
            let state = self.unit(&path).await.map_err(refused("a look"))?.active_state().await;
            if let Ok(state @ ("active" | "activating" | "deactivating" | "reloading")) = state.as_deref() {
                return Err(ProcessError::Unit {
                    what: "a start",
                    unit: name,
                    message: format!("it is {state} already: stop it first"),
                });
            }
        }
        let manager = self.manager().await.map_err(refused("a start"))?;
        // A failed unit of this name stays loaded (with its exit status) until reset.
        let _ = manager.reset_failed_unit(name.clone()).await;
        let env_file = match spec.env.is_empty() {
            true => None,
            false => Some(write_env_file(spec)?),
        };
        let properties = unit_properties(spec, &program, env_file.as_deref(), self.scope)?;
        // A unit of this name that just ended (or was reset) is unloaded by the manager a moment
        // later; until then a transient unit of the same name "already exists".
        let deadline = Instant::now() + UNLOAD_TIMEOUT;
        loop {
            let started = manager
                .start_transient_unit(name.clone(), "fail".into(), properties.clone(), vec![])
                .await;
            match started {
                Ok(_) => break,
                Err(e) if e.to_string().contains("already exists") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(refused("a start")(e)),
            }
        }
        let pid = self.wait_for_main_pid(spec).await?;
        // The start time is the fork's, the same before and after exec.
        let stat = procfs::stat(pid).ok_or_else(|| ProcessError::Vanished {
            name: spec.name.clone(),
            pid,
        })?;
        Ok(ProcessRecord::for_spec(spec, pid, stat.start_time, Some(&spec.unit)))
    }

    /// The main pid once the unit has one (and, for `Type=exec`, has run its program).
    async fn wait_for_main_pid(&self, spec: &ProcessSpec) -> Result<u32, ProcessError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let unit = spec.unit.to_string();
        let mut last = String::from("no start job yet");
        while Instant::now() < deadline {
            if let Some(path) = self.unit_path(&spec.unit).await
                && let (Ok(unit_proxy), Ok(service)) = (self.unit(&path).await, self.service(&path).await)
            {
                let state = unit_proxy.active_state().await.unwrap_or_default();
                let pid = service.main_pid().await.unwrap_or(0);
                // A new transient unit is "inactive (success)" until the manager runs its queued
                // start job: only one with no job left has ended.
                let job_queued = unit_proxy.job().await.is_ok_and(|(id, _)| id != 0);
                match state.as_str() {
                    "failed" | "inactive" if pid == 0 && !job_queued => {
                        let result = service.result().await.unwrap_or_default();
                        return Err(ProcessError::UnitFailed {
                            message: format!("it is {state} ({result})"),
                            log: journal_tail(&spec.unit, 15).await,
                            unit,
                        });
                    }
                    "active" | "reloading" if pid != 0 => return Ok(pid),
                    "activating" if pid != 0 && spec.notify => return Ok(pid),
                    _ => last = format!("it is {state}, main pid {pid}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(ProcessError::UnitFailed {
            message: format!("no main process within {START_TIMEOUT:?} ({last})"),
            log: journal_tail(&spec.unit, 15).await,
            unit,
        })
    }

    /// The unit's main pid now, if it has one.
    pub async fn main_pid(&self, unit: &UnitName) -> Option<u32> {
        let path = self.unit_path(unit).await?;
        let pid = self.service(&path).await.ok()?.main_pid().await.ok()?;
        (pid != 0).then_some(pid)
    }

    /// How `pid`, the unit's last main process, ended, if the manager still knows.
    pub async fn exit_status(&self, unit: &UnitName, pid: u32) -> Option<ExitStatus> {
        let service = self.service(&self.unit_path(unit).await?).await.ok()?;
        if service.exec_main_pid().await.ok()? != pid {
            return None;
        }
        super::wait_status(
            service.exec_main_code().await.ok()?,
            service.exec_main_status().await.ok()?,
        )
    }

    /// Asks the manager to stop the unit (its stop signal, no restart) and returns at once.
    pub async fn stop(&self, unit: &UnitName) -> Result<(), ProcessError> {
        let manager = self.manager().await.map_err(|e| refused("a stop", unit, e))?;
        manager
            .stop_unit(unit.to_string(), "replace".into())
            .await
            .map(|_| ())
            .map_err(|e| refused("a stop", unit, e))
    }

    /// Sends `signal` to every process of the unit.
    pub async fn kill(&self, unit: &UnitName, signal: Signal) -> Result<(), ProcessError> {
        let manager = self.manager().await.map_err(|e| refused("a kill", unit, e))?;
        manager
            .kill_unit(unit.to_string(), "all".into(), signal as i32)
            .await
            .map_err(|e| refused("a kill", unit, e))
    }

    /// Stops a unit whose start could not be recorded; errors are only logged.
    pub async fn stop_now(&self, unit: &UnitName) {
        if let Err(e) = self.kill(unit, Signal::SIGKILL).await {
            tracing::warn!(%unit, error = %e, "cannot kill a unit whose record was not written");
        }
        self.forget(unit).await;
    }

    /// The unit runs, or is starting (or restarting) its process.
    pub async fn is_active(&self, unit: &UnitName) -> bool {
        let Some(path) = self.unit_path(unit).await else {
            return false;
        };
        let Ok(proxy) = self.unit(&path).await else {
            return false;
        };
        matches!(
            proxy.active_state().await.as_deref(),
            Ok("active" | "activating" | "reloading")
        )
    }

    /// Stops the unit if it is loaded and not inactive; errors are only logged.
    pub async fn stop_if_loaded(&self, unit: &UnitName) {
        let Some(path) = self.unit_path(unit).await else {
            return;
        };
        let state = match self.unit(&path).await {
            Ok(proxy) => proxy.active_state().await.unwrap_or_default(),
            Err(_) => return,
        };
        if state != "inactive"
            && state != "failed"
            && let Err(e) = self.stop(unit).await
        {
            tracing::warn!(%unit, error = %e, "cannot stop the unit");
        }
        self.forget(unit).await;
    }

    /// Waits, at most `bound`, until the manager has taken in the exit of the unit's main process:
    /// the unit is inactive, failed or gone. The kernel reports the exit before the manager
    /// records it (SIGCHLD), and a failed state recorded after [`Systemd::forget`] keeps the unit
    /// listed (a unit SIGKILLed during its stop job fails).
    pub async fn settled(&self, unit: &UnitName, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while tokio::time::Instant::now() < deadline {
            let Some(path) = self.unit_path(unit).await else {
                return;
            };
            match self.unit(&path).await {
                Ok(proxy) => {
                    if matches!(
                        proxy.active_state().await.as_deref(),
                        Ok("inactive" | "failed") | Err(_)
                    ) {
                        return;
                    }
                }
                Err(_) => return,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drops a stopped unit's failed state, so that it is no longer listed.
    pub async fn forget(&self, unit: &UnitName) {
        if let Ok(manager) = self.manager().await {
            let _ = manager.reset_failed_unit(unit.to_string()).await;
        }
    }

    /// Moves `pid` into the unit's cgroup.
    pub async fn attach(&self, unit: &UnitName, pid: u32) -> Result<(), ProcessError> {
        let manager = self.manager().await.map_err(|e| refused("an attach", unit, e))?;
        manager
            .attach_processes_to_unit(unit.to_string(), String::new(), vec![pid])
            .await
            .map_err(|e| refused("an attach", unit, e))
    }

    /// The environment a process started outside the unit needs to speak for it once it runs
    /// inside ([`super::Runtime::start_successor`]): the manager's notify socket, and the unit's
    /// name, so that it waits until it is in the unit's cgroup before it says `MAINPID=`.
    pub fn join_env(&self, unit: &UnitName) -> Vec<(String, String)> {
        vec![
            ("NOTIFY_SOCKET".into(), self.dir.join("notify").display().to_string()),
            (JOINING_UNIT_ENV.into(), unit.to_string()),
        ]
    }
}

/// The transient unit's properties for `spec` (`program` resolved), as `StartTransientUnit` takes
/// them.
fn unit_properties(
    spec: &ProcessSpec,
    program: &Path,
    env_file: Option<&Path>,
    scope: Scope,
) -> Result<Vec<(String, OwnedVariant)>, ProcessError> {
    let mut argv = vec![program.display().to_string()];
    argv.extend(spec.args.iter().cloned());
    let mut properties: Vec<(&str, Variant<'static>)> = vec![
        (
            "Description",
            Variant::new(format!("kcpshard {} ({})", spec.name, program.display())),
        ),
        (
            "ExecStart",
            Variant::new(vec![(program.display().to_string(), argv, false)]),
        ),
        ("WorkingDirectory", Variant::new(spec.work_dir().display().to_string())),
        ("Type", Variant::new(if spec.notify { "notify" } else { "exec" })),
        ("KillSignal", Variant::new(spec.stop_signal as i32)),
        ("TimeoutStopUSec", Variant::new(STOP_TIMEOUT_USEC)),
        (
            "Restart",
            Variant::new(match spec.restart {
                Restart::Never => "no",
                Restart::Always => "always",
            }),
        ),
    ];
    if spec.keep_exit_status {
        properties.push(("RemainAfterExit", Variant::new(true)));
    }
    if let Some(file) = env_file {
        properties.push((
            "EnvironmentFiles",
            Variant::new(vec![(file.display().to_string(), false)]),
        ));
    }
    if spec.notify {
        // A successor started beside the main process (a front's upgrade) reports as it;
        // a user's manager moves a process into a unit only when the unit is delegated.
        properties.push(("NotifyAccess", Variant::new("all")));
        properties.push(("Delegate", Variant::new(true)));
        properties.push(("FileDescriptorStoreMax", Variant::new(FD_STORE_MAX)));
    }
    if let Some(listener) = &spec.stdin {
        let fd: OwnedFd = super::dup_listener(listener).map_err(|source| ProcessError::Spawn {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source,
        })?;
        properties.push(("StandardInputFileDescriptor", Variant::Fd(zbus::Fd::from(fd))));
        properties.push(("StandardOutput", Variant::new("journal")));
        properties.push(("StandardError", Variant::new("journal")));
    }
    if let Some(user) = &spec.run_as
        && scope == Scope::System
    {
        properties.push(("User", Variant::new(user.user.clone())));
    }
    properties
        .into_iter()
        .map(|(key, value)| {
            OwnedVariant::try_from(value)
                .map(|v| (key.to_string(), v))
                .map_err(|e| ProcessError::Unit {
                    what: "a start",
                    unit: spec.unit.to_string(),
                    message: e.to_string(),
                })
        })
        .collect()
}

/// Names the unit a successor joins (see [`Systemd::join_env`]).
pub const JOINING_UNIT_ENV: &str = "KCPSHARD_JOINING_UNIT";

fn refused(what: &'static str, unit: &UnitName, e: zbus::Error) -> ProcessError {
    ProcessError::Unit {
        what,
        unit: unit.to_string(),
        message: e.to_string(),
    }
}

/// The journal field that names a unit of this user's manager.
fn journal_field() -> &'static str {
    if nix::unistd::geteuid().is_root() {
        "_SYSTEMD_UNIT"
    } else {
        "_SYSTEMD_USER_UNIT"
    }
}

/// The command that shows the unit's output.
pub fn journal_command(unit: &UnitName) -> String {
    format!("journalctl {}={unit}", journal_field())
}

/// What the unit's process `pid` printed, oldest first (empty if the journal cannot be read).
pub async fn journal_of(unit: &UnitName, pid: u32) -> String {
    let output = tokio::process::Command::new("journalctl")
        .args(["--no-pager", "--quiet", "--output=cat"])
        .arg(format!("{}={unit}", journal_field()))
        .arg(format!("_PID={pid}"))
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    }
}

/// The last `lines` lines the unit's processes printed, oldest first (empty if the journal
/// cannot be read: serve's unit is in group systemd-journal so that it can).
pub async fn journal_tail(unit: &UnitName, lines: usize) -> Vec<String> {
    let output = tokio::process::Command::new("journalctl")
        .args(["--no-pager", "--quiet", "--output=cat", "--lines"])
        .arg(lines.to_string())
        .arg(format!("{}={unit}", journal_field()))
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
        Ok(out) => {
            tracing::debug!(%unit, stderr = %String::from_utf8_lossy(&out.stderr), "cannot read the journal");
            Vec::new()
        }
        Err(e) => {
            tracing::debug!(%unit, error = %e, "cannot run journalctl");
            Vec::new()
        }
    }
}

/// An absolute path to `program` (a bare name is looked up on PATH, as exec would), which must be
/// an executable file: a unit's start would fail later and less clearly.
fn resolve(program: &Path) -> std::io::Result<PathBuf> {
    let found = which::which(program)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::NotFound, "no such executable file"))?;
    std::path::absolute(found)
}

/// Writes `spec.env` (0600) beside its record for `EnvironmentFile=`: a secret in `Environment=`
/// would be in the unit's properties, which the system manager shows to every local user.
fn write_env_file(spec: &ProcessSpec) -> Result<PathBuf, ProcessError> {
    let path = spec.record.with_extension("env");
    let mut text = String::new();
    for (key, value) in &spec.env {
        if value.contains(['\n', '\r']) {
            return Err(ProcessError::Spawn {
                name: spec.name.clone(),
                program: spec.program.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "the environment variable {key} holds a line break, which a unit's environment file cannot"
                    ),
                ),
            });
        }
        let mut quoted = String::with_capacity(value.len() + 2);
        for c in value.chars() {
            if matches!(c, '\\' | '"' | '$' | '`') {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        text.push_str(&format!("{key}=\"{quoted}\"\n"));
    }
    crate::fsutil::write_atomically(&path, text.as_bytes()).map_err(|source| ProcessError::WriteRecord {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests;
