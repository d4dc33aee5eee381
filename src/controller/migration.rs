//! The steps of a move of the shard's data to another store (plan/migration.rs): each records
//! what it decides in controller.json before its effect, and returns. The mirror is a job
//! (jobs.rs, `kcpshard job store-mirror`); FinishJob takes up its end, which is the switch.
use std::path::PathBuf;

use chrono::Utc;

use super::Note;
use super::act::slots::SlotStart;
use super::act::{Actor, Notes};
use super::error::Error;
use super::plan::{FrontChange, JobKind, LeaveCause, MigrationFailure, MigrationRecord, Stopping};
use super::state::{ControllerState, ShardDirs, StoreRecord};
use crate::api::{FrontType, KcpShard, StoreSpec, StoreType};
use crate::process::ProcessRecord;
use crate::store::snapshot::ClientRun;
use crate::store::{EtcdCluster, EtcdTls, StoreBackend};

/// The mirror's files in the job directory.
const PROGRESS_FILE: &str = "mirror-progress.json";
const UNTIL_FILE: &str = "mirror-until";

/// The move under way, as recorded.
fn record(state: &ControllerState) -> Result<&MigrationRecord, Error> {
    state
        .migration
        .as_ref()
        .filter(|m| m.under_way())
        .ok_or(Error::NoMigration)
}

fn update(actor: &Actor<'_>, change: impl FnOnce(&mut MigrationRecord)) -> Result<MigrationRecord, Error> {
    let mut state = actor.dirs.load_state()?;
    let migration = state.migration.as_mut().ok_or(Error::NoMigration)?;
    change(migration);
    let updated = migration.clone();
    actor.dirs.save_state(&state)?;
    Ok(updated)
}

/// Why a move kcpshard can make waits, saying what to do; None while a move to `spec` is under
/// way or none is wanted:
/// - the file a move into KineSqlite would make holds an earlier store's data (a move out of it
///   left it as it was, or a move into it did not finish): nothing is overwritten, the user moves
///   it aside;
/// - a Caddy front cannot hold new connections in the switch (the TCP front does, docs/front.md):
///   requests in those seconds would fail.
pub fn move_waits(dirs: &ShardDirs, shard: &KcpShard, in_use: &StoreSpec, state: &ControllerState) -> Option<String> {
    let spec = &shard.spec.store;
    let under_way = state.migration.as_ref().is_some_and(|m| m.under_way() && &m.to == spec);
    if spec.moved_at(in_use).is_none() || under_way {
        return None;
    }
    let db = dirs.store().join(crate::store::kine::DB_FILE);
    if spec.type_ == StoreType::KineSqlite && db.exists() {
        return Some(format!(
            "spec.store names KineSqlite, and {} holds an earlier store's data (a move out of it left it as it was, or a move into it did not finish): kcpshard does not overwrite it. Once you no longer need it, move it and its -wal and -shm files aside (for f in {0} {0}-wal {0}-shm; do mv $f $f.old; done) and the move begins",
            db.display()
        ));
    }
    (shard.spec.front.type_ == FrontType::Caddy).then(|| {
        "spec.store names another store, and the move waits: its switch needs a front that holds new connections for a few seconds, which the Caddy front cannot (requests then would fail). Set spec.front.type to Tcp for the move, and back to Caddy after it".to_string()
    })
}

/// Where the mirror writes how far it is.
pub fn progress_file(actor_dirs: &ShardDirs) -> PathBuf {
    actor_dirs.job().join(PROGRESS_FILE)
}

/// BeginMigration.
pub fn begin(actor: &Actor<'_>) -> Result<Notes, Error> {
    let from = actor.world.store.store.clone();
    let to = actor.shard.spec.store.clone();
    let mut state = actor.dirs.load_state()?;
    state.migration = Some(MigrationRecord::begun(from.clone(), to.clone(), Utc::now()));
    actor.dirs.save_state(&state)?;
    Ok(vec![Note::normal(
        "MigrationStarted",
        format!(
            "moving the shard's data from {} to {}: the slots serve on while it is copied and followed, then a slot on the new store takes over while the front holds new connections for a moment",
            from.describe(),
            to.describe()
        ),
    )])
}

/// The backend of the store the move goes to.
fn target(actor: &Actor<'_>, record: &MigrationRecord) -> Result<StoreBackend, Error> {
    Ok(actor.ctx.store(actor.shard, &record.to, actor.dirs)?)
}

