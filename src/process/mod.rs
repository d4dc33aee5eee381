//! The process runtime: starts slot and store processes detached from `serve`, records them, finds
//! them again after `serve` restarts, and stops them.
//!
//! Invariants:
//! - A started process runs in its own session (`setsid`), so a signal to `serve`'s process group
//!   or terminal, or `serve`'s death (SIGKILL included), does not reach it. No parent-death
//!   signal is set: slots outlive the controller by design (docs/architecture.md, "State files": everything
//!   the controller needs after a crash is observable).
//! - The record (`pid` + kernel start time) is written atomically (0600) right after the spawn; a
//!   process whose record cannot be written is killed, so no slot runs unrecorded because of us.
//!   A process whose record was lost because `serve` died between spawn and write is found again by
//!   its argv ([`Runtime::find_by_argument`]).
//! - A pid alone never names a process: the pid with the start time from `/proc/<pid>/stat` (field
//!   22) does, so a record never matches a later process that reuses the pid.
//! - The runtime keeps the `Child` of every process it started and reaps it, so no zombie remains
//!   while `serve` lives. Processes adopted from an earlier `serve` are reaped by init (or whoever
//!   inherits them); a zombie counts as not running.
pub mod exits;
pub mod procfs;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::fsutil;

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// A name for logs and errors (`slot-a`, `kine`).
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Added to (or overriding) the environment `serve` runs with.
    pub env: Vec<(String, String)>,
    /// stdout and stderr are appended here (0600). The process's working directory is this file's
    /// directory.
    pub log: PathBuf,
    /// Where the [`ProcessRecord`] is written (atomically, 0600).
    pub record: PathBuf,
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
}

/// How a process ended under [`Runtime::terminate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// From the first signal (or the call, when it had already exited) to its exit.
    pub exited_after: Duration,
    /// SIGTERM was not enough within the grace period; SIGKILL was sent.
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
}

struct Started {
    start_time: u64,
    child: Child,
}

#[derive(Default)]
struct Children {
    running: HashMap<u32, Started>,
    /// Exit statuses of reaped children, by (pid, start time).
    exited: HashMap<(u32, u64), ExitStatus>,
}

/// Starts, observes and stops detached processes. Cheap to clone; clones share the children.
#[derive(Clone, Default)]
pub struct Runtime {
    children: Arc<Mutex<Children>>,
}

/// How long [`Runtime::terminate`] waits for the kernel after SIGKILL.
const AFTER_SIGKILL: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

impl Runtime {
    pub fn new() -> Runtime {
        Runtime::default()
    }

