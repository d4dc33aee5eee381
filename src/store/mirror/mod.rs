//! The mirror of a store into another while slots write to the first: the keys kcp keeps, copied
//! as they were at one revision ([`etcd_keys::copy`]), then every later change applied in order
//! from a watch that starts right after that revision. The job `kcpshard job store-mirror` runs it
//! for a move of the data (controller/migration.rs); it writes how far it is to a progress file
//! that `serve` reads, and ends once `serve` has made its until file (the old store takes no more
//! writes) and every change up to the old store's revision at that moment is applied. Before it
//! says so it checks its work: every key the old store holds at that revision, read again, must be
//! one the mirror wrote as of the same change, and no key it wrote may be gone from the old store
//! ([`differences`]); else the job fails and the old store keeps the data.
//!
//! How far it is comes from the watch itself: after the changes it sent, a progress response
//! (etcd's `WatchProgressRequest`, which kine answers too: kine `pkg/server/watch.go` `Progress`,
//! `ProgressAll`) carries a revision up to which every change has been sent.
//!
//! The job readies the new store itself ([`prepare`]) so that a client that resumes from a
//! resourceVersion of the old store is answered 410 Gone and lists again: its revisions start
//! above every revision the old store hands out. A kine store (over PostgreSQL or sqlite): a kine
//! of the job's own makes kine's table, then, with none running, the revisions are raised above
//! the old store's in one write (store/kine.rs `RAISE_REVISION_SQL`). An etcd cluster: its
//! revision is raised by writes to a key outside kcp's, whose history is then compacted
//! ([`etcd_keys::raise_revision`]). Either by only as much as the move needs (target.rs `raised_above`).
//!
//! A kcp's embedded etcd stops with its kcp: the mirror follows it while it runs, and reads the
//! changes after the last one it applied from a copy of its data once kcp has exited ([`AfterExit`]).
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Client, EventType, WatchOptions};
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::etcd_keys::{self, KCP_PREFIX, KeyRevisions, failed};

mod target;
pub use target::{KineTarget, MirrorTarget, PrivateKine, Readied, prepare, source_kine};

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
    /// The revision the target's revisions were raised above, if the job raised them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raised_above: Option<i64>,
    /// The source's revision when `serve` said it takes no more writes: the mirror ends there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_revision: Option<i64>,
    /// Keys of the source at the revision the mirror ended at, each found written by the mirror
    /// as the source last changed it (checked before the phase is Done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_keys: Option<u64>,
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

/// Where a mirror reads the source's last changes once the source has stopped with its process:
/// a kcp's embedded etcd, which lives and dies with its kcp. A copy of its data directory, taken
/// once the process has exited (serve makes the until file then), opened by an etcd of the job's
/// own in `scratch`: the same revisions, so the mirror goes on from the last one it applied.
#[derive(Debug, Clone)]
pub struct AfterExit {
    /// The embedded etcd's data directory (`<kcp root>/etcd-server`), only ever read.
    pub data_dir: PathBuf,
    pub etcd: PathBuf,
    /// Where the copy and its etcd go (relative: the job's directory).
    pub scratch: PathBuf,
}

/// Where a job opens the copy, in its directory.
pub const COPY_SCRATCH: &str = "embedded-etcd-copy";
/// How long the etcd on the copy may take to answer.
const COPY_ETCD_START: Duration = Duration::from_secs(30);

/// Mirrors kcp's keys from `source` into `target` (which must hold none), writing how far it is
/// into `progress`, until `until_file` exists and every change up to the source's revision at
/// that moment is applied. `raised_above`: the target's revisions start above it, so the source
/// must end below it. With `after_exit`, the source is an embedded etcd: the mirror follows it
/// until it stops (following it again if its watch breaks while it runs), and once `until_file`
/// exists reads the last changes from a copy of its data ([`AfterExit`]).
pub async fn run(
    source: &Client,
    target: &Client,
    progress: &Path,
    until_file: &Path,
    raised_above: Option<i64>,
    after_exit: Option<&AfterExit>,
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
        raised_above,
        end_revision: None,
        verified_keys: None,
        updated_at: Utc::now(),
    };
    state.save(progress)?;
    // Each key written, with the source's revision of the change written: what is checked at the end.
    let (revision, mut mirrored) = etcd_keys::copy(source, target, KCP_PREFIX).await?;
    state.phase = MirrorPhase::Following;
    state.copy_revision = Some(revision);
    state.copied_keys = mirrored.len() as u64;
    state.applied_revision = revision;
    state.source_revision = revision;
    state.save(progress)?;

    let mirror = Mirror {
        target,
        progress,
        until_file,
        raised_above,
    };
    let Some(after_exit) = after_exit else {
        return match mirror.follow(source, &mut state, &mut mirrored, true).await? {
            Followed::Done => Ok(state),
            Followed::SourceGone(e) => Err(e),
        };
    };
    let mut retried = false;
    loop {
        match mirror.follow(source, &mut state, &mut mirrored, false).await? {
            Followed::Done => return Ok(state),
            Followed::SourceGone(e) if !until_file.exists() => {
                // Said once: it retries every PROGRESS_EVERY until the until file says it exited.
                if !std::mem::replace(&mut retried, true) {
                    tracing::info!(
                        "the source stopped answering while its process may still run ({e}); following it again until it is told the process exited"
                    );
                }
                tokio::time::sleep(PROGRESS_EVERY).await;
            }
            Followed::SourceGone(_) => break,
        }
    }
    let (mut etcd, copy) = open_copy(after_exit).await?;
    tracing::info!(
        "following the rest from a copy of {} after revision {}",
        after_exit.data_dir.display(),
        state.applied_revision
    );
    let followed = mirror.follow(&copy, &mut state, &mut mirrored, true).await;
    let _ = etcd.kill().await;
    match followed? {
        Followed::Done => Ok(state),
        Followed::SourceGone(e) => Err(e),
    }
}

