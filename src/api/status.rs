//! The status of a `KcpShard`: what the controller observed and did (the slots it runs, the
//! front, the store, the last roll's timings, the preflight and the last restore, conditions).
//! Written only by the controller, through `/status`; every field's doc comment is its
//! description in the CRD.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kcpshard::StoreType;

/// What the controller observed and did. Written only by the controller, through /status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KcpShardStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the shard is in its life cycle: Pending, Progressing (a roll runs), Ready, Degraded
    /// (no slot serves, or a roll failed) or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The slots the front forwards new connections to, comma-separated (e.g. "a" or "a,b").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_slot: Option<String>,
    /// The kcp version the slots behind the front run (the oldest, if they differ): it differs
    /// from spec.version while a roll runs or when one was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The slots that exist: those that serve and, during a roll, the new one and the old ones
    /// that drain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub slots: Vec<SlotStatus>,
    /// The front as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front: Option<FrontStatus>,
    /// The store as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreStatus>,
    /// When each step of the latest roll happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_roll: Option<RollStatus>,
    /// When each step of the latest replacement of a slot that crashed or was killed happened:
    /// which slot, why, and its new slot's start, readiness and place in the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replacement: Option<RollStatus>,
    /// The latest preflight: the new version run alone on a copy of the data before a roll to it
    /// (spec.rollout.preflight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightStatus>,
    /// The latest snapshot of the store taken on request (`kcpshard snapshot create`, the
    /// kcpshard.io/snapshotRequestedAt annotation) or on schedule (spec.backup.interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<SnapshotStatus>,
    /// The latest restore of a store snapshot (the kcpshard.io/restoreSnapshot annotation), under
    /// way or done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restore: Option<RestoreStatus>,
    /// The latest move of the data to another store (a change of spec.store), under way or done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStatus>,
    /// The take-over of a kcp that ran outside kcpshard (spec.adopt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<AdoptionStatus>,
    /// The latest observations of the shard's state. Ready is True when the front forwards to a
    /// slot that answers /readyz.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Where the shard is in its life cycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    Pending,
    Progressing,
    Ready,
    Degraded,
    Deleting,
}

impl Phase {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Progressing => "Progressing",
            Phase::Ready => "Ready",
            Phase::Degraded => "Degraded",
            Phase::Deleting => "Deleting",
        }
    }
}

/// One kcp process serving the shard.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotStatus {
    /// The slot's name, a to d; its directory under the shard's `slots/` is named after it.
    pub name: String,
    /// The kcp release the slot runs.
    pub version: String,
    /// Process id of the slot's kcp, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The slot's own secure port on loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// Whether the slot answered /readyz on its own port at the last observation.
    pub ready: bool,
    /// Whether the front sends it new connections.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serving: bool,
    /// Whether it holds the kcp-controllers Lease: its kcp runs kcp's controllers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leader: bool,
    /// What is wrong with it, if anything: its last failed /readyz, or that it is stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the slot's process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The kcpshard.io/restartedAt annotation the slot was started for: a restart request is taken
    /// up once the active slot carries its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
}

/// The front as observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FrontStatus {
    /// The address the front listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// The host:port of each slot the front forwards new connections to, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// The store as observed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreStatus {
    /// The kind of store in use.
    #[serde(rename = "type")]
    pub type_: StoreType,
    /// The etcd-protocol endpoints slots use (a kine's listen address, or the etcd members).
    /// Never includes a password.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub endpoints: Vec<String>,
    /// Whether the store accepted connections at the last observation.
    pub ready: bool,
    /// Since when the shard's data is in this store: the first start of a slot on it, or the end of
    /// a move into it (status.migration). A KcpShard created again under the same name runs on
    /// this store until its directory is moved aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_since: Option<Time>,
    /// Why the store is not ready, or what it is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// When each step of a roll happened (docs/architecture.md, "The steps"), and what it rolled between. Times have
/// microseconds: the steps of a roll are often less than a second apart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollStatus {
    /// When the roll began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<MicroTime>,
    /// When the new slot's process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_slot_started_at: Option<MicroTime>,
    /// When the new slot first answered /readyz on its own port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_slot_ready_at: Option<MicroTime>,
    /// When the front began forwarding new connections to the new slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_switched_at: Option<MicroTime>,
    /// When the old slot, sent SIGTERM, stopped listening (after spec.kcp.shutdownDelay): from then
    /// on it leads no controllers, and the Lease is released while it drains its connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_slot_stopped_listening_at: Option<MicroTime>,
    /// When the old slot's process exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_slot_exited_at: Option<MicroTime>,
    /// When the kcp-controllers Lease was handed to a serving slot (taken from a holder that is
    /// gone or stopped listening), so that it leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_released_at: Option<MicroTime>,
    /// When a probe workspace reached phase Ready (a leader runs controllers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_succeeded_at: Option<MicroTime>,
    /// When the roll finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
    /// The version the old slot ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_version: Option<String>,
    /// The version the new slot runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_version: Option<String>,
    /// Path of the store snapshot taken before the roll, if one was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// lastReplacement: the slot that crashed or was killed while it served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_slot: Option<String>,
    /// lastReplacement: why it went ("crashed: <what kcp last wrote>", "killed: ...").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// lastReplacement: when its records went and the replacement could start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_at: Option<MicroTime>,
}