    /// Starts `spec` in its own session with stdin from /dev/null and stdout and stderr appended to
    /// `spec.log`, then writes its record to `spec.record`. If the record cannot be written, the
    /// process is killed and the error returned.
    pub fn start(&self, spec: &ProcessSpec) -> Result<ProcessRecord, ProcessError> {
        self.reap();
        let log_err = |source| ProcessError::Log {
            name: spec.name.clone(),
            path: spec.log.clone(),
            source,
        };
        let log_dir = spec
            .log
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fsutil::create_private_dir(log_dir).map_err(log_err)?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&spec.log)
            .map_err(log_err)?;
        let _ = writeln!(
            log,
            "--- kcpshard: starting {} at {}: {} {}",
            spec.name,
            now_rfc3339(),
            spec.program.display(),
            spec.args.join(" ")
        );

        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(log_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(log_err)?)
            .stderr(log);
        // SAFETY: setsid(2) and close_range(2) are async-signal-safe and touch no memory of the
        // parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                // What serve inherited from its parent (a lock file held for its whole run, a
                // socket) must not stay open in a process that outlives serve: every descriptor
                // above stderr closes at exec. Marked, not closed: spawn's own error pipe is needed
                // until then. A kernel without close_range (before 5.11) keeps the old behaviour.
                libc::close_range(3, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_int);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source,
        })?;
        let pid = child.id();
        // Unreaped, the child's /proc entry exists even if it already exited.
        let Some(stat) = procfs::stat(pid) else {
            return Err(ProcessError::Vanished {
                name: spec.name.clone(),
                pid,
            });
        };
        let record = ProcessRecord {
            pid,
            start_time: stat.start_time,
            program: spec.program.clone(),
            args: spec.args.clone(),
            started_at: now_rfc3339(),
        };
        self.lock().running.insert(
            pid,
            Started {
                start_time: stat.start_time,
                child,
            },
        );
        if let Err(e) = record.save(&spec.record) {
            // Not recorded means not findable after a restart except by argv: do not leave it.
            let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
            if let Some(mut started) = self.lock().running.remove(&pid) {
                let _ = started.child.wait();
            }
            return Err(e);
        }
        tracing::info!(name = %spec.name, pid, program = %spec.program.display(), "started process");
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

    /// The recorded process still runs: same pid, same start time, not a zombie.
    pub fn is_running(&self, record: &ProcessRecord) -> bool {
        self.reap();
        match procfs::stat(record.pid) {
            Some(stat) => stat.start_time == record.start_time && !stat.is_dead(),
            None => false,
        }
    }

    /// The exit status of a process this runtime started and reaped (for crash reports). None if it
    /// runs, was not started by this runtime, or was reaped by someone else.
    pub fn exit_status(&self, record: &ProcessRecord) -> Option<ExitStatus> {
        self.reap();
        self.lock().exited.get(&(record.pid, record.start_time)).copied()
    }

    /// Reaps every child of this runtime that has exited.
    pub fn reap(&self) {
        let mut children = self.lock();
        let mut done = Vec::new();
        for (pid, started) in children.running.iter_mut() {
            match started.child.try_wait() {
                Ok(Some(status)) => done.push((*pid, started.start_time, Some(status))),
                Ok(None) => {}
                // ECHILD: someone else reaped it; nothing left to wait for.
                Err(_) => done.push((*pid, started.start_time, None)),
            }
        }
        for (pid, start_time, status) in done {
            children.running.remove(&pid);
            if let Some(status) = status {
                tracing::info!(pid, code = ?status.code(), signal = ?status.signal(), "process exited");
                children.exited.insert((pid, start_time), status);
            }
        }
    }

    /// Reaps exited children every `every` in a background task, so that a slot that crashes
    /// while nobody asks about it does not stay a zombie. Needs a tokio runtime; the task ends
    /// when the handle is aborted.
    pub fn spawn_reaper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let runtime = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                runtime.reap();
            }
        })
    }

    /// Sends `signal` to the recorded process (its group, when it leads one) and returns at once:
    /// what follows is observed. Ok(false) when it does not run (any more).
    pub fn send(&self, record: &ProcessRecord, signal: Signal) -> Result<bool, ProcessError> {
        if !self.is_running(record) {
            return Ok(false);
        }
        let group = procfs::stat(record.pid).is_some_and(|s| s.pgrp == record.pid as i32);
        self.signal(record, group, signal)?;
        Ok(true)
    }

    /// The last `lines` lines the process printed (its log since its start), for crash reports.
    pub fn log_tail(log: &Path, lines: usize) -> Vec<String> {
        let Ok(bytes) = std::fs::read(log) else {
            return vec![];
        };
        let text = String::from_utf8_lossy(&bytes);
        let since_start = text
            .rfind("--- kcpshard: starting ")
            .map_or(&text[..], |at| &text[at..]);
        let all: Vec<&str> = since_start.lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
        all[all.len().saturating_sub(lines)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    }

    /// Stops the recorded process: SIGTERM, up to `grace` for it to exit, then SIGKILL. Signals go to
    /// the process group when the process leads one (it does when this runtime started it), so
    /// helpers it forked go too. A process that is not running (any more) is success at once.
    pub async fn terminate(&self, record: &ProcessRecord, grace: Duration) -> Result<Termination, ProcessError> {
        let begun = Instant::now();
        if !self.is_running(record) {
            return Ok(Termination {
                exited_after: Duration::ZERO,
                killed: false,
            });
        }
        let group = procfs::stat(record.pid).is_some_and(|s| s.pgrp == record.pid as i32);
        self.signal(record, group, Signal::SIGTERM)?;
        let deadline = begun + grace;
        let mut killed = false;
        loop {
            if !self.is_running(record) {
                break;
            }
            let now = Instant::now();
            if !killed && now >= deadline {
                tracing::warn!(pid = record.pid, ?grace, "process ignored SIGTERM; sending SIGKILL");
                self.signal(record, group, Signal::SIGKILL)?;
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
        if group {
            // Members of the group that outlived their leader. The group id cannot have been
            // reused: Linux does not hand out a pid while a group still uses it.
            let _ = kill(Pid::from_raw(-(record.pid as i32)), Signal::SIGKILL);
        }
        Ok(Termination { exited_after, killed })
    }

    fn signal(&self, record: &ProcessRecord, group: bool, signal: Signal) -> Result<(), ProcessError> {
        if !self.is_running(record) {
            return Ok(());
        }
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

    /// A record for a running process found by other means ([`Runtime::find_by_argument`]), so that
    /// it can be adopted or stopped. `program` is argv\[0\]; `started_at` is computed from the boot
    /// time and the start ticks.
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
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Children> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago: bind port 0, read it, release it. Another
/// program may take it before ours binds it; the caller records the port and retries on a bind
/// failure.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
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
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["startTime"], 42);
        assert_eq!(json["startedAt"], "2026-11-29T17:00:00.000Z");
        assert_eq!(serde_json::from_value::<ProcessRecord>(json).unwrap(), r);
    }

    #[test]
    fn free_ports_are_bindable() {
        let port = free_port().unwrap();
        assert!(port > 0);
        TcpListener::bind(("127.0.0.1", port)).unwrap();
    }

    #[tokio::test]
    async fn a_started_process_does_not_inherit_descriptors_of_serve() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        // As `flock FILE kcpshard serve` hands serve its lock: open, and inherited across exec.
        let held = std::fs::File::create(dir.path().join("held.lock")).unwrap();
        // SAFETY: fcntl(2) on a descriptor this test owns.
        unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETFD, 0) };
        let runtime = Runtime::new();
        let record = runtime
            .start(&ProcessSpec {
                name: "sleeper".into(),
                program: "sleep".into(),
                args: vec!["30".into()],
                env: vec![],
                log: dir.path().join("sleep.log"),
                record: dir.path().join("sleep.json"),
            })
            .unwrap();
        let open: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", record.pid))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|p| p.display().to_string())
            .collect();
        runtime.terminate(&record, Duration::from_secs(5)).await.unwrap();
        assert!(
            !open.iter().any(|p| p.ends_with("held.lock")),
            "the detached process holds serve's lock file: {open:?}"
        );
    }

    #[test]
    fn we_observe_ourselves() {
        let me = Runtime::observe(std::process::id()).unwrap();
        assert_eq!(me.start_time, procfs::stat(std::process::id()).unwrap().start_time);
        assert!(me.started_at.ends_with('Z'));
    }
}
