//! What the plan reads and what it answers: the desired state, the observation, and the steps.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::job::JobKind;
use super::job::JobObservation;

/// What a slot runs: everything that, when changed, needs a new slot. Two slots with equal
/// templates are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotTemplate {
    pub version: String,
    /// The kcp binary, resolved from the spec's template.
    pub binary: String,
    pub extra_args: Vec<String>,
    pub shutdown_delay: String,
    /// The URL every slot advertises (the front's).
    pub front_url: String,
    /// The `kcpshard.io/restartedAt` annotation: a new value asks for a fresh slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// The ids of the shard's admin identities this slot accepts, oldest first (its
    /// `--token-auth-file`; controller/credentials.rs decides them). A rotation changes them,
    /// which rolls the shard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_identities: Vec<String>,
    /// A shard of a sharded kcp (spec.shard, resolved against its root: controller/sharding.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharded: Option<ShardedTemplate>,
}

/// What a slot of a sharded kcp is started with beyond a lone shard's flags.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardedTemplate {
    /// kcp's `--shard-name`.
    pub shard_name: String,
    /// The front-proxy's URL (the root's spec.shard.externalURL): `--shard-external-url`.
    pub external_url: String,
    /// The KcpShard of the root shard, whose state holds the sharded kcp's trust (itself for the
    /// root).
    pub root_kcp_shard: String,
    /// A non-root shard: the root's front, which its root-shard and cache kubeconfigs dial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_front_url: Option<String>,
    /// A non-root shard: spec.shard.cacheKubeconfig (else the root's embedded cache server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_kubeconfig: Option<String>,
    /// A non-root shard: the ids of the root's admin identities it accepts beside its own, so
    /// that one kubeconfig reaches workspaces on every shard through the front-proxy. A rotation
    /// on the root rolls this shard too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_identities: Vec<String>,
}

impl ShardedTemplate {
    /// Whether this is the root shard (it names no root front).
    pub fn is_root(&self) -> bool {
        self.root_front_url.is_none()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub template: SlotTemplate,
    /// How many ready slots serve behind the front at once (spec.slots).
    pub slots: usize,
    /// Whether the binary for the template exists.
    pub binary_present: bool,
    pub readiness_timeout: Duration,
    /// How long a slot that served may go without answering `/readyz` before it is killed.
    pub liveness_timeout: Duration,
    /// How long a slot sent SIGTERM may take to exit before it is killed.
    pub drain_timeout: Duration,
    /// The object is being deleted.
    pub deleting: bool,
    /// Why spec.rollout refuses a roll from the serving slots' version to this one, if it does
    /// (a minor change or a downgrade that is not allowed).
    pub version_refused: Option<String>,
    /// Snapshot the store before a roll that changes the version (spec.rollout, and a store that
    /// takes snapshots).
    pub snapshot_before_version_change: bool,
    /// Run the new version alone on a copy of the data before a roll that changes the version
    /// (spec.rollout.preflight).
    pub preflight: bool,
    /// A preflight that found kcp's own schemas changed does not stop the roll
    /// (spec.rollout.allowMinorVersionChange).
    pub allow_schema_change: bool,
    /// A non-root shard of a sharded kcp whose root cannot take it yet (missing, not a root, not
    /// Ready): why, and no slot starts.
    pub root_not_ready: Option<String>,
    /// A restore asked for with the `kcpshard.io/restoreSnapshot` annotation, as judged.
    pub restore: Option<RestoreRequest>,
    /// The template that last started on the data, when that was another version than the spec's
    /// and its binary is still there (with today's identities and sharding): while the preflight
    /// of the spec's version runs and nothing serves, a slot of it serves meanwhile.
    pub interim: Option<SlotTemplate>,
}

/// A restore asked for (the `kcpshard.io/restoreSnapshot` annotation), judged against the spec
/// and the snapshots before the plan sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreRequest {
    /// The annotation's value: a snapshot's file name in the shard's snapshots directory, or a path.
    pub value: String,
    /// The snapshot's path and the version that served the data in it; or why it cannot be
    /// restored, saying what to do.
    pub verdict: Result<Restorable, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Restorable {
    pub path: String,
    pub version: String,
}

/// A restore of a store snapshot, persisted in controller.json from the moment it is taken up:
/// every slot stops, the snapshot is restored, and slots of the version that served the data in
/// it start (a planned outage, announced with a Warning event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRecord {
    /// The annotation's value it was asked for with.
    pub request: String,
    /// The snapshot's path (empty when the request was refused before one was found).
    pub snapshot: String,
    /// The kcp version that served the data in the snapshot: the slots that start after it.
    pub version: String,
    pub phase: RestorePhase,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub requested_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestorePhase {
    /// Every slot (and its own kine) is being stopped; then the snapshot is restored.
    Stopping,
    /// Restored: slots of the snapshot's version start, as on a first start.
    Starting,
    /// A slot of that version serves through the front again.
    Complete,
    /// Not done: the record's message says why.
    Refused,
}

impl RestorePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RestorePhase::Stopping => "Stopping",
            RestorePhase::Starting => "Starting",
            RestorePhase::Complete => "Complete",
            RestorePhase::Refused => "Refused",
        }
    }
}

