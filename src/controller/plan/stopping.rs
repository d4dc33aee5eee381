//! Processes that must exit (the store's, a slot's own kine, the front): a step asks them to stop,
//! records who and when in controller.json, and returns; later looks see whether they still run,
//! and the plan waits, or sends SIGKILL once their grace is over. A kcp slot's stop is recorded in
//! its own record instead (`StopRecord`): it drains, and its listener is watched meanwhile.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Observed, Step, Wait};

/// What a stop is for, as the plan names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Stopping {
    /// The shard-wide store's processes: a KineSqlite store's kine, a managed PostgreSQL.
    Store,
    /// The own kine of slot `slot` (KinePostgres).
    SlotStore { slot: String },
    /// A kine that serves nothing the shard uses, recorded at `record`.
    OrphanedKine { record: String },
    /// The shard's front.
    Front,
    /// The preflight's kcp and the kine over its copy.
    Preflight,
    /// What kcpshard ran of the store a move took the data from (its data stays).
    OldStore,
}

impl std::fmt::Display for Stopping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopping::Store => write!(f, "the store's processes"),
            Stopping::SlotStore { slot } => write!(f, "the kine of slot {slot}"),
            Stopping::OrphanedKine { record } => write!(f, "the kine recorded at {record}"),
            Stopping::Front => write!(f, "the front"),
            Stopping::Preflight => write!(f, "the preflight's kcp and kine"),
            Stopping::OldStore => write!(f, "the store the data moved from"),
        }
    }
}

/// One process asked to stop, as recorded before the stop was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStop {
    #[serde(flatten)]
    pub what: Stopping,
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`): a pid that now names another process is
    /// not this one.
    pub start_time: u64,
    pub sent_at: DateTime<Utc>,
    /// When SIGKILL follows if it still runs.
    pub kill_at: DateTime<Utc>,
    #[serde(default)]
    pub killed: bool,
    /// The systemd unit whose main process it was: a unit SIGKILLed during its stop job is left
    /// failed, listed by `systemctl --failed`, until its failed state is reset (ForgetKilled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

/// A process asked to stop that still runs after its grace: SIGKILL for what it belongs to.
pub fn overdue(observed: &Observed) -> Option<Step> {
    let stop = observed
        .stopping
        .iter()
        .find(|s| !s.killed && observed.now >= s.kill_at)?;
    Some(Step::KillStopping {
        what: stop.what.clone(),
    })
}

/// Stops that ended in SIGKILL and whose process has exited are done with: their records go, and
/// under systemd their units' failed state with them.
pub fn killed_and_gone(observed: &Observed) -> Option<Step> {
    (!observed.killed_and_gone.is_empty()).then_some(Step::ForgetKilled)
}

/// The step towards `what` no longer running, given that something of it still runs: `send` (the
/// stop) unless a stop was sent to a process of it that still runs, which is waited for.
/// `observed.stopping` holds only the recorded stops whose process still runs.
pub fn towards_stopped(observed: &Observed, what: Stopping, send: Step) -> Step {
    if observed.stopping.iter().any(|s| s.what == what) {
        return Step::Wait(Wait::Stopping { what });
    }
    send
}
