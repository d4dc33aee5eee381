//! Restores of a store snapshot (`kcpshard snapshot restore`, the `kcpshard.io/restoreSnapshot`
//! annotation): whether a request can be done, judged before the plan sees it, with a refusal
//! that names the real cause and says what to do. The CLI asks the same questions before it sets
//! the annotation ([`refusal`]), so a user hears the answer at once; the controller's judgement,
//! with the snapshots directory at hand, is the one that counts.
//!
//! A restore starts the kcp version that served the data in the snapshot (the `<from>` of its
//! file name, `store/snapshot.rs`): newer kcp may have rewritten that data, older kcp cannot be
//! trusted to read what a newer one wrote (docs/how-to/upgrade.md, "Roll back"). So spec.version must
//! be that version when the restore is asked for; the restore itself never changes the spec
//! (which a GitOps checkout would change back).
use std::path::{Path, PathBuf};

use kube::ResourceExt;

use super::plan::{Restorable, RestoreRequest};
use super::state::ShardDirs;
use crate::api::{KcpShard, RESTORE_SNAPSHOT_ANNOTATION, StoreType};
use crate::store::snapshot::SnapshotName;

/// The restore the annotation asks for, if it is set, as judged.
pub fn request(shard: &KcpShard, dirs: &ShardDirs) -> Option<RestoreRequest> {
    let value = shard.annotations().get(RESTORE_SNAPSHOT_ANNOTATION)?.clone();
    Some(RestoreRequest {
        verdict: restorable(shard, dirs, &value),
        value,
    })
}

/// Where a request's value points: a path as given, or a file name in the shard's snapshots dir.
pub fn snapshot_path(dirs: &ShardDirs, value: &str) -> PathBuf {
    if value.contains('/') {
        PathBuf::from(value)
    } else {
        dirs.snapshots().join(value)
    }
}

fn restorable(shard: &KcpShard, dirs: &ShardDirs, value: &str) -> Result<Restorable, String> {
    let name = shard.name_any();
    let path = snapshot_path(dirs, value);
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(refused) = refusal(&name, shard.spec.store.type_, &shard.spec.version, &file_name) {
        return Err(refused);
    }
    if !path.is_file() {
        return Err(format!(
            "no snapshot at {}: `kcpshard snapshot list {name}` lists the shard's snapshots (in {})",
            path.display(),
            dirs.snapshots().display()
        ));
    }
    // Refused before the outage begins rather than failing once every slot has stopped.
    if shard.spec.store.type_ == StoreType::Etcd
        && let Err(missing) = crate::store::etcd_snapshot::EtcdTools::find()
    {
        return Err(missing.to_string());
    }
    let taken = SnapshotName::parse(&file_name).expect("refusal() checked the name");
    Ok(Restorable {
        path: std::path::absolute(&path).unwrap_or(path).display().to_string(),
        version: taken.from,
    })
}

/// Why shard `name` (with this store and spec.version) cannot restore the snapshot named
/// `file_name`, saying what to do; None when it can (as far as the name tells).
pub fn refusal(name: &str, store: StoreType, version: &str, file_name: &str) -> Option<String> {
    let Some(taken) = SnapshotName::parse(file_name) else {
        return Some(format!(
            "{file_name:?} is not a snapshot kcpshard took: its name must be <database>-<from>-to-<to>-<time>.dump (a pg_dump of KinePostgres), state-<from>-to-<to>-<time>.db (a copy of KineSqlite's state.db) or etcd-<from>-to-<to>-<time>.etcd (an etcd snapshot of an Etcd store), where <from> is the kcp version that served the data in it (`kcpshard snapshot list {name}` lists them)"
        ));
    };
    let taken_of = taken.format.store();
    if taken_of != store {
        return Some(format!(
            "snapshot {file_name} was taken of a {} store, and shard {name}'s store is {}: restore a snapshot of the store the shard uses (`kcpshard snapshot list {name}` lists them)",
            taken_of.as_str(),
            store.as_str()
        ));
    }
    if taken.from != version {
        return Some(format!(
            "snapshot {file_name} holds data that kcp {from} served{taken_before}, but spec.version is {version}: a restore starts the version that served the data. Set spec.version to {from} first (kubectl patch ks {name} --type merge -p '{{\"spec\":{{\"version\":\"{from}\"}}}}', or commit it to the manifest GitOps applies), then ask again. Until the restore the running slots keep serving {version}: the change back is refused as a downgrade, unless spec.rollout.allowDowngrade is true, in which case the shard first rolls back to {from} on the newer data",
            from = taken.from,
            taken_before = taken
                .to
                .as_ref()
                .map(|to| format!(" (it was taken before a roll from {} to {to})", taken.from))
                .unwrap_or_default(),
        ));
    }
    None
}

