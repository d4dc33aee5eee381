//! Observe: what runs now, read and never changed. Slot processes (by their records: same pid, same
//! start time), what the health checks have seen of each (`/readyz` on its own port, its listener
//! after SIGTERM), the front's serving set and connection counts through its control socket, the
//! store (its shard-wide part, every running slot's own kine, a read from each kine kcpshard runs),
//! who holds the controllers' Lease, the probe workspace, a preflight's kcp, and the controller's
//! own record of the roll. What needs repair (a slot running without a record) is reported for the plan to act on.
//!
//! Longer than 600 lines on purpose: one look, in the order it reads things; the parts that stand
//! alone (the front, the store, health) are modules of their own.
mod backlog;
mod front;

pub use backlog::BacklogReadings;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::clients::Identity;
use super::health::{Failure, LOOK_TIMEOUT, Seen, Target};
use super::plan::{
    Health, JobObservation, LeaseHolder, MigrationObservation, MigrationRecord, MirrorObservation, Observed,
    ProcessStop, SLOT_NAMES, SlotObservation, StopCause, StopRecord,
};
use super::state::{ControllerState, DataVersion, ShardDirs, SlotDirs, SlotRecord, StoreInUse, StoreRecord};
use super::{Context, Error, Wake};
use crate::front::Backend;
use crate::process::{ProcessRecord, Runtime};
use crate::slot::access;
use crate::store::Kine;
use crate::store::mirror::MirrorProgress;

/// The observation, and the details act and status need that the plan does not.
pub struct World {
    pub observed: Observed,
    pub state: ControllerState,
    pub slots: Vec<ObservedSlot>,
    /// What the front forwards new connections to, as it says (possibly slots that are gone).
    pub front_backends: Vec<Backend>,
    /// The etcd-protocol endpoints the slots dial now (never a password).
    pub store_endpoints: Vec<String>,
    /// The kines kcpshard runs that do not answer a read, with what the last look saw.
    pub unresponsive_kines: Vec<(Kine, String)>,
    /// The shard's kubeconfig through the front (kcpshard's admin identity).
    pub front_kubeconfig: std::path::PathBuf,
    /// The version that last served the shard's data, as recorded beside the store.
    pub data_version: Option<DataVersion>,
    /// The store the shard runs on: the one its data is in.
    pub store: StoreInUse,
}

impl World {
    pub fn slot(&self, name: &str) -> Option<&ObservedSlot> {
        self.slots.iter().find(|s| s.record.name == name)
    }

    /// The version the slots the front forwards to run, the oldest if they differ.
    pub fn serving_version(&self) -> Option<String> {
        self.observed
            .front
            .backends()
            .iter()
            .filter_map(|b| self.slot(b))
            .map(|s| s.record.template.version.clone())
            .min_by_key(|v| crate::api::KcpVersion::parse(v).ok())
    }

    /// A client of a slot the front forwards to that answers, on its own port.
    pub async fn serving_client(&self, ctx: &Context, identity: Identity) -> Result<(String, kube::Client), Error> {
        let slot = self
            .observed
            .front
            .backends()
            .iter()
            .filter_map(|b| self.observed.slot(b))
            .find(|s| s.can_stay() && s.health.ready)
            .or_else(|| {
                self.observed
                    .slots
                    .iter()
                    .find(|s| s.running && s.listening && s.health.ready)
            })
            .ok_or(Error::NoServingSlot)?;
        Ok((slot.name.clone(), self.slot_client(ctx, &slot.name, identity).await?))
    }

    /// A client of slot `name` (a recorded one) on its own port.
    pub async fn slot_client(&self, ctx: &Context, name: &str, identity: Identity) -> Result<kube::Client, Error> {
        let recorded = self.slot(name).expect("observed slots have records");
        // The shard admin is in the slot's own kubeconfig; kcpshard's admin identity, which every
        // slot accepts, in the shard's kubeconfig through the front.
        let kubeconfig = match identity {
            Identity::ShardAdmin => recorded.dirs.admin_kubeconfig(),
            Identity::Admin => self.front_kubeconfig.clone(),
        };
        Ok(ctx
            .slot_clients
            .get(&kubeconfig, recorded.record.port, identity)
            .await?)
    }
}

/// A slot with its record, where it lives, and, once started, its process.
pub struct ObservedSlot {
    pub record: SlotRecord,
    pub dirs: SlotDirs,
    pub process: Option<ProcessRecord>,
}

impl ObservedSlot {
    pub fn name(&self) -> &str {
        &self.record.name
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, self.record.port))
    }
}