impl RestoreRecord {
    /// Under way: the shard is down for it, or starting again after it.
    pub fn under_way(&self) -> bool {
        matches!(self.phase, RestorePhase::Stopping | RestorePhase::Starting)
    }

    /// The snapshot's file name, for messages (status.lastRestore has its path).
    pub fn file_name(&self) -> String {
        std::path::Path::new(&self.snapshot)
            .file_name()
            .map_or_else(|| self.snapshot.clone(), |n| n.to_string_lossy().into_owned())
    }
}

/// The front, as observed through its control socket (or caddy's admin API).
#[derive(Debug, Clone, PartialEq)]
pub enum FrontObservation {
    /// Not running.
    Down,
    /// kcpshard's front process runs but its control socket does not answer (stopped, wedged).
    Unresponsive,
    /// Running; the slots new connections go to, and what it holds per slot.
    Up {
        backends: Vec<String>,
        /// Per slot: connections still open.
        open: Vec<(String, u64)>,
        /// Per slot that left the serving set: kept-alive HTTP/1.1 connections still open that the
        /// front closes between two requests. Before SIGTERM the controller waits for these.
        retiring: Vec<(String, u64)>,
    },
}

impl FrontObservation {
    /// A front with these backends and no connection counts.
    pub fn serving(backends: &[&str]) -> FrontObservation {
        FrontObservation::Up {
            backends: backends.iter().map(|b| b.to_string()).collect(),
            open: vec![],
            retiring: vec![],
        }
    }

    pub fn backends(&self) -> &[String] {
        match self {
            FrontObservation::Up { backends, .. } => backends,
            _ => &[],
        }
    }

    pub fn forwards_to(&self, slot: &str) -> bool {
        self.backends().iter().any(|b| b == slot)
    }

    fn count(list: &[(String, u64)], slot: &str) -> u64 {
        list.iter().find(|(s, _)| s == slot).map_or(0, |(_, n)| *n)
    }

    /// Client connections pinned to `slot` now.
    pub fn open_to(&self, slot: &str) -> u64 {
        match self {
            FrontObservation::Up { open, .. } => Self::count(open, slot),
            _ => 0,
        }
    }

    /// Kept-alive connections to `slot` the front is still closing between requests.
    pub fn retiring_to(&self, slot: &str) -> u64 {
        match self {
            FrontObservation::Up { retiring, .. } => Self::count(retiring, slot),
            _ => 0,
        }
    }
}

