//! Act: perform exactly the step the plan chose, record it in the controller's files before the
//! effect that depends on it, and tell the user with an event. A step sends a signal or a request
//! and returns: a process's exit, a listener closing, a workspace getting Ready are observed later.
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use nix::sys::signal::Signal;

use super::clients::Identity;
use super::error::Error;
use super::observe::{ObservedSlot, World};
use super::plan::{
    BlockCause, Blocked, Desired, FrontChange, KillCause, LeaveCause, ProbeRecord, RestartCause, Restorable,
    RestorePhase, RestoreRecord, RollRecord, SlotTemplate, Step, StopCause, StopRecord,
};
use super::state::{CompletedRoll, DataVersion, ShardDirs, SlotRecord, StoreRecord};
use super::{Context, Note};
use crate::api::{KcpShard, RESTORE_SNAPSHOT_ANNOTATION};
use crate::front::Backend;
use crate::process::{ProcessSpec, Runtime, UnitName, free_port};
use crate::slot;
use crate::store::StoreBackend;

/// How long caddy may take to answer `/readyz` through the front after a change.
const FRONT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a kine (a slot's own, or the shard's at deletion) may take to exit after SIGTERM. kine
/// exits in milliseconds; this bounds a step that waits for it.
const KINE_STOP_GRACE: Duration = Duration::from_secs(2);

/// What a step did that the user should hear about.
pub type Notes = Vec<Note>;

pub struct Actor<'a> {
    pub ctx: &'a Context,
    pub shard: &'a KcpShard,
    pub dirs: &'a ShardDirs,
    pub desired: &'a Desired,
    pub world: &'a World,
}

