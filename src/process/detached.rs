//! The detached back end: each process in its own session (`setsid`), stdin from /dev/null (or
//! the listening socket it is handed), stdout and stderr appended to its log file.
//!
//! The runtime keeps the `Child` of every process it started and reaps it, so no zombie remains
//! while `serve` lives. Processes adopted from an earlier `serve` are reaped by init (or whoever
//! inherits them); a zombie counts as not running.
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{ProcessError, ProcessRecord, ProcessSpec, now_rfc3339, procfs};
use crate::fsutil;

/// What the runtime writes to a process's log before each start.
pub const START_MARKER: &str = "--- kcpshard: starting ";

/// What a process of `serve` may inherit from `serve`'s own environment and must not: a child that
/// wrote `READY=1` or `WATCHDOG=1` to `serve`'s notify socket would speak for `serve`'s unit.
const SERVE_ONLY: [&str; 7] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "INVOCATION_ID",
];

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

/// Starts detached processes and reaps them. Clones share the children.
#[derive(Clone, Default)]
pub struct Detached {
    children: Arc<Mutex<Children>>,
}

impl Detached {
    /// Starts `spec` in its own session; the record is the caller's to write.
    pub fn start(&self, spec: &ProcessSpec) -> Result<ProcessRecord, ProcessError> {
        self.reap();
        let log_err = |source| ProcessError::Log {
            name: spec.name.clone(),
            path: spec.log.clone(),
            source,
        };
        let work_dir = spec.work_dir();
        fsutil::create_private_dir(work_dir).map_err(log_err)?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&spec.log)
            .map_err(log_err)?;
        if let Some(user) = &spec.run_as {
            std::os::unix::fs::chown(&spec.log, Some(user.uid), Some(user.gid)).map_err(log_err)?;
        }
        let _ = writeln!(
            log,
            "{START_MARKER}{} at {}: {} {}",
            spec.name,
            now_rfc3339(),
            spec.program.display(),
            spec.args.join(" ")
        );

        let stdin = match &spec.stdin {
            Some(listener) => Stdio::from(super::dup_listener(listener).map_err(|source| ProcessError::Spawn {
                name: spec.name.clone(),
                program: spec.program.clone(),
                source,
            })?),
            None => Stdio::null(),
        };
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args);
        for name in SERVE_ONLY {
            cmd.env_remove(name);
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(work_dir)
            .stdin(stdin)
            .stdout(log.try_clone().map_err(log_err)?)
            .stderr(log);
        if let Some(user) = &spec.run_as {
            cmd.uid(user.uid).gid(user.gid).env_remove("HOME");
        }
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
        self.lock().running.insert(
            pid,
            Started {
                start_time: stat.start_time,
                child,
            },
        );
        Ok(ProcessRecord::for_spec(spec, pid, stat.start_time, None))
    }

    /// Kills a process this runtime has just started (its record could not be written), and
    /// reaps it.
    pub fn kill_started(&self, pid: u32) {
        let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
        if let Some(mut started) = self.lock().running.remove(&pid) {
            let _ = started.child.wait();
        }
    }

    /// The exit status of a process this runtime started and reaped.
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Children> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The last `lines` lines of a log file (its last 64 KiB at most).
/// What the latest process started with log `path` printed: the file from the runtime's last
/// start line on (at most its last 8 MiB).
pub fn file_since_start(path: &Path) -> String {
    const MAX: u64 = 8 * 1024 * 1024;
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    match text.rfind(START_MARKER) {
        Some(at) => text[at..].to_string(),
        None => text.into_owned(),
    }
}

pub fn file_tail(path: &Path, lines: usize) -> Vec<String> {
    const MAX: u64 = 64 * 1024;
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Runtime, UnitName};
    use super::*;

    fn sleeper(dir: &Path) -> ProcessSpec {
        ProcessSpec::new(
            "sleeper",
            UnitName::other("sleeper"),
            "sleep",
            vec!["30".into()],
            dir.join("sleep.log"),
            dir.join("sleep.json"),
        )
    }

    fn open_files(pid: u32) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|p| p.display().to_string())
            .collect()
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
        let record = runtime.start(&sleeper(dir.path())).await.unwrap();
        let open = open_files(record.pid);
        runtime.terminate(&record, Duration::from_secs(5)).await.unwrap();
        assert!(
            !open.iter().any(|p| p.ends_with("held.lock")),
            "the detached process holds serve's lock file: {open:?}"
        );
    }

    #[tokio::test]
    async fn a_listening_socket_handed_over_is_the_process_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut spec = sleeper(dir.path());
        spec.stdin = Some(Arc::new(listener.try_clone().unwrap()));
        let runtime = Runtime::new();
        let record = runtime.start(&spec).await.unwrap();
        let stdin = std::fs::read_link(format!("/proc/{}/fd/0", record.pid)).unwrap();
        runtime.terminate(&record, Duration::from_secs(5)).await.unwrap();
        assert!(stdin.display().to_string().starts_with("socket:"), "stdin is {stdin:?}");
    }

    #[test]
    fn a_file_tail_is_its_last_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
        assert_eq!(file_tail(&log, 2), ["two", "three"]);
        assert!(file_tail(&dir.path().join("none"), 2).is_empty());
    }
}
