//! Long work as tracked jobs (docs/architecture.md, "Jobs"): a step that needs a dump or a restore
//! of the store starts it as a process of its own, records it in controller.json before the start,
//! and returns; later looks observe the process, and the plan takes the next step from what they
//! see. Meanwhile every other rule of the plan applies: a slot that crashes during a long dump is
//! replaced at once, not after the dump. One job runs per shard at a time; a job the spec no
//! longer wants (a newer version asked for, the shard deleted) is killed.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Observed, SlotTemplate, Step, Wait};

/// What a job does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum JobKind {
    /// pg_dump of the store before the first slot of `template` starts (a version change).
    #[serde(rename_all = "camelCase")]
    Snapshot { template: Box<SlotTemplate> },
    /// A snapshot of the store asked for with the kcpshard.io/snapshotRequestedAt annotation
    /// (`request`, its value) or due by spec.backup.interval (None).
    #[serde(rename_all = "camelCase")]
    Backup {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<String>,
    },
    /// pg_restore of the snapshot at `snapshot` (a restore under way).
    #[serde(rename_all = "camelCase")]
    Restore { snapshot: String },
    /// pg_dump of the store for the preflight of `template` (no dump was taken for the version
    /// change); its copy follows.
    #[serde(rename_all = "camelCase")]
    PreflightDump { template: Box<SlotTemplate> },
    /// The copy of the data the preflight of `template` runs on: pg_restore into its scratch
    /// database, or sqlite's VACUUM INTO.
    #[serde(rename_all = "camelCase")]
    PreflightCopy { template: Box<SlotTemplate> },
    /// The mirror of the shard's store into the store a move goes to (`kcpshard job
    /// store-mirror`): it ends once the old store takes no more writes and all of them are applied.
    Mirror,
}

impl JobKind {
    /// The job's name, as steps, events and its files name it.
    pub fn name(&self) -> &'static str {
        match self {
            JobKind::Snapshot { .. } => "snapshot",
            JobKind::Backup { .. } => "backup",
            JobKind::Restore { .. } => "restore",
            JobKind::PreflightDump { .. } => "preflight-dump",
            JobKind::PreflightCopy { .. } => "preflight-copy",
            JobKind::Mirror => "store-mirror",
        }
    }

    /// The template whose preflight the job copies the data for, if it does.
    pub fn preflight_of(&self) -> Option<&SlotTemplate> {
        match self {
            JobKind::PreflightDump { template } | JobKind::PreflightCopy { template } => Some(template),
            JobKind::Snapshot { .. } | JobKind::Backup { .. } | JobKind::Restore { .. } | JobKind::Mirror => None,
        }
    }
}

/// A job, as recorded in controller.json before its process starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    #[serde(flatten)]
    pub kind: JobKind,
    pub started_at: DateTime<Utc>,
    /// Where its result goes when it succeeds (a dump's file); it writes beside it until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// When it was killed because nothing wants it any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// The last job that failed, kept until one of its kind succeeds: the same job does not start
/// again before [`JobFailure::retry_at`], so a job that fails at once each time (a store that
/// refuses pg_dump) is tried every 10 s, then less often, not as fast as it can fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobFailure {
    pub kind: JobKind,
    pub at: DateTime<Utc>,
    /// Its exit status and the last lines it printed.
    pub message: String,
    /// How many times in a row it failed.
    pub times: u32,
}

/// The wait before a failed job is tried again, doubled with each failure in a row up to
/// [`LONGEST_RETRY`].
const FIRST_RETRY: chrono::TimeDelta = chrono::TimeDelta::seconds(10);
const LONGEST_RETRY: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

impl JobFailure {
    pub fn retry_at(&self) -> DateTime<Utc> {
        let doublings = self.times.saturating_sub(1).min(10);
        self.at + (FIRST_RETRY * 2_i32.pow(doublings)).min(LONGEST_RETRY)
    }
}

/// How a job stands, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    /// It ended in failure: its exit status and the last lines it printed.
    Failed {
        message: String,
    },
    /// Its process is gone and nobody kept how it ended (serve restarted, or stopped between
    /// the record and the start): its work is done again.
    Lost,
}

/// The job of a shard, as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct JobObservation {
    pub record: JobRecord,
    pub state: JobState,
}

impl JobObservation {
    pub fn running(&self) -> bool {
        self.state == JobState::Running
    }
}

/// While the data is copied for the preflight of `template`: wait for its job, kill one that does
/// other work, or start the next part of the copy with `copy`.
pub fn towards_preflight_copy(job: Option<&JobObservation>, template: &SlotTemplate, copy: Step) -> Step {
    match job {
        Some(job)
            if job.running()
                && job.record.cancelled_at.is_none()
                && job.record.kind.preflight_of() == Some(template) =>
        {
            Step::Wait(Wait::Job {
                job: job.record.kind.name(),
            })
        }
        Some(job) if job.running() => Step::CancelJob,
        _ => copy,
    }
}

/// The step towards a job of `wanted`: wait for it while it runs, kill one that does other work
/// (one job at a time), wait while the same job failed too recently, else `start` it. A job that
/// ended was taken up by FinishJob before.
pub fn towards(observed: &Observed, wanted: &JobKind, start: Step) -> Step {
    match &observed.job {
        Some(job) if job.running() && job.record.cancelled_at.is_none() && &job.record.kind == wanted => {
            Step::Wait(Wait::Job { job: wanted.name() })
        }
        Some(job) if job.running() => Step::CancelJob,
        _ => match &observed.job_failure {
            Some(failure) if &failure.kind == wanted && observed.now < failure.retry_at() => {
                Step::Wait(Wait::JobRetry {
                    job: wanted.name(),
                    at: failure.retry_at(),
                })
            }
            _ => start,
        },
    }
}