/// EnsureTargetStore.
pub async fn ensure_target_store(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = record(&actor.world.state)?.clone();
    let target = target(actor, &record)?;
    let Some(started) = actor.ensure_store_of(&target).await? else {
        return Ok(vec![]);
    };
    Ok(vec![Note::normal(
        "MigrationStoreReady",
        format!("the store the data moves to: {started}"),
    )])
}

/// StartMirror: `kcpshard job store-mirror` from the store the slots use into the new one.
pub async fn start_mirror(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = record(&actor.world.state)?.clone();
    let dir = std::path::absolute(actor.dirs.job())?;
    crate::fsutil::create_private_dir(&dir)?;
    for file in [PROGRESS_FILE, UNTIL_FILE] {
        crate::fsutil::remove_if_there(&dir.join(file))?;
    }
    let mut args = vec!["job".to_string(), "store-mirror".to_string()];
    let source = match actor.store()? {
        // The kine the slots dial, which runs until the move is complete.
        StoreBackend::KineSqlite { .. } => Some(EtcdCluster {
            endpoints: actor.world.store_endpoints.clone(),
            tls: EtcdTls::default(),
        }),
        StoreBackend::Etcd(cluster) => Some(cluster),
        // The job's own kine on the database (the slots' kines stop with them in the switch).
        StoreBackend::KinePostgres { .. } => None,
    };
    match source {
        Some(cluster) => args.extend(cluster.job_args("from-")?),
        None => args.extend(["--from-store".to_string(), spec_arg(&record.from)]),
    }
    // An adopted kcp's embedded etcd exits with it: its last changes are read from its data.
    if let Some(data_dir) = actor.world.state.adoption.as_ref().and_then(|a| a.data_dir.as_ref()) {
        args.extend([
            "--from-data-dir".to_string(),
            data_dir.display().to_string(),
            "--etcd-binary".to_string(),
            crate::store::etcd_snapshot::EtcdTools::find()?
                .etcd
                .display()
                .to_string(),
        ]);
    }
    args.extend(["--to-store".to_string(), spec_arg(&record.to)]);
    if record.to.type_ == StoreType::KineSqlite {
        args.extend([
            "--to-store-dir".to_string(),
            std::path::absolute(actor.dirs.store())?.display().to_string(),
        ]);
    }
    args.extend([
        "--kine-binary".to_string(),
        std::path::absolute(&actor.ctx.kine_binary)?.display().to_string(),
        "--progress".to_string(),
        dir.join(PROGRESS_FILE).display().to_string(),
        "--until".to_string(),
        dir.join(UNTIL_FILE).display().to_string(),
    ]);
    // A password spec.store names by an environment variable of serve's reaches the job the same
    // way (a file it reads itself).
    let env = [&record.from, &record.to]
        .into_iter()
        .filter_map(|store| store.kine_postgres.as_ref())
        .filter_map(|pg| pg.password_from.as_ref()?.env.clone())
        .filter_map(|name| std::env::var(&name).ok().map(|value| (name, value)))
        .collect();
    let run = ClientRun {
        program: actor.ctx.kcpshard_binary.clone(),
        args,
        env,
    };
    super::jobs::start(actor, JobKind::Mirror, None, run).await?;
    Ok(vec![Note::normal(
        "MirrorStarted",
        format!(
            "copying the shard's data into {} and following every change after the copy (progress: {})",
            record.to.describe(),
            dir.join(PROGRESS_FILE).display()
        ),
    )])
}

fn spec_arg(store: &StoreSpec) -> String {
    serde_json::to_string(store).expect("a store spec serializes")
}

/// StartWarmSlot: a slot of the desired template on the new store, out of the front.
pub async fn start_warm_slot(actor: &Actor<'_>, name: &str) -> Result<Notes, Error> {
    let record = record(&actor.world.state)?.clone();
    let started = match actor
        .start_slot(name, &actor.desired.template, false, Some(&record.to))
        .await?
    {
        SlotStart::Kcp(started) => started,
        SlotStart::StoreStarting(note) => return Ok(vec![note]),
    };
    update(actor, |m| m.warm_slot = Some(name.to_string()))?;
    let progress = actor.world.observed.migration.as_ref().and_then(|m| m.mirror.clone());
    let (copied, lag) = progress.map_or((0, 0), |p| (p.copied_keys, p.lag));
    Ok(vec![Note::normal(
        "MigrationCaughtUp",
        format!(
            "copied {copied} keys into {}, which follows every change ({lag} revisions behind); started {started} on it, out of the front: it follows while the serving slots lead",
            record.to.describe()
        ),
    )])
}

