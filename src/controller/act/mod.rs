//! Act: perform exactly the step the plan chose, record it in the controller's files before the
//! effect that depends on it, and tell the user with an event. A step sends a signal or a request
//! and returns: a process's exit, a listener closing, a workspace getting Ready are observed later.

use kube::runtime::events::EventType;

use super::credentials;
use super::error::Error;
use super::observe::{ObservedSlot, World};
use super::plan::{Desired, RollRecord, Step};
use super::state::ShardDirs;
use super::{Context, Note};
use crate::api::KcpShard;
use crate::store::StoreBackend;

mod front;
mod restore;
mod roll;
pub(crate) mod slots;
mod store;

/// What a step did that the user should hear about.
pub type Notes = Vec<Note>;

pub struct Actor<'a> {
    pub ctx: &'a Context,
    pub shard: &'a KcpShard,
    pub dirs: &'a ShardDirs,
    pub desired: &'a Desired,
    pub world: &'a World,
    /// The step being taken (its requests are known by it).
    pub step: &'a Step,
}

impl Actor<'_> {
    pub async fn act(&self, step: &Step) -> Result<Notes, Error> {
        match step {
            Step::Idle | Step::Wait(_) => Ok(vec![]),
            // Its RollBlocked event goes out once, with the first status that says it (mod.rs).
            Step::Blocked { .. } => Ok(vec![]),
            Step::AdoptSlot { name } => self.adopt_slot(name),
            Step::IssueIdentity => Ok(vec![credentials::issue(
                self.dirs,
                self.desired.rotation_request.as_deref(),
                chrono::Utc::now(),
            )?]),
            Step::UpdateIdentities => credentials::update(
                self.dirs,
                &crate::controller::plan::next_record(&self.world.observed.identities, &self.world.observed),
            ),
            Step::WriteKubeconfig => {
                Ok(
                    credentials::write_kubeconfig(self.dirs, &self.world.observed, &self.desired.template.front_url)?
                        .into_iter()
                        .collect(),
                )
            }
            Step::WriteTrust => {
                let trust = super::sharding::Trust::of(self.dirs);
                let written = trust.write(self.dirs, &self.desired.template.front_url)?;
                let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
                Ok(vec![Note::normal(
                    "ShardedTrustWritten",
                    format!("wrote the sharded kcp's trust for the root shard: {}", names.join(", ")),
                )])
            }
            Step::EnsureStore => self.ensure_store().await,
            Step::KillStore => self.kill_store(),
            Step::Snapshot => super::jobs::start_snapshot(self).await,
            Step::Backup { request } => super::jobs::start_backup(self, request.clone()).await,
            Step::FinishJob => super::jobs::finish(self).await,
            Step::CancelJob => super::jobs::cancel(self),
            Step::StartPreflight => super::preflight::start(self).await,
            Step::CopyPreflight => super::preflight::copy(self).await,
            Step::LaunchPreflight => super::preflight::launch(self).await,
            Step::ReleasePreflightLease => super::preflight::release_lease(self).await,
            Step::ComparePreflight => super::preflight::compare(self).await,
            Step::FailPreflight { cause } => super::preflight::fail(self, cause),
            Step::StopPreflight => super::preflight::stop(self).await,
            Step::RemovePreflight => super::preflight::remove(self).await,
            Step::BeginRestore(restorable) => self.begin_restore(restorable).await,
            Step::RefuseRestore { message } => self.refuse_restore(message).await,
            Step::RestoreSnapshot => super::jobs::start_restore(self).await,
            Step::CompleteRestore => self.complete_restore(),
            Step::EnsureFront => self.ensure_front().await,
            Step::UpgradeFront => self.upgrade_front().await,
            Step::MoveFront => super::stops::move_front(self).await,
            Step::KillFront => self.kill_front(),
            Step::StartSlot { name } => self.start_new_slot(name).await,
            Step::StartInterim { name } => self.start_interim(name).await,
            Step::SetFront(change) => self.set_front(change).await,
            Step::FinishFrontCheck { failure } => self.finish_front_check(failure.as_deref()),
            Step::TerminateSlot { name } => self.terminate_slot(name),
            Step::KillSlot { name, cause } => self.kill_slot(name, cause),
            Step::CloseConnections { name } => self.close_connections(name).await,
            Step::StopSlotStore { name } => super::stops::stop_slot_store(self, name).await,
            Step::RemoveSlot { name, crashed } => self.remove_slot(name, *crashed).await,
            Step::RestartSlot { name, cause } => self.restart_slot(name, cause).await,
            Step::AbortRoll { name, cause } => self.abort_roll(name, cause),
            Step::ReleaseLease { holder, to } => self.release_lease(holder.as_deref(), to).await,
            Step::Probe => self.probe().await,
            Step::ProbeSucceeded => self.probe_succeeded().await,
            Step::CompleteRoll => self.complete_roll(),
            Step::StopStore => super::stops::stop_store(self).await,
            Step::StopOrphanedKine { record } => super::stops::stop_orphaned_kine(self, record).await,
            Step::StopFront => super::stops::stop_front(self).await,
            Step::KillStopping { what } => super::stops::kill(self, what).await,
            Step::ForgetKilled => super::stops::forget_killed(self).await,
            Step::BeginMigration => super::migration::begin(self),
            Step::EnsureTargetStore => super::migration::ensure_target_store(self).await,
            Step::StartMirror => super::migration::start_mirror(self).await,
            Step::StartWarmSlot { name } => super::migration::start_warm_slot(self, name).await,
            Step::BeginSwitch => super::migration::begin_switch(self).await,
            Step::EndMirror => super::migration::end_mirror(self),
            Step::StopOldStore => super::migration::stop_old_store(self).await,
            Step::CompleteMigration => super::migration::complete(self),
            Step::FailMigration { cause } => super::migration::fail(self, cause),
            Step::ForgetMigration => super::migration::forget(self),
            Step::AdoptKcp => super::adoption::adopt(self).await,
            Step::HoldControllersLease => super::adoption::hold_lease(self).await,
            Step::RedirectProxy => super::adoption::redirect_proxy(self).await,
            Step::CompleteAdoption => super::adoption::complete(self),
        }
    }

    pub(super) fn store(&self) -> Result<StoreBackend, Error> {
        Ok(self.ctx.store(self.shard, &self.world.store.store, self.dirs)?)
    }

    /// The store slot `name` runs on: the shard's, or the one a move goes to (its record says).
    pub(super) fn slot_store(&self, name: &str) -> Result<StoreBackend, Error> {
        match self.world.slot(name).and_then(|s| s.record.store.as_ref()) {
            Some(spec) => Ok(self.ctx.store(self.shard, spec, self.dirs)?),
            None => self.store(),
        }
    }

    fn slot(&self, name: &str) -> Result<&ObservedSlot, Error> {
        self.world.slot(name).ok_or_else(|| Error::NoSuchSlot(name.to_string()))
    }

    /// Makes `request`, this step's request about `about` (the slot or database it goes to),
    /// beside the reconcile: its answer, or None while it runs (the step then returns; the answer
    /// wakes the shard, and the step planned again takes it up). See controller/requests.rs.
    pub(crate) fn ask<'r, T, F>(
        &'r self,
        about: &str,
        request: F,
    ) -> impl std::future::Future<Output = Result<Option<T>, Error>> + Send + use<'r, T, F>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, Error>> + Send + 'static,
    {
        let woken = (
            kube::runtime::reflector::ObjectRef::from_obj(self.shard),
            super::Wake::Answer,
        );
        let exits = self.ctx.exits.clone();
        let wake = move || exits.wake(woken);
        self.ctx.requests.ask(
            &kube::ResourceExt::name_any(self.shard),
            self.step,
            about,
            wake,
            request,
        )
    }

    /// Starts what kcpshard runs of `store` and, once all of it runs, reaches it over the network
    /// as step `step`'s request: what it found or started, or None while the request runs.
    pub(crate) async fn ensure_store_of(&self, store: &StoreBackend) -> Result<Option<String>, Error> {
        if let Some(started) = store.ensure(&self.ctx.runtime).await? {
            return Ok(Some(started));
        }
        let reach = store.reach();
        self.ask(&store.describe_server(), async move { Ok(reach.await?) })
            .await
    }

    fn update_roll(&self, change: impl FnOnce(&mut RollRecord)) -> Result<(), Error> {
        let mut state = self.dirs.load_state()?;
        if let Some(roll) = state.roll.as_mut() {
            change(roll);
            self.dirs.save_state(&state)?;
        }
        Ok(())
    }
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
