//! A move of the shard's data to another store while it serves (spec.store changed; docs/
//! how-to/stores.md "Move a shard to another store"). The old slots serve on while a job mirrors the
//! store into the new one (a copy at one revision, then every later change: store/mirror.rs); a
//! slot starts on the new store out of the front (it follows: the controllers Lease it reads is
//! the one the serving leader renews, mirrored); then the switch: the front holds new connections,
//! every old slot gets SIGTERM and exits, the mirror applies the old store's last changes and
//! ends, the store record names the new store, and the front sends new connections to the new
//! slot. A failure before the switch ends leaves the old store serving; the new store keeps what
//! was copied (a later move into it is refused until it is cleared).
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::*;
use crate::api::StoreSpec;

/// The largest lag (revisions of the old store not yet in the new) at which the switch begins:
/// what is left is applied while the front holds new connections.
pub const SWITCH_LAG: i64 = 200;

/// A move, recorded in controller.json before anything of it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationRecord {
    pub from: StoreSpec,
    pub to: StoreSpec,
    pub started_at: DateTime<Utc>,
    /// The slot started on the new store, out of the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_slot: Option<String>,
    /// When the front began to hold new connections and the old slots were told to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_started_at: Option<DateTime<Utc>>,
    /// When the mirror was told that the old store takes no more writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_ending_at: Option<DateTime<Utc>>,
    /// When the mirror had applied the old store's last change: the store record names `to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
    /// Why it stopped, and what was left where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

impl MigrationRecord {
    /// A move from `from` to `to` that begins at `at`.
    pub fn begun(from: StoreSpec, to: StoreSpec, at: DateTime<Utc>) -> MigrationRecord {
        MigrationRecord {
            from,
            to,
            started_at: at,
            warm_slot: None,
            switch_started_at: None,
            mirror_ending_at: None,
            switched_at: None,
            completed_at: None,
            failure: None,
        }
    }

    pub fn under_way(&self) -> bool {
        self.completed_at.is_none() && self.failure.is_none()
    }

    pub fn switching(&self) -> bool {
        self.switch_started_at.is_some() && self.switched_at.is_none()
    }
}

/// Why a move stops before its switch ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationFailure {
    /// spec.store changed again before the switch.
    SpecChanged,
    /// The slot on the new store exited before it served.
    WarmSlotExited { slot: String, last_words: Option<String> },
    /// The mirror job failed (its message), or its process is gone.
    Mirror { message: String },
}

/// How the mirror job says it stands (its progress file).
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorObservation {
    pub phase: crate::store::mirror::MirrorPhase,
    pub copied_keys: u64,
    pub lag: i64,
    /// Keys of the old store found written as of its last change, once the mirror checked.
    pub verified_keys: Option<u64>,
}

/// A move under way (or the latest one), as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationObservation {
    pub record: MigrationRecord,
    /// The new store's shard-wide part accepts (a managed PostgreSQL, its database).
    pub target_up: bool,
    /// It is not up, and what of it was started is within its start timeout.
    pub target_starting: bool,
    /// The mirror's progress, once it wrote some.
    pub mirror: Option<MirrorObservation>,
    /// What kcpshard runs of the old store (a kine over sqlite, a managed PostgreSQL) after the
    /// switch: stopped, its data left.
    pub old_store_running: bool,
}

/// What spec.store asks for when it names another store than the data is in.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMove {
    pub to: StoreSpec,
    /// Why it cannot be done (the status says what to do).
    pub refused: Option<String>,
}

