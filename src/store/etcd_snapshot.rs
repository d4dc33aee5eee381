//! Snapshots of an Etcd store (an etcd cluster the user runs), the jobs `kcpshard job
//! etcd-snapshot` and `kcpshard job etcd-restore` run:
//! - a snapshot is etcd's own (its Maintenance API, the file `etcdctl snapshot save` writes, which
//!   `etcdutl snapshot restore` reads), taken from one member while the cluster serves;
//! - a restore puts the keys kcp keeps ([`KCP_PREFIX`]) back as the snapshot holds them, through
//!   the cluster's KV API, with every slot stopped: the snapshot is opened by a private etcd
//!   (`etcdutl snapshot restore` into a scratch directory, then `etcd` on unix sockets only), the
//!   cluster's keys under the prefix are deleted and the snapshot's created. kcpshard cannot
//!   restart the user's members on a restored data directory, and needs not: the keys come back
//!   at new revisions, above every revision a client saw, so a client that resumes a watch is
//!   told to list again. Keys outside the prefix (other users of the cluster) are left alone.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::StoreError;
use super::etcd::EtcdCluster;
use super::etcd_keys::{self, KCP_PREFIX};
use super::private;
use super::snapshot::{ClientRun, absolute_arg, remove_dir_if_there};

/// Where a restore opens the snapshot, in the job's directory.
pub const RESTORE_SCRATCH: &str = "etcd-restore";

/// `kcpshard job <job> <flag> <path>` against `cluster` (`etcd-snapshot --into`, `etcd-restore
/// --from`), as a job's run.
pub fn job_run(
    kcpshard: &Path,
    job: &str,
    flag: &str,
    path: &Path,
    cluster: &EtcdCluster,
) -> Result<ClientRun, StoreError> {
    let mut args: Vec<String> = vec!["job".into(), job.into(), flag.into(), absolute_arg(path)?];
    args.extend(cluster.job_args("")?);
    Ok(ClientRun {
        program: kcpshard.to_path_buf(),
        args,
        env: Vec::new(),
    })
}

/// The etcd programs a restore runs, found on serve's PATH when the restore's job is made: a job
/// under systemd runs with the manager's PATH, not serve's.
#[derive(Debug, Clone)]
pub struct EtcdTools {
    pub etcdutl: PathBuf,
    pub etcd: PathBuf,
}

impl EtcdTools {
    pub fn find() -> Result<EtcdTools, StoreError> {
        Ok(EtcdTools {
            etcdutl: tool("etcdutl")?,
            etcd: tool("etcd")?,
        })
    }
}

/// `kcpshard job etcd-restore` of the snapshot at `path` into `cluster`, with the etcd programs
/// it runs.
pub fn restore_run(kcpshard: &Path, path: &Path, cluster: &EtcdCluster) -> Result<ClientRun, StoreError> {
    let tools = EtcdTools::find()?;
    let mut run = job_run(kcpshard, "etcd-restore", "--from", path, cluster)?;
    run.args.extend([
        "--etcdutl-binary".into(),
        tools.etcdutl.display().to_string(),
        "--etcd-binary".into(),
        tools.etcd.display().to_string(),
    ]);
    Ok(run)
}

/// How long the private etcd may take to answer on its socket.
const PRIVATE_ETCD_START: Duration = Duration::from_secs(30);

/// Writes a snapshot of the cluster into `into` (replaced), from the first member that answers.
/// Returns its size in bytes.
pub async fn save(cluster: &EtcdCluster, into: &Path) -> Result<u64, StoreError> {
    let mut failures = Vec::new();
    for endpoint in &cluster.endpoints {
        // One member: a snapshot is of one member's database.
        let client = match etcd_keys::connect(std::slice::from_ref(endpoint), Some(cluster)).await {
            Ok(client) => client,
            Err(e) => {
                failures.push(e.to_string());
                continue;
            }
        };
        let mut stream = match client.maintenance_client().snapshot().await {
            Ok(stream) => stream,
            Err(e) => {
                failures.push(format!("{endpoint}: {e}"));
                continue;
            }
        };
        let mut file = std::fs::File::create(into).map_err(StoreError::io(into))?;
        let mut size = 0;
        loop {
            match stream.message().await {
                Ok(Some(part)) => {
                    file.write_all(part.blob()).map_err(StoreError::io(into))?;
                    size += part.blob().len() as u64;
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(StoreError::Invalid(format!(
                        "the snapshot stream from {endpoint} broke after {size} bytes: {e}"
                    )));
                }
            }
        }
        file.sync_all().map_err(StoreError::io(into))?;
        return Ok(size);
    }
    Err(StoreError::Invalid(format!(
        "no etcd member gave a snapshot ({}); start etcd or fix spec.store.etcd.endpoints",
        failures.join("; ")
    )))
}

/// Puts the keys under [`KCP_PREFIX`] of the cluster back as the snapshot at `snapshot` holds them,
/// opening it in `scratch` (emptied first, removed after). Nothing may use those keys meanwhile
/// (every slot stopped). Returns how many keys the cluster holds under the prefix now.
pub async fn restore(
    snapshot: &Path,
    cluster: &EtcdCluster,
    scratch: &Path,
    tools: &EtcdTools,
) -> Result<u64, StoreError> {
    remove_dir_if_there(scratch)?;
    crate::fsutil::create_private_dir(scratch).map_err(StoreError::io(scratch))?;
    // etcdutl runs in `scratch` too: the data directory is relative to it, where the etcd finds it.
    let opened = run_to_end(
        &tools.etcdutl,
        &[
            "snapshot".as_ref(),
            "restore".as_ref(),
            snapshot.as_os_str(),
            "--data-dir".as_ref(),
            private::ETCD_DATA.as_ref(),
        ],
        scratch,
    )
    .await;
    let restored = match opened {
        Ok(()) => copy_back(cluster, scratch, &tools.etcd).await,
        Err(e) => Err(e),
    };
    remove_dir_if_there(scratch)?;
    restored
}

/// Starts a private etcd on the snapshot restored in `scratch` and copies its keys into the cluster.
async fn copy_back(cluster: &EtcdCluster, scratch: &Path, etcd: &Path) -> Result<u64, StoreError> {
    let what = "the etcd that opens the snapshot";
    let (mut etcd, snapshot) = private::etcd(etcd, scratch, what, PRIVATE_ETCD_START).await?;
    let copied = async {
        let target = etcd_keys::connect(&cluster.endpoints, Some(cluster)).await?;
        etcd_keys::clear(&target, KCP_PREFIX).await?;
        let (_, copied) = etcd_keys::copy(&snapshot, &target, KCP_PREFIX).await?;
        Ok(copied.len() as u64)
    }
    .await;
    let _ = etcd.kill().await;
    copied
}

/// Runs `program` with `args` in `dir` until it exits; an error with its output unless it succeeded.
async fn run_to_end(program: &Path, args: &[&std::ffi::OsStr], dir: &Path) -> Result<(), StoreError> {
    let name = program.display();
    let output = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| StoreError::Invalid(format!("cannot run {name}: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "{name} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// `name` on PATH; an error that says what to install.
fn tool(name: &str) -> Result<PathBuf, StoreError> {
    which::which(name).map_err(|_| {
            StoreError::Invalid(format!(
                "no {name} on PATH: a restore of an Etcd store runs etcdutl and etcd (install the etcd release your cluster runs)"
            ))
        })
}