/// The kcp processes that run with a slot's root directory: its own, or one whose record is lost.
pub fn slot_processes(slot: &SlotDirs) -> Vec<ProcessRecord> {
    let marker = format!("--root-directory={}", slot.root().display());
    Runtime::find_by_argument(&marker)
        .into_iter()
        .filter_map(Runtime::observe)
        .collect()
}

pub async fn observe(ctx: &Context, shard: &crate::api::KcpShard, dirs: &ShardDirs) -> Result<World, Error> {
    let shard_ref = ObjectRef::from_obj(shard);
    let state = dirs.load_state()?;
    let mut store_in_use = StoreRecord::in_use(dirs.load_store_record()?.as_ref(), &shard.spec.store, dirs);
    if store_in_use.refused.is_none() {
        store_in_use.refused = super::migration::move_waits(dirs, shard, &store_in_use.store, &state);
    }
    let store = ctx.store(shard, &store_in_use.store, dirs).map_err(|e| e.to_string());
    let mut store_status = match &store {
        Ok(store) => store.check(&ctx.runtime).await,
        Err(e) => Err(e.clone()),
    };
    let mut kines: Vec<(String, Kine)> = store_status
        .as_ref()
        .map(|seen| seen.kines.iter().map(|k| ("kine".to_string(), k.clone())).collect())
        .unwrap_or_default();

    let mut records = dirs.slot_records()?;
    let mut unrecorded = Vec::new();
    for name in SLOT_NAMES {
        let slot_dirs = dirs.slot(name);
        let recorded = records.iter().any(|r| r.name == name);
        let process_recorded = Runtime::load(&slot_dirs.process())?.is_some();
        if (!recorded || !process_recorded) && slot_processes(&slot_dirs).iter().any(|p| ctx.runtime.is_running(p)) {
            unrecorded.push(name.to_string());
            records.retain(|r| r.name != name);
        }
    }

    let mut slots = Vec::new();
    let mut observations = Vec::new();
    // Running slots whose own kine (KinePostgres) does not accept.
    let mut kine_down = Vec::new();
    for record in records {
        let slot_dirs = dirs.slot(&record.name);
        let process = Runtime::load(&slot_dirs.process())?;
        let running = process.as_ref().is_some_and(|p| ctx.runtime.is_running(p));
        let mut own_store_running = false;
        // A slot started on the store a move goes to (plan/migration.rs) dials that store's kine.
        let slot_store = match &record.store {
            Some(spec) => ctx.store(shard, spec, dirs).map_err(|e| e.to_string()),
            None => store.clone(),
        };
        if let Ok(store) = &slot_store {
            match store
                .running_slot_kine(&ctx.runtime, &slot_dirs.store(), &record.name)
                .await
            {
                Some(Some(own)) => {
                    own_store_running = true;
                    kines.push((format!("slot-{}-kine", record.name), own.clone()));
                    if let Ok(seen) = &mut store_status {
                        seen.add(&own);
                    }
                }
                Some(None) => {}
                // A running slot whose own kine is down has no store (KinePostgres): EnsureStore
                // brings the kine back at the address the slot dials.
                // Not so for a slot on a move's new store: it stays out of the front, and the
                // move stops if it exits.
                None if running && record.store.is_none() => {
                    store_status = Err(format!("the kine of slot {} does not accept", record.name));
                    kine_down.push(record.name.clone());
                }
                None => {}
            }
        }
        let mut stop = record.stop;
        let seen = match process.as_ref().filter(|_| running) {
            Some(process) => {
                ctx.exits.watch(process.pid, (shard_ref.clone(), Wake::Exit));
                slot_health(ctx, &shard_ref, &shard.name_any(), &record, &slot_dirs, process).await
            }
            // Gone: what was seen of it while it ran (when it stopped listening).
            None => process
                .as_ref()
                .and_then(|p| {
                    ctx.health
                        .last(&target(&shard.name_any(), &format!("slot-{}", record.name), p))
                })
                .map(|seen| Seen {
                    health: Health {
                        ever_ready: seen.health.ever_ready,
                        ..Health::default()
                    },
                    ..seen
                })
                .unwrap_or_default(),
        };
        if process.is_none() {
            // Decided but never started: serve stopped between the record and the start.
            stop.get_or_insert(StopRecord {
                cause: StopCause::NeverStarted,
                at: record.created_at,
                killed: true,
            });
        }
        let mut health = seen.health.clone();
        health.ever_ready |= record.served_at.is_some();
        let listening = running
            && if stop.is_some() {
                seen.listening
            } else {
                crate::process::procfs::tcp_listening(record.port)
            };
        let started_at = process
            .as_ref()
            .and_then(|p| p.started_at.parse::<DateTime<Utc>>().ok())
            .unwrap_or(record.created_at);
        observations.push(SlotObservation {
            name: record.name.clone(),
            template: record.template.clone(),
            running,
            started_at,
            health,
            listening,
            stopped_listening_at: seen.stopped_listening_at,
            stop,
            left_front_at: record.left_front_at,
            own_store_running,
            on_other_store: record.store.is_some(),
            last_words: match process.as_ref().filter(|_| !running) {
                Some(process) => Some(last_words(&ctx.runtime, process, true).await),
                None => None,
            },
        });
        slots.push(ObservedSlot {
            record,
            dirs: slot_dirs,
            process,
        });
    }

    // A read from every kine kcpshard runs: one that accepts but does not answer is replaced.
    let mut unresponsive_kines = Vec::new();
    for (name, kine) in &kines {
        ctx.exits.watch(kine.record.pid, (shard_ref.clone(), Wake::Exit));
        let address = kine.address.clone();
        let seen = ctx
            .health
            .seen(
                target(&shard.name_any(), name, &kine.record),
                shard_ref.clone(),
                None,
                false,
                // Whether kine answers: an error it answers with (its database away) is the store
                // check's to report, and no reason to restart kine.
                // One read, so one LOOK_TIMEOUT: the health task's own bound (two of them) is for
                // a slot's look, which asks twice.
                move || {
                    let address = address.clone();
                    async move {
                        match tokio::time::timeout(LOOK_TIMEOUT, crate::store::kine_read::read_health(&address)).await {
                            Ok(answer) => answer.map(|_| ()).map_err(Failure::slow),
                            Err(_) => Err(Failure::slow(format!("no answer to a read within {LOOK_TIMEOUT:?}"))),
                        }
                    }
                },
            )
            .await;
        if seen.health.unresponsive() {
            unresponsive_kines.push((kine.clone(), seen.health.problem.unwrap_or_default()));
        }
    }
    if let Some((kine, problem)) = unresponsive_kines.first() {
        store_status = Err(format!(
            "kine at {} accepts connections but did not answer a read in {} looks of {}s in a row ({problem}); it is restarted at the same address",
            kine.endpoint(),
            super::plan::UNRESPONSIVE_AFTER,
            LOOK_TIMEOUT.as_secs(),
        ));
    }

    let (stopping, exited): (Vec<ProcessStop>, Vec<ProcessStop>) = state
        .stops
        .iter()
        .cloned()
        .partition(|stop| Runtime::observe(stop.pid).is_some_and(|p| p.start_time == stop.start_time));
    let killed_and_gone: Vec<ProcessStop> = exited.into_iter().filter(|s| s.killed).collect();
    for stop in &stopping {
        ctx.exits.watch(stop.pid, (shard_ref.clone(), Wake::Exit));
    }
    let front = ctx.front(shard, dirs)?;
    let front_look = front::look(ctx, &shard_ref, &front, &slots, &stopping).await;
    // The front's word that a slot left a new connection unanswered since its last ok look.
    for slot in &mut observations {
        let ok_at = slot.health.last_ok_at;
        slot.health.silent_in_front = front_look
            .last_silent
            .iter()
            .any(|(name, at)| *name == slot.name && ok_at.is_some_and(|ok| *at > ok));
    }
    // Not while deleting: what the front serves goes.
    let front_check = match &state.front_check {
        Some(due) if !front.is_ours() && shard.metadata.deletion_timestamp.is_none() => {
            let serving = front_look.observation.backends().first();
            Some(front::check(dirs, front.listen(), serving, due).await)
        }
        _ => None,
    };
    // Own kines of slots (KinePostgres) started and not accepting yet: of a slot about to start,
    // or of a running slot whose kine was started again.
    let mut slot_stores_starting = BTreeMap::new();
    // And of a slot about to start on the store a move goes to.
    let move_target = state
        .migration
        .as_ref()
        .filter(|m| m.under_way() && m.switched_at.is_none())
        .and_then(|m| ctx.store(shard, &m.to, dirs).ok());
    for store in store.iter().chain(&move_target) {
        for name in SLOT_NAMES {
            if let Some(pid) = store
                .starting_slot_kine(&ctx.runtime, &dirs.slot(name).store(), name)
                .await
            {
                slot_stores_starting.insert(name.to_string(), pid);
            }
        }
    }
    let store_starting = match (&store, &store_status) {
        (Ok(store), Err(_)) => match store.starting(&ctx.runtime).await {
            Some(pid) => Some(pid),
            // A running slot's own kine that is down makes the store down; one that starts is
            // waited for.
            None => kine_down
                .iter()
                .find_map(|name| slot_stores_starting.get(name).copied()),
        },
        _ => None,
    };
    for pid in store_status
        .iter()
        .flat_map(|seen| &seen.pids)
        .chain(&store_starting)
        .chain(slot_stores_starting.values())
    {
        ctx.exits.watch(*pid, (shard_ref.clone(), Wake::Exit));
    }
    // When the store's processes last started (a restart after an outage).
    let store_started_at = kines
        .iter()
        .map(|(_, k)| k.record.started_at.clone())
        .chain(
            store_status
                .iter()
                .flat_map(|seen| &seen.pids)
                .filter_map(|pid| Runtime::observe(*pid))
                .map(|p| p.started_at),
        )
        .filter_map(|at| at.parse::<DateTime<Utc>>().ok())
        .max();
    let orphaned_kines = orphaned_kines(ctx, dirs, &kines)?;
    let job = match &state.job {
        Some(record) => {
            let (job_state, pid) = super::jobs::observe(&ctx.runtime, &dirs.job(), record).await?;
            if let Some(pid) = pid {
                ctx.exits.watch(pid, (shard_ref.clone(), Wake::Exit));
            }
            Some(JobObservation {
                record: record.clone(),
                state: job_state,
            })
        }
        None => None,
    };
    let migration = match &state.migration {
        Some(record) => Some(observe_migration(ctx, shard, dirs, record).await?),
        None => None,
    };
    let disk = disk_problem(ctx, shard, store.as_ref().ok());
    let data_version = dirs.load_data_version()?;

    let mut observed = Observed {
        now: Utc::now(),
        store_up: store_status.is_ok(),
        store_starting: store_starting.is_some(),
        slot_stores_starting: slot_stores_starting.into_keys().collect(),
        answer_awaited: ctx.requests.waiting(&shard.name_any()),
        answered: ctx.requests.answered(&shard.name_any()),
        store_problem: store_status.as_ref().err().cloned(),
        store_unresponsive: !unresponsive_kines.is_empty(),
        store_processes_up: store.as_ref().is_ok_and(|s| s.processes_running(&ctx.runtime)),
        snapshot_for: state.snapshot.as_ref().map(|s| s.template.clone()),
        last_backup_at: state.backup.as_ref().map(|b| b.taken_at),
        snapshot_request_answered: state.snapshot_request_answered.clone(),
        front: front_look.observation,
        front_problem: front_look.problem,
        front_outdated: front_look.outdated,
        front_upgrading: front_look.upgrading,
        front_ours: front.is_ours(),
        front_elsewhere: front_look.elsewhere,
        slots: observations,
        unrecorded,
        lease: LeaseHolder::Unknown,
        lease_renewed_at: None,
        probe_ready: false,
        leader_backlog: None,
        disk,
        store_started_at,
        roll: state.roll.clone(),
        blocked: state.blocked.clone(),
        preflight: match &state.preflight {
            Some(record) => Some(super::preflight::observe(ctx, shard, store.as_ref().ok(), dirs, record).await?),
            None => None,
        },
        restore: state.restore.clone(),
        data_version: data_version.as_ref().map(|d| d.version.clone()),
        interim_crashed_for: state.interim_crashed_for.clone(),
        store_refused: store_in_use.refused.clone(),
        orphaned_kines,
        job,
        job_failure: state.job_failure.clone(),
        stopping,
        killed_and_gone,
        front_check,
        migration,
        adoption: state.adoption.clone(),
        identities: Default::default(),
        sharded_trust_stale: match &shard.spec.shard {
            Some(sharded) if sharded.is_root() => {
                super::sharding::Trust::of(dirs).stale(dirs, &super::desired::front_url(&shard.spec.front))?
            }
            _ => false,
        },
    };
    let identities = super::credentials::load(dirs)?;
    observed.identities = super::credentials::observe(Some(&identities));
    observed.identities.kubeconfig_stale = super::credentials::kubeconfig_stale(
        dirs,
        &identities,
        &observed,
        &super::desired::front_url(&shard.spec.front),
    )?;
    let mut world = World {
        observed,
        state,
        slots,
        front_backends: front_look.backends,
        store_endpoints: store_status.map(|seen| seen.endpoints).unwrap_or_default(),
        unresponsive_kines,
        front_kubeconfig: dirs.front_kubeconfig(),
        data_version,
        store: store_in_use,
    };
    // With the store away nothing needs the Lease or the probe (the store comes first), and a kcp
    // without its store may take its time to answer.
    if world.observed.store_up {
        observe_lease_and_probe(ctx, &mut world).await;
    }
    Ok(world)
}

