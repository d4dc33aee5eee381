//! The steps of the shard's jobs (plan/job.rs): start a dump or a restore of the store as a process
//! of its own and return; take up its result once a later look saw it end; kill one nothing wants.
//! A job's process is `<shard>/job/process.json` with its output in `job/job.log` (under systemd,
//! the unit `kcpshard-<shard>-job.service` and its journal).
use std::path::Path;

use chrono::Utc;
use kube::ResourceExt;
use nix::sys::signal::Signal;

use super::Note;
use super::act::{Actor, Notes};
use super::error::Error;
use super::plan::{JobFailure, JobKind, JobRecord, JobState, RestorePhase, RestoreRecord};
use super::state::{BackupRecord, DataVersion, SnapshotRecord};
use crate::fsutil::remove_if_there;
use crate::process::{ProcessSpec, Runtime, UnitName};
use crate::slot::material;
use crate::store::snapshot::{self, ClientRun};

const PROCESS_FILE: &str = "process.json";
const LOG_FILE: &str = "job.log";

/// Snapshot: starts a snapshot of the store (pg_dump, sqlite's VACUUM INTO, etcd's snapshot API)
/// into the snapshots directory, before the roll to the desired version.
pub async fn start_snapshot(actor: &Actor<'_>) -> Result<Notes, Error> {
    let to = actor.desired.template.version.clone();
    let kind = JobKind::Snapshot {
        template: Box::new(actor.desired.template.clone()),
    };
    start_snapshot_job(actor, kind, Some(&to), |from| {
        format!("before rolling {from} to {to}; the roll goes on once it is kept")
    })
    .await
}

/// Backup: starts a snapshot of the store asked for with the kcpshard.io/snapshotRequestedAt
/// annotation's value `request` (the plan saw none taken for it yet), or due by
/// spec.backup.interval (None).
pub async fn start_backup(actor: &Actor<'_>, request: Option<String>) -> Result<Notes, Error> {
    let why = match &request {
        Some(request) => format!("asked for at {request}"),
        None => format!(
            "due every {}",
            actor.shard.spec.backup.interval.as_deref().unwrap_or("?")
        ),
    };
    start_snapshot_job(actor, JobKind::Backup { request }, None, |_| {
        format!("({why}) while it serves")
    })
    .await
}

/// Starts job `kind`, a snapshot of the data the serving version served into the snapshots
/// directory (named for the roll to `to`, or on request or schedule when None); the event ends with
/// `purpose(from)`.
async fn start_snapshot_job(
    actor: &Actor<'_>,
    kind: JobKind,
    to: Option<&str>,
    purpose: impl FnOnce(&str) -> String,
) -> Result<Notes, Error> {
    let from = actor.world.serving_version().unwrap_or_else(|| "none".into());
    let store = actor.store()?;
    // Absolute: the job runs in its own directory.
    let dir = std::path::absolute(actor.dirs.snapshots())?;
    crate::fsutil::create_private_dir(&dir)?;
    let path = store.snapshot_path(&dir, &from, to)?;
    let run = store.snapshot_run(&snapshot::partial_of(&path), &actor.ctx.kcpshard_binary)?;
    start(actor, kind, Some(path.display().to_string()), run).await?;
    Ok(vec![Note::normal(
        "SnapshotStarted",
        format!(
            "taking a snapshot of the store ({}) into {} {}",
            store.describe_server(),
            path.display(),
            purpose(&from)
        ),
    )])
}

/// RestoreSnapshot: every slot has stopped (and a KineSqlite store's kine); starts the restore of
/// the snapshot (pg_restore, a sqlite copy put in place of `state.db`, or an etcd snapshot's keys
/// put back through the cluster's API).
pub async fn start_restore(actor: &Actor<'_>) -> Result<Notes, Error> {
    let Some(record) = actor
        .world
        .state
        .restore
        .as_ref()
        .filter(|r| r.phase == RestorePhase::Stopping)
    else {
        return Ok(vec![]);
    };
    let run = actor
        .store()?
        .restore_run(Path::new(&record.snapshot), &actor.ctx.kcpshard_binary)?;
    let kind = JobKind::Restore {
        snapshot: record.snapshot.clone(),
    };
    start(actor, kind, None, run).await?;
    Ok(vec![])
}

