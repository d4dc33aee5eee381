//! Starting, adopting, upgrading and stopping a front from the controller's side.
//!
//! A front is a process of its own, started through the process runtime like every process
//! kcpshard runs: detached (its own session, output appended to `DIR/front.log`) or as the unit
//! `kcpshard-<shard>-front.service`, which systemd restarts at once when it exits and which keeps
//! the listening socket in its file-descriptor store, so that a crashed front comes back on the
//! same socket without a connection refused (the kernel queues them meanwhile). Under systemd,
//! `serve` binds the listening socket and hands it to the unit (its stdin): `serve` may bind
//! ports below 1024, a unit of an unprivileged user's manager may not.
//!
//! `DIR/process.json` is the runtime's record of the last front started; `DIR/front.pid.json`
//! is the front's own (its pid and start time, field 22 of `/proc/<pid>/stat`): a pid that now
//! names another process is never signalled.
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::front::client::FrontClient;
use crate::front::error::FrontError;
use crate::front::protocol::{CONTROL_SOCKET, ERROR_FILE, FrontStatus, LOG_FILE, PID_FILE, PidRecord, StartError};
use crate::fsutil;
use crate::process::{ProcessError, ProcessRecord, ProcessSpec, Restart, Runtime, RuntimeKind, UnitName, procfs};

/// How long a starting front has to answer on its control socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `stop` waits after SIGTERM (the front drains for up to 30 s by default) before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(40);
const POLL: Duration = Duration::from_millis(50);
/// Names the binary (device and inode) whose upgrade failed, so it is not retried on every call.
pub const UPGRADE_FAILED_FILE: &str = "upgrade.failed";
/// The runtime's record of the last front started for the dir.
pub const PROCESS_FILE: &str = "process.json";
/// The runtime's record of the last successor started for the dir (an upgrade).
pub const SUCCESSOR_FILE: &str = "successor.json";
/// How many lines of a failed front's output an error quotes.
const LOG_TAIL_LINES: usize = 10;

/// One shard's front, as the controller starts it: its binary, its dir and its unit's name.
#[derive(Clone, Copy)]
pub struct FrontLaunch<'a> {
    pub runtime: &'a Runtime,
    /// The shard, which names the front's unit.
    pub shard: &'a str,
    pub binary: &'a Path,
    pub dir: &'a Path,
}

/// Returns a client of the front serving `launch.dir` on `listen`, starting `binary front` if
/// none runs.
///
/// A running front whose control socket answers is adopted when it listens on `listen` (port 0
/// matches any port on the same IP). One that listens elsewhere is stopped and replaced, but only
/// if the new address is free: otherwise it keeps serving and the error says so. One that
/// is alive but does not answer within [`START_TIMEOUT`] is killed and replaced. Under systemd,
/// while the front's unit restarts a front that crashed (active, nothing answers), the answer is
/// [`FrontError::RestartingUnderUnit`]: the unit starts it, on the socket it keeps.
///
/// An adopted front that runs another binary than `binary` (another file, or the same path
/// rebuilt) is upgraded in place with [`upgrade`], without closing its listening socket. If that
/// fails, the old front keeps serving, the failure is logged and written to `DIR/upgrade.failed`,
/// and the same binary is not tried again (a rebuilt or different binary is).
pub async fn ensure_running(launch: FrontLaunch<'_>, listen: SocketAddr) -> Result<FrontClient, FrontError> {
    let dir = launch.dir;
    prepare_dir(dir)?;
    if let Some((client, status)) = answering(dir).await {
        if listen_matches(listen, status.listen) {
            return Ok(adopt(launch, client, &status).await);
        }
        // Never stop a serving front for an address it could not get.
        drop(bind(listen)?);
        info!(dir = %dir.display(), running = %status.listen, wanted = %listen,
            "the front listens on another address; replacing it");
        stop(launch.runtime, launch.shard, dir).await?;
    } else if launch.runtime.unit_active(&UnitName::front(launch.shard)).await {
        // Its unit restarts it (a crash a moment ago), on the socket it keeps: not waited for here.
        return Err(FrontError::RestartingUnderUnit {
            unit: UnitName::front(launch.shard).to_string(),
        });
    } else if let Some(record) = read_pid_record(dir).filter(is_alive) {
        // Alive but silent: still starting (another caller just spawned it), or stuck.
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline && is_alive(&record) {
            if let Some((client, status)) = answering(dir).await {
                if listen_matches(listen, status.listen) {
                    return Ok(client);
                }
                stop(launch.runtime, launch.shard, dir).await?;
                return start(launch, listen, None).await;
            }
            tokio::time::sleep(POLL).await;
        }
        if let Some(stuck) = Runtime::observe(record.pid).filter(|r| r.start_time == record.start_time) {
            warn!(
                pid = record.pid,
                "the recorded front does not answer on its control socket; killing it"
            );
            launch
                .runtime
                .terminate(&stuck, Duration::ZERO)
                .await
                .map_err(process_error)?;
        }
    }
    start(launch, listen, None).await
}

