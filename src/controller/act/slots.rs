//! The steps that start, stop, adopt and replace a shard's kcp slots.
use std::path::PathBuf;

use chrono::Utc;
use kube::ResourceExt;
use nix::sys::signal::Signal;

use super::Actor;
use super::Notes;
use crate::controller::Note;
use crate::controller::error::Error;
use crate::controller::plan::{
    BlockCause, Blocked, GoneSlot, KillCause, RestartCause, RestorePhase, RollRecord, SlotTemplate, StopCause,
    StopRecord,
};
use crate::controller::state::{DataVersion, SlotRecord, StoreRecord};
use crate::process::{PortReservation, ProcessSpec, UnitName};
use crate::slot;
use crate::store::SlotStoreStart;

/// What [`Actor::start_slot`] did.
pub(crate) enum SlotStart {
    /// Started the slot's kcp: what, for the event.
    Kcp(String),
    /// Started the store the slot dials (its own kine), which does not accept yet: the event.
    StoreStarting(Note),
}

/// The restartedAt of a rebuilt slot record: no spec has it, so the slot is rolled away.
pub const REBUILT: &str = "unknown: the slot record was rebuilt from the running process";

impl Actor<'_> {
    /// A slot's kcp runs without a (complete) record: write what its process tells.
    pub(super) fn adopt_slot(&self, name: &str) -> Result<Notes, Error> {
        let dirs = self.dirs.slot(name);
        let process = crate::controller::observe::slot_processes(&dirs)
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

    /// Nothing serves while the preflight runs: a slot of the template that last served the data.
    pub(super) async fn start_interim(&self, name: &str) -> Result<Notes, Error> {
        let Some(template) = &self.desired.interim else {
            return Ok(vec![]);
        };
        let started = match self.start_slot(name, template, false, None).await? {
            SlotStart::Kcp(started) => started,
            SlotStart::StoreStarting(note) => return Ok(vec![note]),
        };
        let version = &self.desired.template.version;
        Ok(vec![Note::warning(
            "InterimSlotStarting",
            format!(
                "no slot serves while the preflight of kcp {version} runs: started {started}, the version that last served the data, to serve until the roll to {version} replaces it"
            ),
        )])
    }

    pub(super) async fn start_new_slot(&self, name: &str) -> Result<Notes, Error> {
        let started = match self.start_slot(name, &self.desired.template, true, None).await? {
            SlotStart::Kcp(started) => started,
            SlotStart::StoreStarting(note) => return Ok(vec![note]),
        };
        Ok(vec![Note::normal(
            "SlotStarting",
            format!("started {started}; waiting for /readyz on its own port"),
        )])
    }

    /// Starts slot `name` of `template`: first its own kine (KinePostgres), which is not waited
    /// for, then once it accepts its records and its kcp; with `begins_roll` it is recorded in the
    /// roll of that template. On the shard's store, or on the store a move goes to (`moving_to`:
    /// the data's records stay as they are until the switch).
    pub(crate) async fn start_slot(
        &self,
        name: &str,
        template: &SlotTemplate,
        begins_roll: bool,
        moving_to: Option<&crate::api::StoreSpec>,
    ) -> Result<SlotStart, Error> {
        let slot_dirs = self.dirs.slot(name);
        let backend = match moving_to {
            Some(spec) => self.ctx.store(self.shard, spec, self.dirs)?,
            None => self.store()?,
        };
        // The slot's own kine (KinePostgres) starts before its kcp, and alone: the other slot's
        // kine, if any, has long created kine's schema (docs/background.md section 7). Until it
        // accepts, looks see it starting and wait (Wait (Store)); StartSlot then goes on here.
        let slot_store = match backend
            .start_slot_store(&self.ctx.runtime, &slot_dirs.store(), name)
            .await?
        {
            SlotStoreStart::Ready(store) => store,
            SlotStoreStart::Starting { pid, etcd_servers } => {
                return Ok(SlotStart::StoreStarting(Note::normal(
                    "SlotStoreStarting",
                    format!(
                        "started the kine slot {name} dials (pid {pid}, {etcd_servers}); its kcp starts once it accepts"
                    ),
                )));
            }
        };
        let reservation = PortReservation::new()?;
        let port = reservation.port();
        let now = Utc::now();
        if begins_roll {
            let mut state = self.dirs.load_state()?;
            // A slot that died while it served is replaced by the next slot of its template: not
            // a roll, unless one of that template is under way.
            let gone = state.gone.take().filter(|g| &g.template == template);
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
                    replaces: gone,
                    ..Default::default()
                });
            }
            state.blocked = None;
            self.dirs.save_state(&state)?;
        }
        // Before the slot touches the data: from now on the data is in this store (a spec.store
        // that names another is not followed, observe.rs), and this version's.
        let store = &self.world.store;
        if moving_to.is_none()
            && (store.since.is_none() || store.store != self.shard.spec.store && store.refused.is_none())
        {
            self.dirs.save_store_record(&StoreRecord {
                store: store.store.clone(),
                since: store.since.unwrap_or(now),
            })?;
        }
        let recorded = self.world.data_version.as_ref();
        if moving_to.is_none() && recorded.and_then(|d| d.template.as_ref()) != Some(template) {
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
            store: moving_to.cloned(),
        })?;
        slot::material::seed_root(&self.dirs.shared(), &slot_dirs.root())?;
        // A shard of a sharded kcp: the root's material (a non-root's first slot) and the
        // kubeconfigs its flags name (controller/sharding.rs).
        let sharded = match &template.sharded {
            Some(sharded) => Some(crate::controller::sharding::prepare_slot(
                &self.ctx.state_dir,
                self.dirs,
                sharded,
                &template.front_url,
                &slot_dirs.root(),
            )?),
            None => None,
        };
        let also_accepted = match &template.sharded {
            Some(sharded) => crate::controller::sharding::token_lines(&self.ctx.state_dir, sharded)?,
            None => String::new(),
        };
        // The admin identities this slot is to accept, before it starts (controller/credentials.rs
        // wrote the record they come from).
        crate::controller::credentials::write_token_file(
            self.dirs,
            &template.accepted_identities,
            &also_accepted,
            &slot_dirs.token_file(),
        )?;
        let launch = slot::args::SlotLaunch {
            name: name.to_string(),
            version: template.version.clone(),
            binary: PathBuf::from(&template.binary),
            root_dir: slot_dirs.root(),
            bind_address: std::net::Ipv4Addr::LOCALHOST.into(),
            port,
            etcd_servers: slot_store.etcd_servers.clone(),
            etcd_tls: slot_store.tls,
            front_url: template.front_url.clone(),
            shutdown_delay: crate::api::parse_duration(&template.shutdown_delay).map_err(|cause| Error::Duration {
                field: "spec.kcp.shutdownDelay",
                cause,
            })?,
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
        reservation.hold_for(self.desired.readiness_timeout);
        if begins_roll {
            self.update_roll(|roll| roll.new_slot_started_at = Some(Utc::now()))?;
        }
        Ok(SlotStart::Kcp(format!(
            "slot {name} (kcp {}, pid {}, port {port}, store {})",
            template.version, process.pid, slot_store.etcd_servers
        )))
    }

    /// Records why and when, then sends the signal.
    pub(super) fn signal_slot(&self, name: &str, cause: StopCause, signal: Signal) -> Result<(), Error> {
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

    pub(super) fn terminate_slot(&self, name: &str) -> Result<Notes, Error> {
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

    pub(super) fn kill_slot(&self, name: &str, cause: &KillCause) -> Result<Notes, Error> {
        let (stop, message) = match cause {
            KillCause::Unresponsive { seconds } => (
                StopCause::Unresponsive,
                format!(
                    "slot {name} has answered nothing on its own port, not even /livez/ping, and done next to no work (CPU) for {seconds}s (spec.rollout.livenessTimeout; last: {}); killed it, a replacement starts",
                    self.world
                        .observed
                        .slot(name)
                        .and_then(|s| s.health.problem.clone())
                        .unwrap_or_default()
                ),
            ),
            KillCause::HungLeader { seconds } => (
                StopCause::Unresponsive,
                format!(
                    "slot {name} leads kcp's controllers but has not renewed their Lease for over {seconds}s (kcp's renew deadline), and its process is stopped, or has answered nothing, not even /livez/ping, and done next to no work (CPU) for as long (last: {}); while it exists its Lease stops every other slot from leading, so killed it (not waiting for spec.rollout.livenessTimeout); its Lease goes once it is gone, another slot leads, a replacement starts",
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
    /// re-establish through the serving slots; what it admitted had [`crate::controller::plan::IN_FLIGHT_GRACE`].
    pub(super) async fn close_connections(&self, name: &str) -> Result<Notes, Error> {
        let address = self.slot(name)?.address();
        self.ctx.front(self.shard, self.dirs)?.close(address).await;
        Ok(vec![])
    }

    /// Stops what only this slot used of the store (its own kine, for KinePostgres).
    /// Drops the records of a slot whose process is gone, and says how it ended. An interim slot
    /// that never got ready is remembered, so that none starts again for this spec.
    pub(super) async fn remove_slot(&self, name: &str, crashed: bool) -> Result<Notes, Error> {
        let slot = self.slot(name)?;
        // A unit whose kcp crashed or was killed stays failed (and listed) until reset; the next
        // slot may take another name.
        if let Some(unit) = slot.process.as_ref().and_then(|p| p.unit()) {
            self.ctx.runtime.forget_unit(&unit).await;
        }
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
        let served = seen.is_some_and(|s| s.health.ever_ready);
        let last_words = seen.and_then(|s| s.last_words.clone()).unwrap_or_default();
        // A slot of the desired template that served and died: the next slot replaces it.
        let gone_because = match slot.record.stop {
            _ if old || !served => None,
            None if crashed => Some(format!("crashed: {last_words}")),
            // Unresponsive for livenessTimeout, or broken: the SlotKilled event said which.
            Some(stop) if stop.killed && stop.cause == StopCause::Unresponsive => {
                Some("killed: it had stopped serving (see its SlotKilled event)".to_string())
            }
            _ => None,
        };
        if let Some(cause) = gone_because {
            let mut state = self.dirs.load_state()?;
            state.gone = Some(GoneSlot {
                slot: name.to_string(),
                cause,
                gone_at: Utc::now(),
                template: slot.record.template.clone(),
            });
            self.dirs.save_state(&state)?;
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
    pub(super) async fn restart_slot(&self, name: &str, cause: &RestartCause) -> Result<Notes, Error> {
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
                        Some(process) =>
                            crate::controller::observe::last_words(&self.ctx.runtime, process, false).await,
                        None => "it has no process record".into(),
                    }
                )
            }
        };
        Ok(vec![Note::warning("SlotRestarting", message)])
    }

    pub(super) fn abort_roll(&self, name: &str, cause: &BlockCause) -> Result<Notes, Error> {
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
}

fn seconds_since(at: chrono::DateTime<Utc>) -> f64 {
    (Utc::now() - at).num_milliseconds() as f64 / 1000.0
}

/// The version in a kcp binary's path (`bin/kcp-v0.31.2`, `/opt/kcp/v0.31.2/kcp`), if it names one.
fn version_in_path(program: &std::path::Path) -> Option<String> {
    program
        .to_string_lossy()
        .split(['/', '-', '_'])
        .find(|part| crate::api::KcpVersion::parse(part).is_ok())
        .map(str::to_string)
}

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
        template: crate::controller::plan::SlotTemplate {
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
        // Which store its --etcd-servers names is not told: the shard's.
        store: None,
    })
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