/// Records the job, then starts its process: a serve that stops in between finds the record and
/// no process (the job is lost, and done again).
pub(super) async fn start(
    actor: &Actor<'_>,
    kind: JobKind,
    output: Option<String>,
    run: ClientRun,
) -> Result<(), Error> {
    let dir = actor.dirs.job();
    crate::fsutil::create_private_dir(&dir)?;
    let process = dir.join(PROCESS_FILE);
    // An earlier job's record would pass for this one's process, and under systemd its unit,
    // still loaded, would refuse the start.
    remove_if_there(&process)?;
    let unit = UnitName::job(&actor.shard.name_any());
    actor.ctx.runtime.stop_unit(&unit).await;
    let mut state = actor.dirs.load_state()?;
    state.job = Some(JobRecord {
        kind: kind.clone(),
        started_at: Utc::now(),
        output,
        cancelled_at: None,
    });
    actor.dirs.save_state(&state)?;
    let mut spec = ProcessSpec::new(kind.name(), unit, run.program, run.args, dir.join(LOG_FILE), process);
    spec.env = run.env;
    spec.keep_exit_status = true;
    actor.ctx.runtime.start(&spec).await?;
    Ok(())
}

/// What observe sees of the recorded job: its process runs, ended (how, when this serve or
/// systemd kept it), or is gone with nobody knowing how it ended.
pub async fn observe(runtime: &Runtime, job_dir: &Path, record: &JobRecord) -> Result<(JobState, Option<u32>), Error> {
    let Some(process) = Runtime::load(&job_dir.join(PROCESS_FILE))? else {
        return Ok((JobState::Lost, None));
    };
    if runtime.is_running(&process) {
        return Ok((JobState::Running, Some(process.pid)));
    }
    let state = match runtime.exit_status(&process).await {
        Some(status) if status.success() => JobState::Succeeded,
        Some(status) => {
            // This run's output only: a job that fails the same way each time it is tried says the
            // same, so the failure is told once and its retries back off.
            let printed = runtime.output_tail(&process, 10).await.join("\n");
            JobState::Failed {
                message: format!(
                    "{} ({status}): {printed} (log: {})",
                    record.kind.name(),
                    Runtime::log_location(&process)
                ),
            }
        }
        None => JobState::Lost,
    };
    Ok((state, None))
}