/// A copy of the stopped embedded etcd's data, opened by an etcd of the job's own.
async fn open_copy(after_exit: &AfterExit) -> Result<(tokio::process::Child, Client), StoreError> {
    let scratch = &after_exit.scratch;
    super::snapshot::remove_dir_if_there(scratch)?;
    crate::fsutil::create_private_dir(scratch).map_err(StoreError::io(scratch))?;
    let data = scratch.join(super::private::ETCD_DATA);
    copy_tree(&after_exit.data_dir.join("member"), &data.join("member"))?;
    let what = format!("the etcd on a copy of {}", after_exit.data_dir.display());
    super::private::etcd(&after_exit.etcd, scratch, &what, COPY_ETCD_START).await
}

/// Copies the directory `from` and everything in it to `to` (directories 0700).
fn copy_tree(from: &Path, to: &Path) -> Result<(), StoreError> {
    crate::fsutil::create_private_dir(to).map_err(StoreError::io(to))?;
    for entry in std::fs::read_dir(from).map_err(StoreError::io(from))? {
        let entry = entry.map_err(StoreError::io(from))?;
        let (path, into) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().map_err(StoreError::io(&path))?.is_dir() {
            copy_tree(&path, &into)?;
        } else {
            std::fs::copy(&path, &into).map_err(StoreError::io(&path))?;
        }
    }
    Ok(())
}

/// How a stretch of following a source ended.
enum Followed {
    /// Every change up to the end revision is applied and checked.
    Done,
    /// The source's watch broke, or (when the mirror does not end on it) the until file appeared.
    SourceGone(StoreError),
}

/// What every stretch of a mirror shares.
struct Mirror<'a> {
    target: &'a Client,
    progress: &'a Path,
    until_file: &'a Path,
    raised_above: Option<i64>,
}