/// The move's next step, while one is wanted or under way; None once nothing of it is left to do.
pub(super) fn migration(desired: &Desired, observed: &Observed) -> Option<Step> {
    let Some(m) = observed.migration.as_ref().filter(|m| m.record.under_way()) else {
        return begin(desired, observed);
    };
    let record = &m.record;
    if record.switched_at.is_some() {
        return after_switch(observed, m);
    }
    if !record.switching() && desired.store_move.as_ref().map(|w| &w.to) != Some(&record.to) {
        return Some(Step::FailMigration {
            cause: MigrationFailure::SpecChanged,
        });
    }
    // Before the switch the old store serves: with no slot of it running (they died, or the shard
    // was created again on the same data) one starts there first, and the move waits until the
    // roll that starts it (a replacement, a first start) has ended.
    if !record.switching() {
        if !observed.slots.iter().any(|s| s.running && !s.on_other_store) {
            return Some(Step::StartSlot {
                name: free_name(observed)?,
            });
        }
        if let Some(step) = super::roll_progress(desired, observed) {
            return Some(step);
        }
    }
    let mirror_job = observed
        .job
        .as_ref()
        .filter(|j| matches!(j.record.kind, JobKind::Mirror));
    // A KineSqlite target's kine starts on the file the mirror readied (its revisions are raised
    // while no kine runs on it); any other target is up before the mirror writes into it.
    let target_after_mirror = record.to.type_ == crate::api::StoreType::KineSqlite;
    if !m.target_up && !target_after_mirror {
        return Some(target_step(m));
    }
    let Some(job) = mirror_job else {
        if observed.job.as_ref().is_some_and(JobObservation::running) {
            return Some(Step::CancelJob);
        }
        return Some(Step::StartMirror);
    };
    let following = job.running()
        && m.mirror
            .as_ref()
            .is_some_and(|p| p.phase == crate::store::mirror::MirrorPhase::Following);
    if !following {
        return Some(Step::Wait(Wait::Job { job: "store-mirror" }));
    }
    if !m.target_up {
        return Some(target_step(m));
    }
    let warm = record.warm_slot.as_ref().and_then(|name| observed.slot(name));
    let Some(warm) = warm else {
        if let Some(name) = &record.warm_slot {
            // Recorded, and no record of its process: it exited (RemoveSlot) or never started.
            return Some(Step::FailMigration {
                cause: MigrationFailure::WarmSlotExited {
                    slot: name.clone(),
                    last_words: None,
                },
            });
        }
        return Some(Step::StartWarmSlot {
            name: free_name(observed)?,
        });
    };
    if !warm.running {
        return Some(Step::FailMigration {
            cause: MigrationFailure::WarmSlotExited {
                slot: warm.name.clone(),
                last_words: warm.last_words.clone(),
            },
        });
    }
    if record.switch_started_at.is_none() {
        let lag = m.mirror.as_ref().map_or(i64::MAX, |p| p.lag);
        return Some(if warm.health.ready && lag <= SWITCH_LAG {
            Step::BeginSwitch
        } else if warm.health.ready {
            Step::Wait(Wait::Job { job: "store-mirror" })
        } else {
            Step::Wait(Wait::Ready {
                slot: warm.name.clone(),
            })
        });
    }
    // The switch: every old slot stops once settled, as in a roll (the front holds new
    // connections meanwhile), then the mirror takes the old store's last changes.
    let old: Vec<&SlotObservation> = observed.slots.iter().filter(|s| !s.on_other_store).collect();
    if let Some(s) = old.iter().find(|s| s.running && !s.stopping()) {
        return Some(super::settled_or_settling(observed, s));
    }
    if let Some(s) = old.iter().find(|s| s.running) {
        return Some(Step::Wait(Wait::Exit { slot: s.name.clone() }));
    }
    // Their own kines (KinePostgres) too, while the slots' records still name the old store.
    if let Some(s) = old.iter().find(|s| s.own_store_running) {
        return Some(stop_slot_store(observed, &s.name));
    }
    Some(switch_ending(observed).unwrap_or(Step::Wait(Wait::Job { job: "store-mirror" })))
}

/// Towards the new store's shard-wide part accepting.
fn target_step(m: &MigrationObservation) -> Step {
    if m.target_starting {
        Step::Wait(Wait::Store)
    } else {
        Step::EnsureTargetStore
    }
}

/// EndMirror, during a move's switch once no old slot runs and the mirror has not been told yet.
pub(super) fn switch_ending(observed: &Observed) -> Option<Step> {
    let m = observed.migration.as_ref().filter(|m| m.record.under_way())?;
    let ending = m.record.switching() && m.record.mirror_ending_at.is_none();
    let old_gone = observed
        .slots
        .iter()
        .all(|s| s.on_other_store || !(s.running || s.own_store_running));
    (ending && old_gone).then_some(Step::EndMirror)
}

/// A move of the data wanted and not begun: it begins once the shard is steady (no roll,
/// preflight, restore or job, every slot serving), and not again for a target it failed for
/// until spec.store has named the data's store in between.
fn begin(desired: &Desired, observed: &Observed) -> Option<Step> {
    // A slot a move that stopped started on its new store goes first.
    if let Some(s) = observed
        .slots
        .iter()
        .find(|s| s.on_other_store && s.running && !s.stopping())
    {
        return Some(Step::TerminateSlot { name: s.name.clone() });
    }
    let failed_for = observed
        .migration
        .as_ref()
        .filter(|m| m.record.failure.is_some())
        .map(|m| &m.record.to);
    if failed_for.is_some() && desired.store_move.is_none() {
        return Some(Step::ForgetMigration);
    }
    let wanted = desired.store_move.as_ref().filter(|w| w.refused.is_none())?;
    if failed_for == Some(&wanted.to) {
        return None;
    }
    let busy = observed.roll.is_some()
        || adoption_waits(observed)
        || observed.preflight.as_ref().is_some_and(|p| p.leftovers)
        || observed.restore.as_ref().is_some_and(RestoreRecord::under_way)
        || observed.job.as_ref().is_some_and(JobObservation::running);
    let in_front = |s: &SlotObservation| observed.front.forwards_to(&s.name) || front_waits_for_switch(observed);
    let steady = observed.slots.iter().all(|s| s.can_stay() && in_front(s)) && !observed.slots.is_empty();
    (!busy && steady).then_some(Step::BeginMigration)
}

/// After the switch, once the front sends new connections to the new store's slot (the plan's
/// own SetFront): what ran the old store stops (its data stays), and the move is complete.
fn after_switch(observed: &Observed, m: &MigrationObservation) -> Option<Step> {
    if !observed.front_serves() {
        return None;
    }
    Some(if m.old_store_running {
        towards_stopped(observed, Stopping::OldStore, Step::StopOldStore)
    } else {
        Step::CompleteMigration
    })
}

/// The first slot name no slot has.
fn free_name(observed: &Observed) -> Option<String> {
    SLOT_NAMES
        .iter()
        .find(|n| observed.slot(n).is_none())
        .map(|n| n.to_string())
}