/// A move of the data (plan/migration.rs): whether its new store accepts (before the switch), how
/// far the mirror is, and whether what ran the old store still runs (after the switch).
async fn observe_migration(
    ctx: &Context,
    shard: &crate::api::KcpShard,
    dirs: &ShardDirs,
    record: &MigrationRecord,
) -> Result<MigrationObservation, Error> {
    let mut seen = MigrationObservation {
        record: record.clone(),
        target_up: false,
        target_starting: false,
        mirror: MirrorProgress::load(&super::migration::progress_file(dirs))?.map(|p| MirrorObservation {
            phase: p.phase,
            copied_keys: p.copied_keys,
            lag: p.lag(),
            verified_keys: p.verified_keys,
        }),
        old_store_running: false,
    };
    if !record.under_way() {
        return Ok(seen);
    }
    if record.switched_at.is_none() {
        if let Ok(target) = ctx.store(shard, &record.to, dirs) {
            seen.target_up = target.check(&ctx.runtime).await.is_ok();
            seen.target_starting = !seen.target_up && target.starting(&ctx.runtime).await.is_some();
        }
    } else {
        seen.old_store_running = super::migration::old_store_processes(ctx, shard, dirs, record)
            .is_ok_and(|processes| !processes.is_empty());
    }
    Ok(seen)
}