/// The snapshots of a shard, oldest first (`kcpshard snapshot list`).
pub fn snapshots(state_dir: &Path, shard: &str) -> Result<Vec<PathBuf>, crate::store::StoreError> {
    crate::store::snapshot::list(&ShardDirs::new(state_dir, shard).snapshots())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "kcp-v0.30.0-to-v0.31.2-20261201T180102.123Z.dump";
    const SQLITE: &str = "state-v0.30.0-to-v0.31.2-20261201T180102.123Z.db";
    const ETCD: &str = "etcd-v0.30.0-20261201T180102.123Z.etcd";

    #[test]
    fn a_snapshot_restores_only_into_the_store_it_was_taken_of_with_spec_version_its_data_version() {
        assert_eq!(refusal("dev", StoreType::KinePostgres, "v0.30.0", DUMP), None);
        let newer = refusal("dev", StoreType::KinePostgres, "v0.31.2", DUMP).unwrap();
        assert!(
            newer.contains("kcp v0.30.0 served")
                && newer.contains("spec.version is v0.31.2")
                && newer.contains(r#"kubectl patch ks dev --type merge -p '{"spec":{"version":"v0.30.0"}}'"#),
            "{newer}"
        );
        let sqlite = refusal("dev", StoreType::KineSqlite, "v0.30.0", DUMP).unwrap();
        assert!(
            sqlite.contains("taken of a KinePostgres store") && sqlite.contains("store is KineSqlite"),
            "{sqlite}"
        );
        assert_eq!(refusal("dev", StoreType::KineSqlite, "v0.30.0", SQLITE), None);
        let dump_into_postgres = refusal("dev", StoreType::KinePostgres, "v0.30.0", SQLITE).unwrap();
        assert!(
            dump_into_postgres.contains("taken of a KineSqlite store"),
            "{dump_into_postgres}"
        );
        let newer_sqlite = refusal("dev", StoreType::KineSqlite, "v0.31.2", SQLITE).unwrap();
        assert!(newer_sqlite.contains("kcp v0.30.0 served"), "{newer_sqlite}");
        let dump_into_etcd = refusal("dev", StoreType::Etcd, "v0.30.0", DUMP).unwrap();
        assert!(
            dump_into_etcd.contains("taken of a KinePostgres store") && dump_into_etcd.contains("store is Etcd"),
            "{dump_into_etcd}"
        );
        assert_eq!(refusal("dev", StoreType::Etcd, "v0.30.0", ETCD), None);
        let foreign = refusal("dev", StoreType::KinePostgres, "v0.30.0", "nightly.dump").unwrap();
        assert!(foreign.contains("not a snapshot kcpshard took"), "{foreign}");
    }

    #[test]
    fn a_request_names_a_file_in_the_snapshots_dir_or_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        assert_eq!(snapshot_path(&dirs, DUMP), dirs.snapshots().join(DUMP));
        assert_eq!(
            snapshot_path(&dirs, "/backups/x.dump"),
            PathBuf::from("/backups/x.dump")
        );
    }
}