/// FinishJob: takes up what the ended job did, and drops its record.
pub async fn finish(actor: &Actor<'_>) -> Result<Notes, Error> {
    let Some(job) = actor.world.observed.job.clone() else {
        return Ok(vec![]);
    };
    let record = job.record;
    let mut state = actor.dirs.load_state()?;
    state.job = None;
    // Under systemd a job that failed leaves its unit loaded until it is reset.
    actor
        .ctx
        .runtime
        .stop_unit(&UnitName::job(&actor.shard.name_any()))
        .await;
    let took = (Utc::now() - record.started_at).num_milliseconds() as f64 / 1000.0;
    let drop_output = || match &record.output {
        Some(path) => remove_if_there(&snapshot::partial_of(Path::new(path))),
        None => Ok(()),
    };
    if record.cancelled_at.is_some() {
        drop_output()?;
        actor.dirs.save_state(&state)?;
        return Ok(vec![Note::normal(
            "JobCancelled",
            format!("stopped the {} job, which nothing needed any more", record.kind.name()),
        )]);
    }
    match &job.state {
        JobState::Succeeded => state.job_failure = state.job_failure.take().filter(|f| f.kind != record.kind),
        JobState::Failed { message } => {
            let times = state
                .job_failure
                .as_ref()
                .filter(|f| f.kind == record.kind)
                .map_or(0, |f| f.times);
            state.job_failure = Some(JobFailure {
                kind: record.kind.clone(),
                at: Utc::now(),
                message: message.clone(),
                times: times + 1,
            });
        }
        JobState::Running | JobState::Lost => {}
    }
    match (&record.kind, job.state) {
        (_, JobState::Running) => Ok(vec![]),
        (JobKind::Snapshot { template }, JobState::Succeeded) => {
            let path = record.output.clone().unwrap_or_default();
            let keep = actor.shard.spec.rollout.snapshots_to_keep.max(1) as usize;
            snapshot::keep_snapshot(Path::new(&path), keep, &actor.dirs.shared())?;
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            state.snapshot = Some(SnapshotRecord {
                template: (**template).clone(),
                path: path.clone(),
                taken_at: Utc::now(),
            });
            actor.dirs.save_state(&state)?;
            Ok(vec![Note::normal(
                "SnapshotTaken",
                format!(
                    "took a snapshot of the store: {path} ({size} bytes, {took:.1}s) before rolling to {}; docs/how-to/snapshots.md says how to restore it",
                    template.version
                ),
            )])
        }
        (JobKind::Backup { request }, JobState::Succeeded) => {
            let path = record.output.clone().unwrap_or_default();
            let keep = actor.shard.spec.backup.keep.max(1) as usize;
            snapshot::keep_snapshot(Path::new(&path), keep, &actor.dirs.shared())?;
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if request.is_some() {
                state.snapshot_request_answered = request.clone();
            }
            state.backup = Some(BackupRecord {
                request: request.clone(),
                path: path.clone(),
                bytes,
                taken_at: Utc::now(),
            });
            actor.dirs.save_state(&state)?;
            Ok(vec![Note::normal(
                "SnapshotTaken",
                format!(
                    "took a snapshot of the store: {path} ({bytes} bytes, {took:.1}s); `kcpshard snapshot restore` takes it back (docs/how-to/snapshots.md, \"Restore a snapshot\")"
                ),
            )])
        }
        (kind @ (JobKind::PreflightDump { .. } | JobKind::PreflightCopy { .. }), JobState::Succeeded) => {
            if let Some(dump) = &record.output {
                snapshot::keep_dump(Path::new(dump), 1)?;
            }
            actor.dirs.save_state(&state)?;
            super::preflight::copied(actor.dirs, kind, record.output.as_deref())?;
            Ok(vec![])
        }
        (JobKind::Restore { snapshot }, JobState::Succeeded) => {
            let Some(restore) = state.restore.clone().filter(|r| r.phase == RestorePhase::Stopping) else {
                actor.dirs.save_state(&state)?;
                return Ok(vec![]);
            };
            let keys = snapshot::keys_of(Path::new(snapshot));
            let shared = actor.dirs.shared();
            let keys_note = if !keys.is_dir() {
                " It holds no key material (taken by an earlier kcpshard): the shard keeps its own."
            } else if material::same_identity(&keys, &shared)? {
                ""
            } else {
                snapshot::restore_keys(Path::new(snapshot), &shared)?;
                " It was taken of a shard with another identity (another host, or a state dir made anew): its key material (serving certificate, sa.key, admin tokens and identities) replaced the shard's, so its clients' kubeconfigs and tokens are valid again."
            };
            let now = Utc::now();
            actor.dirs.save_data_version(&DataVersion {
                version: restore.version.clone(),
                since: now,
                template: None,
            })?;
            state.restore = Some(RestoreRecord {
                phase: RestorePhase::Starting,
                restored_at: Some(now),
                ..restore.clone()
            });
            state.roll = None;
            state.blocked = None;
            actor.dirs.save_state(&state)?;
            Ok(vec![Note::normal(
                "SnapshotRestored",
                format!(
                    "restored {snapshot} into the store ({took:.1}s); {} now records kcp {} as the data's version, and a slot of it starts.{keys_note}",
                    actor.dirs.data_version_file().display(),
                    restore.version
                ),
            )])
        }
        (JobKind::Mirror, JobState::Succeeded) => super::migration::switched(actor, &mut state),
        (JobKind::Mirror, JobState::Failed { message }) => {
            actor.dirs.save_state(&state)?;
            super::migration::failed(actor, format!("the mirror failed: {message}"))
        }
        (JobKind::Mirror, JobState::Lost) => {
            actor.dirs.save_state(&state)?;
            super::migration::failed(
                actor,
                "the mirror's process is gone and how it ended is unknown (serve stopped while it ran)".into(),
            )
        }
        (JobKind::PreflightDump { .. } | JobKind::PreflightCopy { .. }, JobState::Failed { message }) => {
            drop_output()?;
            actor.dirs.save_state(&state)?;
            super::preflight::fail_with(actor, format!("its copy of the data failed: {message}"))
        }
        (kind, JobState::Failed { message }) => {
            drop_output()?;
            actor.dirs.save_state(&state)?;
            let (job, next) = match kind {
                JobKind::Restore { .. } => (
                    "restore",
                    "the data is as it was (a dump is restored in one transaction, a sqlite copy replaces state.db only once complete), and the restore is tried again",
                ),
                JobKind::Backup { .. } => ("snapshot", "it is tried again"),
                // A snapshot before a roll (the preflight's jobs were taken up above).
                _ => (
                    "snapshot before the roll",
                    "the roll waits, and the snapshot is tried again",
                ),
            };
            Err(Error::JobFailed { job, message, next })
        }
        (kind, JobState::Lost) => {
            drop_output()?;
            actor.dirs.save_state(&state)?;
            Ok(vec![Note::warning(
                "JobLost",
                format!(
                    "the {} job's process is gone and how it ended is unknown (serve stopped while it ran); it runs again",
                    kind.name()
                ),
            )])
        }
    }
}