/// The records of kines kcpshard started for this shard that still run but serve neither the
/// store in use nor a slot that has a record: a store an older kcpshard let spec.store move away
/// from, or a slot's kine whose slot is gone. Deleting the shard stops them.
fn orphaned_kines(ctx: &Context, dirs: &ShardDirs, in_use: &[(String, Kine)]) -> Result<Vec<String>, Error> {
    let records = std::iter::once(dirs.store())
        .chain(SLOT_NAMES.iter().map(|name| dirs.slot(name).store()))
        .map(|dir| dir.join(crate::store::kine::RECORD_FILE));
    let mut orphaned = Vec::new();
    for path in records {
        if let Some(record) = Runtime::load(&path)?
            && ctx.runtime.is_running(&record)
            && !in_use.iter().any(|(_, kine)| kine.record.pid == record.pid)
        {
            orphaned.push(path.display().to_string());
        }
    }
    Ok(orphaned)
}

/// How a slot's process ended (or, with `ended` false, what it is doing), for an event: its exit
/// status when this serve saw it, the last error line it printed (kcp prints `Error: ...` or a klog
/// `E`/`F` line), and where its log is.
pub async fn last_words(runtime: &Runtime, process: &ProcessRecord, ended: bool) -> String {
    let status = match ended {
        true => runtime
            .exit_status(process)
            .await
            .map(|s| format!("{s}; "))
            .unwrap_or_default(),
        false => String::new(),
    };
    let tail = runtime.log_tail(process, 40).await;
    let is_error = |line: &&String| {
        let line = line.trim_start();
        line.starts_with("Error:")
            || line.starts_with("error:")
            || (line.len() > 5
                && matches!(line.as_bytes()[0], b'E' | b'F')
                && line.as_bytes()[1..5].iter().all(u8::is_ascii_digit))
    };
    let log = Runtime::log_location(process);
    match tail.iter().rev().find(is_error).or(tail.last()) {
        Some(line) => format!("{status}it printed {:?} (log: {log})", line.trim()),
        None => format!("{status}it printed nothing (log: {log})"),
    }
}