/// What the health checks have seen of one slot since its process started (`/readyz` on its own
/// port, 1 s per look, every 0.25 s; at once again after a failure).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// It answered ok at least once: it got ready and may serve.
    pub ever_ready: bool,
    /// Its last answer was ok.
    pub ready: bool,
    /// Looks in a row that failed (timed out or not ok) since the last ok.
    pub failures: u32,
    /// Looks in a row whose answer showed it broken: `/readyz` ok, 404 for kcp's own APIs.
    pub broken_looks: u32,
    /// When it last answered ok.
    pub last_ok_at: Option<DateTime<Utc>>,
    /// When it last answered anything (a failing `/readyz`, or its store-free ping): a kcp whose
    /// store is away answers, a wedged one does not.
    pub last_alive_at: Option<DateTime<Utc>>,
    /// What the last failed look saw.
    pub problem: Option<String>,
}

/// Failed looks in a row that take a serving slot out of the front.
pub const UNRESPONSIVE_AFTER: u32 = 2;

impl Health {
    /// The health of a slot whose look at `now` found it serving.
    pub fn serving(now: DateTime<Utc>) -> Health {
        Health {
            ever_ready: true,
            ready: true,
            failures: 0,
            broken_looks: 0,
            last_ok_at: Some(now),
            last_alive_at: Some(now),
            problem: None,
        }
    }

    /// A slot that served and has failed [`UNRESPONSIVE_AFTER`] looks in a row.
    pub fn unresponsive(&self) -> bool {
        self.ever_ready && self.failures >= UNRESPONSIVE_AFTER
    }

    /// [`UNRESPONSIVE_AFTER`] looks in a row showed it broken: it will never serve (kcp redoes no
    /// lost bootstrap step; docs/reliability.md), so it is replaced at once.
    pub fn broken(&self) -> bool {
        self.broken_looks >= UNRESPONSIVE_AFTER
    }
}

/// Why kcpshard stopped (or is stopping) a slot: recorded before the signal, so an exit that
/// follows is expected, not a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopCause {
    /// It left the front for a newer slot (a roll) or was one more than spec.slots.
    Retired,
    /// A new slot, not ready, stopped to be started again.
    Restart,
    /// A new slot stopped because the roll cannot go on.
    Abort,
    /// It served, then stopped answering for livenessTimeout.
    Unresponsive,
    /// It did not exit within drainTimeout after SIGTERM.
    DrainTimeout,
    /// The shard is being deleted.
    Deleting,
    /// Its record was written but its process never started (serve stopped in between).
    NeverStarted,
    /// Every slot stops for a restore of a store snapshot.
    Restore,
}

/// A signal kcpshard sent a slot, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopRecord {
    pub cause: StopCause,
    pub at: DateTime<Utc>,
    /// SIGKILL was sent (else SIGTERM only).
    #[serde(default)]
    pub killed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SlotObservation {
    pub name: String,
    pub template: SlotTemplate,
    /// The recorded process is alive (same pid, same start time).
    pub running: bool,
    pub started_at: DateTime<Utc>,
    pub health: Health,
    /// Its port has a listener (it stops listening after SIGTERM, once its shutdown delay ends).
    pub listening: bool,
    /// When it was first seen not listening after SIGTERM.
    pub stopped_listening_at: Option<DateTime<Utc>>,
    /// What kcpshard sent it, if anything.
    pub stop: Option<StopRecord>,
    /// When the front last stopped sending it new connections.
    pub left_front_at: Option<DateTime<Utc>>,
    /// What only this slot uses of the store runs (its own kine, on KinePostgres).
    pub own_store_running: bool,
    /// A slot that is gone: how it ended (exit status, the last error it printed, its log), for
    /// the events and conditions that report it.
    pub last_words: Option<String>,
}

impl SlotObservation {
    /// Sent SIGTERM (or SIGKILL) by kcpshard.
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// Answers `/readyz` now and was not told to stop: may join the front.
    pub fn can_join(&self) -> bool {
        self.running && !self.stopping() && self.health.ready
    }

    /// May stay in the front: it served and has not failed too many looks in a row.
    pub fn can_stay(&self) -> bool {
        self.running && !self.stopping() && self.health.ever_ready && !self.health.unresponsive()
    }
}

