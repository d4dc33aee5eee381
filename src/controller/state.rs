//! What the controller keeps on disk per shard, under `<state>/shards/<name>/`:
//!
//! ```text
//! controller.json        the roll in progress, a blocked spec, the last completed roll, the
//!                        latest snapshot and the latest restore of one
//! admin.kubeconfig       kcp through the front: contexts root and base (kcpshard's admin
//!                        identity, every slot accepts it) and system:admin (shard-admin)
//! shared/                key material every slot must share (docs/background.md 2), 0700, and
//!                        admin-identities.json: kcpshard's admin identities (credentials.rs)
//! slots/<a-d>/slot.json  the slot's template and port, written before its process starts; when
//!                        it joined and left the front, and what kcpshard sent it
//! slots/<a-d>/process.json, kcp.log, root/   its process record, log and kcp root directory
//! slots/<a-d>/admin-tokens.csv  the admin identities the slot accepts (--token-auth-file)
//! slots/<a-d>/store/     the slot's own kine (KinePostgres): record and log
//! store/                 the store's processes and data (kine and sqlite, or a managed PostgreSQL),
//!                        store.json (which store the data is in) and data-version.json
//! snapshots/             pg_dump files taken before version changes (KinePostgres)
//! job/                   the running job's process record and log (a dump, a restore)
//! preflight/             the latest preflight: its process record, kcp.log, the serving slots'
//!                        schemas it compares with (original.json), and copy/ (the copied data,
//!                        its kine, the kcp root and token file), removed after the preflight
//! front/                 the front's control socket, backend, pid and log
//! ```
//!
//! Everything else the controller needs after a crash is observed (processes, ports, `/readyz`,
//! the front's backend). Every file is written atomically before the step that depends on it.
//!
//! Longer than 600 lines on purpose: one file per record would scatter the layout above, which
//! readers and the records' loaders need in one place.
use std::io;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::plan::{
    Blocked, GoneSlot, JobFailure, JobRecord, ProcessStop, RestoreRecord, RollRecord, SlotTemplate, StopRecord,
};
use crate::api::PreflightResult;
use crate::fsutil;

/// The directories of one shard.
#[derive(Debug, Clone)]
pub struct ShardDirs {
    root: PathBuf,
}

impl ShardDirs {
    pub fn new(state_dir: &Path, shard: &str) -> ShardDirs {
        ShardDirs {
            root: state_dir.join("shards").join(shard),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn shared(&self) -> PathBuf {
        self.root.join("shared")
    }

    pub fn store(&self) -> PathBuf {
        self.root.join("store")
    }

    pub fn front(&self) -> PathBuf {
        self.root.join("front")
    }

    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// The kubeconfig users reach kcp with through the front, as kcpshard's admin identity.
    pub fn front_kubeconfig(&self) -> PathBuf {
        self.root.join("admin.kubeconfig")
    }

    /// kcpshard's admin identities of this shard (secret: 0600, with the shared material).
    pub fn identities(&self) -> PathBuf {
        self.shared().join("admin-identities.json")
    }

    /// The job's process record and log (`job/process.json`, `job/job.log`).
    pub fn job(&self) -> PathBuf {
        self.root.join("job")
    }

    pub fn preflight(&self) -> PreflightDirs {
        PreflightDirs {
            dir: self.root.join("preflight"),
        }
    }

    pub fn slot(&self, name: &str) -> SlotDirs {
        SlotDirs {
            dir: self.root.join("slots").join(name),
        }
    }

    fn controller_file(&self) -> PathBuf {
        self.root.join("controller.json")
    }

    /// Which kcp version last served the shard's data, beside the store (it stays when the
    /// KcpShard is deleted, and moves with a copied state dir).
    pub fn data_version_file(&self) -> PathBuf {
        self.store().join("data-version.json")
    }

    pub fn load_data_version(&self) -> io::Result<Option<DataVersion>> {
        read_json(&self.data_version_file())
    }

    pub fn save_data_version(&self, record: &DataVersion) -> io::Result<()> {
        std::fs::create_dir_all(self.store())?;
        write_json(&self.data_version_file(), record)
    }

    /// Which store the shard's data is in, beside the store (it stays when the KcpShard is
    /// deleted, and moves with a copied state dir).
    pub fn store_record_file(&self) -> PathBuf {
        self.store().join("store.json")
    }

    pub fn load_store_record(&self) -> io::Result<Option<StoreRecord>> {
        read_json(&self.store_record_file())
    }

    pub fn save_store_record(&self, record: &StoreRecord) -> io::Result<()> {
        std::fs::create_dir_all(self.store())?;
        write_json(&self.store_record_file(), record)
    }

    /// The controller's record for this shard (empty when there is none yet).
    pub fn load_state(&self) -> io::Result<ControllerState> {
        read_json(&self.controller_file()).map(Option::unwrap_or_default)
    }

    pub fn save_state(&self, state: &ControllerState) -> io::Result<()> {
        write_json(&self.controller_file(), state)
    }

    /// The slots that have a record.
    pub fn slot_records(&self) -> io::Result<Vec<SlotRecord>> {
        let mut records = Vec::new();
        for name in super::plan::SLOT_NAMES {
            if let Some(record) = read_json::<SlotRecord>(&self.slot(name).record())? {
                records.push(record);
            }
        }
        Ok(records)
    }
}

/// The files of one slot.
#[derive(Debug, Clone)]
pub struct SlotDirs {
    dir: PathBuf,
}

impl SlotDirs {
    /// kcp's `--root-directory`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    pub fn record(&self) -> PathBuf {
        self.dir.join("slot.json")
    }

    pub fn process(&self) -> PathBuf {
        self.dir.join("process.json")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("kcp.log")
    }

    /// What the slot runs of the store for itself (its kine, for KinePostgres).
    pub fn store(&self) -> PathBuf {
        self.dir.join("store")
    }

    /// The slot's `--token-auth-file`: the admin identities it accepts, written before it starts.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("admin-tokens.csv")
    }