/// The worst filesystem of the state dir and the store's data, if one is below its watermark; the
/// free space of each goes to `/metrics`.
fn disk_problem(
    ctx: &Context,
    shard: &crate::api::KcpShard,
    store: Option<&crate::store::StoreBackend>,
) -> Option<crate::store::disk::DiskProblem> {
    use crate::store::disk;
    let paths: Vec<&std::path::Path> = std::iter::once(ctx.state_dir.as_path())
        .chain(store.and_then(|s| s.data_dir()))
        .collect();
    match disk::free_space(&paths) {
        Ok(spaces) => {
            ctx.metrics.store_disk_seen(&shard.name_any(), &spaces);
            disk::verdict(&spaces, &disk::Watermark::default())
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell the free space of the state dir and the store");
            None
        }
    }
}

fn target(shard: &str, name: &str, process: &ProcessRecord) -> Target {
    Target {
        shard: shard.to_string(),
        name: name.to_string(),
        pid: process.pid,
        start_time: process.start_time,
    }
}

/// What the health checks have seen of a running slot.
async fn slot_health(
    ctx: &Context,
    shard_ref: &ObjectRef<crate::api::KcpShard>,
    shard: &str,
    record: &SlotRecord,
    dirs: &SlotDirs,
    process: &ProcessRecord,
) -> Seen {
    let clients = ctx.slot_clients.clone();
    let kubeconfig = dirs.admin_kubeconfig();
    let port = record.port;
    // A non-root shard of a sharded kcp has no `root` workspace: its own API instead.
    let api = match &record.template.sharded {
        Some(sharded) if !sharded.is_root() => crate::slot::serving::Request::ShardApi,
        _ => crate::slot::serving::Request::KcpApi,
    };
    let look = move || {
        let clients = clients.clone();
        let kubeconfig = kubeconfig.clone();
        async move {
            // kcp writes its admin.kubeconfig early in its start; until then it cannot answer.
            let client = clients
                .get(&kubeconfig, port, Identity::ShardAdmin)
                .await
                .map_err(|e| Failure::slow(e.to_string()))?;
            // The ping beside it: a look takes no longer than its readiness request.
            let (serving, ping) = tokio::join!(
                crate::slot::serves_kcp_apis(&client, api, LOOK_TIMEOUT),
                access::answers_ping(&client, LOOK_TIMEOUT)
            );
            serving.map_err(|e| Failure {
                broken: e.kind() == crate::slot::NotServingKind::Broken,
                alive: ping || !matches!(e.answer, crate::slot::serving::Answer::None(_)),
                stopped: false,
                message: e.to_string(),
            })
        }
    };
    ctx.health
        .seen(
            target(shard, &format!("slot-{}", record.name), process),
            shard_ref.clone(),
            Some(port),
            record.stop.is_some(),
            look,
        )
        .await
}