impl Actor<'_> {
    pub async fn act(&self, step: &Step) -> Result<Notes, Error> {
        match step {
            Step::Idle | Step::Wait(_) => Ok(vec![]),
            // Its RollBlocked event goes out once, with the first status that says it (mod.rs).
            Step::Blocked { .. } => Ok(vec![]),
            Step::AdoptSlot { name } => self.adopt_slot(name),
            Step::EnsureStore => self.ensure_store().await,
            Step::KillStore => self.kill_store(),
            Step::Snapshot => super::jobs::start_snapshot(self).await,
            Step::FinishJob => super::jobs::finish(self).await,
            Step::CancelJob => super::jobs::cancel(self),
            Step::StartPreflight => super::preflight::start(self).await,
            Step::PreflightProbe => super::preflight::probe(self).await,
            Step::ComparePreflight => super::preflight::compare(self).await,
            Step::FailPreflight { cause } => super::preflight::fail(self, cause),
            Step::RemovePreflight => super::preflight::remove(self).await,
            Step::BeginRestore(restorable) => self.begin_restore(restorable).await,
            Step::RefuseRestore { message } => self.refuse_restore(message).await,
            Step::RestoreSnapshot => super::jobs::start_restore(self).await,
            Step::CompleteRestore => self.complete_restore(),
            Step::EnsureFront => self.ensure_front().await,
            Step::KillFront => self.kill_front(),
            Step::StartSlot { name } => self.start_new_slot(name).await,
            Step::StartInterim { name } => self.start_interim(name).await,
            Step::SetFront(change) => self.set_front(change).await,
            Step::TerminateSlot { name } => self.terminate_slot(name),
            Step::KillSlot { name, cause } => self.kill_slot(name, cause),
            Step::CloseConnections { name } => self.close_connections(name).await,
            Step::StopSlotStore { name } => {
                self.stop_slot_store(name).await?;
                Ok(vec![])
            }
            Step::RemoveSlot { name, crashed } => self.remove_slot(name, *crashed),
            Step::RestartSlot { name, cause } => self.restart_slot(name, cause).await,
            Step::AbortRoll { name, cause } => self.abort_roll(name, cause),
            Step::ReleaseLease { holder } => self.release_lease(holder.as_deref()).await,
            Step::Probe => self.probe().await,
            Step::ProbeSucceeded => self.probe_succeeded().await,
            Step::CompleteRoll => self.complete_roll(),
            Step::StopStore => {
                self.store()?.stop(&self.ctx.runtime, KINE_STOP_GRACE).await?;
                Ok(vec![])
            }
            Step::StopOrphanedKine { record } => self.stop_orphaned_kine(record).await,
            Step::StopFront => {
                self.ctx
                    .front(self.shard, self.dirs)?
                    .stop()
                    .await
                    .map_err(Error::Front)?;
                Ok(vec![Note::normal(
                    "Stopped",
                    format!(
                        "stopped the slots, the store's processes and the front; the data stays in {}",
                        self.dirs.root().display()
                    ),
                )])
            }
        }
    }

    /// Stops a kine of the shard that serves nothing it uses, and drops its record.
    async fn stop_orphaned_kine(&self, record: &str) -> Result<Notes, Error> {
        let path = std::path::Path::new(record);
        let Some(kine) = Runtime::load(path)? else {
            return Ok(vec![]);
        };
        self.ctx.runtime.terminate(&kine, KINE_STOP_GRACE).await?;
        std::fs::remove_file(path)?;
        Ok(vec![Note::normal(
            "OrphanedKineStopped",
            format!(
                "stopped kine (pid {}, {record}), which served no store or slot the shard uses; its data stays",
                kine.pid
            ),
        )])
    }

    pub(super) fn store(&self) -> Result<StoreBackend, Error> {
        Ok(self.ctx.store(self.shard, &self.world.store.store, self.dirs)?)
    }

    fn slot(&self, name: &str) -> Result<&ObservedSlot, Error> {
        self.world.slot(name).ok_or_else(|| Error::NoSuchSlot(name.to_string()))
    }

    fn update_roll(&self, change: impl FnOnce(&mut RollRecord)) -> Result<(), Error> {
        let mut state = self.dirs.load_state()?;
        if let Some(roll) = state.roll.as_mut() {
            change(roll);
            self.dirs.save_state(&state)?;
        }
        Ok(())
    }

    /// A slot's kcp runs without a (complete) record: write what its process tells.
    fn adopt_slot(&self, name: &str) -> Result<Notes, Error> {
        let dirs = self.dirs.slot(name);
        let process = super::observe::slot_processes(&dirs)
            .into_iter()
            .find(|p| self.ctx.runtime.is_running(p))
            .ok_or_else(|| Error::NoSuchSlot(name.to_string()))?;
        process.save(&dirs.process())?;
        let recorded = self.dirs.slot_records()?.iter().any(|r| r.name == name);
        if recorded {
            return Ok(vec![Note::normal(
                "SlotAdopted",
                format!(
                    "slot {name}'s kcp (pid {}) had no process record; recorded it",
                    process.pid
                ),
            )]);
        }
        let record = record_from_argv(name, &process).ok_or_else(|| Error::Unadoptable {
            slot: name.to_string(),
            pid: process.pid,
        })?;
        dirs.save(&record)?;
        Ok(vec![Note::warning(
            "SlotAdopted",
            format!(
                "slot {name}'s kcp (pid {}, port {}) runs without a slot record; rebuilt it from its command line. What that does not tell (the restart annotation, which flags were extra) is lost, so the slot is replaced by a roll",
                process.pid, record.port
            ),
        )])
    }

    /// Starts the store's shard-wide part, then brings back the own kine of every running slot
    /// whose kine is down (on the port that slot dials).
    async fn ensure_store(&self) -> Result<Notes, Error> {
        // A new slot that is still starting will be started again once the store is back.
        let now = Utc::now();
        let starting = self
            .world
            .observed
            .slots
            .iter()
            .any(|s| s.running && !s.health.ever_ready);
        self.update_roll(|roll| {
            if starting {
                roll.store_down_at = Some(now);
            }
        })?;
        let store = self.store()?;
        let runs = self.world.observed.slots.iter().any(|s| s.running);
        // The shard-wide part went away under running slots (a kine killed, PostgreSQL restarted):
        // an outage the user should hear about, not a start.
        let outage = match store.check(&self.ctx.runtime).await {
            Err(problem) if runs => Some(problem),
            _ => None,
        };
        let started = store.ensure(&self.ctx.runtime).await?;
        let mut notes = vec![match outage {
            Some(problem) => Note::warning(
                "StoreRestarted",
                format!("the store was down while slots ran ({problem}); {started}"),
            ),
            None => Note::normal("StoreStarted", started),
        }];
        for (slot, seen) in self.world.slots.iter().zip(&self.world.observed.slots) {
            let name = slot.name();
            let dir = slot.dirs.store();
            if seen.running && store.running_slot_kine(&self.ctx.runtime, &dir, name).await.is_none() {
                let own = store.ensure_slot(&self.ctx.runtime, &dir, name).await?;
                notes.push(Note::warning(
                    "SlotStoreRestarted",
                    format!(
                        "the kine of slot {name} was down; it runs again at {}",
                        own.etcd_servers
                    ),
                ));
            }
        }
        Ok(notes)
    }

    /// Kills the kines that accept connections but do not answer reads; EnsureStore starts them
    /// again on the same ports.
    fn kill_store(&self) -> Result<Notes, Error> {
        let mut notes = Vec::new();
        for (kine, problem) in &self.world.unresponsive_kines {
            self.ctx.runtime.signal(&kine.record, Signal::SIGKILL)?;
            notes.push(Note::warning(
                "StoreUnresponsive",
                format!(
                    "kine at {} (pid {}) accepted connections but answered no read ({problem}); killed it, it starts again on the same port",
                    kine.endpoint, kine.record.pid
                ),
            ));
        }
        Ok(notes)
    }

    /// Takes up a restore request: records it (from now on the plan stops every slot) and drops
    /// the annotation. A request already taken up only has its annotation dropped.
    async fn begin_restore(&self, restorable: &Restorable) -> Result<Notes, Error> {
        let request = self.restore_request()?;
        let mut state = self.dirs.load_state()?;
        let taken = state
            .restore
            .as_ref()
            .is_some_and(|r| r.under_way() && r.request == request);
        if !taken {
            state.restore = Some(RestoreRecord {
                request: request.clone(),
                snapshot: restorable.path.clone(),
                version: restorable.version.clone(),
                phase: RestorePhase::Stopping,
                message: None,
                requested_at: Utc::now(),
                restored_at: None,
                completed_at: None,
            });
            // What a roll under way or a blocked spec remembered is about data the restore replaces.
            state.roll = None;
            state.blocked = None;
            self.dirs.save_state(&state)?;
        }
        self.drop_restore_annotation(&request).await?;
        if taken {
            return Ok(vec![]);
        }
        Ok(vec![Note::warning(
            "RestoreStarted",
            format!(
                "the shard is down for a restore: the front serves no slot, every slot stops, then {} is restored into the store and kcp {} (which served the data in it) starts on it; what was written after the snapshot was taken is gone",
                restorable.path, restorable.version
            ),
        )])
    }

    /// Drops a restore request that cannot be done; the record says why (unless a restore is
    /// under way, which it must not hide).
    async fn refuse_restore(&self, message: &str) -> Result<Notes, Error> {
        let request = self.restore_request()?;
        let mut state = self.dirs.load_state()?;
        if !state.restore.as_ref().is_some_and(RestoreRecord::under_way) {
            state.restore = Some(RestoreRecord {
                request: request.clone(),
                snapshot: String::new(),
                version: String::new(),
                phase: RestorePhase::Refused,
                message: Some(message.to_string()),
                requested_at: Utc::now(),
                restored_at: None,
                completed_at: None,
            });
            self.dirs.save_state(&state)?;
        }
        self.drop_restore_annotation(&request).await?;
        Ok(vec![Note::warning(
            "RestoreRefused",
            format!("the restore of {request} is refused: {message}; the shard runs on as it is"),
        )])
    }

    fn restore_request(&self) -> Result<String, Error> {
        self.desired
            .restore
            .as_ref()
            .map(|r| r.value.clone())
            .ok_or_else(|| Error::Metadata(format!("the {RESTORE_SNAPSHOT_ANNOTATION} annotation is gone")))
    }

    /// Removes the restore annotation, if it still holds `request` (a new value is a new request).
    async fn drop_restore_annotation(&self, request: &str) -> Result<(), Error> {
        let api: kube::Api<KcpShard> = kube::Api::all(self.ctx.client.clone());
        let path = format!(
            "/metadata/annotations/{}",
            RESTORE_SNAPSHOT_ANNOTATION.replace('/', "~1")
        );
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": path, "value": request},
            {"op": "remove", "path": path},
        ]))
        .expect("a valid JSON patch");
        api.patch(
            &self.shard.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Json::<()>(patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            Error::Metadata(format!(
                "cannot remove the {RESTORE_SNAPSHOT_ANNOTATION} annotation of KcpShard {}: {e}",
                self.shard.name_any()
            ))
        })
    }

    fn complete_restore(&self) -> Result<Notes, Error> {
        let mut state = self.dirs.load_state()?;
        let Some(record) = state.restore.as_mut().filter(|r| r.phase == RestorePhase::Starting) else {
            return Ok(vec![]);
        };
        let now = Utc::now();
        record.phase = RestorePhase::Complete;
        record.completed_at = Some(now);
        let message = format!(
            "kcp {} serves the data restored from {} through the front; the shard was down {:.1}s",
            record.version,
            record.snapshot,
            (now - record.requested_at).num_milliseconds() as f64 / 1000.0
        );
        self.dirs.save_state(&state)?;
        Ok(vec![Note::normal("RestoreComplete", message)])
    }

    async fn ensure_front(&self) -> Result<Notes, Error> {
        let front = self.ctx.front(self.shard, self.dirs)?;
        let listen = front.listen();
        // A front that moves must not be stopped before its new address is known to be free: the
        // running one keeps serving while the spec names a taken address.
        let starts =
            self.world.observed.front_elsewhere || self.world.observed.front == super::plan::FrontObservation::Down;
        // A front that systemd restarts holds the address in its unit's descriptor store.
        if front.is_ours()
            && starts
            && !front.restarting().await
            && let Err(source) = std::net::TcpListener::bind(listen)
        {
            return Err(Error::FrontAddress {
                listen,
                holder: crate::process::procfs::listener_pid(listen.port()).map(describe_process),
                source,
            });
        }
        if !front.is_ours()
            && let Some(ready) = self.world.observed.slots.iter().find(|s| s.health.ready)
        {
            // Caddy serves the shard's certificate: once a slot made it, it is in shared/ for
            // caddy's config (`kcpshard front caddy-config`), before caddy can run.
            slot::material::capture_shared(&self.dirs.slot(&ready.name).root(), &self.dirs.shared())?;
        }
        let started = front.ensure().await.map_err(|e| {
            if front.is_ours() {
                Error::Front(e)
            } else {
                Error::Front(anyhow::anyhow!(
                    "{e:#} (the shard's certificate, key and CA for caddy's config are in {} once the first slot is ready)",
                    self.dirs.shared().display()
                ))
            }
        })?;
        let reason = if self.world.observed.front_outdated {
            "FrontUpgraded"
        } else {
            "FrontStarted"
        };
        Ok(vec![Note::normal(reason, started)])
    }

    fn kill_front(&self) -> Result<Notes, Error> {
        let front = self.ctx.front(self.shard, self.dirs)?;
        let message = match front.kill() {
            Some(pid) => format!(
                "the front (pid {pid}) runs but did not answer on its control socket; killed it, it starts again on {}",
                front.listen()
            ),
            None => "the front did not answer on its control socket and has exited; it starts again".to_string(),
        };
        Ok(vec![Note::warning("FrontUnresponsive", message)])
    }

    /// Nothing serves while the preflight runs: a slot of the template that last served the data.
    async fn start_interim(&self, name: &str) -> Result<Notes, Error> {
        let Some(template) = &self.desired.interim else {
            return Ok(vec![]);
        };
        let started = self.start_slot(name, template, false).await?;
        let version = &self.desired.template.version;
        Ok(vec![Note::warning(
            "InterimSlotStarting",
            format!(
                "no slot serves while the preflight of kcp {version} runs: started {started}, the version that last served the data, to serve until the roll to {version} replaces it"
            ),
        )])
    }

    async fn start_new_slot(&self, name: &str) -> Result<Notes, Error> {
        let started = self.start_slot(name, &self.desired.template, true).await?;
        Ok(vec![Note::normal(
            "SlotStarting",
            format!("started {started}; waiting for /readyz on its own port"),
        )])
    }

    /// Starts slot `name` of `template` (its records, its own kine, its kcp), and with
    /// `begins_roll` records it in the roll of that template. Says what it started.
    async fn start_slot(&self, name: &str, template: &SlotTemplate, begins_roll: bool) -> Result<String, Error> {
        let slot_dirs = self.dirs.slot(name);
        let port = free_port()?;
        let now = Utc::now();
        if begins_roll {
            let mut state = self.dirs.load_state()?;
            // One roll per template: the slots a superseded template started are stopped by this one.
            if state
                .roll
                .as_ref()
                .is_none_or(|r| r.template.as_ref() != Some(template))
            {
                state.roll = Some(RollRecord {
                    template: Some(template.clone()),
                    from_version: self.world.serving_version(),
                    to_version: template.version.clone(),
                    started_at: now,
                    snapshot: state
                        .snapshot
                        .as_ref()
                        .filter(|s| &s.template == template)
                        .map(|s| s.path.clone()),
                    ..Default::default()
                });
            }
            state.blocked = None;
            self.dirs.save_state(&state)?;
        }
        // Before the slot touches the data: from now on the data is in this store (a spec.store
        // that names another is not followed, observe.rs), and this version's.
        let store = &self.world.store;
        if store.since.is_none() || store.store != self.shard.spec.store && store.refused.is_none() {
            self.dirs.save_store_record(&StoreRecord {
                store: store.store.clone(),
                since: store.since.unwrap_or(now),
            })?;
        }
        let recorded = self.world.data_version.as_ref();
        if recorded.and_then(|d| d.template.as_ref()) != Some(template) {
            let since = recorded
                .filter(|d| d.version == template.version)
                .map_or(now, |d| d.since);
            self.dirs.save_data_version(&DataVersion {
                version: template.version.clone(),
                since,
                template: Some(template.clone()),
            })?;
        }
        slot_dirs.save(&SlotRecord {
            name: name.to_string(),
            template: template.clone(),
            port,
            created_at: now,
            served_at: None,
            left_front_at: None,
            stop: None,
        })?;
        slot::material::seed_root(&self.dirs.shared(), &slot_dirs.root())?;
        // A shard of a sharded kcp: the root's material (a non-root's first slot) and the
        // kubeconfigs its flags name (controller/sharding.rs).
        let sharded = match &template.sharded {
            Some(sharded) => Some(super::sharding::prepare_slot(
                &self.ctx.state_dir,
                self.dirs,
                sharded,
                &template.front_url,
                &slot_dirs.root(),
            )?),
            None => None,
        };
        let also_accepted = match &template.sharded {
            Some(sharded) => super::sharding::token_lines(&self.ctx.state_dir, sharded)?,
            None => String::new(),
        };
        // The admin identities this slot is to accept, before it starts (controller/credentials.rs
        // wrote the record they come from).
        super::credentials::write_token_file(
            self.dirs,
            &template.accepted_identities,
            &also_accepted,
            &slot_dirs.token_file(),
        )?;
        // The slot's own kine (KinePostgres) starts before its kcp, and alone: the other slot's
        // kine, if any, has long created kine's schema (docs/background.md section 7).
        let store = self
            .store()?
            .ensure_slot(&self.ctx.runtime, &slot_dirs.store(), name)
            .await?;
        let launch = slot::args::SlotLaunch {
            name: name.to_string(),
            version: template.version.clone(),
            binary: PathBuf::from(&template.binary),
            root_dir: slot_dirs.root(),
            bind_address: std::net::Ipv4Addr::LOCALHOST.into(),
            port,
            etcd_servers: store.etcd_servers.clone(),
            etcd_tls: store.tls,
            front_url: template.front_url.clone(),
            shutdown_delay: crate::api::parse_duration(&template.shutdown_delay).map_err(Error::Spec)?,
            token_auth_file: std::path::absolute(slot_dirs.token_file())?,
            extra_args: template.extra_args.clone(),
            sharded,
        };
        let spec = ProcessSpec::new(
            format!("slot-{name}"),
            UnitName::slot(&self.shard.name_any(), name),
            launch.binary.clone(),
            slot::args::kcp_args(&launch)?,
            slot_dirs.log(),
            slot_dirs.process(),
        );
        let process = self.ctx.runtime.start(&spec).await?;
        if begins_roll {
            self.update_roll(|roll| roll.new_slot_started_at = Some(Utc::now()))?;
        }
        Ok(format!(
            "slot {name} (kcp {}, pid {}, port {port}, store {})",
            template.version, process.pid, store.etcd_servers
        ))
    }

    /// Changes the front's serving set: records who joined and left first (a slot that left is
    /// then let settle before SIGTERM), then applies it.
    async fn set_front(&self, change: &FrontChange) -> Result<Notes, Error> {
        let now = Utc::now();
        for name in &change.joined {
            self.slot(name)?.dirs.update(|r| {
                r.served_at.get_or_insert(now);
                r.left_front_at = None;
            })?;
        }
        for (name, _) in &change.left {
            if let Some(slot) = self.world.slot(name) {
                slot.dirs.update(|r| r.left_front_at = Some(now))?;
            }
        }
        let joined_new = change.joined.iter().any(|j| {
            self.world
                .slot(j)
                .is_some_and(|s| s.record.template == self.desired.template)
        });
        if joined_new {
            self.update_roll(|roll| roll.new_slot_ready_at = Some(now))?;
        }
        // The first slot made the shard's key material; every later slot gets a copy before it starts.
        let mut renewed = None;
        if let Some(first) = change.joined.first() {
            slot::material::capture_shared(&self.dirs.slot(first).root(), &self.dirs.shared())?;
            renewed = super::credentials::renew_kubeconfig(
                self.dirs,
                &self.world.observed,
                &self.desired.template.front_url,
            )?;
        }
        let backends: Vec<Backend> = change
            .backends
            .iter()
            .map(|name| {
                self.slot(name).map(|s| Backend {
                    slot: name.clone(),
                    address: s.address(),
                })
            })
            .collect::<Result<_, _>>()?;
        let front = self.ctx.front(self.shard, self.dirs)?;
        front.serve(&backends).await.map_err(Error::Front)?;
        if joined_new {
            self.update_roll(|roll| roll.front_switched_at = Some(Utc::now()))?;
        }
        let mut notes: Notes = renewed.into_iter().collect();
        notes.extend(change.joined.iter().map(|name| {
            let port = self.world.slot(name).map_or(0, |s| s.record.port);
            Note::normal(
                "SlotReady",
                format!("slot {name} answers /readyz on its own port {port}"),
            )
        }));
        for (name, cause) in &change.left {
            if *cause == LeaveCause::Unresponsive {
                let problem = self
                    .world
                    .observed
                    .slot(name)
                    .and_then(|s| s.health.problem.clone())
                    .unwrap_or_default();
                notes.push(Note::warning(
                    "SlotUnresponsive",
                    format!(
                        "slot {name} failed {} looks at /readyz on its own port in a row ({problem}); the front sends it no new connections, those pinned to it stay; it rejoins when it answers, and is killed if it does not answer within spec.rollout.livenessTimeout",
                        super::plan::UNRESPONSIVE_AFTER
                    ),
                ));
            }
        }
        let serving = if change.backends.is_empty() {
            "no slot".to_string()
        } else {
            change.backends.join(", ")
        };
        let left = change
            .left
            .iter()
            .map(|(name, cause)| {
                let why = match cause {
                    LeaveCause::Replaced => "replaced",
                    LeaveCause::Unresponsive => "unresponsive",
                    LeaveCause::Exited => "exited",
                };
                format!("{name} ({why})")
            })
            .collect::<Vec<_>>();
        notes.push(Note::normal(
            "FrontSwitched",
            format!(
                "the front forwards new connections to {serving}{}; open connections stay on their slot",
                if left.is_empty() {
                    String::new()
                } else {
                    format!("; left: {}", left.join(", "))
                }
            ),
        ));
        if !front.is_ours()
            && let Some(first) = change.backends.first()
            && let Err(e) = self.check_through_front(first, front.listen()).await
        {
            // Caddy terminates TLS and may be misconfigured in ways its admin API does not show:
            // ask it, as a client would.
            notes.push(Note::warning(
                "FrontCheckFailed",
                format!("the front was changed, but {e}: check caddy's config (kcpshard front caddy-config) and log"),
            ));
        }
        Ok(notes)
    }

    /// `/readyz` through the front's address answers ok within [`FRONT_CHECK_TIMEOUT`].
    async fn check_through_front(&self, slot: &str, listen: std::net::SocketAddr) -> anyhow::Result<()> {
        let kubeconfig = self.dirs.slot(slot).admin_kubeconfig();
        let client = slot::access::shard_admin_client(&kubeconfig, &format!("https://{listen}")).await?;
        let deadline = std::time::Instant::now() + FRONT_CHECK_TIMEOUT;
        loop {
            let outcome = tokio::time::timeout(Duration::from_secs(2), slot::access::readyz(&client)).await;
            match outcome {
                Ok(Ok(true)) => return Ok(()),
                _ if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Ok(Ok(false)) => anyhow::bail!("/readyz through {listen} does not answer ok"),
                Ok(Err(e)) => anyhow::bail!("/readyz through {listen} failed: {e}"),
                Err(_) => anyhow::bail!("/readyz through {listen} did not answer within 2s"),
            }
        }
    }

    /// Records why and when, then sends the signal.
    fn signal_slot(&self, name: &str, cause: StopCause, signal: Signal) -> Result<(), Error> {
        let slot = self.slot(name)?;
        let killed = signal == Signal::SIGKILL;
        slot.dirs.update(|r| {
            let at = r.stop.map_or_else(Utc::now, |s| s.at);
            r.stop = Some(StopRecord { cause, at, killed });
        })?;
        if let Some(process) = &slot.process {
            self.ctx.runtime.signal(process, signal)?;
        }
        Ok(())
    }

    fn terminate_slot(&self, name: &str) -> Result<Notes, Error> {
        let restoring = self
            .world
            .state
            .restore
            .as_ref()
            .is_some_and(|r| r.phase == RestorePhase::Stopping);
        let cause = if self.desired.deleting {
            StopCause::Deleting
        } else if restoring {
            StopCause::Restore
        } else {
            StopCause::Retired
        };
        self.signal_slot(name, cause, Signal::SIGTERM)?;
        let delay = &self.slot(name)?.record.template.shutdown_delay;
        Ok(vec![Note::normal(
            "SlotDraining",
            format!(
                "sent slot {name} SIGTERM: it stops listening after its shutdown delay ({delay}) and then can no longer lead kcp's controllers; it drains its open connections and exits (killed after spec.rollout.drainTimeout)"
            ),
        )])
    }

    fn kill_slot(&self, name: &str, cause: &KillCause) -> Result<Notes, Error> {
        let (stop, message) = match cause {
            KillCause::Unresponsive { seconds } => (
                StopCause::Unresponsive,
                format!(
                    "slot {name} has not answered /readyz on its own port for {seconds}s (spec.rollout.livenessTimeout; last: {}); killed it, a replacement starts",
                    self.world
                        .observed
                        .slot(name)
                        .and_then(|s| s.health.problem.clone())
                        .unwrap_or_default()
                ),
            ),
            KillCause::Broken => (
                StopCause::Unresponsive,
                format!(
                    "slot {name} answers /readyz but not kcp's own APIs ({}): its start-up lost a bootstrap step, which kcp never redoes; killed it, a replacement starts",
                    self.world
                        .observed
                        .slot(name)
                        .and_then(|s| s.health.problem.clone())
                        .unwrap_or_default()
                ),
            ),
            KillCause::DrainTimeout { seconds } => (
                StopCause::DrainTimeout,
                format!(
                    "slot {name} did not exit within spec.rollout.drainTimeout ({seconds}s) after SIGTERM; killed it"
                ),
            ),
        };
        self.signal_slot(name, stop, Signal::SIGKILL)?;
        if *cause == KillCause::Broken {
            self.update_roll(|roll| roll.broken_slots += 1)?;
        }
        Ok(vec![Note::warning("SlotKilled", message)])
    }

    /// Ends the front's connections to a slot that stopped listening a while ago, so that watches
    /// re-establish through the serving slots; what it admitted had [`super::plan::IN_FLIGHT_GRACE`].
    async fn close_connections(&self, name: &str) -> Result<Notes, Error> {
        let address = self.slot(name)?.address();
        self.ctx.front(self.shard, self.dirs)?.close(address).await;
        Ok(vec![])
    }

    /// Stops what only this slot used of the store (its own kine, for KinePostgres).
    async fn stop_slot_store(&self, name: &str) -> Result<(), Error> {
        self.store()?
            .stop_slot(&self.ctx.runtime, &self.dirs.slot(name).store(), name, KINE_STOP_GRACE)
            .await?;
        Ok(())
    }

    /// Drops the records of a slot whose process is gone, and says how it ended. An interim slot
    /// that never got ready is remembered, so that none starts again for this spec.
    fn remove_slot(&self, name: &str, crashed: bool) -> Result<Notes, Error> {
        let slot = self.slot(name)?;
        let seen = self.world.observed.slot(name);
        let old = slot.record.template != self.desired.template;
        if old {
            let now = Utc::now();
            let stopped_listening = seen.and_then(|s| s.stopped_listening_at);
            self.update_roll(|roll| {
                roll.old_slot_exited_at = Some(now);
                if let Some(at) = stopped_listening {
                    roll.old_slot_stopped_listening_at = Some(at);
                }
            })?;
        }
        slot.dirs.forget()?;
        if !crashed {
            let stop = slot.record.stop;
            let how = match (stop, seen.and_then(|s| s.stopped_listening_at)) {
                (Some(stop), _) if stop.killed => format!("was killed ({:?})", stop.cause),
                (Some(stop), Some(listen)) => format!(
                    "exited {:.1}s after SIGTERM ({:.2}s to stop listening)",
                    seconds_since(stop.at),
                    (listen - stop.at).num_milliseconds() as f64 / 1000.0
                ),
                (Some(stop), None) => format!("exited {:.1}s after SIGTERM", seconds_since(stop.at)),
                (None, _) => "exited".to_string(),
            };
            return Ok(vec![Note::normal("SlotStopped", format!("slot {name} {how}"))]);
        }
        let served = seen.is_some_and(|s| s.health.ever_ready);
        let last_words = seen.and_then(|s| s.last_words.clone()).unwrap_or_default();
        if !served && old && self.desired.interim.as_ref() == Some(&slot.record.template) {
            let mut state = self.dirs.load_state()?;
            state.interim_crashed_for = Some(self.desired.template.clone());
            self.dirs.save_state(&state)?;
            return Ok(vec![Note::warning(
                "InterimSlotCrashed",
                format!(
                    "interim slot {name} (kcp {}, the version that last served the data) exited before it was ready: {last_words}; it is not started again for this spec, so nothing serves until the preflight of kcp {} passed and the roll starts it",
                    slot.record.template.version, self.desired.template.version
                ),
            )]);
        }
        // A new slot that crashed before it was ready blocked its spec first (AbortRoll).
        let next = match &self.world.observed.blocked {
            Some(blocked) if blocked.template == self.desired.template => format!(
                "none starts while the roll is blocked ({}: see the Degraded condition)",
                blocked.cause.reason()
            ),
            _ => "a replacement starts".to_string(),
        };
        Ok(vec![Note::warning(
            "SlotCrashed",
            format!(
                "slot {name}{} exited: {last_words}; {next}",
                if served { ", which served the shard," } else { "" },
            ),
        )])
    }

    /// Stops a new slot that is not ready yet (it serves nobody: SIGKILL); the roll record stays,
    /// so a slot is started again for the same roll once it is gone.
    async fn restart_slot(&self, name: &str, cause: &RestartCause) -> Result<Notes, Error> {
        self.signal_slot(name, StopCause::Restart, Signal::SIGKILL)?;
        let message = match cause {
            RestartCause::StoreOutage => format!(
                "slot {name} was starting when the store went down, and a kcp may never get ready after that (its informers do not sync); starting it again"
            ),
            RestartCause::Broken => {
                self.update_roll(|roll| {
                    roll.not_ready_restarts += 1;
                    roll.broken_slots += 1;
                })?;
                format!(
                    "slot {name} answers /readyz but not kcp's own APIs ({}): its start-up lost a bootstrap step, which kcp never redoes (docs/reliability.md); starting it again",
                    self.world
                        .observed
                        .slot(name)
                        .and_then(|s| s.health.problem.clone())
                        .unwrap_or_default()
                )
            }
            RestartCause::NotReady { timeout_seconds } => {
                self.update_roll(|roll| roll.not_ready_restarts += 1)?;
                format!(
                    "slot {name} did not answer /readyz on its own port within {timeout_seconds}s; a kcp start-up sometimes never finishes, so it is started once more before the roll stops ({}); the serving slots keep serving",
                    match &self.slot(name)?.process {
                        Some(process) => super::observe::last_words(&self.ctx.runtime, process, false).await,
                        None => "it has no process record".into(),
                    }
                )
            }
        };
        Ok(vec![Note::warning("SlotRestarting", message)])
    }

    fn abort_roll(&self, name: &str, cause: &BlockCause) -> Result<Notes, Error> {
        let cause = cause.clone();
        if self.world.observed.slot(name).is_some_and(|s| s.running) {
            self.signal_slot(name, StopCause::Abort, Signal::SIGKILL)?;
        }
        let mut state = self.dirs.load_state()?;
        state.roll = None;
        state.blocked = Some(Blocked {
            template: self.desired.template.clone(),
            cause: cause.clone(),
        });
        self.dirs.save_state(&state)?;
        Ok(vec![Note::warning(cause.reason(), cause.message())])
    }

    async fn release_lease(&self, holder: Option<&str>) -> Result<Notes, Error> {
        let (through, client) = self
            .world
            .serving_client(self.ctx, Identity::ShardAdmin)
            .await
            .map_err(Error::Front)?;
        let deleted = slot::access::release_controllers_lease(&client).await?;
        // The holder stopped listening (or exited): from then on no slot could lead until now.
        let stopped_listening = holder
            .and_then(|h| self.world.observed.slot(h))
            .and_then(|h| h.stopped_listening_at);
        self.update_roll(|roll| {
            roll.lease_released_at = Some(Utc::now());
            if let Some(at) = stopped_listening {
                roll.old_slot_stopped_listening_at = Some(at);
            }
        })?;
        let whose = match holder.and_then(|h| self.world.observed.slot(h)) {
            Some(h) if !h.running => format!("held by slot {}, which is gone", h.name),
            Some(h) => format!(
                "held by slot {}, which stopped listening and can no longer renew it",
                h.name
            ),
            None => "held by a kcp that no longer runs".to_string(),
        };
        let message = if deleted {
            format!(
                "deleted Lease kube-system/kcp-controllers ({whose}, through slot {through}) so a serving slot leads at once"
            )
        } else {
            "no kcp-controllers Lease to release".to_string()
        };
        Ok(vec![Note::normal("LeaseReleased", message)])
    }

    async fn probe(&self) -> Result<Notes, Error> {
        // A non-root shard serves no `root` workspace to create one in: its new leader is proven
        // by the controllers Lease it holds (an empty probe workspace; observe.rs).
        if self.desired.template.sharded.as_ref().is_some_and(|s| !s.is_root()) {
            self.update_roll(|roll| {
                roll.probe = Some(ProbeRecord {
                    workspace: String::new(),
                    created_at: Utc::now(),
                })
            })?;
            return Ok(vec![]);
        }
        let (_, client) = self
            .world
            .serving_client(self.ctx, Identity::Admin)
            .await
            .map_err(Error::Front)?;
        let stale = self.world.state.roll.as_ref().and_then(|r| r.probe.clone());
        let workspace = slot::access::create_probe_workspace(&client).await?;
        self.update_roll(|roll| {
            roll.probe = Some(ProbeRecord {
                workspace,
                created_at: Utc::now(),
            })
        })?;
        if let Some(stale) = stale {
            let _ = slot::access::delete_workspace(&client, &stale.workspace).await;
            return Ok(vec![Note::warning(
                "ProbeSlow",
                format!(
                    "probe workspace {} did not reach Ready within {:?}: is a slot leading kcp's controllers? Trying a new one",
                    stale.workspace,
                    super::plan::PROBE_TIMEOUT
                ),
            )]);
        }
        Ok(vec![])
    }

    async fn probe_succeeded(&self) -> Result<Notes, Error> {
        let Some(probe) = self.world.state.roll.as_ref().and_then(|r| r.probe.clone()) else {
            return Ok(vec![]);
        };
        let now = Utc::now();
        self.update_roll(|roll| roll.probe_succeeded_at = Some(now))?;
        if probe.workspace.is_empty() {
            return Ok(vec![Note::normal(
                "ProbeSucceeded",
                format!(
                    "a new slot holds the controllers Lease {:.2}s after the probe began: it leads kcp's controllers",
                    (now - probe.created_at).num_milliseconds() as f64 / 1000.0
                ),
            )]);
        }
        if let Ok((_, client)) = self.world.serving_client(self.ctx, Identity::Admin).await
            && let Err(e) = slot::access::delete_workspace(&client, &probe.workspace).await
        {
            tracing::warn!(workspace = %probe.workspace, error = %e, "could not delete the probe workspace");
        }
        Ok(vec![Note::normal(
            "ProbeSucceeded",
            format!(
                "a probe workspace reached Ready {:.2}s after it was created: a leader runs kcp's controllers",
                (now - probe.created_at).num_milliseconds() as f64 / 1000.0
            ),
        )])
    }

    fn complete_roll(&self) -> Result<Notes, Error> {
        let mut state = self.dirs.load_state()?;
        let Some(mut roll) = state.roll.take() else {
            return Ok(vec![]);
        };
        // The spec may have changed mid-roll: the record names what serves now.
        if let Some(serving) = self.world.serving_version() {
            roll.to_version = serving;
        }
        let completed = CompletedRoll {
            roll,
            completed_at: Utc::now(),
        };
        let message = roll_summary(&completed, &self.world.observed.front.backends().join(", "));
        state.last_roll = Some(completed);
        self.dirs.save_state(&state)?;
        // Counted once it is recorded: a failed save retries the step, and must not count twice.
        if let Some(completed) = &state.last_roll {
            self.ctx.metrics.roll_completed(&self.shard.name_any(), completed);
        }
        Ok(vec![Note::normal("RollComplete", message)])
    }
}