    /// The kubeconfig kcp writes into its root on every start.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.root().join("admin.kubeconfig")
    }

    pub fn save(&self, record: &SlotRecord) -> io::Result<()> {
        write_json(&self.record(), record)
    }

    /// Changes the slot's record (which must exist) and saves it.
    pub fn update(&self, change: impl FnOnce(&mut SlotRecord)) -> io::Result<()> {
        let mut record = read_json::<SlotRecord>(&self.record())?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{} is gone", self.record().display())))?;
        change(&mut record);
        self.save(&record)
    }

    /// Drops the slot's records and its token file (no process reads it any more); its root
    /// directory and log stay for inspection.
    pub fn forget(&self) -> io::Result<()> {
        for file in [self.record(), self.process(), self.token_file()] {
            fsutil::remove_if_there(&file)?;
        }
        Ok(())
    }
}

/// The files of a shard's preflight.
#[derive(Debug, Clone)]
pub struct PreflightDirs {
    dir: PathBuf,
}

impl PreflightDirs {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Everything the preflight copies and makes: removed with it.
    pub fn copy(&self) -> PathBuf {
        self.dir.join("copy")
    }

    /// Its kcp's `--root-directory`.
    pub fn root(&self) -> PathBuf {
        self.copy().join("root")
    }

    /// Its `--token-auth-file` (secret, removed with the copy).
    pub fn token_file(&self) -> PathBuf {
        self.copy().join("admin-tokens.csv")
    }

    /// Its kcp's log: kept after the copy is removed, for a preflight that failed.
    pub fn log(&self) -> PathBuf {
        self.dir.join("kcp.log")
    }

    pub fn process(&self) -> PathBuf {
        self.dir.join("process.json")
    }

    /// kcp's own schemas as the serving slots had them when the preflight started.
    pub fn original(&self) -> PathBuf {
        self.dir.join("original.json")
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.root().join(crate::slot::material::ADMIN_KUBECONFIG)
    }
}

/// A preflight of one template (controller/preflight.rs), written before anything of it starts,
/// so that observe finds what it left after a crash of serve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightRecord {
    pub template: SlotTemplate,
    /// Its kcp's own secure port on loopback.
    pub port: u16,
    pub started_at: DateTime<Utc>,
    /// The scratch database the copy is restored into (KinePostgres), named before it is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_database: Option<String>,
    /// The dump taken for it (KinePostgres, when none was taken for the version change), once
    /// its job succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<String>,
    /// When the copy of the data was complete (its job succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_at: Option<DateTime<Utc>>,
    /// When its kcp started on the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_at: Option<DateTime<Utc>>,
    /// When its kcp first answered `/readyz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<DateTime<Utc>>,
    /// When the copied controllers' Lease was deleted through its kcp, for its own to take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_released_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<PreflightResult>,
    /// What the new version changed in kcp's own resources (SchemaChanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
    /// When its kcp, kine, copy and scratch database were all gone: until then it has leftovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_at: Option<DateTime<Utc>>,
}

