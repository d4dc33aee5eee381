//! The desired state of a shard, from its spec: the template its slots run, and whether a version
//! change is refused.
use std::path::{Path, PathBuf};

use super::*;

/// The desired state from the spec: the template every current slot must have (but for the admin
/// identities it accepts, which `step` adds from the observed record: [`plan::accepted`]).
pub fn desired(shard: &KcpShard, working_dir: &Path) -> Result<Desired, Error> {
    let spec = &shard.spec;
    let binary = working_dir.join(spec.kcp.binary_for(&spec.version));
    let template = SlotTemplate {
        version: spec.version.clone(),
        binary: binary.display().to_string(),
        extra_args: spec.kcp.extra_args.clone(),
        shutdown_delay: spec.kcp.shutdown_delay.clone(),
        front_url: front_url(&spec.front),
        restarted_at: shard.annotations().get(RESTARTED_AT_ANNOTATION).cloned(),
        // From the shard's identity record and what runs: `plan::accepted`, in `step`.
        accepted_identities: vec![],
        // From the root shard: `sharding::resolve`, in `step`.
        sharded: None,
    };
    Ok(Desired {
        binary_present: binary.is_file(),
        template,
        slots: spec.slots as usize,
        readiness_timeout: spec.rollout.readiness_timeout().map_err(|cause| Error::Duration {
            field: "spec.rollout.readinessTimeout",
            cause,
        })?,
        liveness_timeout: spec.rollout.liveness_timeout().map_err(|cause| Error::Duration {
            field: "spec.rollout.livenessTimeout",
            cause,
        })?,
        drain_timeout: spec.rollout.drain_timeout().map_err(|cause| Error::Duration {
            field: "spec.rollout.drainTimeout",
            cause,
        })?,
        deleting: shard.meta().deletion_timestamp.is_some(),
        version_refused: None,
        // From the store the data is in: in `step`.
        store_move: None,
        root_not_ready: None,
        // And a store that takes snapshots: the one in use, in `step`.
        snapshot_before_version_change: spec.rollout.snapshot_before_version_change,
        preflight: spec.rollout.preflight,
        allow_schema_change: spec.rollout.allow_minor_version_change,
        // Judged with the shard's files: `restore::request`, in `step`.
        restore: None,
        // From the store in use, in `step`.
        restore_stops_store: false,
        snapshot_request: shard.annotations().get(SNAPSHOT_REQUEST_ANNOTATION).cloned(),
        backup_interval: spec.backup.interval().transpose().map_err(|cause| Error::Duration {
            field: "spec.backup.interval",
            cause,
        })?,
        // From the data's record, once the template is whole: `interim`, in `step`.
        interim: None,
        rotation_request: shard.annotations().get(ROTATE_CREDENTIALS_ANNOTATION).cloned(),
        adopt: spec.adopt.as_ref().map(|a| PathBuf::from(&a.root_directory)),
    })
}

/// What an interim slot runs (see [`Desired::interim`]): the template last started on the data,
/// when it is of another version than the spec's and its binary is still there, with the
/// identities and sharding every slot takes now (a rotation or a root's move since it ran does
/// not make the interim slot a stranger).
pub(super) fn interim(desired: &Desired, data: Option<&state::DataVersion>) -> Option<SlotTemplate> {
    let recorded = data?.template.as_ref()?;
    if recorded.version == desired.template.version || !Path::new(&recorded.binary).is_file() {
        return None;
    }
    Some(SlotTemplate {
        front_url: desired.template.front_url.clone(),
        accepted_identities: desired.template.accepted_identities.clone(),
        sharded: desired.template.sharded.clone(),
        ..recorded.clone()
    })
}

/// Why spec.version may not roll from the version that serves: a roll is judged from the version
/// that served when it began, not from a half-rolled front; a first slot from the version that
/// last served the data (a re-created shard, a copied state dir), so that no kcp starts on data a
/// newer one has rewritten.
pub(super) fn version_refused(shard: &KcpShard, world: &observe::World, dirs: &ShardDirs) -> Option<String> {
    let from = world
        .state
        .roll
        .as_ref()
        .and_then(|r| r.from_version.clone())
        .or_else(|| world.serving_version());
    if let Some(from) = &from {
        return shard
            .spec
            .rollout
            .version_change(from, &shard.spec.version)
            .err()
            .map(|refused| format!("{refused}; the running slots keep serving"));
    }
    let data = world.data_version.as_ref()?;
    shard
        .spec
        .rollout
        .version_change(&data.version, &shard.spec.version)
        .err()
        .map(|refused| {
            format!(
                "no slot runs, and kcp {} last served this shard's data (since {}, {}): {refused}",
                data.version,
                data.since.format("%Y-%m-%dT%H:%M:%SZ"),
                dirs.data_version_file().display()
            )
        })
}

/// The URL clients reach the shard at: the front's address.
pub fn front_url(front: &crate::api::FrontSpec) -> String {
    format!("https://{}", front.listen)
}