/// CancelJob: records why, then SIGKILLs the job's process (a dump or a restore has nothing to
/// finish: pg_restore's transaction rolls back). FinishJob drops the record once it is gone.
pub fn cancel(actor: &Actor<'_>) -> Result<Notes, Error> {
    let mut state = actor.dirs.load_state()?;
    let Some(job) = state.job.as_mut() else {
        return Ok(vec![]);
    };
    if job.cancelled_at.is_none() {
        job.cancelled_at = Some(Utc::now());
        actor.dirs.save_state(&state)?;
    }
    if let Some(process) = Runtime::load(&actor.dirs.job().join(PROCESS_FILE))? {
        actor.ctx.runtime.signal(&process, Signal::SIGKILL)?;
    }
    Ok(vec![])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::tests::template;

    fn record() -> JobRecord {
        JobRecord {
            kind: JobKind::Snapshot {
                template: Box::new(template("v1")),
            },
            started_at: Utc::now(),
            output: None,
            cancelled_at: None,
        }
    }

    async fn run(runtime: &Runtime, dir: &Path, script: &str) -> u32 {
        let spec = ProcessSpec::new(
            "snapshot",
            UnitName::job("dev"),
            "/bin/sh",
            vec!["-c".into(), script.into()],
            dir.join(LOG_FILE),
            dir.join(PROCESS_FILE),
        );
        runtime.start(&spec).await.unwrap().pid
    }

    async fn ended(runtime: &Runtime, dir: &Path) -> JobState {
        loop {
            match observe(runtime, dir, &record()).await.unwrap() {
                (JobState::Running, pid) => {
                    assert!(pid.is_some(), "a running job's pid is watched");
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                (state, _) => return state,
            }
        }
    }

    #[tokio::test]
    async fn a_job_is_seen_running_then_ended_with_how_it_ended() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new();
        assert_eq!(
            observe(&runtime, dir.path(), &record()).await.unwrap().0,
            JobState::Lost,
            "never started"
        );

        run(&runtime, dir.path(), "sleep 0.2").await;
        assert_eq!(
            observe(&runtime, dir.path(), &record()).await.unwrap().0,
            JobState::Running
        );
        assert_eq!(ended(&runtime, dir.path()).await, JobState::Succeeded);

        run(
            &runtime,
            dir.path(),
            "echo 'pg_dump: error: connection refused' >&2; exit 1",
        )
        .await;
        let JobState::Failed { message } = ended(&runtime, dir.path()).await else {
            panic!("not a failure")
        };
        assert!(message.starts_with("snapshot (exit status: 1)"), "{message}");
        assert!(message.contains("pg_dump: error: connection refused"), "{message}");
        assert!(
            message.contains(&dir.path().join(LOG_FILE).display().to_string()),
            "{message}"
        );

        // Ended while another serve watched it: nobody kept its status.
        run(&runtime, dir.path(), "exit 0").await;
        assert_eq!(ended(&Runtime::new(), dir.path()).await, JobState::Lost);
    }
}