/// A slot as decided before its process starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotRecord {
    pub name: String,
    pub template: SlotTemplate,
    pub port: u16,
    pub created_at: DateTime<Utc>,
    /// When it first joined the front: it got ready and served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_at: Option<DateTime<Utc>>,
    /// When the front last stopped sending it new connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_front_at: Option<DateTime<Utc>>,
    /// The signal kcpshard sent it, and why: written before the signal, so its exit is expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopRecord>,
    /// The store a move goes to, for a slot started on it before the switch (plan/migration.rs);
    /// None: the shard's store (its store record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::api::StoreSpec>,
}

/// The controller's memory of a shard: what cannot be observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll: Option<RollRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Blocked>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_roll: Option<CompletedRoll>,
    /// The latest replacement of a slot that crashed or was killed (a roll record with `replaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replacement: Option<CompletedRoll>,
    /// A slot that served, crashed or was killed, and is not replaced yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone: Option<GoneSlot>,
    /// The latest snapshot taken before a version change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotRecord>,
    /// The latest snapshot taken on request or on schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupRecord>,
    /// The latest kcpshard.io/snapshotRequestedAt value a snapshot was taken for (a scheduled
    /// snapshot after it does not make the request new again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_request_answered: Option<String>,
    /// The latest preflight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightRecord>,
    /// The latest restore of a snapshot (`kcpshard snapshot restore`), under way or done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreRecord>,
    /// The spec whose interim slot exited before it was ready: no interim slot starts again for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interim_crashed_for: Option<SlotTemplate>,
    /// The job under way (a dump, a restore), recorded before its process starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRecord>,
    /// The last job that failed, until one of its kind succeeds (it is tried again later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_failure: Option<JobFailure>,
    /// The processes asked to stop (the store's, a slot's kine, the front), recorded before the
    /// stop is sent; the latest per thing stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stops: Vec<ProcessStop>,
    /// A change of a caddy front's upstreams whose check through the front is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_check: Option<crate::controller::plan::FrontCheck>,
    /// The move of the data to another store under way, or the latest one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<crate::controller::plan::MigrationRecord>,
    /// The take-over of a kcp that ran outside kcpshard (spec.adopt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<crate::controller::plan::AdoptionRecord>,
}

/// The kcp version that last served a shard's data, written before a slot of another version
/// starts on it: a first slot (a re-created KcpShard, a state dir copied to another host) is
/// judged against the data by the same version rules as a roll, not only against what runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataVersion {
    pub version: String,
    /// When a slot of this version first started on the data.
    pub since: DateTime<Utc>,
    /// The template the last slot started on the data ran (none in records written before it
    /// was kept, or after a restore): what an interim slot runs while the preflight of a new
    /// version keeps that version's first slot waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<SlotTemplate>,
}

/// The store a shard's data is in, written before the first slot starts on it (and again when
/// the settings that reach it change). From then on the controller runs the shard on this store,
/// whatever spec.store says: a slot on another store would serve an empty kcp (docs/how-to/stores.md,
/// "Move a shard to another store").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreRecord {
    pub store: crate::api::StoreSpec,
    /// When the first slot started on it.
    pub since: DateTime<Utc>,
}

impl StoreRecord {
    /// The store the shard runs on, given spec.store: the spec's while it names the store the data
    /// is in (its other settings may change), the recorded one when it names another (until a
    /// move's switch); and, when kcpshard cannot move the data there, why, saying what to do.
    pub fn in_use(record: Option<&StoreRecord>, spec: &crate::api::StoreSpec, dirs: &ShardDirs) -> StoreInUse {
        let Some(record) = record else {
            return StoreInUse {
                store: spec.clone(),
                since: None,
                refused: None,
            };
        };
        match spec.moved_at(&record.store) {
            None => StoreInUse {
                store: spec.clone(),
                since: Some(record.since),
                refused: None,
            },
            Some(field) => StoreInUse {
                store: record.store.clone(),
                since: Some(record.since),
                // A move kcpshard can make is made (plan/migration.rs); until its switch the shard
                // runs on the store its data is in.
                refused: record.store.move_refused(spec).map(|why| {
                    format!(
                        "{field} names {} but the shard's data is in {} (since {}, {}), and {why}: the shard runs on the store its data is in. Put spec.store back as it was; to run the shard on the new store without its data, delete the KcpShard, move {} aside, and create it again",
                        spec.describe(),
                        record.store.describe(),
                        record.since.format("%Y-%m-%dT%H:%M:%SZ"),
                        dirs.store_record_file().display(),
                        dirs.store().display(),
                    )
                }),
            },
        }
    }
}

