//! Snapshots of a shard's store, taken before a version change (docs/background.md section 6: a
//! roll to a new release may migrate stored objects, and only a copy taken before it can undo
//! that), while the store serves:
//! - KinePostgres: `pg_dump --format=custom` of the shard's database, `<database>-...dump`;
//! - KineSqlite: sqlite's `VACUUM INTO` of `state.db` (a consistent copy taken in one read
//!   transaction while kine writes on, `kcpshard job sqlite-copy`), `state-...db`;
//! - Etcd: etcd's own snapshot of one member (`kcpshard job etcd-snapshot`), `etcd-...etcd`.
//!
//! They go into `<shard>/snapshots/`, named `<stem>-<from>-to-<to>-<UTC time>.<extension>`:
//! `<from>` is the kcp version that served the data in it, which is the version a restore starts
//! again ([`SnapshotName`]). Only the newest `keep` stay. A restore (`kcpshard snapshot restore`,
//! docs/how-to/snapshots.md) puts one back with every slot stopped: a dump with [`restore_run`] in one
//! transaction, a sqlite copy over `state.db` with its kine stopped too, an etcd snapshot's keys
//! through the cluster's API ([`super::etcd_snapshot`]). The first two leave the data as it was
//! when they fail; a failed etcd restore is to be run again.
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::StoreError;
use super::managed::binary;
use super::postgres::PostgresServer;
use crate::api::StoreType;

/// What a snapshot file holds, told by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// A pg_dump (custom format) of a KinePostgres store's database.
    PgDump,
    /// A sqlite database: a copy of a KineSqlite store's `state.db`.
    Sqlite,
    /// An etcd snapshot (etcd's Maintenance API; `etcdutl snapshot restore` reads it) of an Etcd
    /// store.
    Etcd,
}

impl SnapshotFormat {
    pub const ALL: [SnapshotFormat; 3] = [SnapshotFormat::PgDump, SnapshotFormat::Sqlite, SnapshotFormat::Etcd];

    pub fn extension(self) -> &'static str {
        match self {
            SnapshotFormat::PgDump => "dump",
            SnapshotFormat::Sqlite => "db",
            SnapshotFormat::Etcd => "etcd",
        }
    }

    /// The store a snapshot of this format is taken of and restored into.
    pub fn store(self) -> StoreType {
        match self {
            SnapshotFormat::PgDump => StoreType::KinePostgres,
            SnapshotFormat::Sqlite => StoreType::KineSqlite,
            SnapshotFormat::Etcd => StoreType::Etcd,
        }
    }

    /// The format of the file `path` names, if it is a snapshot's.
    pub fn of(path: &Path) -> Option<SnapshotFormat> {
        let extension = path.extension()?;
        Self::ALL.into_iter().find(|f| extension == f.extension())
    }
}

