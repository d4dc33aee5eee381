//! What the plan reads of the spec: the desired state.
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// spec.store names another store than the data is in: a move (plan/migration.rs).
    pub store_move: Option<super::StoreMove>,
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
    /// The kcpshard.io/snapshotRequestedAt annotation: a value no snapshot was taken for yet asks
    /// for one.
    pub snapshot_request: Option<String>,
    /// spec.backup.interval: a snapshot is due this long after the last one.
    pub backup_interval: Option<Duration>,
    /// A restore replaces the store's files, so the store's own processes stop first (a KineSqlite
    /// store's kine); otherwise it is restored through the running store (pg_restore).
    pub restore_stops_store: bool,
    /// The template that last started on the data, when that was another version than the spec's
    /// and its binary is still there (with today's identities and sharding): while the preflight
    /// of the spec's version runs and nothing serves, a slot of it serves meanwhile.
    pub interim: Option<SlotTemplate>,
    /// The `kcpshard.io/rotateCredentialsAt` annotation: a value the identities were not issued
    /// for asks for a new admin identity.
    pub rotation_request: Option<String>,
    /// spec.adopt.rootDirectory: a kcp to take over.
    pub adopt: Option<std::path::PathBuf>,
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