/// The outcome of a preflight.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PreflightResult {
    /// The new version started on the copy, its controllers took their Lease, and it changed none
    /// of kcp's own schemas or storage versions: the roll goes on.
    Compatible,
    /// The new version started and served, and changed kcp's own schemas or storage versions
    /// (see changes): the roll goes on only with spec.rollout.allowMinorVersionChange, and a roll
    /// back would need the snapshot.
    SchemaChanged,
    /// The new version exited, missed readinessTimeout for /readyz, or its controllers did not
    /// take their Lease on the copy within readinessTimeout (the message says which): the roll is
    /// blocked, the old slots serve on.
    Failed,
    /// The store is not copied (Etcd): no preflight ran.
    Skipped,
}

impl PreflightResult {
    pub fn as_str(self) -> &'static str {
        match self {
            PreflightResult::Compatible => "Compatible",
            PreflightResult::SchemaChanged => "SchemaChanged",
            PreflightResult::Failed => "Failed",
            PreflightResult::Skipped => "Skipped",
        }
    }
}

/// A preflight of one version on a copy of the data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightStatus {
    /// The version that was tried.
    pub version: String,
    /// Empty while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<PreflightResult>,
    /// What the new version changed in kcp's own resources, one line each (e.g. "CRD
    /// shards.core.kcp.io: storedVersions [v1alpha1] -> [v1alpha1 v1alpha2]").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub changes: Vec<String>,
    /// When it began (its copy of the data was asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<MicroTime>,
    /// When the copy of the data it runs on was complete (the copy is a job of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_at: Option<MicroTime>,
    /// When its kcp started on the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_at: Option<MicroTime>,
    /// When its result was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
    /// What happened: how long each check took, or why it failed (kcp's last error line and
    /// where its log is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A snapshot of the store taken on request or on schedule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The kcpshard.io/snapshotRequestedAt value it was taken for; unset when taken on schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The snapshot's path (`kcpshard snapshot restore` takes it, or its file name).
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was complete.
    pub taken_at: MicroTime,
}

/// A restore of a store snapshot: a planned outage (every slot stops, the snapshot is restored,
/// slots of the version that served the data in it start).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The kcpshard.io/restoreSnapshot value it was asked for with.
    pub request: String,
    /// Path of the snapshot restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The kcp version that served the data in the snapshot, which the slots run after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Stopping (every slot stops; the shard is down), Starting (restored; slots of the version
    /// start), Complete (a slot serves the restored data), or Refused (message says why).
    pub phase: String,
    /// Why it was refused, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the controller took the request up: from then on the shard is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<MicroTime>,
    /// When the snapshot was restored into the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<MicroTime>,
    /// When a slot served the restored data through the front again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
}

/// A move of the shard's data to another store while it serves (docs/how-to/stores.md, "Move a shard
/// to another store").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// Copying (into the new store), Following (every change applied as it is made; a slot
    /// starts on the new store, out of the front), Switching (the front holds new connections
    /// while the old slots stop and their last changes are applied), Switched (the new store
    /// serves; what ran the old one stops), Complete, or Failed (message says why).
    pub phase: String,
    /// The store the data was in.
    pub from: String,
    /// The store the data moves to.
    pub to: String,
    /// When the move began (spec.store was changed).
    pub started_at: MicroTime,
    /// When it ended: Complete or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
    /// Keys copied at one revision of the old store, before the following began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_keys: Option<u64>,
    /// Keys of the old store at its last revision that the mirror checked, before the switch
    /// ended, to be in the new store as of their last change (a difference fails the move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_keys: Option<u64>,
    /// Revisions of the old store not yet applied to the new, as the mirror last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// From when the front began to hold new connections to when the new store had the old
    /// store's last change, e.g. "2.1s": what a write in the switch waited at most, plus the
    /// front's change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_pause: Option<String>,
    /// The store the data was in, left as it was for the user to drop once satisfied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_store: Option<String>,
    /// Why it failed, and what was left where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The take-over of a running kcp (spec.adopt; docs/how-to/adopt.md, "Adopt a running kcp").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionStatus {
    /// Serving (its material is the shard's, it serves behind the front while its data moves:
    /// status.migration), Switched (it was stopped, the shard's slots serve), Complete, or Failed
    /// (message says why; the old kcp serves on untouched).
    pub phase: String,
    /// The kcp taken over: its release, process, address and store.
    pub from: String,
    /// When the take-over began.
    pub started_at: MicroTime,
    /// When it ended: Complete or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
    /// Why it failed, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
