//! Following a KcpShard to the end of something the controller does (a roll, a rotation): poll
//! the object, print a line each time the controller's message changes, succeed or fail with the
//! controller's own words, and give up after `--timeout`. `rollout status` and `credentials
//! rotate` differ only in how they read the object ([`Progress`]) and in their words ([`Wording`]).
use std::time::Duration;

use anyhow::bail;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::connect::{Cluster, QUALIFIED};

const POLL: Duration = Duration::from_millis(250);

/// Where the thing followed stands, read from the object.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing to tell yet (the status is of an older generation, a request not taken up yet).
    Stale,
    Moving(String),
    Blocked(String),
    Done(String),
}

/// How the lines name what is followed: `kcpshard "NAME" {done}: ...`, `kcpshard "NAME"
/// {blocked}: ...`, `Waiting for kcpshard "NAME" {waiting}: ...`, `... waiting for kcpshard "NAME"
/// {timed_out} (last: ...)`.
pub struct Wording {
    pub done: &'static str,
    pub blocked: &'static str,
    pub waiting: &'static str,
    pub timed_out: &'static str,
}

/// How a command that asks the controller for something follows it to its end.
#[derive(Debug, clap::Args)]
pub struct FollowArgs {
    /// Wait until it is done. `--wait=false` returns once it is asked for.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub wait: bool,
    /// Give up waiting after this many seconds (0: wait as long as it takes).
    #[arg(long, default_value_t = 0)]
    pub timeout: u64,
}

/// Asks the controller for something by setting `annotation` to `value` on KcpShard `name` (what
/// `kubectl annotate` would do), prints `KcpShard "NAME" {asked}`, then as `how` says follows it
/// like [`follow`].
pub async fn ask_and_follow(
    cluster: &Cluster,
    name: &str,
    (annotation, value): (&str, &str),
    asked: &str,
    how: &FollowArgs,
    words: &Wording,
    progress: impl Fn(&Value) -> Progress,
) -> anyhow::Result<()> {
    let patch = json!({ "metadata": { "annotations": { annotation: value } } });
    cluster
        .kcpshards()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| cluster.explain(e))?;
    println!("{QUALIFIED} \"{name}\" {asked}");
    if !how.wait {
        return Ok(());
    }
    follow(cluster, name, how.timeout, words, progress).await
}

/// Polls KcpShard `name` until `progress` says Done (Ok) or Blocked (Err), or `timeout` seconds
/// pass (0: no limit).
pub async fn follow(
    cluster: &Cluster,
    name: &str,
    timeout: u64,
    words: &Wording,
    progress: impl Fn(&Value) -> Progress,
) -> anyhow::Result<()> {
    let api = cluster.kcpshards();
    let deadline = (timeout > 0).then(|| tokio::time::Instant::now() + Duration::from_secs(timeout));
    let mut last = String::new();
    loop {
        let object = api.get(name).await.map_err(|e| cluster.explain(e))?;
        match progress(&serde_json::to_value(&object)?) {
            Progress::Done(message) => {
                println!("kcpshard \"{name}\" {}: {message}", words.done);
                return Ok(());
            }
            Progress::Blocked(message) => bail!("kcpshard \"{name}\" {}: {message}", words.blocked),
            Progress::Moving(message) if message != last => {
                println!("Waiting for kcpshard \"{name}\" {}: {message}...", words.waiting);
                last = message;
            }
            Progress::Moving(_) | Progress::Stale => {}
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            bail!(
                "timed out after {timeout}s waiting for kcpshard \"{name}\" {} (last: {last})",
                words.timed_out
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