/// The store a shard runs on, and why, when it is not the one spec.store names.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreInUse {
    pub store: crate::api::StoreSpec,
    /// Since when the data is in it (None before the first slot started).
    pub since: Option<DateTime<Utc>>,
    pub refused: Option<String>,
}

/// A store snapshot taken before rolling to `template`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub template: SlotTemplate,
    pub path: String,
    pub taken_at: DateTime<Utc>,
}

/// A store snapshot taken on request (the kcpshard.io/snapshotRequestedAt value it was taken for)
/// or on schedule (no request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    pub path: String,
    pub bytes: u64,
    pub taken_at: DateTime<Utc>,
}

/// A finished roll, for `status.lastRoll`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedRoll {
    #[serde(flatten)]
    pub roll: RollRecord,
    pub completed_at: DateTime<Utc>,
}

/// A state file that exists but does not parse (edited by hand, or damaged on disk).
#[derive(Debug, thiserror::Error)]
#[error("{} does not parse: {reason}", path.display())]
pub struct CorruptFile {
    pub path: PathBuf,
    pub reason: String,
}

/// The state file (a controller or slot record, a process record) that `error` says cannot be
/// parsed, if that is what it is about.
pub fn corrupt_file(error: &super::Error) -> Option<PathBuf> {
    use crate::process::ProcessError::ParseRecord;
    match error {
        super::Error::Io(e) => e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<CorruptFile>())
            .map(|c| c.path.clone()),
        super::Error::Process(ParseRecord { path, .. })
        | super::Error::Store(crate::store::StoreError::Process(ParseRecord { path, .. })) => Some(path.clone()),
        _ => None,
    }
}

pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fsutil::read_optional(path)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                CorruptFile {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                },
            )
        }),
    }
}