/// A run of one of PostgreSQL's clients (pg_dump, pg_restore) against a server's database,
/// connecting as kine does (sslmode, the password in the environment, never in argv). A roll's
/// snapshot and a restore run it as a job (controller/jobs.rs); the preflight's copy runs it inline.
#[derive(Debug, Clone)]
pub struct ClientRun {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// `path` made absolute, as an argument of a job (which runs in a directory of its own).
pub(super) fn absolute_arg(path: &Path) -> Result<String, StoreError> {
    std::path::absolute(path)
        .map(|p| p.display().to_string())
        .map_err(StoreError::io(path))
}

fn client_run(name: &str, server: &PostgresServer, args: Vec<String>) -> Result<ClientRun, StoreError> {
    let mut all = vec![
        format!("--host={}", server.host),
        format!("--port={}", server.port),
        format!("--username={}", server.user),
        "--no-password".into(),
        format!("--dbname={}", server.database),
    ];
    all.extend(args);
    let mut env = vec![("PGSSLMODE".to_string(), server.ssl_mode.as_str().to_string())];
    env.extend(server.env());
    Ok(ClientRun {
        program: binary(name)?,
        args: all,
        env,
    })
}

/// pg_dump of the database into `partial` (a job: [`keep_dump`] takes the file once it succeeded).
pub fn dump_run(server: &PostgresServer, partial: &Path) -> Result<ClientRun, StoreError> {
    client_run(
        "pg_dump",
        server,
        vec!["--format=custom".into(), format!("--file={}", partial.display())],
    )
}

/// pg_restore of the dump at `path` into the server's database, replacing what is in it: every
/// object the dump holds is dropped first (`--clean --if-exists`), all in one transaction, so a
/// restore that fails leaves the database as it was. Nothing may use the database meanwhile
/// (every kine stopped). Owners are not restored, so a dump taken as another user restores as
/// this one.
pub fn restore_run(server: &PostgresServer, path: &Path) -> Result<ClientRun, StoreError> {
    let mut args: Vec<String> = [
        "--clean",
        "--if-exists",
        "--single-transaction",
        "--no-owner",
        "--exit-on-error",
    ]
    .map(String::from)
    .to_vec();
    args.push(path.display().to_string());
    client_run("pg_restore", server, args)
}

/// Where a snapshot of format `format` taken at `now` of data `from` served goes in `dir`: before
/// a roll to `to`, or (None) on request or on schedule. `stem` names what it is of (the database,
/// `state` for sqlite).
pub fn snapshot_path(
    format: SnapshotFormat,
    stem: &str,
    dir: &Path,
    from: &str,
    to: Option<&str>,
    now: DateTime<Utc>,
) -> PathBuf {
    let roll = to.map(|to| format!("-to-{to}")).unwrap_or_default();
    dir.join(format!(
        "{stem}-{from}{roll}-{}.{}",
        now.format(TIME_FORMAT),
        format.extension()
    ))
}

/// Where a dump is written until it is complete: hidden, and without the extension [`list`] keeps.
pub fn partial_of(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.partial"))
}

/// Keeps a complete snapshot: 0600, moved from its partial file to `path`, then all but the
/// newest `keep` snapshots of its kind in its directory go (those taken before rolls, or those
/// taken on request or on schedule).
pub fn keep_dump(path: &Path, keep: usize) -> Result<(), StoreError> {
    let partial = partial_of(path);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::set_permissions(&partial, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(StoreError::io(&partial))?;
    std::fs::rename(&partial, path).map_err(StoreError::io(path))?;
    crate::fsutil::sync_dir(dir).map_err(StoreError::io(dir))?;
    let backup = SnapshotName::is_backup(path);
    prune(dir, keep, |p| SnapshotName::is_backup(p) == backup)?;
    Ok(())
}

/// Where the shard's key material kept with the snapshot at `path` is: the directory
/// `<file name>.keys` beside it.
pub fn keys_of(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}.keys"))
}

/// Keeps a copy of the shard's key material beside the snapshot at `path` ([`keys_of`]): every
/// file in `shared` (the serving certificate and key clients pin, `sa.key`, the admin token store
/// and kubeconfig, kcpshard's admin identities), 0600 in a 0700 directory, complete or not at all.
/// Restored with the data, it keeps clients trusting the shard and their tokens valid, also on
/// another host. Nothing is kept while the shard has no material yet (no slot was ready).
pub fn keep_keys(path: &Path, shared: &Path) -> Result<(), StoreError> {
    if !shared.is_dir() {
        return Ok(());
    }
    let keys = keys_of(path);
    let partial = partial_of(&keys);
    remove_dir_if_there(&partial)?;
    copy_files(shared, &partial)?;
    remove_dir_if_there(&keys)?;
    std::fs::rename(&partial, &keys).map_err(StoreError::io(&keys))?;
    let dir = keys.parent().unwrap_or(Path::new("."));
    crate::fsutil::sync_dir(dir).map_err(StoreError::io(dir))
}

/// Keeps a complete snapshot of the store with the shard's key material from `shared` beside it
/// ([`keep_keys`], then [`keep_dump`]).
pub fn keep_snapshot(path: &Path, keep: usize, shared: &Path) -> Result<(), StoreError> {
    keep_keys(path, shared)?;
    keep_dump(path, keep)
}

/// Puts the key material kept with the snapshot at `path` in place of the files of the same names
/// in `shared` (every slot has stopped: a restore).
pub fn restore_keys(path: &Path, shared: &Path) -> Result<(), StoreError> {
    copy_files(&keys_of(path), shared)
}

/// Copies every file of `from` into `into` (made 0700 if missing), each written atomically, 0600.
fn copy_files(from: &Path, into: &Path) -> Result<(), StoreError> {
    crate::fsutil::create_private_dir(into).map_err(StoreError::io(into))?;
    for entry in std::fs::read_dir(from).map_err(StoreError::io(from))? {
        let file = entry.map_err(StoreError::io(from))?.path();
        if !file.is_file() {
            continue;
        }
        let bytes = std::fs::read(&file).map_err(StoreError::io(&file))?;
        let copy = into.join(file.file_name().unwrap_or_default());
        crate::fsutil::write_atomically(&copy, &bytes).map_err(StoreError::io(&copy))?;
    }
    Ok(())
}

pub(super) fn remove_dir_if_there(dir: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io(dir)(e)),
        _ => Ok(()),
    }
}