/// Who holds the controllers' Lease (`kube-system/kcp-controllers` in `system:admin`), matched
/// against the identity each slot's kcp logged when its leader election started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseHolder {
    /// Not read (no slot answers to read it through).
    Unknown,
    /// No Lease, or no holder: nothing to release.
    Free,
    /// This slot holds it.
    Slot(String),
    /// A holder that is none of the running slots, and every running slot's identity is known: a
    /// process that is gone.
    Gone,
    /// A holder that matches no slot whose identity is known, while some running slot's is not:
    /// it may be that slot, so it is left alone.
    Unmatched,
}

/// A roll that could not go on, kept until the spec changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocked {
    pub template: SlotTemplate,
    pub cause: BlockCause,
}

/// Why a roll cannot go on. Each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum BlockCause {
    /// The binary for the version does not exist.
    NoBinary { path: String },
    /// The new slot did not answer `/readyz` in time.
    SlotNotReady { slot: String, timeout_seconds: u64 },
    /// The new slot answered `/readyz` but not kcp's own APIs, also after a restart.
    SlotBroken {
        slot: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// The new slot's process exited before it was ready.
    SlotCrashed {
        slot: String,
        /// The last line kcp printed, and where its log is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// spec.rollout does not allow this version change.
    VersionRefused { message: String },
    /// The new version, run alone on a copy of the data, exited, missed readinessTimeout or got
    /// no workspace Ready.
    PreflightFailed { version: String, detail: String },
    /// The new version changed kcp's own schemas or storage versions on the copy, and
    /// spec.rollout.allowMinorVersionChange is off.
    PreflightSchemaChanged { version: String, changes: Vec<String> },
    /// A non-root shard's root shard is missing, not a root, or not Ready.
    RootShardNotReady { message: String },
}

impl BlockCause {
    /// The CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            BlockCause::NoBinary { .. } => "BinaryMissing",
            BlockCause::SlotNotReady { .. } => "SlotNotReady",
            BlockCause::SlotBroken { .. } => "SlotBroken",
            BlockCause::SlotCrashed { .. } => "SlotCrashed",
            BlockCause::VersionRefused { .. } => "VersionChangeRefused",
            BlockCause::PreflightFailed { .. } => "PreflightFailed",
            BlockCause::PreflightSchemaChanged { .. } => "PreflightSchemaChanged",
            BlockCause::RootShardNotReady { .. } => "RootShardNotReady",
        }
    }

    /// The spec changed in a way that answers this cause without a new template: a slot that was
    /// not ready in time is tried again once spec.rollout.readinessTimeout is raised.
    pub fn lifted_by(&self, desired: &Desired) -> bool {
        match self {
            BlockCause::SlotNotReady { timeout_seconds, .. } => desired.readiness_timeout.as_secs() > *timeout_seconds,
            BlockCause::PreflightSchemaChanged { .. } => desired.allow_schema_change,
            _ => false,
        }
    }

    /// What happened and what to do about it.
    pub fn message(&self) -> String {
        match self {
            BlockCause::NoBinary { path } => format!(
                "no kcp binary at {path}: install it (hack/install-deps.sh builds bin/kcp-<version>) or set spec.version or spec.kcp.binary to one that exists; the running slots keep serving"
            ),
            BlockCause::SlotNotReady { slot, timeout_seconds } => format!(
                "slot {slot} did not answer /readyz on its own port within {timeout_seconds}s and was stopped; the old slots keep serving. See the slot's log under the state dir, then fix spec.version, spec.kcp or raise spec.rollout.readinessTimeout to retry"
            ),
            BlockCause::SlotBroken { slot, detail } => format!(
                "slot {slot} answered /readyz but not kcp's own APIs ({}), also when started again, and was stopped; the old slots keep serving. See the slot's log under the state dir; its store may be failing writes",
                detail.as_deref().unwrap_or("404")
            ),
            BlockCause::SlotCrashed { slot, detail } => format!(
                "slot {slot} exited before it was ready{}; the old slots keep serving. Fix spec.version or spec.kcp to retry",
                detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
            ),
            BlockCause::VersionRefused { message } | BlockCause::RootShardNotReady { message } => message.clone(),
            BlockCause::PreflightFailed { version, detail } => format!(
                "the preflight of kcp {version} on a copy of the data failed: {detail}; the old slots keep serving, no slot of {version} was started. Fix spec.version or spec.kcp to try again (the preflight reruns for a changed spec), or set spec.rollout.preflight to false to roll without it"
            ),
            BlockCause::PreflightSchemaChanged { version, changes } => format!(
                "the preflight of kcp {version} on a copy of the data changed kcp's own schemas ({}); a roll back would need the snapshot. Set spec.rollout.allowMinorVersionChange to roll anyway; the old slots keep serving",
                changes.join("; ")
            ),
        }
    }
}