/// BeginSwitch: recorded, then the front holds new connections (an empty serving set); the old
/// slots' connections stay until each slot stops.
pub async fn begin_switch(actor: &Actor<'_>) -> Result<Notes, Error> {
    // An adopted kcp whose address the front takes: the front starts now, on kcp's own socket,
    // with nothing to send to yet (if it cannot, the switch does not begin: kcp serves on).
    let took = super::adoption::take_address(actor).await?;
    let record = update(actor, |m| m.switch_started_at = Some(Utc::now()))?;
    let left = actor
        .world
        .observed
        .front
        .backends()
        .iter()
        .map(|name| (name.clone(), LeaveCause::Replaced))
        .collect();
    if took.is_none() {
        actor
            .set_front(&FrontChange {
                backends: vec![],
                joined: vec![],
                left,
            })
            .await?;
    }
    Ok(took.into_iter().chain([Note::normal(
        "MigrationSwitching",
        format!(
            "slot {} on {} is ready: the front holds new connections while the slots on {} stop and their last changes are applied",
            record.warm_slot.as_deref().unwrap_or("?"),
            record.to.describe(),
            record.from.describe()
        ),
    )])
    .collect())
}

/// EndMirror: the old store takes no more writes (every slot on it has exited).
pub fn end_mirror(actor: &Actor<'_>) -> Result<Notes, Error> {
    let until = actor.dirs.job().join(UNTIL_FILE);
    update(actor, |m| m.mirror_ending_at = Some(Utc::now()))?;
    crate::fsutil::write_atomically(&until, Utc::now().to_rfc3339().as_bytes())?;
    Ok(vec![])
}

/// The mirror ended having applied the old store's last change: the data is in the new store.
/// Called by FinishJob.
pub fn switched(actor: &Actor<'_>, state: &mut ControllerState) -> Result<Notes, Error> {
    let now = Utc::now();
    let Some(migration) = state.migration.as_mut().filter(|m| m.under_way()) else {
        return Ok(vec![]);
    };
    actor.dirs.save_store_record(&StoreRecord {
        store: migration.to.clone(),
        since: now,
    })?;
    if let Some(name) = &migration.warm_slot {
        actor.dirs.slot(name).update(|slot| slot.store = None)?;
    }
    migration.switched_at = Some(now);
    let pause = migration
        .switch_started_at
        .map_or(0.0, |at| (now - at).num_milliseconds() as f64 / 1000.0);
    let checked = actor
        .world
        .observed
        .migration
        .as_ref()
        .and_then(|m| m.mirror.as_ref()?.verified_keys)
        .map_or_else(String::new, |keys| format!(" (each of its {keys} keys checked)"));
    let message = format!(
        "{} has every change of {}{checked}: slot {} takes new connections ({pause:.1}s since the front began to hold them)",
        migration.to.describe(),
        migration.from.describe(),
        migration.warm_slot.as_deref().unwrap_or("?"),
    );
    let adopted = super::adoption::switched(state);
    actor.dirs.save_state(state)?;
    Ok(std::iter::once(Note::normal("MigrationSwitched", message))
        .chain(adopted)
        .collect())
}

/// What kcpshard runs of the store the data left that the new store does not also use (a managed
/// PostgreSQL both databases are on runs on), each with its stop grace.
pub fn old_store_processes(
    ctx: &super::Context,
    shard: &crate::api::KcpShard,
    dirs: &ShardDirs,
    record: &MigrationRecord,
) -> Result<Vec<(ProcessRecord, std::time::Duration)>, Error> {
    let kept: Vec<u32> = ctx
        .store(shard, &record.to, dirs)?
        .processes(&ctx.runtime)?
        .iter()
        .map(|(p, _)| p.pid)
        .collect();
    let mut old = ctx.store(shard, &record.from, dirs)?.processes(&ctx.runtime)?;
    old.retain(|(p, _)| !kept.contains(&p.pid));
    Ok(old)
}

/// StopOldStore: what kcpshard ran of the store the data left; its data stays.
pub async fn stop_old_store(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = actor.world.state.migration.as_ref().ok_or(Error::NoMigration)?;
    let processes = old_store_processes(actor.ctx, actor.shard, actor.dirs, record)?;
    super::stops::send(actor, Stopping::OldStore, processes).await?;
    Ok(vec![])
}

/// CompleteMigration.
pub fn complete(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = update(actor, |m| m.completed_at = Some(Utc::now()))?;
    let took = record
        .completed_at
        .map_or(0, |at| (at - record.started_at).num_seconds());
    Ok(vec![Note::normal(
        "MigrationComplete",
        format!(
            "moved the shard's data from {} to {} in {took}s; {}",
            record.from.describe(),
            record.to.describe(),
            left_as_it_was(actor, &record.from)
        ),
    )])
}

