//! The mirror of a store into another while slots write to the first: the keys kcp keeps, copied
//! as they were at one revision ([`etcd_keys::copy`]), then every later change applied in order
//! from a watch that starts right after that revision. The job `kcpshard job store-mirror` runs it
//! for a store migration; it writes how far it is to a progress file that `serve` reads, and ends
//! once it has applied every change up to a revision `serve` names in another file (the source's
//! last, once nothing writes to it any more).
//!
//! How far it is comes from the watch itself: after the changes it sent, a progress response
//! (etcd's `WatchProgressRequest`, which kine answers too: kine `pkg/server/watch.go` `Progress`,
//! `ProgressAll`) carries a revision up to which every change has been sent.
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Client, WatchOptions};
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::etcd_keys::{self, KCP_PREFIX, failed};

/// How often the progress file is written and the watch asked for its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MirrorPhase {
    /// The keys are being copied as they were at one revision.
    Copying,
    /// Every change after the copy's revision is applied as the source makes it.
    Following,
    /// Every change up to the revision asked for is applied; the job has ended.
    Done,
}

/// How far a mirror is, as its progress file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorProgress {
    pub phase: MirrorPhase,
    /// The source's revision the copy read at.
    pub copy_revision: Option<i64>,
    pub copied_keys: u64,
    /// Every change of the source up to this revision is in the target.
    pub applied_revision: i64,
    /// Changes applied after the copy.
    pub applied_changes: u64,
    /// The source's latest revision the mirror has heard of.
    pub source_revision: i64,
    pub updated_at: DateTime<Utc>,
}

impl MirrorProgress {
    /// How many revisions of the source the target is behind, as last heard.
    pub fn lag(&self) -> i64 {
        (self.source_revision - self.applied_revision).max(0)
    }

    /// The progress file at `path`, if the mirror has written one.
    pub fn load(path: &Path) -> Result<Option<MirrorProgress>, StoreError> {
        let Some(bytes) = crate::fsutil::read_optional(path).map_err(StoreError::io(path))? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Invalid(format!("{}: not a mirror's progress: {e}", path.display())))
    }

    fn save(&mut self, path: &Path) -> Result<(), StoreError> {
        self.updated_at = Utc::now();
        let bytes = serde_json::to_vec_pretty(self).expect("progress serializes");
        crate::fsutil::write_atomically(path, &bytes).map_err(StoreError::io(path))
    }
}

/// The revision a mirror is to end at, as `serve` wrote it into `path` (none yet: it goes on).
pub fn until(path: &Path) -> Result<Option<i64>, StoreError> {
    let Some(bytes) = crate::fsutil::read_optional(path).map_err(StoreError::io(path))? else {
        return Ok(None);
    };
    String::from_utf8_lossy(&bytes)
        .trim()
        .parse()
        .map(Some)
        .map_err(|e| StoreError::Invalid(format!("{}: not a revision: {e}", path.display())))
}

/// Mirrors kcp's keys from `source` into `target` (which must hold none), writing how far it is
/// into `progress`, until every change up to the revision in `until_file` is applied.
pub async fn run(
    source: &Client,
    target: &Client,
    progress: &Path,
    until_file: &Path,
) -> Result<MirrorProgress, StoreError> {
    if etcd_keys::holds_keys(target, KCP_PREFIX).await? {
        return Err(StoreError::Invalid(format!(
            "the store to mirror into already holds keys under {KCP_PREFIX}: it is another shard's, or an earlier copy's that did not finish; clear it or name another"
        )));
    }
    let mut state = MirrorProgress {
        phase: MirrorPhase::Copying,
        copy_revision: None,
        copied_keys: 0,
        applied_revision: 0,
        applied_changes: 0,
        source_revision: 0,
        updated_at: Utc::now(),
    };
    state.save(progress)?;
    let (revision, copied) = etcd_keys::copy(source, target, KCP_PREFIX).await?;
    state.phase = MirrorPhase::Following;
    state.copy_revision = Some(revision);
    state.copied_keys = copied;
    state.applied_revision = revision;
    state.source_revision = revision;
    state.save(progress)?;

    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1)
        .with_progress_notify();
    let (mut requests, mut responses) = source
        .watch_client()
        .watch(KCP_PREFIX, Some(options))
        .await
        .map_err(|e| failed(format!("cannot watch the keys under {KCP_PREFIX}"), e))?
        .split();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let mut saved = state.clone();
    loop {
        tokio::select! {
            message = responses.message() => {
                let broke = |e| failed(format!("the watch of {KCP_PREFIX} from revision {} broke", revision + 1), e);
                let Some(response) = message.map_err(broke)? else {
                    return Err(StoreError::Invalid(format!("the source ended the watch of {KCP_PREFIX}")));
                };
                if response.canceled() {
                    return Err(StoreError::Invalid(format!(
                        "the source canceled the watch of {KCP_PREFIX} from revision {} (compacted at {}): {}",
                        revision + 1,
                        response.compact_revision(),
                        response.cancel_reason()
                    )));
                }
                let heard = response.header().map_or(0, |h| h.revision());
                state.source_revision = state.source_revision.max(heard);
                if response.events().is_empty() {
                    // A progress response: every change up to its revision was sent before it.
                    if !response.created() {
                        state.applied_revision = state.applied_revision.max(heard);
                    }
                    continue;
                }
                for event in response.events() {
                    if etcd_keys::apply(target, event).await? {
                        state.applied_changes += 1;
                    }
                    if let Some(kv) = event.kv() {
                        state.applied_revision = kv.mod_revision();
                    }
                }
            }
            _ = tick.tick() => {
                requests
                    .request_progress()
                    .await
                    .map_err(|e| failed(format!("cannot ask the watch of {KCP_PREFIX} for its progress"), e))?;
                if until(until_file)?.is_some_and(|end| state.applied_revision >= end) {
                    state.phase = MirrorPhase::Done;
                    state.save(progress)?;
                    return Ok(state);
                }
                if state != saved {
                    state.save(progress)?;
                    saved = state.clone();
                }
            }
        }
    }
}
