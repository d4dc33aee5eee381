//! Act: perform exactly the step the plan chose, record it in the controller's state file before
//! the effect that depends on it, and tell the user with an event.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::clients::Identity;
use super::observe::World;
use super::plan::{BlockCause, Blocked, Desired, RestartCause, RollRecord, Step};
use super::state::{CompletedRoll, ShardDirs, SlotRecord, SnapshotRecord};
use super::{Context, Note};
use crate::api::KcpShard;
use crate::front::Backend;
use crate::process::{ProcessSpec, UnitName, free_port};
use crate::slot;
use crate::store::StoreBackend;

/// How long the probe workspace may take to become Ready.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long caddy may take to answer `/readyz` through the front after a switch.
const FRONT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a slot's own kine may take to exit after SIGTERM.
const KINE_STOP_GRACE: Duration = Duration::from_secs(10);
/// How often a slot sent SIGTERM is looked at, to see when it stops listening.
const LISTEN_POLL: Duration = Duration::from_millis(10);
/// How long requests a slot admitted before it stopped listening get to finish before the front
/// closes that slot's connections. Watches never finish, and kcp stays alive while they are open.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(1);

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
    pub async fn act(&self, step: &Step) -> anyhow::Result<Notes> {
        match step {
            Step::Idle | Step::AwaitReady { .. } | Step::AwaitSettle { .. } => Ok(vec![]),
            Step::Blocked { cause } => Ok(vec![Note::warning("RollBlocked", cause.message())]),
            Step::EnsureStore => self.ensure_store().await,
            Step::Snapshot => self.snapshot().await,
            Step::EnsureFront => {
                let front = self.ctx.front(self.shard, self.dirs)?;
                let listen = front.listen();
                // A front that moves must not be stopped before its new address is known to be free:
                // the running one keeps serving while the spec names a taken address.
                let starts = self.world.observed.front_elsewhere
                    || self.world.observed.front == super::plan::FrontObservation::Down;
                // A front that systemd restarts holds the address in its unit's descriptor store.
                if front.is_ours()
                    && starts
                    && !front.restarting().await
                    && let Err(e) = std::net::TcpListener::bind(listen)
                {
                    anyhow::bail!(
                        "the front address {listen} is in use by another program ({e}): choose another spec.front.listen, or stop that program"
                    );
                }
                if !front.is_ours()
                    && let Some(ready) = self.world.observed.slots.iter().find(|s| s.ready)
                {
                    // Caddy serves the shard's certificate: once a slot made it, it is in shared/
                    // for caddy's config (`kcpshard front caddy-config`), before caddy can run.
                    slot::material::capture_shared(&self.dirs.slot(&ready.name).root(), &self.dirs.shared())?;
                }
                let started = front.ensure().await.map_err(|e| {
                    if front.is_ours() {
                        e
                    } else {
                        anyhow::anyhow!(
                            "{e:#} (the shard's certificate, key and CA for caddy's config are in {} once the first slot is ready)",
                            self.dirs.shared().display()
                        )
                    }
                })?;
                let reason = if self.world.observed.front_outdated {
                    "FrontUpgraded"
                } else {
                    "FrontStarted"
                };
                Ok(vec![Note::normal(reason, started)])
            }
            Step::StartSlot { name } => self.start_slot(name).await,
            Step::SwitchFront { to } => self.switch_front(to).await,
            Step::TerminateSlot { name } => self.terminate_slot(name).await,
            Step::StopSlot { name } => self.stop_slot(name).await,
            Step::RestartSlot { name, cause } => self.restart_slot(name, cause).await,
            Step::ForgetSlot { name, was_active } => {
                self.stop_slot_store(name).await?;
                let log = self
                    .slot(name)
                    .map(|slot| crate::process::Runtime::log_location(&slot.process))
                    .unwrap_or_else(|_| self.dirs.slot(name).log().display().to_string());
                self.dirs.slot(name).forget()?;
                if *was_active {
                    return Ok(vec![Note::warning(
                        "SlotCrashed",
                        format!("slot {name}, which served the shard, exited; starting a replacement (see {log})"),
                    )]);
                }
                Ok(vec![Note::warning("SlotCrashed", format!("slot {name} exited"))])
            }
            Step::AbortRoll { name, cause } => self.abort_roll(name, cause).await,
            Step::ReleaseLease => self.release_lease().await,
            Step::Probe => self.probe().await,
            Step::CompleteRoll => self.complete_roll(),
            Step::Cleanup => self.cleanup().await,
        }
    }

    fn store(&self) -> anyhow::Result<StoreBackend> {
        Ok(self.ctx.store(self.shard, self.dirs)?)
    }

    /// Starts the store's shard-wide part, then brings back the own kine of every running slot
    /// whose kine is down (on the port that slot dials).
    async fn ensure_store(&self) -> anyhow::Result<Notes> {
        // A new slot that is still starting will be started again once the store is back.
        let now = Utc::now();
        self.update_roll(|roll| {
            if roll.new_slot_ready_at.is_none() && roll.new_slot_started_at.is_some() {
                roll.store_down_at = Some(now);
            }
        })?;
        let store = self.store()?;
        // The shard-wide part went away under running slots (a kine killed, PostgreSQL restarted):
        // an outage the user should hear about, not a start.
        let outage = match store.check(&self.ctx.runtime).await {
            Err(problem) if self.world.observed.slots.iter().any(|s| s.running) => Some(problem),
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
            let name = &slot.record.name;
            let dir = self.dirs.slot(name).store();
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

    /// Stops what only this slot used of the store (its own kine, for KinePostgres).
    async fn stop_slot_store(&self, name: &str) -> anyhow::Result<()> {
        self.store()?
            .stop_slot(&self.ctx.runtime, &self.dirs.slot(name).store(), name, KINE_STOP_GRACE)
            .await?;
        Ok(())
    }

    /// Dumps the store before a roll to a new version, and remembers the file for the roll.
    async fn snapshot(&self) -> anyhow::Result<Notes> {
        let from = self.world.serving_version().unwrap_or_else(|| "none".into());
        let to = &self.desired.template.version;
        let keep = self.shard.spec.rollout.snapshots_to_keep.max(1) as usize;
        let started = std::time::Instant::now();
        let path = self
            .store()?
            .snapshot(&self.dirs.snapshots(), &from, to, keep)
            .await?
            .ok_or_else(|| anyhow::anyhow!("this store takes no snapshots"))?;
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut state = self.dirs.load_state()?;
        state.snapshot = Some(SnapshotRecord {
            template: self.desired.template.clone(),
            path: path.display().to_string(),
            taken_at: Utc::now(),
        });
        self.dirs.save_state(&state)?;
        Ok(vec![Note::normal(
            "SnapshotTaken",
            format!(
                "dumped the store to {} ({size} bytes, {:.1}s) before rolling {from} to {to}; docs/operations.md says how to restore it",
                path.display(),
                started.elapsed().as_secs_f64()
            ),
        )])
    }

    fn update_roll(&self, change: impl FnOnce(&mut RollRecord)) -> anyhow::Result<()> {
        let mut state = self.dirs.load_state()?;
        if let Some(roll) = state.roll.as_mut() {
            change(roll);
            self.dirs.save_state(&state)?;
        }
        Ok(())
    }

    async fn start_slot(&self, name: &str) -> anyhow::Result<Notes> {
        let template = &self.desired.template;
        let slot_dirs = self.dirs.slot(name);
        // A process left with this root directory (the controller stopped right after starting
        // it) would fight the new one: stop it first.
        let marker = format!("--root-directory={}", slot_dirs.root().display());
        for pid in crate::process::Runtime::find_by_argument(&marker) {
            if let Some(orphan) = crate::process::Runtime::observe(pid) {
                tracing::warn!(pid, slot = name, "stopping a leftover process of this slot");
                self.ctx.runtime.terminate(&orphan, Duration::from_secs(10)).await?;
            }
        }
        let port = free_port()?;
        let now = Utc::now();
        let mut state = self.dirs.load_state()?;
        if state.roll.as_ref().is_none_or(|r| r.to != name) {
            // The roll starts from what the front forwards to, even a slot that crashed: its
            // Lease must still be released once the new slot is ready.
            let from = self.world.front_backend.as_ref().map(|b| b.slot.clone());
            let serving = from.as_ref().and_then(|f| {
                self.world.slots.iter().find(|s| {
                    &s.record.name == f
                        && s.record.port == self.world.front_backend.as_ref().map_or(0, |b| b.address.port())
                })
            });
            state.roll = Some(RollRecord {
                from_version: serving.map(|s| s.record.template.version.clone()),
                snapshot: state
                    .snapshot
                    .as_ref()
                    .filter(|s| &s.template == template)
                    .map(|s| s.path.clone()),
                // A slot that is no longer there has already exited.
                old_slot_exited_at: from.as_ref().filter(|_| serving.is_none()).map(|_| now),
                from,
                to: name.to_string(),
                to_version: template.version.clone(),
                started_at: now,
                ..Default::default()
            });
        }
        state.blocked = None;
        self.dirs.save_state(&state)?;
        slot_dirs.save(&SlotRecord {
            name: name.to_string(),
            template: template.clone(),
            port,
            created_at: now,
        })?;

        slot::material::seed_root(&self.dirs.shared(), &slot_dirs.root())?;
        // The slot's own kine (KinePostgres) starts before its kcp, and alone: the other slot's
        // kine, if any, has long created kine's schema (docs/background.md section 7: two kines racing on a fresh
        // database).
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
            shutdown_delay: crate::api::parse_duration(&template.shutdown_delay).map_err(anyhow::Error::msg)?,
            extra_args: template.extra_args.clone(),
        };
        let args = slot::args::kcp_args(&launch)?;
        let spec = ProcessSpec::new(
            format!("slot-{name}"),
            UnitName::slot(&self.shard.name_any(), name),
            launch.binary.clone(),
            args,
            slot_dirs.log(),
            slot_dirs.process(),
        );
        let process = self.ctx.runtime.start(&spec).await?;
        self.update_roll(|roll| roll.new_slot_started_at = Some(Utc::now()))?;
        Ok(vec![Note::normal(
            "SlotStarting",
            format!(
                "started slot {name} (kcp {}, pid {}, port {port}, store {}); waiting for /readyz on its own port",
                template.version, process.pid, store.etcd_servers
            ),
        )])
    }

    async fn switch_front(&self, to: &str) -> anyhow::Result<Notes> {
        let slot = self.slot(to)?;
        let ready_at = Utc::now();
        self.update_roll(|roll| {
            roll.new_slot_ready_at.get_or_insert(ready_at);
        })?;
        // The first slot made the shard's key material; every later slot gets a copy before it starts.
        slot::material::capture_shared(&self.dirs.slot(to).root(), &self.dirs.shared())?;
        let front = self.ctx.front(self.shard, self.dirs)?;
        let address = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, slot.record.port));
        front
            .switch(&Backend {
                slot: to.to_string(),
                address,
            })
            .await?;
        self.update_roll(|roll| roll.front_switched_at = Some(Utc::now()))?;
        let mut notes = Vec::new();
        if !front.is_ours() {
            // Caddy terminates TLS and may be misconfigured in ways its admin API does not show:
            // ask it, as a client would, once it forwards to the new slot.
            if let Err(e) = self.check_through_front(to, front.listen()).await {
                notes.push(Note::warning(
                    "FrontCheckFailed",
                    format!("the front was switched to slot {to}, but {e}: check caddy's config (kcpshard front caddy-config) and log"),
                ));
            }
        }
        // Users reach kcp through the front with this file. kcp writes it with the shard URL (the
        // front); its kcp-admin token belongs to the slot that wrote it, so it is renewed per switch.
        let kubeconfig = std::fs::read(self.dirs.slot(to).admin_kubeconfig())?;
        crate::fsutil::write_atomically(&self.dirs.front_kubeconfig(), &kubeconfig)?;
        notes.splice(
            0..0,
            [
                Note::normal(
                    "SlotReady",
                    format!("slot {to} answers /readyz on its own port {}", slot.record.port),
                ),
                Note::normal(
                    "FrontSwitched",
                    format!(
                        "the front forwards new connections to slot {to} ({address}); open connections stay on their slot"
                    ),
                ),
            ],
        );
        Ok(notes)
    }

    /// `/readyz` through the front's address answers ok within [`FRONT_CHECK_TIMEOUT`].
    async fn check_through_front(&self, slot: &str, listen: SocketAddr) -> anyhow::Result<()> {
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

    fn slot(&self, name: &str) -> anyhow::Result<&super::observe::ObservedSlot> {
        self.world
            .slots
            .iter()
            .find(|s| s.record.name == name)
            .ok_or_else(|| anyhow::anyhow!("slot {name} has no record"))
    }

    /// Sends the roll's old slot SIGTERM and waits until it stops listening, after its shutdown
    /// delay (or exits). kcp then cancels its leader election and controllers, which reach kcp
    /// only through that listener: the old slot can no longer renew or re-create the Lease, so the
    /// Lease goes to the new slot while the old one drains its open connections.
    async fn terminate_slot(&self, name: &str) -> anyhow::Result<Notes> {
        let slot = self.slot(name)?;
        let drain = self.shard.spec.rollout.drain_timeout().map_err(anyhow::Error::msg)?;
        let port = slot.record.port;
        let began = std::time::Instant::now();
        let stopped_listening = async {
            while crate::process::procfs::tcp_listening(port) {
                tokio::time::sleep(LISTEN_POLL).await;
            }
        };
        let exited = tokio::select! {
            // SIGTERM goes out on the first poll of `terminate`, before the first look at the port.
            biased;
            done = self.ctx.runtime.terminate(&slot.process, drain) => Some(done?),
            () = stopped_listening => None,
        };
        let now = Utc::now();
        self.update_roll(|roll| {
            roll.old_slot_stopped_listening_at = Some(now);
            if exited.is_some() {
                roll.old_slot_exited_at = Some(now);
            }
        })?;
        let took = began.elapsed().as_secs_f64();
        let message = match exited {
            Some(_) => format!("slot {name} exited {took:.2}s after SIGTERM"),
            None => format!(
                "slot {name} stopped listening {took:.2}s after SIGTERM; it drains its open connections while the new slot takes the controllers' Lease"
            ),
        };
        Ok(vec![Note::normal("SlotDraining", message)])
    }

    async fn stop_slot(&self, name: &str) -> anyhow::Result<Notes> {
        let slot = self.slot(name)?;
        let drain = self.shard.spec.rollout.drain_timeout().map_err(anyhow::Error::msg)?;
        // kcp stops listening after its shutdown delay, but stays alive while connections (watches)
        // are open through the front, until drainTimeout kills it. Once what it admitted before
        // has had time to finish, the front closes them: clients re-watch, through the new slot.
        let stopped_listening = self
            .world
            .observed
            .roll
            .as_ref()
            .filter(|r| r.from.as_deref() == Some(name))
            .and_then(|r| r.old_slot_stopped_listening_at);
        let close_after = match stopped_listening {
            Some(at) => IN_FLIGHT_GRACE.saturating_sub((Utc::now() - at).to_std().unwrap_or_default()),
            None => {
                crate::api::parse_duration(&slot.record.template.shutdown_delay).unwrap_or_default() + IN_FLIGHT_GRACE
            }
        };
        let terminate = self.ctx.runtime.terminate(&slot.process, drain);
        tokio::pin!(terminate);
        let termination = tokio::select! {
            done = &mut terminate => done?,
            _ = tokio::time::sleep(close_after) => {
                let address = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, slot.record.port));
                self.ctx.front(self.shard, self.dirs)?.close(address).await;
                terminate.await?
            }
        };
        let exited_at = Utc::now();
        self.stop_slot_store(name).await?;
        self.update_roll(|roll| {
            if roll.from.as_deref() == Some(name) {
                roll.old_slot_exited_at.get_or_insert(exited_at);
            }
        })?;
        self.dirs.slot(name).forget()?;
        let mut notes = vec![Note::normal(
            "SlotStopped",
            match stopped_listening {
                Some(at) => format!(
                    "slot {name} exited {:.1}s after it stopped listening",
                    (exited_at - at).num_milliseconds() as f64 / 1000.0
                ),
                None => format!(
                    "slot {name} exited {:.1}s after SIGTERM",
                    termination.exited_after.as_secs_f64()
                ),
            },
        )];
        if termination.killed {
            notes.push(Note::warning(
                "SlotKilled",
                format!("slot {name} did not exit within spec.rollout.drainTimeout ({drain:?}) and was killed"),
            ));
        }
        Ok(notes)
    }

    /// Stops a slot that never got ready (it serves nobody: no drain), then its own kine, and drops
    /// its records.
    async fn discard_unready_slot(&self, name: &str) -> anyhow::Result<()> {
        if let Ok(slot) = self.slot(name) {
            self.ctx
                .runtime
                .terminate(&slot.process, Duration::from_secs(10))
                .await?;
        }
        self.stop_slot_store(name).await?;
        self.dirs.slot(name).forget()?;
        Ok(())
    }

    /// Stops a new slot that is not ready yet and its own kine; the roll record stays, so the next
    /// step starts the slot again for the same roll.
    async fn restart_slot(&self, name: &str, cause: &RestartCause) -> anyhow::Result<Notes> {
        self.discard_unready_slot(name).await?;
        let message = match cause {
            RestartCause::StoreOutage => format!(
                "slot {name} was starting when the store went down, and a kcp may never get ready after that (its informers do not sync); starting it again"
            ),
            RestartCause::NotReady { timeout_seconds } => {
                // Counted after the stop: a crash in between costs one more try, never the try.
                self.update_roll(|roll| roll.not_ready_restarts += 1)?;
                format!(
                    "slot {name} did not answer /readyz on its own port within {timeout_seconds}s; a kcp start-up sometimes never finishes, so it is started once more before the roll stops (its log is under the state dir); the old slot keeps serving"
                )
            }
        };
        Ok(vec![Note::warning("SlotRestarting", message)])
    }

    async fn abort_roll(&self, name: &str, cause: &BlockCause) -> anyhow::Result<Notes> {
        self.discard_unready_slot(name).await?;
        let mut state = self.dirs.load_state()?;
        state.roll = None;
        state.blocked = Some(Blocked {
            template: self.desired.template.clone(),
            cause: cause.clone(),
        });
        self.dirs.save_state(&state)?;
        Ok(vec![
            Note::warning(cause.reason(), cause.message()),
            Note::warning(
                "RollBlocked",
                format!("the roll to slot {name} stopped; the old slot keeps serving"),
            ),
        ])
    }

    /// A client of the active slot on its own port: the shard admin, or with `kcp_admin` the
    /// slot's own kcp-admin (a real identity, needed to create workspaces).
    async fn active_client(&self, kcp_admin: bool) -> anyhow::Result<kube::Client> {
        let super::plan::FrontObservation::Up { backend: Some(active) } = &self.world.observed.front else {
            anyhow::bail!("the front has no backend");
        };
        let slot = self.slot(active)?;
        let identity = if kcp_admin {
            Identity::KcpAdmin
        } else {
            Identity::ShardAdmin
        };
        Ok(self
            .ctx
            .slot_clients
            .get(&self.dirs.slot(active).admin_kubeconfig(), slot.record.port, identity)
            .await?)
    }

    async fn release_lease(&self) -> anyhow::Result<Notes> {
        // Only once the old slot has stopped listening or exited: a live leader would take the Lease
        // back (docs/background.md section 3: without this, controllers stop for ~61 s).
        let deleted = slot::access::release_controllers_lease(&self.active_client(false).await?).await?;
        self.update_roll(|roll| roll.lease_released_at = Some(Utc::now()))?;
        let message = if deleted {
            "deleted Lease kube-system/kcp-controllers so the new slot leads at once"
        } else {
            "no kcp-controllers Lease to release"
        };
        Ok(vec![Note::normal("LeaseReleased", message)])
    }

    async fn probe(&self) -> anyhow::Result<Notes> {
        let took = slot::access::probe_workspace(&self.active_client(true).await?, PROBE_TIMEOUT).await?;
        self.update_roll(|roll| roll.probe_succeeded_at = Some(Utc::now()))?;
        Ok(vec![Note::normal(
            "ProbeSucceeded",
            format!(
                "a probe workspace reached Ready in {:.2}s: a leader runs the controllers",
                took.as_secs_f64()
            ),
        )])
    }

    fn complete_roll(&self) -> anyhow::Result<Notes> {
        let mut state = self.dirs.load_state()?;
        let Some(roll) = state.roll.take() else {
            return Ok(vec![]);
        };
        let completed = CompletedRoll {
            roll,
            completed_at: Utc::now(),
        };
        let message = roll_summary(&completed);
        state.last_roll = Some(completed);
        self.dirs.save_state(&state)?;
        // Counted once it is recorded: a failed save retries the step, and must not count twice.
        if let Some(completed) = &state.last_roll {
            self.ctx.metrics.roll_completed(&self.shard.name_any(), completed);
        }
        Ok(vec![Note::normal("RollComplete", message)])
    }

    async fn cleanup(&self) -> anyhow::Result<Notes> {
        for slot in &self.world.slots {
            let drain = self
                .shard
                .spec
                .rollout
                .drain_timeout()
                .unwrap_or(Duration::from_secs(30));
            self.ctx.runtime.terminate(&slot.process, drain).await?;
            self.stop_slot_store(&slot.record.name).await?;
            self.dirs.slot(&slot.record.name).forget()?;
        }
        self.store()?.stop(&self.ctx.runtime, KINE_STOP_GRACE).await?;
        self.ctx.front(self.shard, self.dirs)?.stop().await?;
        Ok(vec![Note::normal(
            "Stopped",
            format!(
                "stopped the slots, the store's processes and the front; the data stays in {}",
                self.dirs.root().display()
            ),
        )])
    }
}

fn roll_summary(done: &CompletedRoll) -> String {
    let r = &done.roll;
    let since = |t: Option<chrono::DateTime<Utc>>| {
        t.map(|t| format!("{:.2}s", (t - r.started_at).num_milliseconds() as f64 / 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    let what = match &r.from {
        Some(from) => format!("rolled slot {from} to slot {}", r.to),
        None => format!("started slot {}", r.to),
    };
    format!(
        "{what} ({}): new slot ready {}, front switched {}, old slot stopped listening {}, lease released {}, probe Ready {}, old slot exited {}, done {}",
        r.to_version,
        since(r.new_slot_ready_at),
        since(r.front_switched_at),
        since(r.old_slot_stopped_listening_at),
        since(r.lease_released_at),
        since(r.probe_succeeded_at),
        since(r.old_slot_exited_at),
        since(Some(done.completed_at)),
    )
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