/// What a snapshot's file name tells: `<stem>-<from>-to-<to>-<time>.<extension>` for one taken
/// before a roll, `<stem>-<from>-<time>.<extension>` for one taken on request or on schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotName {
    pub format: SnapshotFormat,
    /// The kcp version that served the data in it.
    pub from: String,
    /// The version the roll it was taken before went to; None for one taken on request or on
    /// schedule.
    pub to: Option<String>,
    /// When it was taken, as the name says it (UTC, [`TIME_FORMAT`]).
    pub taken: String,
}

/// How a snapshot's name says when it was taken (UTC).
const TIME_FORMAT: &str = "%Y%m%dT%H%M%S%.3fZ";

impl SnapshotName {
    /// None for a name kcpshard did not make (or whose `from` is no kcp version: "none", a dump
    /// taken while no slot served).
    pub fn parse(file_name: &str) -> Option<SnapshotName> {
        let format = SnapshotFormat::of(Path::new(file_name))?;
        let stem = file_name.strip_suffix(&format!(".{}", format.extension()))?;
        let (rest, taken) = stem.rsplit_once('-')?;
        chrono::NaiveDateTime::parse_from_str(taken, TIME_FORMAT).ok()?;
        let is_version = |v: &str| crate::api::KcpVersion::parse(v).is_ok();
        let (head, to) = match rest.rsplit_once("-to-") {
            Some((head, to)) if is_version(to) => (head, Some(to.to_string())),
            _ => (rest, None),
        };
        // The stem may hold '-', and so may a pre-release version: the shortest tail of `head`
        // that is a version.
        let from = head
            .match_indices('-')
            .rev()
            .map(|(at, _)| &head[at + 1..])
            .find(|v| is_version(v))?;
        Some(SnapshotName {
            format,
            from: from.to_string(),
            to,
            taken: taken.to_string(),
        })
    }

    /// Whether the file at `path` is a snapshot taken on request or on schedule, which are kept
    /// apart from those taken before rolls ([`keep_dump`]).
    fn is_backup(path: &Path) -> bool {
        let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        SnapshotName::parse(&name).is_some_and(|n| n.to.is_none())
    }
}

/// The snapshots in `dir`, oldest first (by modification time); none when the directory is missing.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        other => other.map_err(StoreError::io(dir))?,
    };
    let mut dumps: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| SnapshotFormat::of(p).is_some())
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    dumps.sort();
    Ok(dumps.into_iter().map(|(_, p)| p).collect())
}

