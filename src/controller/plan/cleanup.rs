//! The plan's rules for stopping everything: a deletion, and every slot before a restore.
use super::*;

/// Deleting: every slot gets SIGTERM (SIGKILL after drainTimeout), their own stores stop and their
/// records go, then the shard-wide store's processes, every other kine of the shard that still
/// runs, then the front; done once every process asked to stop has exited. The data stays.
pub(super) fn cleanup(desired: &Desired, observed: &Observed) -> Step {
    if observed.job.as_ref().is_some_and(JobObservation::running) {
        return Step::CancelJob;
    }
    if let Some(step) = stop_every_slot(desired, observed) {
        return step;
    }
    if observed.preflight.as_ref().is_some_and(|p| p.leftovers) {
        return remove_preflight(observed);
    }
    if observed.store_processes_up {
        return towards_stopped(observed, Stopping::Store, Step::StopStore);
    }
    if let Some(record) = observed.orphaned_kines.first() {
        let what = Stopping::OrphanedKine { record: record.clone() };
        return towards_stopped(observed, what, Step::StopOrphanedKine { record: record.clone() });
    }
    if observed.front_ours && !matches!(observed.front, FrontObservation::Down) {
        return towards_stopped(observed, Stopping::Front, Step::StopFront);
    }
    // Asked to stop, and no longer serving, but not gone yet.
    if let Some(stop) = observed.stopping.first() {
        return Step::Wait(Wait::Stopping {
            what: stop.what.clone(),
        });
    }
    Step::Idle
}

/// The next step towards no slot at all (deleting, restoring): SIGTERM to every slot (SIGKILL
/// after drainTimeout), then each one's own store and records; None once no slot is left.
pub(super) fn stop_every_slot(desired: &Desired, observed: &Observed) -> Option<Step> {
    if let Some(s) = observed.slots.iter().find(|s| s.running && !s.stopping()) {
        return Some(Step::TerminateSlot { name: s.name.clone() });
    }
    if let Some(step) = kills(desired, observed) {
        return Some(step);
    }
    if let Some(gone) = observed.slots.iter().find(|s| !s.running) {
        return Some(if gone.own_store_running {
            stop_slot_store(observed, &gone.name)
        } else {
            Step::RemoveSlot {
                name: gone.name.clone(),
                crashed: false,
            }
        });
    }
    observed
        .slots
        .first()
        .map(|s| Step::Wait(Wait::Exit { slot: s.name.clone() }))
}

/// Towards the own kine of slot `name`, whose kcp is gone, no longer running.
pub(super) fn stop_slot_store(observed: &Observed, name: &str) -> Step {
    let what = Stopping::SlotStore { slot: name.to_string() };
    towards_stopped(observed, what, Step::StopSlotStore { name: name.to_string() })
}