/// The probe of a roll: a throwaway workspace that reaches Ready once a leader runs kcp's
/// controllers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeRecord {
    pub workspace: String,
    pub created_at: DateTime<Utc>,
}

/// The roll in progress, persisted so that a restarted controller carries on where it stopped.
/// What cannot be observed (the probe's workspace, what served before) is recorded here; each time
/// is the latest of its kind (the last new slot started, the last old slot that stopped listening),
/// for status.lastRoll.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollRecord {
    /// The version the front served when the roll began, if any.
    pub from_version: Option<String>,
    /// The version the roll started for (status says, once it completes, what serves).
    pub to_version: String,
    /// The template the roll started for: a spec change mid-roll starts a roll of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<SlotTemplate>,
    pub started_at: DateTime<Utc>,
    pub new_slot_started_at: Option<DateTime<Utc>>,
    pub new_slot_ready_at: Option<DateTime<Utc>>,
    /// When a new slot last joined the front.
    pub front_switched_at: Option<DateTime<Utc>>,
    /// When the last old slot stopped listening after SIGTERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_slot_stopped_listening_at: Option<DateTime<Utc>>,
    pub old_slot_exited_at: Option<DateTime<Utc>>,
    pub lease_released_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeRecord>,
    pub probe_succeeded_at: Option<DateTime<Utc>>,
    /// The store snapshot taken before this roll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// When the store was last seen down while a new slot was starting. A kcp whose store goes
    /// away during its start-up may never get ready once the store is back (its informers never
    /// sync: docs/reliability.md), so that slot is started again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_down_at: Option<DateTime<Utc>>,
    /// How often a new slot was started again after it missed readinessTimeout or was broken.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_ready_restarts: u32,
    /// How many slots were found broken (`/readyz` ok, 404 for kcp's own APIs) and replaced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub broken_slots: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The outcome of a preflight, as the plan reads it.
pub use crate::api::PreflightResult;

/// The preflight of a template: its record (written before anything of it starts) and its kcp.
#[derive(Debug, Clone, PartialEq)]
pub struct PreflightObservation {
    /// The template whose version it runs.
    pub template: SlotTemplate,
    pub started_at: DateTime<Utc>,
    pub run: PreflightRun,
    /// Recorded once the checks ended (or failed).
    pub result: Option<PreflightResult>,
    /// What it left in the store (Failed) or changed (SchemaChanged), for the block's message.
    pub detail: Vec<String>,
    /// Not all of it is removed yet (its kcp, its kine, the copy, a scratch database): cleared
    /// only once everything is gone, so that a crash leaves nothing behind unnoticed.
    pub leftovers: bool,
}

