//! Starting, adopting, upgrading and stopping a front from the controller's side.
//!
//! A front is a process of its own: started in a new session (setsid), stdin from /dev/null,
//! stdout and stderr appended to `DIR/front.log`, so that neither a SIGKILL of `serve` nor the end
//! of its terminal session reaches it. `DIR/front.pid.json` records its pid and its start time
//! (field 22 of `/proc/<pid>/stat`): a pid that now names another process is never signalled.
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::front::client::FrontClient;
use crate::front::error::FrontError;
use crate::front::protocol::{CONTROL_SOCKET, ERROR_FILE, FrontStatus, LOG_FILE, PID_FILE, PidRecord, StartError};
use crate::fsutil;

/// How long a starting front has to answer on its control socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `stop` waits after SIGTERM (the front drains for up to 30 s by default) before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(40);
const POLL: Duration = Duration::from_millis(50);
/// Names the binary (device and inode) whose upgrade failed, so it is not retried on every call.
pub const UPGRADE_FAILED_FILE: &str = "upgrade.failed";

/// Returns a client of the front serving `dir` on `listen`, starting `binary front` if none runs.
///
/// A running front whose control socket answers is adopted when it listens on `listen` (port 0
/// matches any port on the same IP). One that listens elsewhere is stopped and replaced, but only
/// if the new address is free: otherwise it keeps serving and the error says so. One that
/// is alive but does not answer within [`START_TIMEOUT`] is killed and replaced.
///
/// An adopted front that runs another binary than `binary` (another file, or the same path
/// rebuilt) is upgraded in place with [`upgrade`], without closing its listening socket. If that
/// fails, the old front keeps serving, the failure is logged and written to `DIR/upgrade.failed`,
/// and the same binary is not tried again (a rebuilt or different binary is).
pub async fn ensure_running(binary: &Path, dir: &Path, listen: SocketAddr) -> Result<FrontClient, FrontError> {
    prepare_dir(dir)?;
    if let Some((client, status)) = answering(dir).await {
        if listen_matches(listen, status.listen) {
            return Ok(adopt(binary, dir, client, &status).await);
        }
        // Never stop a serving front for an address it could not get.
        if let Err(err) = std::net::TcpListener::bind(listen) {
            return Err(match err.kind() {
                std::io::ErrorKind::AddrInUse => FrontError::AddressInUse { address: listen },
                _ => FrontError::CannotListen {
                    address: listen,
                    message: err.to_string(),
                },
            });
        }
        info!(dir = %dir.display(), running = %status.listen, wanted = %listen,
            "the front listens on another address; replacing it");
        stop(dir).await?;
    } else if let Some(record) = read_pid_record(dir).filter(is_alive) {
        // Alive but silent: still starting (another caller just spawned it), or stuck.
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline && is_alive(&record) {
            if let Some((client, status)) = answering(dir).await {
                if listen_matches(listen, status.listen) {
                    return Ok(client);
                }
                stop(dir).await?;
                return start(binary, dir, listen, None).await;
            }
            tokio::time::sleep(POLL).await;
        }
        if is_alive(&record) {
            warn!(
                pid = record.pid,
                "the recorded front does not answer on its control socket; killing it"
            );
            kill(record.pid, libc::SIGKILL);
            wait_gone(&record, Duration::from_secs(5)).await;
        }
    }
    start(binary, dir, listen, None).await
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
async fn adopt(binary: &Path, dir: &Path, client: FrontClient, status: &FrontStatus) -> FrontClient {
    if !runs_other_binary(binary, dir, status.pid) {
        return client;
    }
    let Some(wanted) = file_identity(binary) else {
        return client;
    };
    let failed_path = dir.join(UPGRADE_FAILED_FILE);
    let marker = upgrade_marker(wanted);
    info!(pid = status.pid, binary = %binary.display(), "the front runs another binary; upgrading it");
    match upgrade(binary, dir).await {
        Ok(upgraded) => {
            let _ = std::fs::remove_file(&failed_path);
            upgraded
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
/// connections (up to its drain timeout). Returns a client once the successor answers.
pub async fn upgrade(binary: &Path, dir: &Path) -> Result<FrontClient, FrontError> {
    let client = FrontClient::connect(dir).await?;
    let status = client.status().await?;
    let from = dir.join(CONTROL_SOCKET);
    start(binary, dir, status.listen, Some(&from)).await
}

/// Stops the front serving `dir`, if any: SIGTERM, then wait (it drains its connections), then
/// SIGKILL after [`STOP_TIMEOUT`]. The backend file and the log stay.
pub async fn stop(dir: &Path) -> Result<(), FrontError> {
    let target = match answering(dir).await {
        Some((_, status)) => start_time(status.pid).map(|start_time| PidRecord {
            pid: status.pid,
            start_time,
            listen: status.listen,
            binary: None,
        }),
        None => read_pid_record(dir).filter(is_alive),
    };
    if let Some(record) = target {
        info!(pid = record.pid, dir = %dir.display(), "stopping the front");
        kill(record.pid, libc::SIGTERM);
        if !wait_gone(&record, STOP_TIMEOUT).await {
            warn!(
                pid = record.pid,
                "the front did not exit within {:?} of SIGTERM; killing it", STOP_TIMEOUT
            );
            kill(record.pid, libc::SIGKILL);
            wait_gone(&record, Duration::from_secs(5)).await;
        }
    }
    if read_pid_record(dir).is_some_and(|r| !is_alive(&r)) {
        let _ = std::fs::remove_file(dir.join(PID_FILE));
    }
    Ok(())
}

/// Creates the front's dir 0700 (and tightens an existing one).
pub(crate) fn prepare_dir(dir: &Path) -> Result<(), FrontError> {
    let context = || format!("cannot prepare the front dir {}", dir.display());
    fsutil::create_private_dir(dir).map_err(|e| FrontError::io(context(), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| FrontError::io(context(), e))
}

/// The pid of the front recorded in `dir`, while that process runs.
pub fn recorded_pid(dir: &Path) -> Option<u32> {
    read_pid_record(dir).filter(is_alive).map(|r| r.pid)
}

pub(crate) fn read_pid_record(dir: &Path) -> Option<PidRecord> {
    let bytes = fsutil::read_optional(&dir.join(PID_FILE)).ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// Written by the spawner right after the spawn and by the front itself once it is up (a front
/// started by hand, or a successor, has no other writer), so each writer uses its own temp file.
pub(crate) fn write_pid_record(dir: &Path, record: &PidRecord) -> Result<(), FrontError> {
    use std::io::Write as _;
    let path = dir.join(PID_FILE);
    let bytes = serde_json::to_vec_pretty(record).expect("a pid record always serializes");
    let tmp = dir.join(format!("{PID_FILE}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        fsutil::sync_dir(dir)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        FrontError::io(format!("cannot write {}", path.display()), e)
    })
}

/// Field 22 of `/proc/<pid>/stat`, or `None` if the process is gone.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text).map(|(_, start)| start)
}

/// Parses the state (field 3) and start time (field 22) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may itself hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3) come fields 4..; field 22 is the 19th after the state.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The recorded process still runs (not a zombie) and is the one recorded (same start time).
pub(crate) fn is_alive(record: &PidRecord) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{}/stat", record.pid)) else {
        return false;
    };
    match parse_stat(&text) {
        Some((state, start)) => !matches!(state, 'Z' | 'X' | 'x') && start == record.start_time,
        None => false,
    }
}

/// Does a front on `actual` satisfy a request for `wanted`? Port 0 asks for "any port".
pub(crate) fn listen_matches(wanted: SocketAddr, actual: SocketAddr) -> bool {
    wanted == actual || (wanted.port() == 0 && wanted.ip() == actual.ip())
}

fn kill(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory effects; callers checked the pid names the recorded process.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

async fn wait_gone(record: &PidRecord, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while is_alive(record) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
    true
}

/// The client and status of the front answering on `dir`'s control socket, if one does.
async fn answering(dir: &Path) -> Option<(FrontClient, FrontStatus)> {
    let client = FrontClient::connect(dir).await.ok()?;
    let status = tokio::time::timeout(START_TIMEOUT, client.status()).await.ok()?.ok()?;
    Some((client, status))
}

async fn start(
    binary: &Path,
    dir: &Path,
    listen: SocketAddr,
    inherit_from: Option<&Path>,
) -> Result<FrontClient, FrontError> {
    let error_path = dir.join(ERROR_FILE);
    let log_path = dir.join(LOG_FILE);
    let _ = std::fs::remove_file(&error_path);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| FrontError::io(format!("cannot open the front log {}", log_path.display()), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| FrontError::io("cannot duplicate the log fd", e))?;
    let mut command = tokio::process::Command::new(binary);
    command
        .arg("front")
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--dir")
        .arg(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some(from) = inherit_from {
        command.arg("--inherit-from").arg(from);
    }
    // SAFETY: setsid(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.as_std_mut().pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|cause| FrontError::Spawn {
        binary: binary.to_path_buf(),
        cause,
    })?;
    let pid = child.id().expect("a child that was just spawned has a pid");
    let record = PidRecord {
        pid,
        start_time: start_time(pid).unwrap_or(0),
        listen,
        binary: Some(binary.to_path_buf()),
    };
    // Recorded at once, so that a front that hangs before writing its own record can be stopped.
    // A successor writes its own record once it owns the dir; until then the old front's stays.
    if inherit_from.is_none() {
        write_pid_record(dir, &record)?;
    }
    info!(pid, binary = %binary.display(), %listen, dir = %dir.display(), "started a front");

    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(exit)) = child.try_wait() {
            if let Some(error) = read_start_error(dir) {
                return Err(error.into_error());
            }
            return Err(FrontError::Exited {
                status: exit.to_string(),
                tail: log_tail(&log_path),
                log: log_path,
            });
        }
        if let Some((client, status)) = answering(dir).await
            && status.pid == pid
        {
            // Dropping the handle leaves the front running; tokio reaps it if it exits while we live.
            drop(child);
            return Ok(client);
        }
        if Instant::now() >= deadline {
            kill(pid, libc::SIGKILL);
            let _ = child.wait().await;
            return Err(FrontError::StartTimeout {
                pid,
                socket: dir.join(CONTROL_SOCKET),
                log: log_path,
                seconds: START_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

fn read_start_error(dir: &Path) -> Option<StartError> {
    let bytes = fsutil::read_optional(&dir.join(ERROR_FILE)).ok()??;
    serde_json::from_slice(&bytes).ok()
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_with_parentheses_in_the_name() {
        let line = "1234 (kcp (shard) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 8 0 987654 1000 200";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (init) Z 0 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

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