/// What a move leaves of the store the data was in.
fn left_as_it_was(actor: &Actor<'_>, from: &StoreSpec) -> String {
    match from.type_ {
        StoreType::KineSqlite => format!(
            "the old store is left as it was ({}): remove it once satisfied",
            actor.dirs.store().join(crate::store::kine::DB_FILE).display()
        ),
        StoreType::KinePostgres | StoreType::Etcd => format!(
            "the old store ({}) is left as it was: drop it once satisfied",
            from.describe()
        ),
    }
}

/// FailMigration: the mirror stops, and the slot on the new store goes (the plan stops it); the
/// old store serves on.
pub fn fail(actor: &Actor<'_>, cause: &MigrationFailure) -> Result<Notes, Error> {
    let why = match cause {
        MigrationFailure::SpecChanged => "spec.store changed before the switch".to_string(),
        MigrationFailure::WarmSlotExited { slot, last_words } => format!(
            "slot {slot} on the new store exited before it served{}",
            last_words.as_deref().map(|w| format!(": {w}")).unwrap_or_default()
        ),
        MigrationFailure::Mirror { message } => format!("the mirror failed: {message}"),
    };
    failed(actor, why)
}

/// ForgetMigration: the record of a move that failed goes.
pub fn forget(actor: &Actor<'_>) -> Result<Notes, Error> {
    let mut state = actor.dirs.load_state()?;
    state.migration = None;
    actor.dirs.save_state(&state)?;
    Ok(vec![])
}

/// Records the move as failed with `why`, and kills its mirror if it runs.
pub fn failed(actor: &Actor<'_>, why: String) -> Result<Notes, Error> {
    let record = update(actor, |m| m.failure = Some(why.clone()))?;
    if actor
        .world
        .observed
        .job
        .as_ref()
        .is_some_and(|j| j.running() && j.record.kind == JobKind::Mirror)
    {
        super::jobs::cancel(actor)?;
    }
    Ok(vec![Note::warning(
        "MigrationFailed",
        format!(
            "the move of the data from {} to {} stopped: {why}. The shard serves on {} as before. {} holds what was copied: clear it before moving there again",
            record.from.describe(),
            record.to.describe(),
            record.from.describe(),
            record.to.describe()
        ),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(store: &str, front: &str) -> KcpShard {
        let spec =
            format!("{{version: v0.31.2, store: {store}, front: {{type: {front}, listen: \"127.0.0.1:6443\"}}}}");
        KcpShard::new("dev", serde_yaml::from_str(&spec).unwrap())
    }

    #[test]
    fn a_move_waits_for_an_earlier_state_db_to_be_moved_aside_and_for_a_front_that_holds() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(dir.path(), "dev");
        let postgres: StoreSpec = serde_yaml::from_str("{type: KinePostgres, kinePostgres: {host: h}}").unwrap();
        let back_to_sqlite = shard("{type: KineSqlite}", "Tcp");
        let none = ControllerState::default();
        assert_eq!(
            move_waits(&dirs, &back_to_sqlite, &postgres, &none),
            None,
            "no state.db: it begins"
        );

        std::fs::create_dir_all(dirs.store()).unwrap();
        std::fs::write(dirs.store().join("state.db"), "an earlier store's").unwrap();
        let why = move_waits(&dirs, &back_to_sqlite, &postgres, &none).unwrap();
        assert!(why.contains("holds an earlier store's data"), "{why}");
        assert!(why.contains("-wal and -shm files aside"), "{why}");
        // The move into it under way made the file.
        let under_way = ControllerState {
            migration: Some(MigrationRecord::begun(
                postgres.clone(),
                back_to_sqlite.spec.store.clone(),
                Utc::now(),
            )),
            ..Default::default()
        };
        assert_eq!(move_waits(&dirs, &back_to_sqlite, &postgres, &under_way), None);
        // No move wanted.
        let sqlite = back_to_sqlite.spec.store.clone();
        assert_eq!(move_waits(&dirs, &back_to_sqlite, &sqlite, &none), None);

        let behind_caddy = shard("{type: KinePostgres, kinePostgres: {host: h}}", "Caddy");
        let why = move_waits(&dirs, &behind_caddy, &sqlite, &none).unwrap();
        assert!(why.contains("Set spec.front.type to Tcp for the move"), "{why}");
        assert_eq!(
            move_waits(&dirs, &behind_caddy, &postgres, &none),
            None,
            "no move, no wait"
        );
    }
}
