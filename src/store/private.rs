//! A store process a job runs for itself (the etcd that opens a snapshot, the kine a store mirror
//! writes through): in the job's directory, its output in a log there, SIGKILLed with the job
//! however the job ends (PR_SET_PDEATHSIG, and kill_on_drop).
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use etcd_client::Client;

use super::StoreError;
use super::etcd_keys;

/// Starts `program` with `args` and `env` in `dir`, appending its output to `log`.
pub fn spawn(
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    dir: &Path,
    log: &Path,
) -> Result<tokio::process::Child, StoreError> {
    let out = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(StoreError::io(log))?;
    let mut command = tokio::process::Command::new(program);
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(StoreError::io(log))?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| StoreError::Invalid(format!("cannot start {}: {e}", program.display())))
}

/// A client of `child`, `what` serving the etcd API at `endpoint`, once it answers a read; an
/// error with the end of its `log` when it exits first or does not answer `within`.
pub async fn answering(
    what: &str,
    endpoint: &str,
    child: &mut tokio::process::Child,
    log: &Path,
    within: Duration,
) -> Result<Client, StoreError> {
    let deadline = tokio::time::Instant::now() + within;
    let log_tail = || crate::process::detached::file_tail(log, 5).join("\n");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StoreError::Invalid(format!(
                "{what} exited ({status}); its log: {}",
                log_tail()
            )));
        }
        let last = match etcd_keys::connect(&[endpoint.to_string()], None).await {
            Ok(client) => match etcd_keys::revision(&client).await {
                Ok(_) => return Ok(client),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Invalid(format!(
                "{what} did not answer within {within:?} ({last}); its log: {}",
                log_tail()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The data directory of [`etcd`], in its directory.
pub const ETCD_DATA: &str = "data";

/// An etcd of the job's own on the data directory [`ETCD_DATA`] in `dir` (its log there), serving
/// only on a unix socket there, and a client of it once it answers (within `within`). `what` names
/// it in errors. The data may be a copy of a member's from elsewhere: etcd restarts it as that
/// member, alone, and commits every entry its log holds (`--force-new-cluster` would drop those
/// its last saved commit index does not cover: the last writes before the member stopped).
pub async fn etcd(
    etcd: &Path,
    dir: &Path,
    what: &str,
    within: Duration,
) -> Result<(tokio::process::Child, Client), StoreError> {
    // etcd takes a unix socket as `unix://<name>:<port>`, made in its working directory.
    let socket = "client:0";
    let log = dir.join("etcd.log");
    let args = [
        // Relative, like every path of the etcd: it runs in `dir`.
        "--data-dir".to_string(),
        ETCD_DATA.to_string(),
        "--listen-client-urls".to_string(),
        format!("unix://{socket}"),
        "--advertise-client-urls".to_string(),
        format!("unix://{socket}"),
        "--listen-peer-urls".to_string(),
        "unix://peer:0".to_string(),
    ];
    let mut child = spawn(etcd, &args, &[], dir, &log)?;
    let endpoint = format!("unix://{}", dir.join(socket).display());
    match answering(what, &endpoint, &mut child, &log, within).await {
        Ok(client) => Ok((child, client)),
        Err(e) => {
            let _ = child.kill().await;
            Err(e)
        }
    }
}
