//! The process runtime: starts every long-running process kcpshard runs (slots' kcp, kines, a
//! managed PostgreSQL, the front), records it, finds it again after `serve` restarts, tells
//! whether it runs, signals and stops it, and reads what it printed.
//!
//! Two back ends, chosen once by `serve` ([`RuntimeKind`]):
//! - [`detached`]: a process of its own session (`setsid`), output appended to a log file. For a
//!   shell, CI, containers: anywhere systemd does not supervise `serve`.
//! - [`systemd`]: a transient unit per process ([`units`] names them), started through systemd's
//!   D-Bus API, output in the journal. Units are not in `serve`'s cgroup, so `systemctl restart`
//!   and `systemctl stop` of `serve`'s own unit touch `serve` alone.
//!
//! Invariants, for both:
//! - A process outlives `serve` (SIGKILL included): no parent-death signal, not in `serve`'s
//!   session or cgroup (docs/architecture.md, "State files": everything the controller needs after
//!   a crash is observable).
//! - The record (`pid` + kernel start time, and the unit for a unit) is written atomically (0600)
//!   right after the start; a process whose record cannot be written is stopped, so none runs
//!   unrecorded because of us. One whose record was lost because `serve` died in between is found
//!   again by its argv ([`Runtime::find_by_argument`]), and its unit by its cgroup.
//! - A pid alone never names a process: the pid with the start time from `/proc/<pid>/stat` (field
//!   22) does, so a record never matches a later process that reuses the pid.
//! - What a record says decides how it is stopped, whatever back end `serve` chose now: a unit
//!   through its manager (so that a unit with `Restart=always` is not restarted), a detached
//!   process by signals.
//! - Nothing kcpshard starts inherits `serve`'s descriptors or its notify socket: a child's
//!   `READY=1` must never reach `serve`'s unit.
pub mod detached;
pub mod exits;
pub mod listener;
mod port;
pub mod procfs;
mod spec;
pub mod systemd;
pub mod units;

pub use port::PortReservation;

pub use spec::*;

use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::fsutil;
pub use units::UnitName;

/// Starts, observes and stops kcpshard's processes. Cheap to clone; clones share their state.
#[derive(Clone)]
pub struct Runtime {
    detached: detached::Detached,
    /// Set when new processes start as units.
    systemd: Option<systemd::Systemd>,
}

impl Default for Runtime {
    fn default() -> Runtime {
        Runtime::new()
    }
}