fn seconds_since(at: chrono::DateTime<Utc>) -> f64 {
    (Utc::now() - at).num_milliseconds() as f64 / 1000.0
}

/// "pid 1234 (caddy run ...)" for an error about who holds an address.
fn describe_process(pid: u32) -> String {
    let argv = crate::process::procfs::cmdline(pid).unwrap_or_default().join(" ");
    let argv: String = argv.chars().take(120).collect();
    format!("pid {pid} ({argv})")
}

fn roll_summary(done: &CompletedRoll, serving: &str) -> String {
    let r = &done.roll;
    let since = |t: Option<chrono::DateTime<Utc>>| {
        t.map(|t| format!("{:.2}s", (t - r.started_at).num_milliseconds() as f64 / 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    let what = match &r.from_version {
        Some(from) => format!("rolled {from} to {}", r.to_version),
        None => format!("started {}", r.to_version),
    };
    format!(
        "{what}, slots {serving} serve: new slot ready {}, front switched {}, old slot stopped listening {}, lease released {}, probe Ready {}, old slot exited {}, done {}",
        since(r.new_slot_ready_at),
        since(r.front_switched_at),
        since(r.old_slot_stopped_listening_at),
        since(r.lease_released_at),
        since(r.probe_succeeded_at),
        since(r.old_slot_exited_at),
        since(Some(done.completed_at)),
    )
}

/// The version in a kcp binary's path (`bin/kcp-v0.31.2`, `/opt/kcp/v0.31.2/kcp`), if it names one.
fn version_in_path(program: &std::path::Path) -> Option<String> {
    program
        .to_string_lossy()
        .split(['/', '-', '_'])
        .find(|part| crate::api::KcpVersion::parse(part).is_ok())
        .map(str::to_string)
}

/// The restartedAt of a rebuilt slot record: no spec has it, so the slot is rolled away.
pub const REBUILT: &str = "unknown: the slot record was rebuilt from the running process";

/// A slot record from a slot's kcp command line (port, binary, front URL, shutdown delay); None
/// without a port. What argv does not tell (the restartedAt annotation, which arguments were
/// extra) is lost, so the rebuilt template matches no spec and the plan replaces the slot by a
/// roll: starting a slot under its name instead would stop the shard with it.
fn record_from_argv(name: &str, process: &crate::process::ProcessRecord) -> Option<SlotRecord> {
    let flag = |name: &str| {
        let prefix = format!("--{name}=");
        process
            .args
            .iter()
            .find_map(|a| a.strip_prefix(&prefix))
            .map(str::to_string)
    };
    let created_at = process.started_at.parse().unwrap_or_else(|_| Utc::now());
    Some(SlotRecord {
        name: name.to_string(),
        template: super::plan::SlotTemplate {
            version: version_in_path(&process.program).unwrap_or_else(|| "unknown".into()),
            binary: process.program.display().to_string(),
            extra_args: vec![],
            shutdown_delay: flag("shutdown-delay-duration").unwrap_or_default(),
            front_url: flag("shard-base-url").unwrap_or_default(),
            restarted_at: Some(REBUILT.into()),
            // Not known from the argv (the token file holds secrets, not ids): none, so no
            // kubeconfig is written for it and the roll away from it gives every slot the identity.
            accepted_identities: vec![],
            sharded: None,
        },
        port: flag("secure-port")?.parse().ok()?,
        created_at,
        // It runs with the shard's flags and may well serve: it is treated as one that did.
        served_at: Some(created_at),
        left_front_at: None,
        stop: None,
    })
}

impl Note {
    pub fn normal(reason: &'static str, message: impl Into<String>) -> Note {
        Note {
            type_: EventType::Normal,
            reason,
            message: message.into(),
        }
    }

    pub fn warning(reason: &'static str, message: impl Into<String>) -> Note {
        Note {
            type_: EventType::Warning,
            reason,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_record_is_rebuilt_from_its_kcp_command_line_and_matches_no_spec() {
        let process = crate::process::ProcessRecord {
            pid: 4242,
            start_time: 1,
            program: "/work/bin/kcp-v0.31.2".into(),
            args: [
                "start",
                "--root-directory=/s/shards/dev/slots/b/root",
                "--bind-address=127.0.0.1",
                "--secure-port=40123",
                "--shard-base-url=https://127.0.0.1:6443",
                "--shutdown-delay-duration=2s",
                "--v=2",
            ]
            .map(String::from)
            .to_vec(),
            started_at: "2026-05-01T10:00:00Z".into(),
            unit: None,
            log: None,
            stop_signal: None,
        };
        let record = record_from_argv("b", &process).unwrap();
        assert_eq!((record.name.as_str(), record.port), ("b", 40123));
        assert_eq!(record.template.version, "v0.31.2");
        assert_eq!(record.template.binary, "/work/bin/kcp-v0.31.2");
        assert_eq!(record.template.front_url, "https://127.0.0.1:6443");
        assert_eq!(record.template.shutdown_delay, "2s");
        assert_eq!(record.template.restarted_at.as_deref(), Some(REBUILT));
        assert_eq!(record.created_at.to_rfc3339(), "2026-05-01T10:00:00+00:00");
        assert_eq!(
            version_in_path(std::path::Path::new("/opt/kcp/v0.32.3/kcp")).as_deref(),
            Some("v0.32.3")
        );
        assert_eq!(version_in_path(std::path::Path::new("/usr/local/bin/kcp")), None);
        let no_port = crate::process::ProcessRecord {
            args: vec!["start".into()],
            ..process
        };
        assert!(record_from_argv("b", &no_port).is_none(), "no port, no slot");
    }
}
