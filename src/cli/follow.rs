//! Following a KcpShard to the end of something the controller does (a roll, a rotation): poll
//! the object, print a line each time the controller's message changes, succeed or fail with the
//! controller's own words, and give up after `--timeout`. `rollout status` and `credentials
//! rotate` differ only in how they read the object ([`Progress`]) and in their words ([`Wording`]).
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

use super::connect::Cluster;

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