/// Where the preflight's kcp is.
#[derive(Debug, Clone, PartialEq)]
pub enum PreflightRun {
    /// Recorded, but its kcp never started (serve stopped in between).
    NeverStarted,
    /// Its kcp runs.
    Running {
        /// It answered `/readyz` on its own port.
        ready: bool,
        /// The probe workspace made on it.
        probe: Option<ProbeRecord>,
        probe_ready: bool,
    },
    /// Its kcp is gone: how it ended (its last error line and log).
    Exited { last_words: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub now: DateTime<Utc>,
    /// The store accepts connections and answers a read (and every running slot's own kine, for
    /// KinePostgres).
    pub store_up: bool,
    /// Why the store is not up (PostgreSQL's own error, a kine that is down), for StoreReady.
    pub store_problem: Option<String>,
    /// A kine kcpshard runs runs but does not answer reads: it is replaced.
    pub store_unresponsive: bool,
    /// kcpshard runs processes for the shard-wide store (kine over sqlite, a managed PostgreSQL)
    /// and they are up: deleting the shard stops them. An external store is not ours to stop.
    pub store_processes_up: bool,
    /// The template the latest store snapshot was taken for.
    pub snapshot_for: Option<SlotTemplate>,
    pub front: FrontObservation,
    /// Why the front is down (caddy's admin API does not answer, ...), for FrontReady.
    pub front_problem: Option<String>,
    /// kcpshard's front runs an older binary than this controller: EnsureFront upgrades it.
    pub front_outdated: bool,
    /// kcpshard runs the front (Tcp); a caddy is the user's, and deleting the shard leaves it.
    pub front_ours: bool,
    /// The front runs, but on another address than spec.front.listen (the spec changed).
    pub front_elsewhere: bool,
    pub slots: Vec<SlotObservation>,
    /// Slots whose kcp runs (found by its root directory) but whose record is missing or was moved
    /// aside: their record is rebuilt from the process before anything else.
    pub unrecorded: Vec<String>,
    pub lease: LeaseHolder,
    /// Whether the roll's probe workspace is Ready.
    pub probe_ready: bool,
    /// A filesystem of the state dir or the store's data below its watermark.
    pub disk: Option<crate::store::disk::DiskProblem>,
    /// When the store's processes kcpshard runs last started (a kine, a managed PostgreSQL's
    /// postmaster, a slot's own kine): one that started after a slot did went away during that
    /// slot's start-up, even if no look landed in the outage.
    pub store_started_at: Option<DateTime<Utc>>,
    pub roll: Option<RollRecord>,
    pub blocked: Option<Blocked>,
    /// The latest preflight, if any.
    pub preflight: Option<PreflightObservation>,
    /// The latest restore of a store snapshot, if any was asked for.
    pub restore: Option<RestoreRecord>,
    /// The kcp version that last served the shard's data (recorded beside the store before a
    /// slot of a new version starts), if any did.
    pub data_version: Option<String>,
    /// The spec whose interim slot exited before it was ready (see [`Desired::interim`]).
    pub interim_crashed_for: Option<SlotTemplate>,
    /// spec.store names another store than the one the shard's data is in, which the shard keeps
    /// running on: why, and what to do.
    pub store_refused: Option<String>,
    /// The records of kines of this shard that run but serve nothing it uses (observe.rs).
    pub orphaned_kines: Vec<String>,
    /// The shard's job (a dump, a restore), while it has one.
    pub job: Option<JobObservation>,
}

impl Observed {
    pub fn slot(&self, name: &str) -> Option<&SlotObservation> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// The front sends new connections to a slot that may stay there.
    pub fn front_serves(&self) -> bool {
        self.front
            .backends()
            .iter()
            .filter_map(|b| self.slot(b))
            .any(|s| s.can_stay())
    }
}

/// Why the front's serving set changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontChange {
    /// The slots new connections go to after the change.
    pub backends: Vec<String>,
    pub joined: Vec<String>,
    /// The slots that leave, each with why.
    pub left: Vec<(String, LeaveCause)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveCause {
    /// A newer slot took its place, or it is one more than spec.slots.
    Replaced,
    /// It failed [`UNRESPONSIVE_AFTER`] looks in a row.
    Unresponsive,
    /// Its process is gone.
    Exited,
}

/// Why a slot is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillCause {
    /// It served, and has not answered `/readyz` for livenessTimeout.
    Unresponsive { seconds: u64 },
    /// It served, and now answers `/readyz` but not kcp's own APIs.
    Broken,
    /// Sent SIGTERM, it did not exit within drainTimeout.
    DrainTimeout { seconds: u64 },
}