/// Removes all but the newest `keep` snapshots in `dir` that are `of_kind` (by modification time).
pub fn prune(dir: &Path, keep: usize, of_kind: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, StoreError> {
    let dumps: Vec<PathBuf> = list(dir)?.into_iter().filter(|p| of_kind(p)).collect();
    let excess = dumps.len().saturating_sub(keep);
    let removed: Vec<PathBuf> = dumps.into_iter().take(excess).collect();
    for path in &removed {
        std::fs::remove_file(path).map_err(StoreError::io(path))?;
        remove_dir_if_there(&keys_of(path))?;
        tracing::info!(path = %path.display(), "removed an old snapshot");
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_name_tells_the_version_that_served_the_data_in_it() {
        let name = SnapshotName::parse("kcp-e2e-db-v0.30.0-to-v0.31.2-20261201T180102.123Z.dump").unwrap();
        assert_eq!(
            name,
            SnapshotName {
                format: SnapshotFormat::PgDump,
                from: "v0.30.0".into(),
                to: Some("v0.31.2".into()),
                taken: "20261201T180102.123Z".into()
            }
        );
        let rc = SnapshotName::parse("kcp-v0.32.0-rc.1-to-v0.32.0-20261201T180102.123Z.dump").unwrap();
        assert_eq!((rc.from.as_str(), rc.to.as_deref()), ("v0.32.0-rc.1", Some("v0.32.0")));
        assert_eq!(
            SnapshotName::parse("kcp-none-to-v0.31.2-20261201T180102.123Z.dump"),
            None
        );
        assert_eq!(
            SnapshotName::parse("kcp-v0.30.0-to-v0.31.2-20261201T180102.123Z.sql"),
            None
        );
        assert_eq!(SnapshotName::parse("backup.dump"), None);
        let backup = SnapshotName::parse("kcp-to-prod-v0.31.2-20261201T180102.123Z.dump").unwrap();
        assert_eq!(
            (backup.from.as_str(), backup.to, backup.taken.as_str()),
            ("v0.31.2", None, "20261201T180102.123Z"),
            "taken on request: a stem with -to- in it is no roll"
        );
        assert_eq!(SnapshotName::parse("kcp-v0.31.2-yesterday.dump"), None);
        let sqlite = SnapshotName::parse("state-v0.31.0-to-v0.31.2-20261201T180102.123Z.db").unwrap();
        assert_eq!(
            (sqlite.format, sqlite.from.as_str(), sqlite.format.store()),
            (SnapshotFormat::Sqlite, "v0.31.0", StoreType::KineSqlite)
        );
    }

    /// A file at `path` modified at second 1000 + `rank` of the epoch (a higher rank is newer).
    fn file_of_age(path: &Path, rank: u64) {
        std::fs::write(path, "x").unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + rank);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn only_the_newest_dumps_stay() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            file_of_age(&dir.path().join(format!("kcp-v1-to-v2-{i}.dump")), i);
        }
        std::fs::write(dir.path().join("notes.txt"), "kept").unwrap();
        let removed = prune(dir.path(), 2, |_| true).unwrap();
        let names = |paths: Vec<PathBuf>| {
            let mut n: Vec<String> = paths
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(
            names(removed),
            ["kcp-v1-to-v2-0.dump", "kcp-v1-to-v2-1.dump", "kcp-v1-to-v2-2.dump"]
        );
        let left = names(
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect(),
        );
        assert_eq!(left, ["kcp-v1-to-v2-3.dump", "kcp-v1-to-v2-4.dump", "notes.txt"]);
    }

    #[test]
    fn snapshots_taken_on_request_are_kept_apart_from_those_taken_before_rolls() {
        let dir = tempfile::tempdir().unwrap();
        let at = |minute: u32| format!("20261201T18{minute:02}00.000Z");
        let mut names: Vec<String> = (0..2)
            .map(|i| format!("kcp-v0.30.0-to-v0.31.2-{}.dump", at(i)))
            .chain((2..5).map(|i| format!("kcp-v0.31.2-{}.dump", at(i))))
            .collect();
        for (i, name) in names.iter().enumerate() {
            file_of_age(&dir.path().join(name), i as u64);
        }
        let newest = dir.path().join(format!("kcp-v0.31.2-{}.dump", at(5)));
        std::fs::write(partial_of(&newest), "x").unwrap();
        keep_dump(&newest, 2).unwrap();
        names.push(newest.file_name().unwrap().to_string_lossy().into_owned());
        let mut left: Vec<String> = list(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [&names[0], &names[1], &names[4], &names[5]].map(|n| n.clone()));
    }

    #[test]
    fn key_material_is_kept_beside_its_snapshot_privately_and_goes_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("sa.key"), "old key").unwrap();
        std::fs::write(shared.join("apiserver.crt"), "old CA").unwrap();
        let snapshots = dir.path().join("snapshots");
        std::fs::create_dir(&snapshots).unwrap();
        let taken = |second: u32| {
            let path = snapshots.join(format!("kcp-v0.31.2-20261201T1800{second:02}.000Z.dump"));
            file_of_age(&partial_of(&path), second.into());
            keep_snapshot(&path, 1, &shared).unwrap();
            path
        };
        let first = taken(1);
        let keys = keys_of(&first);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&keys), mode(&keys.join("sa.key"))), (0o700, 0o600));
        assert_eq!(std::fs::read_to_string(keys.join("apiserver.crt")).unwrap(), "old CA");

        let second = taken(2);
        assert!(
            !first.exists() && !keys.exists(),
            "the older snapshot went with its keys"
        );
        let elsewhere = dir.path().join("another-host");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("sa.key"), "new key").unwrap();
        restore_keys(&second, &elsewhere).unwrap();
        assert_eq!(std::fs::read_to_string(elsewhere.join("sa.key")).unwrap(), "old key");
        assert_eq!(list(&snapshots).unwrap(), std::slice::from_ref(&second));
        keep_keys(&second, &dir.path().join("no-slot-was-ready")).unwrap();
        assert!(keys_of(&second).is_dir(), "material kept before stays");
    }
}