/// The Lease's holder (read through a slot that answers) matched against the slots' identities,
/// and whether the roll's probe workspace is Ready.
async fn observe_lease_and_probe(ctx: &Context, world: &mut World) {
    let Ok((_, client)) = world.serving_client(ctx, Identity::ShardAdmin).await else {
        return;
    };
    if let Ok(Ok(lease)) = tokio::time::timeout(LOOK_TIMEOUT, access::controllers_lease(&client)).await {
        let mut identities = Vec::new();
        for (slot, seen) in world.slots.iter().zip(&world.observed.slots) {
            let identity = match &slot.process {
                Some(process) => ctx.identity(process).await,
                None => None,
            };
            identities.push((seen.name.clone(), identity, seen.running));
        }
        world.observed.lease = super::lease::holder(lease.holder.as_deref(), &identities);
        world.observed.lease_renewed_at = lease.renewed_at;
    }
    let probe = world
        .state
        .roll
        .as_ref()
        .filter(|r| r.probe_succeeded_at.is_none())
        .and_then(|r| r.probe.clone());
    // A non-root shard's probe is the Lease: held by a running slot once no old slot may lead, and
    // renewed by it since ReleaseLease handed it over (until then it names a slot not yet leading).
    if probe.as_ref().is_some_and(|p| p.workspace.is_empty()) {
        let released_at = world.state.roll.as_ref().and_then(|r| r.lease_released_at);
        let renewed_since_handed = released_at.is_none_or(|released| {
            world
                .observed
                .lease_renewed_at
                .is_some_and(|renewed| renewed > released)
        });
        world.observed.probe_ready = renewed_since_handed
            && matches!(&world.observed.lease, LeaseHolder::Slot(name)
            if world.observed.slots.iter().any(|s| &s.name == name && s.running && s.listening));
        return;
    }
    if let Some(probe) = probe
        && let Ok((_, client)) = world.serving_client(ctx, Identity::Admin).await
        && let Ok(Ok(phase)) =
            tokio::time::timeout(LOOK_TIMEOUT, access::workspace_phase(&client, &probe.workspace)).await
    {
        world.observed.probe_ready = phase.as_deref() == Some("Ready");
        if !world.observed.probe_ready {
            world.observed.leader_backlog = backlog::leader_backlog(ctx, world).await;
        }
    }
}