/// How long [`Runtime::terminate`] waits for the kernel after SIGKILL.
const AFTER_SIGKILL: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);
/// How long `serve` waits for the systemd manager to answer at its start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl Runtime {
    /// The detached runtime.
    pub fn new() -> Runtime {
        Runtime {
            detached: detached::Detached::default(),
            systemd: None,
        }
    }

    /// The runtime of `kind`; systemd's connects to the manager that runs this user's units.
    pub async fn of_kind(kind: RuntimeKind) -> Result<Runtime, ProcessError> {
        let mut runtime = Runtime::new();
        if kind == RuntimeKind::Systemd {
            // At boot, a user's manager (and its bus) may come up a moment after serve.
            let deadline = Instant::now() + CONNECT_TIMEOUT;
            let systemd = loop {
                match systemd::Systemd::connect().await {
                    Ok(systemd) => break systemd,
                    Err(e) if Instant::now() < deadline => {
                        tracing::info!(error = %e, "waiting for the systemd manager");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e),
                }
            };
            runtime.systemd = Some(systemd);
        }
        Ok(runtime)
    }

    pub fn kind(&self) -> RuntimeKind {
        match self.systemd {
            Some(_) => RuntimeKind::Systemd,
            None => RuntimeKind::Process,
        }
    }

    /// Starts `spec` and writes its record to `spec.record`. If the record cannot be written, the
    /// process is stopped and the error returned.
    pub async fn start(&self, spec: &ProcessSpec) -> Result<ProcessRecord, ProcessError> {
        let record = match &self.systemd {
            Some(systemd) => systemd.start(spec).await?,
            None => self.detached.start(spec)?,
        };
        if let Err(e) = record.save(&spec.record) {
            // Not recorded means not findable after a restart except by argv: do not leave it.
            match &self.systemd {
                Some(systemd) => systemd.stop_now(&spec.unit).await,
                None => self.detached.kill_started(record.pid),
            }
            return Err(e);
        }
        tracing::info!(name = %spec.name, pid = record.pid, unit = ?record.unit, program = %spec.program.display(), "started process");
        Ok(record)
    }

    /// Starts `spec` beside the running `main`, to take over from it: a front's successor, which
    /// receives `main`'s listening socket. Under systemd it joins `main`'s unit (and announces
    /// itself as its main process once it has taken over), so that the unit's restart policy and
    /// file-descriptor store carry over.
    pub async fn start_successor(
        &self,
        main: &ProcessRecord,
        spec: &ProcessSpec,
    ) -> Result<ProcessRecord, ProcessError> {
        let Some(unit) = main.unit() else {
            return self.start(spec).await;
        };
        let systemd = self.manager_for(&unit).await?;
        let mut joining = spec.clone();
        joining.env.extend(systemd.join_env(&unit));
        let mut record = self.detached.start(&joining)?;
        if let Err(e) = systemd.attach(&unit, record.pid).await {
            self.detached.kill_started(record.pid);
            return Err(e);
        }
        record.unit = Some(unit.to_string());
        if let Err(e) = record.save(&spec.record) {
            self.detached.kill_started(record.pid);
            return Err(e);
        }
        tracing::info!(name = %spec.name, pid = record.pid, %unit, "started a successor in the unit");
        Ok(record)
    }

    /// Reads a record written by [`Runtime::start`]; None when the file does not exist.
    pub fn load(record_path: &Path) -> Result<Option<ProcessRecord>, ProcessError> {
        let bytes = fsutil::read_optional(record_path).map_err(|source| ProcessError::ReadRecord {
            path: record_path.to_path_buf(),
            source,
        })?;
        bytes
            .map(|b| serde_json::from_slice(&b))
            .transpose()
            .map_err(|source| ProcessError::ParseRecord {
                path: record_path.to_path_buf(),
                source,
            })
    }

    /// The recorded process still runs: same pid, same start time, not a zombie. Asks the kernel
    /// only, so it is cheap and never waits.
    pub fn is_running(&self, record: &ProcessRecord) -> bool {
        self.detached.reap();
        match procfs::stat(record.pid) {
            Some(stat) => stat.start_time == record.start_time && !stat.is_dead(),
            None => false,
        }
    }

    /// How the recorded process ended, where known: a detached child this runtime reaped, or a
    /// unit's main process as its manager saw it end (a failed unit stays loaded until it is
    /// started again). None while it runs, and when nobody kept the status.
    pub async fn exit_status(&self, record: &ProcessRecord) -> Option<ExitStatus> {
        if let Some(status) = self.detached.exit_status(record) {
            return Some(status);
        }
        let unit = record.unit()?;
        let systemd = self.manager_for(&unit).await.ok()?;
        systemd.exit_status(&unit, record.pid).await
    }

    /// Sends `signal` to the recorded process (to its process group when it leads one, so helpers
    /// it forked get it too) and returns at once. Nothing is sent when it no longer runs. A unit
    /// whose main process a signal ends may be restarted by its manager (the front's is): stop it
    /// with [`Runtime::terminate`] instead.
    pub fn signal(&self, record: &ProcessRecord, signal: Signal) -> Result<(), ProcessError> {
        if !self.is_running(record) {
            return Ok(());
        }
        let group = procfs::stat(record.pid).is_some_and(|s| s.pgrp == record.pid as i32);
        let target = if group { -(record.pid as i32) } else { record.pid as i32 };
        match kill(Pid::from_raw(target), signal) {
            Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
            Err(source) => Err(ProcessError::Signal {
                pid: record.pid,
                signal,
                source,
            }),
        }
    }

    /// Asks the recorded process to stop and returns: its stop signal (SIGTERM unless recorded
    /// otherwise), or, for the main process of a unit, a stop through its manager, which then
    /// neither restarts it nor keeps a failed unit listed. A reconcile sends this, records when,
    /// and watches for the exit ([`Runtime::kill`] once its grace is over).
    pub async fn send_stop(&self, record: &ProcessRecord) -> Result<(), ProcessError> {
        if !self.is_running(record) {
            return Ok(());
        }
        match self.managing_unit(record).await {
            Some((systemd, unit)) => systemd.stop(&unit).await,
            None => self.signal(record, record.stop_signal()),
        }
    }

    /// SIGKILL to the recorded process: through its unit's manager to every process of the unit,
    /// or to its process group when it leads one (members that outlive their leader included:
    /// Linux does not hand out a pid while a group still uses it).
    pub async fn kill(&self, record: &ProcessRecord) -> Result<(), ProcessError> {
        match self.managing_unit(record).await {
            Some((systemd, unit)) => systemd.kill(&unit, Signal::SIGKILL).await,
            None => self.signal(record, Signal::SIGKILL),
        }
    }

    /// The unit whose main process `record` is, with its manager.
    async fn managing_unit(&self, record: &ProcessRecord) -> Option<(systemd::Systemd, UnitName)> {
        let unit = record.unit()?;
        let systemd = self.manager_for(&unit).await.ok()?;
        (systemd.main_pid(&unit).await == Some(record.pid)).then_some((systemd, unit))
    }

    /// Stops the recorded process and waits for it: [`Runtime::send_stop`], up to `grace` for it
    /// to exit, then [`Runtime::kill`]. A process that is not running (any more) is success at
    /// once. For callers that may wait (the CLI, tests, a cleanup); a reconcile sends the stop and
    /// watches for the exit.
    pub async fn terminate(&self, record: &ProcessRecord, grace: Duration) -> Result<Termination, ProcessError> {
        let begun = Instant::now();
        if !self.is_running(record) {
            return Ok(Termination {
                exited_after: Duration::ZERO,
                killed: false,
            });
        }
        let managed = self.managing_unit(record).await;
        self.send_stop(record).await?;
        let group = procfs::stat(record.pid).is_some_and(|s| s.pgrp == record.pid as i32);
        let deadline = begun + grace;
        let mut killed = false;
        while self.is_running(record) {
            let now = Instant::now();
            if !killed && now >= deadline {
                tracing::warn!(
                    pid = record.pid,
                    ?grace,
                    "process did not stop in time; sending SIGKILL"
                );
                self.kill(record).await?;
                killed = true;
            } else if killed && now >= deadline + AFTER_SIGKILL {
                return Err(ProcessError::Unkillable {
                    pid: record.pid,
                    waited: AFTER_SIGKILL,
                });
            }
            tokio::time::sleep(POLL).await;
        }
        let exited_after = begun.elapsed();
        if group && managed.is_none() {
            // Members of the group that outlived their leader. The group id cannot have been
            // reused: Linux does not hand out a pid while a group still uses it.
            let _ = kill(Pid::from_raw(-(record.pid as i32)), Signal::SIGKILL);
        }
        if let Some((systemd, unit)) = &managed {
            systemd.settled(unit, AFTER_SIGKILL).await;
            systemd.forget(unit).await;
        }
        Ok(Termination { exited_after, killed })
    }

    /// Under systemd, whether unit `unit` runs or is about to (a unit that restarts its process
    /// is `activating` between a crash and the restart). Always false for the detached runtime.
    pub async fn unit_active(&self, unit: &UnitName) -> bool {
        match &self.systemd {
            Some(systemd) => systemd.is_active(unit).await,
            None => false,
        }
    }

    /// Under systemd, stops unit `unit` if it is loaded, and drops its failed state: a unit
    /// that restarts its process has none between a crash and the restart, and would come back.
    /// Nothing for the detached runtime.
    pub async fn stop_unit(&self, unit: &UnitName) {
        if let Some(systemd) = &self.systemd {
            systemd.stop_if_loaded(unit).await;
        }
    }

    /// Under systemd, drops the failed state of unit `unit`, whose processes have exited, once its
    /// manager has taken the exit in (it lags the kernel by milliseconds; at most 1 s is waited):
    /// a unit SIGKILLed during its stop job fails, and a failed unit stays listed and keeps a new
    /// unit of its name from starting. Nothing for the detached runtime.
    pub async fn forget_unit(&self, unit: &UnitName) {
        if let Some(systemd) = &self.systemd {
            systemd.settled(unit, Duration::from_secs(1)).await;
            systemd.forget(unit).await;
        }
    }

    /// The last `lines` lines the recorded process printed (its log file, or its unit's journal),
    /// oldest first; empty when there is nothing to read.
    pub async fn log_tail(&self, record: &ProcessRecord, lines: usize) -> Vec<String> {
        match (record.unit(), &record.log) {
            (Some(unit), _) => systemd::journal_tail(&unit, lines).await,
            (None, Some(log)) => detached::file_tail(log, lines),
            (None, None) => Vec::new(),
        }
    }

    /// What the recorded process has printed since it started (its log file from the runtime's
    /// start line on, or its unit's journal for its pid).
    pub async fn log_since_start(&self, record: &ProcessRecord) -> String {
        match (record.unit(), &record.log) {
            (Some(unit), _) => systemd::journal_of(&unit, record.pid).await,
            (None, Some(log)) => detached::file_since_start(log),
            (None, None) => String::new(),
        }
    }

    /// The last `lines` the recorded process printed, since its start only: not what an earlier
    /// process of the same log printed, nor the runtime's start line (which holds the time).
    pub async fn output_tail(&self, record: &ProcessRecord, lines: usize) -> Vec<String> {
        let output = self.log_since_start(record).await;
        // A log file's output since the start begins with the runtime's start line.
        let printed: Vec<&str> = output
            .lines()
            .skip_while(|line| line.starts_with(detached::START_MARKER))
            .collect();
        printed[printed.len().saturating_sub(lines)..]
            .iter()
            .map(|line| line.to_string())
            .collect()
    }

    /// Where the recorded process's output is: a file, or the journal command that shows it.
    pub fn log_location(record: &ProcessRecord) -> String {
        match (record.unit(), &record.log) {
            (Some(unit), _) => systemd::journal_command(&unit),
            (None, Some(log)) => log.display().to_string(),
            (None, None) => "its log".to_string(),
        }
    }

    /// Pids of the processes (other than this one) whose argv holds `arg` as one whole argument.
    /// Used to find a process whose record was never written or was lost, e.g. by the unique
    /// `--root-directory=<slot root>` of a slot or the `--endpoint=<db>` of a kine.
    pub fn find_by_argument(arg: &str) -> Vec<u32> {
        let me = std::process::id();
        let mut found: Vec<u32> = procfs::pids()
            .into_iter()
            .filter(|pid| *pid != me)
            .filter(|pid| procfs::cmdline(*pid).is_some_and(|argv| argv.iter().any(|a| a == arg)))
            .filter(|pid| procfs::stat(*pid).is_some_and(|s| !s.is_dead()))
            .collect();
        found.sort_unstable();
        found
    }

    /// A record for a running process found by other means ([`Runtime::find_by_argument`], a
    /// front's own answer), so that it can be adopted or stopped. `program` is argv\[0\];
    /// `started_at` is computed from the boot time and the start ticks; the unit is the one whose
    /// cgroup holds it, if it is one of kcpshard's.
    pub fn observe(pid: u32) -> Option<ProcessRecord> {
        let stat = procfs::stat(pid).filter(|s| !s.is_dead())?;
        let mut argv = procfs::cmdline(pid)?;
        if argv.is_empty() {
            return None;
        }
        let program = PathBuf::from(argv.remove(0));
        let started_at = procfs::boot_time()
            .map(|boot| {
                let ticks = procfs::clock_ticks();
                let secs = boot + stat.start_time / ticks;
                let nanos = (stat.start_time % ticks) * (1_000_000_000 / ticks);
                chrono::DateTime::from_timestamp(secs as i64, nanos as u32)
                    .unwrap_or_default()
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            })
            .unwrap_or_default();
        Some(ProcessRecord {
            pid,
            start_time: stat.start_time,
            program,
            args: argv,
            started_at,
            unit: procfs::unit(pid).map(|u| u.to_string()),
            log: None,
            stop_signal: None,
        })
    }

    /// The manager of `unit`'s: the one new processes start under, or (a state dir whose processes
    /// a `serve` of the other runtime started) this user's.
    async fn manager_for(&self, unit: &UnitName) -> Result<systemd::Systemd, ProcessError> {
        match &self.systemd {
            Some(systemd) => Ok(systemd.clone()),
            None => {
                tracing::debug!(%unit, "connecting to systemd for a unit started by an earlier serve");
                systemd::Systemd::connect().await
            }
        }
    }
}

