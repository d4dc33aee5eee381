//! The preflight: before the first slot of a new spec.version starts while another version serves,
//! that version runs alone on a COPY of the data (docs/how-to/upgrade.md, "The preflight"; kcp's
//! minor releases rewrite kcp's own schemas at start, docs/background.md section 6).
//!
//! Its steps, each short (plan.rs decides, this module acts and observes):
//! 1. StartPreflight: kcp's own schemas are read from a serving slot (`original.json`), the record
//!    is written (before anything starts), the data copied (store/copy.rs) and served by a kine of
//!    its own, and the new kcp started on it through the process runtime: its own root seeded
//!    with the shard's material, its own port, leader election on, never behind the front.
//! 2. observe: its `/readyz` on its own port, then who holds the controllers' Lease on the copy.
//! 3. ReleasePreflightLease: the copied controllers' Lease is deleted through it (its holder leads
//!    the real data, not the copy, and would keep the copy leaderless for the Lease's 60 s).
//! 4. ComparePreflight, once its own controllers took the Lease: kcp's own schemas on the copy
//!    against `original.json` (slot/schemas.rs): Compatible or SchemaChanged. FailPreflight: it
//!    exited, missed readinessTimeout for `/readyz`, or its controllers did not take the Lease
//!    within readinessTimeout of its release.
//! 5. StopPreflight: its kcp and kine are asked to stop (plan/stopping.rs); once both are gone,
//!    RemovePreflight: the copy and the scratch database go; only then is `removedAt` recorded,
//!    so a crash of serve at any point leaves leftovers that the next observe finds and removes.
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::act::{Actor, Notes};
use super::clients::Identity;
use super::health::LOOK_TIMEOUT;
use super::plan::{JobKind, PreflightFailure, PreflightObservation, PreflightResult, PreflightRun, Stopping};
use super::state::{ControllerState, PreflightRecord, ShardDirs};
use super::{Context, Error, Note, Wake};
use crate::process::{PortReservation, ProcessRecord, ProcessSpec, Runtime, UnitName};
use crate::slot;
use crate::slot::schemas::{self, Schemas};
use crate::store::copy::{CopyPlace, CopyRun};
use crate::store::{KineStart, StoreBackend};

/// How long the preflight's kcp and kine get to exit after their stop signal before SIGKILL: none.
/// They serve nobody and their copy is thrown away, so there is nothing to drain (a kcp drains for
/// seconds after SIGTERM).
const STOP_GRACE: Duration = Duration::ZERO;

fn place(actor: &Actor<'_>, record: Option<&PreflightRecord>) -> CopyPlace {
    copy_place(actor.dirs, record, actor.shard)
}

fn copy_place(dirs: &ShardDirs, record: Option<&PreflightRecord>, shard: &crate::api::KcpShard) -> CopyPlace {
    CopyPlace {
        dir: dirs.preflight().copy(),
        scratch_database: record.and_then(|r| r.scratch_database.clone()),
        shard: shard.name_any(),
    }
}

fn save(dirs: &ShardDirs, change: impl FnOnce(&mut PreflightRecord)) -> Result<PreflightRecord, Error> {
    let mut state = dirs.load_state()?;
    let record = state.preflight.as_mut().ok_or(Error::NoPreflight)?;
    change(record);
    let record = record.clone();
    dirs.save_state(&state)?;
    Ok(record)
}