impl Mirror<'_> {
    /// Applies every change `source` makes after `state.applied_revision`. `ends_here`: once the
    /// until file exists, the mirror ends at the source's revision then; else that file only ends
    /// this stretch.
    async fn follow(
        &self,
        source: &Client,
        state: &mut MirrorProgress,
        mirrored: &mut KeyRevisions,
        ends_here: bool,
    ) -> Result<Followed, StoreError> {
        let from = state.applied_revision + 1;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify();
        let (mut requests, mut responses) = match source.watch_client().watch(KCP_PREFIX, Some(options)).await {
            Ok(watch) => watch.split(),
            Err(e) => {
                let e = failed(format!("cannot watch the keys under {KCP_PREFIX}"), e);
                return Ok(Followed::SourceGone(e));
            }
        };
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        let mut saved = state.clone();
        loop {
            tokio::select! {
                message = responses.message() => {
                    let response = match message {
                        Ok(Some(response)) => response,
                        Ok(None) => {
                            let e = StoreError::Invalid(format!("the source ended the watch of {KCP_PREFIX}"));
                            return Ok(Followed::SourceGone(e));
                        }
                        Err(e) => {
                            let e = failed(format!("the watch of {KCP_PREFIX} from revision {from} broke"), e);
                            return Ok(Followed::SourceGone(e));
                        }
                    };
                    if response.canceled() {
                        return Err(StoreError::Invalid(format!(
                            "the source canceled the watch of {KCP_PREFIX} from revision {from} (compacted at {}): {}",
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
                        if etcd_keys::apply(self.target, event).await? {
                            state.applied_changes += 1;
                            let kv = event.kv().expect("an applied change names its key");
                            match event.event_type() {
                                EventType::Put => mirrored.insert(kv.key().to_vec(), kv.mod_revision()),
                                EventType::Delete => mirrored.remove(kv.key()),
                            };
                        }
                        if let Some(kv) = event.kv() {
                            state.applied_revision = kv.mod_revision();
                        }
                    }
                }
                _ = tick.tick() => {
                    if let Err(e) = requests.request_progress().await {
                        let e = failed(format!("cannot ask the watch of {KCP_PREFIX} for its progress"), e);
                        return Ok(Followed::SourceGone(e));
                    }
                    if state.end_revision.is_none() && self.until_file.exists() {
                        if !ends_here {
                            let e = StoreError::Invalid("the source's process has exited".into());
                            return Ok(Followed::SourceGone(e));
                        }
                        let end = etcd_keys::revision(source).await?;
                        if let Some(raised) = self.raised_above.filter(|raised| end >= *raised) {
                            return Err(StoreError::Invalid(format!(
                                "the source reached revision {end} during the move, above the {raised} the target's revisions start from: a client could resume from a revision of the source that the target handed out for another change. The old store wrote more during the move than ten minutes at the rate it wrote when the move began; clear the new store and move again at a quieter time"
                            )));
                        }
                        state.end_revision = Some(end);
                    }
                    if state.end_revision.is_some_and(|end| state.applied_revision >= end) {
                        self.verify(source, state, mirrored).await?;
                        return Ok(Followed::Done);
                    }
                    if *state != saved {
                        state.save(self.progress)?;
                        saved = state.clone();
                    }
                }
            }
        }
    }

    /// Checks that every key of `source` as of the applied revision is as the mirror wrote it,
    /// then says the mirror is done.
    async fn verify(
        &self,
        source: &Client,
        state: &mut MirrorProgress,
        mirrored: &KeyRevisions,
    ) -> Result<(), StoreError> {
        let source_keys = etcd_keys::key_revisions(source, KCP_PREFIX, state.applied_revision).await?;
        let differing = differences(&source_keys, mirrored);
        if !differing.is_empty() {
            return Err(StoreError::Invalid(format!(
                "the new store does not have every change of the old one up to revision {}: {} of its keys differ ({}{}). The old store keeps the data; the job's log says what the mirror did",
                state.applied_revision,
                differing.len(),
                differing.iter().take(3).cloned().collect::<Vec<_>>().join("; "),
                if differing.len() > 3 { "; ..." } else { "" },
            )));
        }
        state.verified_keys = Some(source_keys.len() as u64);
        state.phase = MirrorPhase::Done;
        state.save(self.progress)
    }
}

/// Where the keys the mirror wrote differ from the `source`'s, each key with the revision of its
/// last change: a key the source holds and the mirror wrote at another of its changes or never
/// wrote, or one the mirror wrote and the source no longer holds.
pub fn differences(source: &KeyRevisions, mirrored: &KeyRevisions) -> Vec<String> {
    let name = |key: &[u8]| String::from_utf8_lossy(key).into_owned();
    let mut differing: Vec<String> = source
        .iter()
        .filter_map(|(key, revision)| match mirrored.get(key) {
            Some(written) if written == revision => None,
            Some(written) => Some(format!("{}: changed at {revision}, written as of {written}", name(key))),
            None => Some(format!("{}: changed at {revision}, never written", name(key))),
        })
        .collect();
    differing.extend(
        mirrored
            .iter()
            .filter(|(key, _)| !source.contains_key(*key))
            .map(|(key, written)| format!("{}: deleted, still there as of {written}", name(key))),
    );
    differing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(entries: &[(&str, i64)]) -> KeyRevisions {
        entries.iter().map(|(k, r)| (k.as_bytes().to_vec(), *r)).collect()
    }

    #[test]
    fn a_mirror_that_wrote_every_last_change_differs_nowhere() {
        let source = keys(&[("/registry/a", 3), ("/registry/b", 7)]);
        assert!(differences(&source, &source.clone()).is_empty());
    }

    #[test]
    fn every_change_the_mirror_missed_is_named() {
        let source = keys(&[("/registry/a", 3), ("/registry/b", 7), ("/registry/c", 9)]);
        // b's last change not written, c never written, d deleted in the source and still written.
        let mirrored = keys(&[("/registry/a", 3), ("/registry/b", 5), ("/registry/d", 4)]);
        assert_eq!(
            differences(&source, &mirrored),
            [
                "/registry/b: changed at 7, written as of 5",
                "/registry/c: changed at 9, never written",
                "/registry/d: deleted, still there as of 4",
            ]
        );
    }
}