/// A wait status (`waitpid(2)`) from what systemd reports for a main process: `code` is CLD_EXITED
/// (1), CLD_KILLED (2) or CLD_DUMPED (3), `status` the exit code or signal.
fn wait_status(code: i32, status: i32) -> Option<ExitStatus> {
    match code {
        1 => Some(ExitStatus::from_raw((status & 0xff) << 8)),
        2 => Some(ExitStatus::from_raw(status & 0x7f)),
        3 => Some(ExitStatus::from_raw((status & 0x7f) | 0x80)),
        _ => None,
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago: bind port 0, read it, release it. Another
/// program may take it before ours binds it; the caller records the port and retries on a bind
/// failure.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A duplicate of `listener` for a child's stdin.
fn dup_listener(listener: &TcpListener) -> std::io::Result<OwnedFd> {
    Ok(listener.try_clone()?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_camel_case_fields() {
        let r = ProcessRecord {
            pid: 7,
            start_time: 42,
            program: "/bin/kcp".into(),
            args: vec!["start".into()],
            started_at: "2026-11-29T17:00:00.000Z".into(),
            unit: Some("kcpshard-dev-slot-a.service".into()),
            log: None,
            stop_signal: Some("SIGINT".into()),
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["startTime"], 42);
        assert_eq!(json["startedAt"], "2026-11-29T17:00:00.000Z");
        assert_eq!(json["unit"], "kcpshard-dev-slot-a.service");
        assert_eq!(serde_json::from_value::<ProcessRecord>(json).unwrap(), r);
        assert_eq!(r.stop_signal(), Signal::SIGINT);
        assert_eq!(r.unit(), Some(UnitName::slot("dev", "a")));
    }

    #[test]
    fn a_record_of_an_earlier_release_reads_as_a_detached_process_stopped_by_sigterm() {
        let old = r#"{"pid":7,"startTime":42,"program":"/bin/kine","args":[],"startedAt":"2026-11-29T17:00:00.000Z"}"#;
        let r: ProcessRecord = serde_json::from_str(old).unwrap();
        assert_eq!((r.unit(), r.stop_signal()), (None, Signal::SIGTERM));
    }

    #[tokio::test]
    async fn a_process_output_is_what_it_printed_since_its_start_without_the_start_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("job.log");
        std::fs::write(
            &log,
            format!(
                "{m}pg_dump at 2026-12-07T07:20:38.177Z: /usr/bin/pg_dump --dbname=kcp\n\
                 pg_dump: error: connection refused\n\
                 {m}pg_dump at 2026-12-07T07:20:40.504Z: /usr/bin/pg_dump --dbname=kcp\n\
                 pg_dump: error: server closed the connection\n\
                 pg_dump: detail: it was shutting down\n",
                m = detached::START_MARKER
            ),
        )
        .unwrap();
        let record = ProcessRecord {
            pid: 7,
            start_time: 42,
            program: "/usr/bin/pg_dump".into(),
            args: vec![],
            started_at: "2026-12-07T07:20:40.504Z".into(),
            unit: None,
            log: Some(log),
            stop_signal: None,
        };
        let runtime = Runtime::new();
        assert_eq!(
            runtime.output_tail(&record, 10).await,
            [
                "pg_dump: error: server closed the connection",
                "pg_dump: detail: it was shutting down"
            ]
        );
        assert_eq!(
            runtime.output_tail(&record, 1).await,
            ["pg_dump: detail: it was shutting down"]
        );
    }

    #[test]
    fn systemd_exit_codes_become_wait_statuses() {
        assert_eq!(wait_status(1, 3).and_then(|s| s.code()), Some(3));
        assert_eq!(wait_status(2, 9).and_then(|s| s.signal()), Some(9));
        assert_eq!(wait_status(3, 6).and_then(|s| s.signal()), Some(6));
        assert!(wait_status(3, 6).is_some_and(|s| s.core_dumped()));
        assert_eq!(wait_status(0, 0), None);
    }

    #[test]
    fn free_ports_are_bindable() {
        let port = free_port().unwrap();
        assert!(port > 0);
        TcpListener::bind(("127.0.0.1", port)).unwrap();
    }

    #[test]
    fn we_observe_ourselves() {
        let me = Runtime::observe(std::process::id()).unwrap();
        assert_eq!(me.start_time, procfs::stat(std::process::id()).unwrap().start_time);
        assert!(me.started_at.ends_with('Z'));
    }
}