fn seconds(from: chrono::DateTime<Utc>, to: chrono::DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

/// StartPreflight.
pub async fn start(actor: &Actor<'_>) -> Result<Notes, Error> {
    let template = actor.desired.template.clone();
    let version = template.version.clone();
    let store = actor.store()?;
    let now = Utc::now();
    let mut record = PreflightRecord {
        template: template.clone(),
        port: 0,
        started_at: now,
        scratch_database: store.scratch_database(),
        dump: None,
        copied_at: None,
        launched_at: None,
        ready_at: None,
        lease_released_at: None,
        result: None,
        changes: vec![],
        message: None,
        completed_at: None,
        removed_at: None,
    };
    let skipped = if !store.copies() {
        Some(format!(
            "the store is {}: kcpshard does not copy an Etcd store, so no preflight of kcp {version} ran; the roll goes on",
            actor.world.store.store.describe()
        ))
    } else if template.sharded.as_ref().is_some_and(|s| !s.is_root()) {
        // A non-root shard's data holds no root workspace: alone on a copy, kcp would bootstrap
        // one, which says nothing about the shard's own roll.
        Some(format!(
            "a non-root shard of a sharded kcp is not preflighted (its data needs its root shard), so no preflight of kcp {version} ran; the roll goes on"
        ))
    } else {
        None
    };
    if let Some(message) = skipped {
        record.result = Some(PreflightResult::Skipped);
        record.message = Some(message.clone());
        record.completed_at = Some(now);
        record.removed_at = Some(now);
        save_new(actor.dirs, record)?;
        return Ok(vec![Note::normal("PreflightSkipped", message)]);
    }
    // kcp's own schemas as they are served now, before the copy is taken.
    let (through, client) = match actor.world.serving_client(actor.ctx, Identity::ShardAdmin).await {
        Ok(serving) => serving,
        // Nothing serves and no slot of the version that last served the data can start (the
        // plan starts one when it can): there is nothing to compare the copy with.
        Err(e) if !actor.world.observed.front_serves() => {
            save_new(actor.dirs, record)?;
            return fail_with(
                actor,
                format!(
                    "no slot serves to read kcp's own schemas from, to compare the copy with ({e}), and none of the version that last served the data could be started (its binary is gone, its record in {} predates the template it keeps, or it exited or did not answer /readyz within spec.rollout.readinessTimeout); set spec.rollout.preflight to false to start kcp {version} without a preflight",
                    actor.dirs.data_version_file().display()
                ),
            );
        }
        Err(e) => return Err(e),
    };
    let read = async move { Ok(schemas::read(&client).await?) };
    let Some(original) = actor.ask(&through, read).await? else {
        return Ok(vec![]);
    };
    let dirs = actor.dirs.preflight();
    crate::fsutil::create_private_dir(dirs.dir())?;
    super::state::write_json(&dirs.original(), &original)?;
    save_new(actor.dirs, record)?;
    Ok(vec![Note::normal(
        "PreflightStarted",
        format!(
            "copying the data for kcp {version} to run alone on (a job: {}); {} of kcp's own resources read from slot {through} to compare with",
            actor.dirs.job().join("job.log").display(),
            original.len()
        ),
    )])
}

fn save_new(dirs: &ShardDirs, record: PreflightRecord) -> Result<(), Error> {
    let mut state: ControllerState = dirs.load_state()?;
    state.preflight = Some(record);
    dirs.save_state(&state)?;
    Ok(())
}

/// CopyPreflight: starts the next job of the copy (a dump first when the store needs one and none
/// was taken for this version change) and returns. A copy that cannot be started fails the
/// preflight (a spec change tries again); what it left is removed next.
pub async fn copy(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let template = &record.template;
    // The dump taken for this version change, if any, is what the copy is restored from.
    let dump = actor
        .world
        .state
        .snapshot
        .as_ref()
        .filter(|s| &s.template == template)
        .map(|s| s.path.clone())
        .or_else(|| record.dump.clone())
        .map(PathBuf::from);
    let store = actor.store()?;
    let place = place(actor, Some(&record));
    if dump.is_some()
        && let Some(recreate) = store.recreate_scratch(&place)
    {
        let about = place.scratch_database.clone().unwrap_or_default();
        match actor.ask(&about, async move { Ok(recreate.await?) }).await {
            Ok(Some(())) => {}
            Ok(None) => return Ok(vec![]),
            Err(e) => return fail_with(actor, format!("its copy of the data could not be started: {e}")),
        }
    }
    let run = store.copy_run(&place, dump.as_deref(), &actor.ctx.kcpshard_binary);
    let template = Box::new(template.clone());
    match run {
        Ok(CopyRun::Dump { run, dump }) => {
            let output = Some(dump.display().to_string());
            super::jobs::start(actor, JobKind::PreflightDump { template }, output, run).await?;
        }
        Ok(CopyRun::Copy(run)) => super::jobs::start(actor, JobKind::PreflightCopy { template }, None, run).await?,
        Err(e) => return fail_with(actor, format!("its copy of the data could not be started: {e}")),
    }
    Ok(vec![])
}

/// FinishJob of a preflight's dump or copy that succeeded: records it, so that the next part
/// (the copy, or the launch) follows.
pub fn copied(dirs: &ShardDirs, kind: &JobKind, output: Option<&str>) -> Result<(), Error> {
    let now = Utc::now();
    save(dirs, |r| match kind {
        JobKind::PreflightDump { .. } => r.dump = output.map(String::from),
        _ => r.copied_at = Some(now),
    })?;
    Ok(())
}

/// LaunchPreflight: starts a kine on the copy (or adopts the one a serve that stopped started)
/// and returns; once it accepts (the plan waits, [`observe`]), the next LaunchPreflight starts the
/// new kcp on it.
pub async fn launch(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let dirs = actor.dirs.preflight();
    let template = &record.template;
    let etcd_servers = match actor
        .store()?
        .serve_copy(&actor.ctx.runtime, &place(actor, Some(&record)))
        .await?
    {
        KineStart::Accepting(kine) => kine.endpoint(),
        KineStart::Starting(_) => return Ok(Vec::new()),
    };
    slot::material::seed_root(&actor.dirs.shared(), &dirs.root())?;
    super::credentials::write_token_file(actor.dirs, &template.accepted_identities, "", &dirs.token_file())?;
    let reservation = PortReservation::new()?;
    let port = reservation.port();
    let launch = slot::args::SlotLaunch {
        name: "preflight".into(),
        version: template.version.clone(),
        binary: PathBuf::from(&template.binary),
        root_dir: std::path::absolute(dirs.root())?,
        bind_address: std::net::Ipv4Addr::LOCALHOST.into(),
        port,
        etcd_servers,
        etcd_tls: Default::default(),
        front_url: template.front_url.clone(),
        shutdown_delay: Duration::ZERO,
        token_auth_file: std::path::absolute(dirs.token_file())?,
        extra_args: template.extra_args.clone(),
        // A root shard's copy runs as a kcp of one shard: alone, never reached through the
        // front-proxy (non-root shards are not preflighted).
        sharded: None,
    };
    let spec = ProcessSpec::new(
        "preflight",
        UnitName::preflight(&actor.shard.name_any()),
        launch.binary.clone(),
        slot::args::kcp_args(&launch)?,
        dirs.log(),
        dirs.process(),
    );
    let launched_at = Utc::now();
    save(actor.dirs, |r| {
        r.launched_at = Some(launched_at);
        r.port = port;
    })?;
    let process = actor.ctx.runtime.start(&spec).await?;
    reservation.hold_for(actor.desired.readiness_timeout);
    let copied = match (record.copied_at, record.dump.is_some()) {
        (Some(at), _) => format!("copied in {:.1}s", seconds(record.started_at, at)),
        (None, _) => "copied".into(),
    };
    Ok(vec![Note::normal(
        "PreflightLaunched",
        format!(
            "started kcp {} alone on a copy of the data ({copied}; pid {}, port {}, never behind the front)",
            template.version, process.pid, port
        ),
    )])
}

/// ReleasePreflightLease.
pub async fn release_lease(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let url = slot::slot_url(record.port);
    let shard_admin = slot::shard_admin_client(&actor.dirs.preflight().admin_kubeconfig(), &url).await?;
    // The copied Lease names a slot that leads the real data: on the copy nobody renews it.
    let release = async move { Ok(slot::release_controllers_lease(&shard_admin).await?) };
    if actor.ask(&url, release).await?.is_none() {
        return Ok(vec![]);
    }
    let now = Utc::now();
    save(actor.dirs, |r| {
        r.ready_at.get_or_insert(now);
        r.lease_released_at = Some(now);
    })?;
    Ok(vec![])
}

/// ComparePreflight.
pub async fn compare(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let dirs = actor.dirs.preflight();
    let url = slot::slot_url(record.port);
    let client = slot::shard_admin_client(&dirs.admin_kubeconfig(), &url).await?;
    let read = async move { Ok(schemas::read(&client).await?) };
    let Some(after) = actor.ask(&url, read).await? else {
        return Ok(vec![]);
    };
    let before: Schemas = super::state::read_json(&dirs.original())?.unwrap_or_default();
    let changes = schemas::changes(&before, &after);
    let now = Utc::now();
    let version = &record.template.version;
    let launched_at = record.launched_at.unwrap_or(record.started_at);
    let timings = format!(
        "/readyz {:.1}s and its controllers leading {:.1}s after its start",
        record.ready_at.map_or(0.0, |at| seconds(launched_at, at)),
        seconds(launched_at, now)
    );
    let (result, message) = if changes.is_empty() {
        (
            PreflightResult::Compatible,
            format!(
                "kcp {version} served a copy of the data: {timings}; none of kcp's {} own schemas and storage versions changed",
                after.len()
            ),
        )
    } else {
        let snapshot = actor
            .world
            .state
            .snapshot
            .as_ref()
            .filter(|s| s.template == record.template)
            .map(|s| format!(" taken before it ({})", s.path))
            .unwrap_or_else(|| {
                " of the data, and none was taken (spec.rollout.snapshotBeforeVersionChange is false, or the store is an etcd: take one yourself first)"
                    .into()
            });
        let goes_on = if actor.desired.allow_schema_change {
            "the roll goes on (spec.rollout.allowMinorVersionChange)"
        } else {
            "the roll waits for spec.rollout.allowMinorVersionChange"
        };
        (
            PreflightResult::SchemaChanged,
            format!(
                "kcp {version} served a copy of the data ({timings}) and changed {} of kcp's own schemas: a roll back will need the snapshot{snapshot}; {goes_on}",
                changes.len()
            ),
        )
    };
    save(actor.dirs, |r| {
        r.result = Some(result);
        r.changes = changes.clone();
        r.message = Some(message.clone());
        r.completed_at = Some(now);
    })?;
    let line = if changes.is_empty() {
        message
    } else {
        format!("{message}: {}", changes.join("; "))
    };
    Ok(vec![match result {
        PreflightResult::Compatible => Note::normal("PreflightPassed", line),
        _ => Note::warning("PreflightPassed", line),
    }])
}

/// FailPreflight.
pub fn fail(actor: &Actor<'_>, cause: &PreflightFailure) -> Result<Notes, Error> {
    let log = actor.dirs.preflight().log();
    let detail = match cause {
        PreflightFailure::Exited { last_words } => format!("its kcp exited: {last_words}"),
        PreflightFailure::NotReady { timeout_seconds } => format!(
            "its kcp did not answer /readyz on its own port within {timeout_seconds}s (spec.rollout.readinessTimeout; log: {})",
            log.display()
        ),
        PreflightFailure::ControllersNotLeading { timeout_seconds } => format!(
            "its controllers did not take their Lease on the copy within {timeout_seconds}s of kcpshard deleting the copied one (spec.rollout.readinessTimeout; log: {})",
            log.display()
        ),
    };
    fail_with(actor, detail)
}

pub(super) fn fail_with(actor: &Actor<'_>, detail: String) -> Result<Notes, Error> {
    let now = Utc::now();
    let record = save(actor.dirs, |r| {
        r.result = Some(PreflightResult::Failed);
        r.message = Some(detail.clone());
        r.completed_at = Some(now);
    })?;
    Ok(vec![Note::warning(
        "PreflightFailed",
        format!(
            "the preflight of kcp {} on a copy of the data failed: {detail}; the roll is blocked and the old slots keep serving",
            record.template.version
        ),
    )])
}

/// The preflight's processes that still run: its kcp (by its record, and any kcp on its root) and
/// the kine over its copy.
fn processes(
    runtime: &Runtime,
    store: Option<&StoreBackend>,
    dirs: &ShardDirs,
    place: &CopyPlace,
) -> Result<Vec<ProcessRecord>, Error> {
    let files = dirs.preflight();
    let mut processes: Vec<ProcessRecord> = Runtime::load(&files.process())?
        .into_iter()
        .filter(|p| runtime.is_running(p))
        .collect();
    let root_arg = slot::args::root_dir_arg(&std::path::absolute(files.root())?);
    for pid in Runtime::find_by_argument(&root_arg) {
        if !processes.iter().any(|p| p.pid == pid)
            && let Some(process) = Runtime::observe(pid)
        {
            processes.push(process);
        }
    }
    if let Some(store) = store {
        processes.extend(store.copy_processes(runtime, place)?);
    }
    Ok(processes)
}

/// StopPreflight: asks its kcp and kine to stop (recorded; SIGKILL follows on the next look, see
/// [`STOP_GRACE`]), and returns.
pub async fn stop(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let store = actor.store()?;
    let processes = processes(
        &actor.ctx.runtime,
        Some(&store),
        actor.dirs,
        &place(actor, Some(&record)),
    )?;
    let stops = processes.into_iter().map(|p| (p, STOP_GRACE)).collect();
    super::stops::send(actor, Stopping::Preflight, stops).await?;
    Ok(vec![])
}

/// RemovePreflight, once none of its processes runs: drops the scratch database, removes the copy;
/// then records that nothing is left (or forgets a preflight that never started, so that it
/// starts again).
pub async fn remove(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = current(actor.dirs)?;
    let store = actor.store()?;
    let place = place(actor, Some(&record));
    let running = processes(&actor.ctx.runtime, Some(&store), actor.dirs, &place)?;
    if let Some(process) = running.first() {
        return Err(Error::StillRunning {
            what: "the preflight's kcp or kine",
            pid: process.pid,
        });
    }
    // A preflight kcp that failed (an unknown flag) leaves its unit failed.
    for unit in [
        UnitName::preflight(&place.shard),
        UnitName::preflight_kine(&place.shard),
    ] {
        actor.ctx.runtime.forget_unit(&unit).await;
    }
    if let Some(drop) = store.drop_scratch(&place) {
        let about = place.scratch_database.clone().unwrap_or_default();
        if actor.ask(&about, async move { Ok(drop.await?) }).await?.is_none() {
            return Ok(vec![]);
        }
    }
    store.remove_copy(&place)?;
    crate::fsutil::remove_if_there(&actor.dirs.preflight().process())?;
    let mut state = actor.dirs.load_state()?;
    if record.result.is_none() {
        state.preflight = None;
    } else if let Some(r) = state.preflight.as_mut() {
        r.removed_at = Some(Utc::now());
    }
    actor.dirs.save_state(&state)?;
    Ok(vec![])
}

fn current(dirs: &ShardDirs) -> Result<PreflightRecord, Error> {
    dirs.load_state()?.preflight.ok_or(Error::NoPreflight)
}

/// What the plan needs of the recorded preflight: its kcp's state (one `/readyz` and, once the
/// copied Lease was released, one read of who holds it now, each bounded by [`LOOK_TIMEOUT`]) and
/// whether anything of it is left.
pub async fn observe(
    ctx: &Context,
    shard: &crate::api::KcpShard,
    store: Option<&StoreBackend>,
    dirs: &ShardDirs,
    record: &PreflightRecord,
) -> Result<PreflightObservation, Error> {
    let shard_ref = ObjectRef::from_obj(shard);
    let files = dirs.preflight();
    let copy = copy_place(dirs, Some(record), shard);
    let run = match (record.result, Runtime::load(&files.process())?) {
        (Some(_), _) => PreflightRun::Exited {
            last_words: "done".into(),
        },
        (None, None)
            if record.copied_at.is_some()
                && let Some(store) = store
                && store.copy_starting(&ctx.runtime, &copy).await =>
        {
            PreflightRun::StoreStarting
        }
        (None, None) if record.copied_at.is_some() => PreflightRun::Copied,
        (None, None) => PreflightRun::Copying,
        (None, Some(process)) if !ctx.runtime.is_running(&process) => PreflightRun::Exited {
            last_words: super::observe::last_words(&ctx.runtime, &process, true).await,
        },
        (None, Some(process)) => {
            ctx.exits.watch(process.pid, (shard_ref.clone(), Wake::Exit));
            let ready = record.ready_at.is_some()
                || matches!(
                    tokio::time::timeout(LOOK_TIMEOUT, slot::slot_ready(&files.root(), record.port)).await,
                    Ok(Ok(true))
                );
            // After the release, any holder is the preflight's kcp: nothing else reaches the copy.
            let mut controllers_lead = false;
            if record.lease_released_at.is_some()
                && let Ok(shard_admin) = ctx
                    .slot_clients
                    .get(&files.admin_kubeconfig(), record.port, Identity::ShardAdmin)
                    .await
                && let Ok(Ok(lease)) =
                    tokio::time::timeout(LOOK_TIMEOUT, slot::access::controllers_lease(&shard_admin)).await
            {
                controllers_lead = lease.holder.is_some();
            }
            PreflightRun::Running {
                ready,
                lease_released_at: record.lease_released_at,
                controllers_lead,
            }
        }
    };
    let detail = match record.result {
        Some(PreflightResult::Failed) => record.message.iter().cloned().collect(),
        _ => record.changes.clone(),
    };
    Ok(PreflightObservation {
        template: record.template.clone(),
        started_at: record.started_at,
        launched_at: record.launched_at,
        run,
        result: record.result,
        detail,
        leftovers: record.removed_at.is_none(),
        processes_running: record.removed_at.is_none() && !processes(&ctx.runtime, store, dirs, &copy)?.is_empty(),
    })
}