/// Whether the front `pid` serving `dir` runs another binary than `binary` (another file, or the
/// same path rebuilt) that has not failed an upgrade before: [`ensure_running`] would upgrade it.
pub fn runs_other_binary(binary: &Path, dir: &Path, pid: u32) -> bool {
    let (Some(running), Some(wanted)) = (exe_identity(pid), file_identity(binary)) else {
        return false;
    };
    running != wanted && std::fs::read_to_string(dir.join(UPGRADE_FAILED_FILE)).ok() != Some(upgrade_marker(wanted))
}

fn upgrade_marker((dev, ino): (u64, u64)) -> String {
    format!("{dev} {ino}\n")
}

/// The adopted front, upgraded first if it runs another binary than `binary`.
async fn adopt(launch: FrontLaunch<'_>, client: FrontClient, status: &FrontStatus) -> FrontClient {
    if !runs_other_binary(launch.binary, launch.dir, status.pid) {
        return client;
    }
    let Some(wanted) = file_identity(launch.binary) else {
        return client;
    };
    let failed_path = launch.dir.join(UPGRADE_FAILED_FILE);
    let marker = upgrade_marker(wanted);
    info!(pid = status.pid, binary = %launch.binary.display(), "the front runs another binary; upgrading it");
    match upgrade(launch).await {
        Ok(upgraded) => {
            let _ = std::fs::remove_file(&failed_path);
            upgraded
        }
        Err(err @ FrontError::KilledWhileStarting { .. }) => {
            warn!(error = %err, "front upgrade interrupted; the old front keeps serving, and the upgrade is tried again");
            client
        }
        Err(err) => {
            warn!(error = %err, "front upgrade failed; the old front keeps serving");
            let _ = fsutil::write_atomically(&failed_path, marker.as_bytes());
            client
        }
    }
}

/// Device and inode of the file a process runs (`/proc/<pid>/exe` resolves even when the file was
/// replaced or deleted since).
fn exe_identity(pid: u32) -> Option<(u64, u64)> {
    file_identity(Path::new(&format!("/proc/{pid}/exe")))
}

fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Replaces the running front with `binary` without closing the listening socket: the successor
/// receives it over the control socket, then the old front stops accepting and drains its open
/// connections (up to its drain timeout). Under systemd the successor joins the front's unit and
/// becomes its main process, so the unit's restart and descriptor store carry over. Returns a
/// client once the successor answers.
pub async fn upgrade(launch: FrontLaunch<'_>) -> Result<FrontClient, FrontError> {
    let client = FrontClient::connect(launch.dir).await?;
    let status = client.status().await?;
    let old = Runtime::observe(status.pid)
        .ok_or_else(|| FrontError::Handover(format!("the front (pid {}) exited", status.pid)))?;
    start(launch, status.listen, Some(&old)).await
}

