//! The plan's rules for a restore of a store snapshot: taking up the request, then every slot
//! stops and the snapshot is restored.
use super::*;

/// A restore request: taken up (act drops the annotation; a request already taken up, seen again
/// before its annotation is gone, is taken up again, which only drops it), or refused.
pub(super) fn take_restore_request(request: &RestoreRequest, observed: &Observed) -> Step {
    if let Some(under_way) = observed.restore.as_ref().filter(|r| r.under_way())
        && under_way.request != request.value
    {
        return Step::RefuseRestore {
            message: format!(
                "a restore of {} is under way; ask again once it is complete",
                under_way.snapshot
            ),
        };
    }
    match &request.verdict {
        Ok(restorable) => Step::BeginRestore(restorable.clone()),
        Err(message) => Step::RefuseRestore {
            message: message.clone(),
        },
    }
}

/// The shard is down for a restore: the front serves no slot, every slot and its own kine stop,
/// then the snapshot is restored: through the store, which must be up (pg_restore), or in place of
/// its files once its own processes stopped too (a KineSqlite store's kine).
pub(super) fn restoring(desired: &Desired, observed: &Observed) -> Step {
    if !observed.front.backends().is_empty() {
        let current = observed.front.backends();
        return Step::SetFront(FrontChange {
            backends: vec![],
            joined: vec![],
            left: current.iter().map(|b| (b.clone(), LeaveCause::Replaced)).collect(),
        });
    }
    if let Some(step) = stop_every_slot(desired, observed) {
        return step;
    }
    if desired.restore_stops_store {
        if observed.store_processes_up {
            return towards_stopped(observed, Stopping::Store, Step::StopStore);
        }
    } else if observed.store_unresponsive {
        return Step::KillStore;
    } else if !observed.store_up {
        return super::towards_store(observed);
    }
    let restore = JobKind::Restore {
        snapshot: observed
            .restore
            .as_ref()
            .map(|r| r.snapshot.clone())
            .unwrap_or_default(),
    };
    job::towards(observed, &restore, Step::RestoreSnapshot)
}