/// Why a new slot, not ready yet, is started again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartCause {
    /// Its start-up overlapped a store outage, after which kcp's informers may never sync.
    StoreOutage,
    /// It did not answer /readyz within readinessTimeout.
    NotReady { timeout_seconds: u64 },
    /// It answers `/readyz` but not kcp's own APIs.
    Broken,
}

/// What is waited for, when nothing can be done now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A new slot's `/readyz`.
    Ready { slot: String },
    /// Connections pinned to a slot that left the front, before it gets SIGTERM.
    Settle { slot: String, remaining: Duration },
    /// A slot sent SIGTERM: it stops listening, drains and exits.
    Exit { slot: String },
    /// The probe workspace to reach Ready.
    Probe,
    /// The preflight's kcp to answer `/readyz`, or its probe workspace to reach Ready.
    Preflight,
    /// The running job (a dump, a restore: its [`JobKind::name`]) to end.
    Job { job: &'static str },
}

/// Why a preflight failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreflightFailure {
    /// Its kcp exited (with its last error line and log).
    Exited { last_words: String },
    /// Its kcp did not answer `/readyz` within readinessTimeout.
    NotReady { timeout_seconds: u64 },
    /// Its probe workspace did not reach Ready within readinessTimeout.
    ProbeTimeout { timeout_seconds: u64 },
}

/// The one thing to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A slot's kcp runs without a record: rebuild the record from its command line (it is then
    /// replaced by a roll, since what argv does not tell is lost).
    AdoptSlot {
        name: String,
    },
    EnsureStore,
    /// A kine kcpshard runs does not answer reads: kill it (EnsureStore starts it again on the same
    /// port).
    KillStore,
    EnsureFront,
    /// kcpshard's front does not answer on its control socket: kill it by its recorded pid
    /// (EnsureFront starts it again).
    KillFront,
    /// Start dumping the store before a roll to a new version (docs/background.md section 6): a
    /// job (job.rs), whose end FinishJob takes up.
    Snapshot,
    /// A job ended: take up its result (a dump kept and recorded, a restore's version recorded),
    /// or report how it failed; the record goes.
    FinishJob,
    /// Kill the running job: the spec no longer wants it (another version, the shard deleted) or
    /// another job must run.
    CancelJob,
    /// Record a preflight of the desired template, copy the data and start its kine and kcp on
    /// the copy (for a store that is not copied, record it as skipped).
    StartPreflight,
    /// The preflight's kcp answers `/readyz`: free the copied controllers' Lease (its holder runs
    /// on the real data, not on the copy) and create a probe workspace on it.
    PreflightProbe,
    /// The probe workspace on the copy is Ready: compare kcp's own schemas on the copy with the
    /// serving slots' and record the result.
    ComparePreflight,
    /// Record the preflight as failed.
    FailPreflight {
        cause: PreflightFailure,
    },
    /// Stop the preflight's kcp and kine, remove the copy and the scratch database; a preflight
    /// that never started is forgotten (and started again).
    RemovePreflight,
    /// Take up a restore request: record it (the shard goes down for it) and drop the annotation.
    BeginRestore(Restorable),
    /// Drop a restore request that cannot be done, saying why.
    RefuseRestore {
        message: String,
    },
    /// Every slot is gone: start restoring the snapshot into the store (a job; FinishJob records
    /// its version as the data's).
    RestoreSnapshot,
    /// A slot of the restored version serves: the restore is complete.
    CompleteRestore,
    /// Start a slot with the desired template.
    StartSlot {
        name: String,
    },
    /// Nothing serves while the preflight of a new version runs (the old slot exited, or none ran:
    /// a re-created shard): start a slot of the template that last served the data, which serves
    /// until the roll replaces it. It begins no roll.
    StartInterim {
        name: String,
    },
    /// Change the slots the front sends new connections to.
    SetFront(FrontChange),
    /// SIGTERM a slot that left the front; it stops listening after its shutdown delay and drains.
    TerminateSlot {
        name: String,
    },
    /// SIGKILL a slot.
    KillSlot {
        name: String,
        cause: KillCause,
    },
    /// A slot that stopped listening has had time to finish what it admitted: close the front's
    /// connections to it (watches re-watch through the serving slots).
    CloseConnections {
        name: String,
    },
    /// Stop what only this slot used of the store (its own kine), after its kcp exited.
    StopSlotStore {
        name: String,
    },
    /// A slot's process is gone (and its own store): drop its records. `crashed` when kcpshard did
    /// not stop it.
    RemoveSlot {
        name: String,
        crashed: bool,
    },
    /// Stop a new slot, not ready yet, for the reason given; it is started again for the same roll.
    RestartSlot {
        name: String,
        cause: RestartCause,
    },
    /// Stop the new slot and remember that this spec cannot roll.
    AbortRoll {
        name: String,
        cause: BlockCause,
    },
    /// Delete the controllers' Lease, whose holder is gone or can no longer renew it (it stopped
    /// listening), so a serving slot leads within kcp's retry period instead of after 60 s.
    ReleaseLease {
        holder: Option<String>,
    },
    /// Create the probe workspace.
    Probe,
    /// The probe workspace is Ready: record it and remove the workspace.
    ProbeSucceeded,
    CompleteRoll,
    /// Deleting: what kcpshard runs for the shard-wide store, then the front.
    StopStore,
    /// Deleting: a kine of the shard that serves nothing it uses (its record's path).
    StopOrphanedKine {
        record: String,
    },
    StopFront,
    /// Nothing to do until the spec changes; the running slots keep serving.
    Blocked {
        cause: BlockCause,
    },
    /// Nothing to do now: look again when it may have happened.
    Wait(Wait),
    /// Converged.
    Idle,
}