/// Starts an upgrade of the front serving `launch.dir` to `launch.binary` and returns at once: a
/// successor that takes the listening socket over once it answers ([`upgrading`] until then).
///
/// The last successor that did not take over is judged first, once: one killed by a signal (a
/// stop of serve's own unit takes what serve just spawned) or whose end nobody saw (serve
/// restarted meanwhile) is no verdict on its binary, and is tried again; one that exited with an
/// error, or still runs past [`START_TIMEOUT`] (it is killed), marks its binary in
/// `DIR/upgrade.failed` (not tried again, see [`runs_other_binary`]) and its error is returned.
pub async fn start_upgrade(launch: FrontLaunch<'_>) -> Result<UpgradeStart, FrontError> {
    let status = FrontClient::connect(launch.dir).await?.status().await?;
    if let Some(last) = pending_successor(launch.dir, status.pid) {
        let _ = std::fs::remove_file(launch.dir.join(SUCCESSOR_FILE));
        let failure = match launch.runtime.is_running(&last) {
            true => {
                let _ = launch.runtime.kill(&last).await;
                Some(FrontError::StartTimeout {
                    pid: last.pid,
                    socket: launch.dir.join(CONTROL_SOCKET),
                    log: Runtime::log_location(&last),
                    seconds: START_TIMEOUT.as_secs(),
                })
            }
            false => {
                let status = launch.runtime.exit_status(&last).await;
                match exit_error(launch.runtime, launch.dir, &last, status).await {
                    FrontError::KilledWhileStarting { .. } => None,
                    // Its end unseen, and nothing written in the dir.
                    FrontError::Exited { .. } if status.is_none() => None,
                    error => Some(error),
                }
            }
        };
        let _ = std::fs::remove_file(launch.dir.join(ERROR_FILE));
        if let Some(error) = failure
            && let Some(identity) = file_identity(&last.program).filter(|i| Some(*i) == file_identity(launch.binary))
        {
            let failed_path = launch.dir.join(UPGRADE_FAILED_FILE);
            fsutil::write_atomically(&failed_path, upgrade_marker(identity).as_bytes())
                .map_err(|e| FrontError::io(format!("cannot write {}", failed_path.display()), e))?;
            return Ok(UpgradeStart::LastFailed {
                serving: status.pid,
                error,
            });
        }
    }
    let old = Runtime::observe(status.pid)
        .ok_or_else(|| FrontError::Handover(format!("the front (pid {}) exited", status.pid)))?;
    let successor = spawn(launch, status.listen, Some(&old), None).await?;
    Ok(UpgradeStart::Started {
        serving: status.pid,
        successor: successor.pid,
    })
}

/// What [`start_upgrade`] did.
#[derive(Debug)]
pub enum UpgradeStart {
    /// A successor was started beside the front `serving`.
    Started { serving: u32, successor: u32 },
    /// The last successor to this binary failed (`error`): the front `serving` serves on, and
    /// this binary is not tried again.
    LastFailed { serving: u32, error: FrontError },
}

/// The successor of an upgrade started less than [`START_TIMEOUT`] ago that runs and has not taken
/// over from the front `serving` (a pid) yet: its pid.
pub fn upgrading(runtime: &Runtime, dir: &Path, serving: u32) -> Option<u32> {
    pending_successor(dir, serving)
        .filter(|s| runtime.is_running(s) && s.running_for() < START_TIMEOUT)
        .map(|s| s.pid)
}

/// The last successor started for `dir`, unless it is the front `serving` (it took over).
fn pending_successor(dir: &Path, serving: u32) -> Option<ProcessRecord> {
    Runtime::load(&dir.join(SUCCESSOR_FILE))
        .ok()
        .flatten()
        .filter(|s| s.pid != serving)
}

/// Stops the front serving `dir`, if any: SIGTERM (under systemd: the unit is stopped, so that it
/// is not restarted), then wait (it drains its connections), then SIGKILL after
/// [`STOP_TIMEOUT`]. The backend file and the log stay.
pub async fn stop(runtime: &Runtime, shard: &str, dir: &Path) -> Result<(), FrontError> {
    let pid = match answering(dir).await {
        Some((_, status)) => Some(status.pid),
        None => read_pid_record(dir).filter(is_alive).map(|r| r.pid),
    };
    if let Some(record) = pid.and_then(Runtime::observe) {
        info!(pid = record.pid, dir = %dir.display(), "stopping the front");
        let stopped = runtime.terminate(&record, STOP_TIMEOUT).await.map_err(process_error)?;
        if stopped.killed {
            warn!(
                pid = record.pid,
                "the front did not exit within {STOP_TIMEOUT:?} of SIGTERM and was killed"
            );
        }
    }
    // A unit between a crash and its restart has no process to stop, and would come back.
    runtime.stop_unit(&UnitName::front(shard)).await;
    if read_pid_record(dir).is_some_and(|r| !is_alive(&r)) {
        let _ = std::fs::remove_file(dir.join(PID_FILE));
    }
    Ok(())
}

