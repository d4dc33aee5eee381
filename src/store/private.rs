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