impl Step {
    /// The step's kind, as logs and metrics name it.
    pub fn name(&self) -> &'static str {
        match self {
            Step::AdoptSlot { .. } => "AdoptSlot",
            Step::EnsureStore => "EnsureStore",
            Step::KillStore => "KillStore",
            Step::EnsureFront => "EnsureFront",
            Step::KillFront => "KillFront",
            Step::Snapshot => "Snapshot",
            Step::StartPreflight => "StartPreflight",
            Step::PreflightProbe => "PreflightProbe",
            Step::ComparePreflight => "ComparePreflight",
            Step::FailPreflight { .. } => "FailPreflight",
            Step::RemovePreflight => "RemovePreflight",
            Step::BeginRestore(_) => "BeginRestore",
            Step::RefuseRestore { .. } => "RefuseRestore",
            Step::RestoreSnapshot => "RestoreSnapshot",
            Step::CompleteRestore => "CompleteRestore",
            Step::FinishJob => "FinishJob",
            Step::CancelJob => "CancelJob",
            Step::StartSlot { .. } => "StartSlot",
            Step::StartInterim { .. } => "StartInterim",
            Step::SetFront(_) => "SetFront",
            Step::TerminateSlot { .. } => "TerminateSlot",
            Step::KillSlot { .. } => "KillSlot",
            Step::CloseConnections { .. } => "CloseConnections",
            Step::StopSlotStore { .. } => "StopSlotStore",
            Step::RemoveSlot { .. } => "RemoveSlot",
            Step::RestartSlot { .. } => "RestartSlot",
            Step::AbortRoll { .. } => "AbortRoll",
            Step::ReleaseLease { .. } => "ReleaseLease",
            Step::Probe => "Probe",
            Step::ProbeSucceeded => "ProbeSucceeded",
            Step::CompleteRoll => "CompleteRoll",
            Step::StopStore => "StopStore",
            Step::StopOrphanedKine { .. } => "StopOrphanedKine",
            Step::StopFront => "StopFront",
            Step::Blocked { .. } => "Blocked",
            Step::Wait(_) => "Wait",
            Step::Idle => "Idle",
        }
    }
}