fn process_error(e: ProcessError) -> FrontError {
    FrontError::Io {
        context: "cannot stop the front".into(),
        cause: std::io::Error::other(e.to_string()),
    }
}

/// Creates the front's dir 0700 (and tightens an existing one).
pub(crate) fn prepare_dir(dir: &Path) -> Result<(), FrontError> {
    let context = || format!("cannot prepare the front dir {}", dir.display());
    fsutil::create_private_dir(dir).map_err(|e| FrontError::io(context(), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| FrontError::io(context(), e))
}

/// The pid of the front recorded in `dir`, while that process runs.
/// The front process serving `dir`, by its pid record, while it runs.
pub fn recorded_process(dir: &Path) -> Option<ProcessRecord> {
    let recorded = read_pid_record(dir).filter(is_alive)?;
    Runtime::observe(recorded.pid).filter(|p| p.start_time == recorded.start_time)
}

pub fn recorded_pid(dir: &Path) -> Option<u32> {
    read_pid_record(dir).filter(is_alive).map(|r| r.pid)
}

pub(crate) fn read_pid_record(dir: &Path) -> Option<PidRecord> {
    let bytes = fsutil::read_optional(&dir.join(PID_FILE)).ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// Written by the spawner right after the spawn and by the front itself once it is up (a front
/// started by hand, or a successor, has no other writer); each write has a temp file of its own.
pub(crate) fn write_pid_record(dir: &Path, record: &PidRecord) -> Result<(), FrontError> {
    let path = dir.join(PID_FILE);
    let bytes = serde_json::to_vec_pretty(record).expect("a pid record always serializes");
    fsutil::write_atomically(&path, &bytes).map_err(|e| FrontError::io(format!("cannot write {}", path.display()), e))
}

/// Field 22 of `/proc/<pid>/stat`, or `None` if the process is gone.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    procfs::stat(pid).map(|s| s.start_time)
}

/// The recorded process still runs (not a zombie) and is the one recorded (same start time).
pub(crate) fn is_alive(record: &PidRecord) -> bool {
    procfs::stat(record.pid).is_some_and(|s| !s.is_dead() && s.start_time == record.start_time)
}

/// Does a front on `actual` satisfy a request for `wanted`? Port 0 asks for "any port".
pub(crate) fn listen_matches(wanted: SocketAddr, actual: SocketAddr) -> bool {
    wanted == actual || (wanted.port() == 0 && wanted.ip() == actual.ip())
}

/// The client and status of the front answering on `dir`'s control socket, if one does.
async fn answering(dir: &Path) -> Option<(FrontClient, FrontStatus)> {
    let client = FrontClient::connect(dir).await.ok()?;
    let status = tokio::time::timeout(START_TIMEOUT, client.status()).await.ok()?.ok()?;
    Some((client, status))
}

/// The listening socket for a new front, bound by `serve`.
fn bind(listen: SocketAddr) -> Result<std::net::TcpListener, FrontError> {
    std::net::TcpListener::bind(listen).map_err(|err| match err.kind() {
        std::io::ErrorKind::AddrInUse => FrontError::AddressInUse { address: listen },
        _ => FrontError::CannotListen {
            address: listen,
            message: err.to_string(),
        },
    })
}

/// Starts a front on `listen`, or with `successor_of` a successor that takes the listening socket
/// over from that front; returns once it answers on the control socket.
async fn start(
    launch: FrontLaunch<'_>,
    listen: SocketAddr,
    successor_of: Option<&ProcessRecord>,
) -> Result<FrontClient, FrontError> {
    let record = spawn(launch, listen, successor_of, None).await?;
    wait_answering(launch, &record, successor_of.is_some()).await
}

/// Starts a front on `listen` for `launch.dir` and returns at once, its pid recorded: it answers
/// on its control socket a moment later ([`starting`] until then). The caller has checked that
/// no front runs for the dir. A start error the last front wrote is returned instead, once, and
/// forgotten: the next call starts again.
pub async fn start_front(launch: FrontLaunch<'_>, listen: SocketAddr) -> Result<ProcessRecord, FrontError> {
    prepare_dir(launch.dir)?;
    if let Some(error) = read_start_error(launch.dir) {
        let _ = std::fs::remove_file(launch.dir.join(ERROR_FILE));
        return Err(error.into_error());
    }
    spawn(launch, listen, None, None).await
}

/// As [`start_front`], on the very socket process `pid` listens on at `listen` (taken over here,
/// in serve, and handed to the front as its stdin): no connection to the address is refused while
/// `pid` closes its own copy and exits (docs/front.md, "Taking the address from another program").
pub async fn start_front_taking(
    launch: FrontLaunch<'_>,
    listen: SocketAddr,
    pid: u32,
) -> Result<ProcessRecord, FrontError> {
    prepare_dir(launch.dir)?;
    let taken = crate::process::listener::take_listener(pid, listen).map_err(|e| FrontError::CannotListen {
        address: listen,
        message: e.to_string(),
    })?;
    spawn(launch, listen, None, Some(taken)).await
}

/// The front recorded in `dir` runs and started less than [`START_TIMEOUT`] ago: it may not answer
/// on its control socket yet.
pub fn starting(dir: &Path) -> Option<ProcessRecord> {
    recorded_process(dir).filter(|p| p.running_for() < START_TIMEOUT)
}

/// What the last front of `dir` said when it could not start (and exited), while it is unread.
pub fn start_error(dir: &Path) -> Option<FrontError> {
    read_start_error(dir).map(StartError::into_error)
}

/// Spawns the front process of [`start`] and records its pid; does not wait for it. `taken`: the
/// listening socket it serves on, taken from another process.
async fn spawn(
    launch: FrontLaunch<'_>,
    listen: SocketAddr,
    successor_of: Option<&ProcessRecord>,
    taken: Option<std::net::TcpListener>,
) -> Result<ProcessRecord, FrontError> {
    let FrontLaunch {
        runtime,
        shard,
        binary,
        dir,
    } = launch;
    let _ = std::fs::remove_file(dir.join(ERROR_FILE));
    if successor_of.is_none() {
        // A successor of an earlier front is no upgrade of this one's.
        let _ = std::fs::remove_file(dir.join(SUCCESSOR_FILE));
    }
    let unit = UnitName::front(shard);
    // The unit's stdin is the listening socket; a detached front binds its own (with the
    // capabilities serve has, which it inherits).
    let listener = match (taken, successor_of, runtime.kind()) {
        (Some(taken), _, _) => Some(taken),
        (None, None, RuntimeKind::Systemd) => Some(bind(listen)?),
        _ => None,
    };
    let listen = match &listener {
        Some(l) => l
            .local_addr()
            .map_err(|e| FrontError::io("cannot read the bound address", e))?,
        None => listen,
    };
    let mut args = vec![
        "front".to_string(),
        "--listen".into(),
        listen.to_string(),
        "--dir".into(),
        dir.display().to_string(),
    ];
    if successor_of.is_some() {
        args.extend(["--inherit-from".into(), dir.join(CONTROL_SOCKET).display().to_string()]);
    }
    let mut spec = ProcessSpec::new(
        "front",
        unit.clone(),
        binary,
        args,
        dir.join(LOG_FILE),
        dir.join(if successor_of.is_some() {
            SUCCESSOR_FILE
        } else {
            PROCESS_FILE
        }),
    );
    spec.env = vec![("NO_COLOR".into(), "1".into())];
    spec.restart = Restart::Always;
    spec.notify = true;
    spec.stdin = listener.map(Arc::new);
    let started = match successor_of {
        Some(old) => runtime.start_successor(old, &spec).await,
        None => runtime.start(&spec).await,
    };
    let record = started.map_err(|e| match e {
        ProcessError::Spawn { source, .. } => FrontError::Spawn {
            binary: binary.to_path_buf(),
            cause: source,
        },
        other => FrontError::io("cannot start the front", std::io::Error::other(other.to_string())),
    })?;
    drop(spec);
    // Recorded at once, so that a front that hangs before writing its own record can be stopped.
    // A successor writes its own record once it owns the dir; until then the old front's stays.
    if successor_of.is_none() {
        write_pid_record(
            dir,
            &PidRecord {
                pid: record.pid,
                start_time: record.start_time,
                listen,
                binary: Some(binary.to_path_buf()),
            },
        )?;
    }
    info!(pid = record.pid, binary = %binary.display(), %listen, dir = %dir.display(), unit = ?record.unit, "started a front");
    Ok(record)
}

/// Waits until the front `record` answers on the control socket of `launch.dir`, at most
/// [`START_TIMEOUT`]; one that exits or does not answer in time is stopped and its unit too
/// (unless it is a successor, whose unit is the serving front's).
async fn wait_answering(
    launch: FrontLaunch<'_>,
    record: &ProcessRecord,
    successor: bool,
) -> Result<FrontClient, FrontError> {
    let FrontLaunch {
        runtime, shard, dir, ..
    } = launch;
    let unit = UnitName::front(shard);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if !runtime.is_running(record) {
            // Not restarted over and over by its unit: it failed at its start.
            if !successor {
                runtime.stop_unit(&unit).await;
            }
            return Err(exit_error(runtime, dir, record, runtime.exit_status(record).await).await);
        }
        if let Some((client, status)) = answering(dir).await
            && status.pid == record.pid
        {
            return Ok(client);
        }
        if Instant::now() >= deadline {
            let _ = runtime.terminate(record, Duration::ZERO).await;
            if !successor {
                runtime.stop_unit(&unit).await;
            }
            return Err(FrontError::StartTimeout {
                pid: record.pid,
                socket: dir.join(CONTROL_SOCKET),
                log: Runtime::log_location(record),
                seconds: START_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Why the front `record`, started for `dir`, exited before it answered: what it wrote in its
/// dir, or its exit `status` (None: nobody saw it) and the last lines it printed.
async fn exit_error(runtime: &Runtime, dir: &Path, record: &ProcessRecord, status: Option<ExitStatus>) -> FrontError {
    if let Some(error) = read_start_error(dir) {
        return error.into_error();
    }
    if let Some(killed) = status.filter(|s| s.signal().is_some()) {
        return FrontError::KilledWhileStarting {
            status: killed.to_string(),
            log: Runtime::log_location(record),
        };
    }
    FrontError::Exited {
        status: status.map_or_else(|| "status unknown".to_string(), |s| s.to_string()),
        tail: runtime.log_tail(record, LOG_TAIL_LINES).await.join("\n"),
        log: Runtime::log_location(record),
    }
}

fn read_start_error(dir: &Path) -> Option<StartError> {
    let bytes = fsutil::read_optional(&dir.join(ERROR_FILE)).ok()??;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_different_start_time_is_not() {
        let pid = std::process::id();
        let start = start_time(pid).expect("our own stat");
        let listen = "127.0.0.1:1".parse().unwrap();
        let me = PidRecord {
            pid,
            start_time: start,
            listen,
            binary: None,
        };
        assert!(is_alive(&me));
        assert!(!is_alive(&PidRecord {
            start_time: start + 1,
            ..me.clone()
        }));
        assert!(!is_alive(&PidRecord {
            pid: u32::MAX - 1,
            ..me
        }));
    }

    #[test]
    fn port_zero_matches_any_port_on_the_same_ip() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(listen_matches(a("127.0.0.1:6443"), a("127.0.0.1:6443")));
        assert!(!listen_matches(a("127.0.0.1:6443"), a("127.0.0.1:6444")));
        assert!(listen_matches(a("127.0.0.1:0"), a("127.0.0.1:40000")));
        assert!(!listen_matches(a("127.0.0.2:0"), a("127.0.0.1:40000")));
    }
}