pub(super) fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    bytes.push(b'\n');
    fsutil::write_atomically(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_state_round_trips_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        assert_eq!(dirs.load_state().unwrap(), ControllerState::default());
        let state = ControllerState {
            roll: Some(RollRecord {
                to_version: "v0.32.3".into(),
                started_at: Utc::now(),
                ..Default::default()
            }),
            ..Default::default()
        };
        dirs.save_state(&state).unwrap();
        assert_eq!(dirs.load_state().unwrap(), state);
    }

    /// Records only gain fields (absent in an older file: None) or lose them (ignored), so a
    /// newer release reads an older one's state dir as it is (docs/how-to/install.md, "Upgrade
    /// kcpshard itself"). The one change of meaning so far: a preflight recorded its probe
    /// workspace (`probe`) until it recorded the release of the copied Lease (`leaseReleasedAt`);
    /// a preflight that an older release left running reads as one whose Lease was not released
    /// yet, and is released once more (its kcp takes it again within its retry period).
    #[test]
    fn a_preflight_recorded_by_an_older_release_reads_as_one_whose_lease_is_not_released_yet() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        let now = Utc::now();
        let record = PreflightRecord {
            template: crate::controller::plan::tests::template("v0.31.2"),
            port: 7001,
            started_at: now,
            scratch_database: None,
            dump: None,
            copied_at: Some(now),
            launched_at: Some(now),
            ready_at: Some(now),
            lease_released_at: Some(now),
            result: None,
            changes: vec![],
            message: None,
            completed_at: None,
            removed_at: None,
        };
        let mut older = serde_json::to_value(ControllerState {
            preflight: Some(record.clone()),
            ..Default::default()
        })
        .unwrap();
        let preflight = older["preflight"].as_object_mut().unwrap();
        preflight.remove("leaseReleasedAt");
        preflight.insert(
            "probe".into(),
            serde_json::json!({ "workspace": "kcpshard-probe-1", "createdAt": now }),
        );
        std::fs::create_dir_all(dirs.root()).unwrap();
        std::fs::write(dirs.controller_file(), older.to_string()).unwrap();

        let read = dirs.load_state().unwrap().preflight.unwrap();
        assert_eq!(
            read,
            PreflightRecord {
                lease_released_at: None,
                ..record
            }
        );
    }

    #[test]
    fn a_state_file_that_does_not_parse_is_named_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        std::fs::create_dir_all(dirs.root()).unwrap();
        std::fs::write(dirs.controller_file(), b"\0\0{garbage").unwrap();
        let error = super::super::Error::from(dirs.load_state().unwrap_err());
        assert_eq!(corrupt_file(&error), Some(dirs.controller_file()));
        assert!(error.to_string().contains("controller.json does not parse"), "{error}");

        let slot = dirs.slot("a");
        std::fs::create_dir_all(slot.record().parent().unwrap()).unwrap();
        std::fs::write(slot.record(), b"{\"name\": 7}").unwrap();
        let error = super::super::Error::from(dirs.slot_records().unwrap_err());
        assert_eq!(corrupt_file(&error), Some(slot.record()));

        std::fs::write(slot.process(), b"garbage").unwrap();
        let error = super::super::Error::from(crate::process::Runtime::load(&slot.process()).unwrap_err());
        assert_eq!(corrupt_file(&error), Some(slot.process()));

        // A kine's record, as the store reports it.
        let kine = slot.store().join("kine.json");
        std::fs::create_dir_all(slot.store()).unwrap();
        std::fs::write(&kine, b"{").unwrap();
        let error = crate::process::Runtime::load(&kine).unwrap_err();
        let error = super::super::Error::from(crate::store::StoreError::from(error));
        assert_eq!(corrupt_file(&error), Some(kine));

        let other = super::super::Error::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(corrupt_file(&other), None);
    }

    #[test]
    fn a_shard_runs_on_the_store_its_data_is_in_whatever_spec_store_names() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        let sqlite: crate::api::StoreSpec = serde_yaml::from_str("type: KineSqlite").unwrap();
        let postgres: crate::api::StoreSpec =
            serde_yaml::from_str("{type: KinePostgres, kinePostgres: {host: 127.0.0.1, managed: true}}").unwrap();
        // No slot started yet: the spec's store.
        assert_eq!(dirs.load_store_record().unwrap(), None);
        let fresh = StoreRecord::in_use(None, &postgres, &dirs);
        assert_eq!(
            (fresh.store, fresh.since, fresh.refused),
            (postgres.clone(), None, None)
        );

        let since = "2026-12-04T10:00:00Z".parse().unwrap();
        let record = StoreRecord {
            store: sqlite.clone(),
            since,
        };
        dirs.save_store_record(&record).unwrap();
        let record = dirs.load_store_record().unwrap();
        // A store the data can move to: the data's store until the move's switch, nothing refused.
        let moving = StoreRecord::in_use(record.as_ref(), &postgres, &dirs);
        assert_eq!(
            (&moving.store, moving.since, &moving.refused),
            (&sqlite, Some(since), &None)
        );
        // One it cannot move to (another managed PostgreSQL): the data's store, and why.
        let in_postgres = StoreRecord {
            store: postgres.clone(),
            since,
        };
        let mut other_postgres = postgres.clone();
        other_postgres.kine_postgres.as_mut().unwrap().port = 5433;
        let moved = StoreRecord::in_use(Some(&in_postgres), &other_postgres, &dirs);
        assert_eq!(moved.store, postgres, "the data's store, not the spec's");
        assert_eq!(moved.since, Some(since));
        let why = moved.refused.unwrap();
        assert!(
            why.starts_with("spec.store.kinePostgres.port names KinePostgres (database kcp on the managed PostgreSQL at 127.0.0.1:5433) but the shard's data is in KinePostgres (database kcp on the managed PostgreSQL at 127.0.0.1:5432) (since 2026-12-04T10:00:00Z"),
            "{why}"
        );
        assert!(why.contains(&format!("move {} aside", dirs.store().display())), "{why}");

        // Other settings of the same store are the spec's.
        let mut reached_otherwise = postgres.clone();
        reached_otherwise.kine_postgres.as_mut().unwrap().user = "admin".into();
        let record = StoreRecord { store: postgres, since };
        let same = StoreRecord::in_use(Some(&record), &reached_otherwise, &dirs);
        assert_eq!((same.store, same.refused), (reached_otherwise, None));
    }
}
