//! What the controller records in its files and the plan reads back: rolls, blocks, stops,
//! probes and restores, and the messages that tell an operator about them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::*;

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
    /// spec.adopt names a kcp kcpshard cannot take over (src/adopt): why, and what to do.
    AdoptionRefused { message: String },
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
            BlockCause::AdoptionRefused { .. } => "AdoptionFailed",
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
            BlockCause::VersionRefused { message }
            | BlockCause::RootShardNotReady { message }
            | BlockCause::AdoptionRefused { message } => message.clone(),
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

/// A change of a caddy front's upstreams, made at `since`, to be checked as a client would
/// (caddy terminates TLS and may be misconfigured in ways its admin API does not show): `/readyz`
/// through the front.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontCheck {
    pub since: DateTime<Utc>,
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
    /// Set when this is no roll but the replacement of a slot that crashed or was killed while it
    /// served: status.lastReplacement, not status.lastRoll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<GoneSlot>,
}

/// A slot that served and crashed or was killed (not one retired by a roll): the next slot
/// started for its template replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoneSlot {
    pub slot: String,
    /// Why it went, in words: "crashed: <what kcp last wrote>", "killed: ...".
    pub cause: String,
    pub gone_at: DateTime<Utc>,
    pub template: SlotTemplate,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
