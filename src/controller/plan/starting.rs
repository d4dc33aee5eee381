//! The slots of the desired template that are to start: wait for the one starting, start one (after
//! the checks a new template must pass), or start one again whose start went wrong.
use super::*;

/// Fewer than N slots of the desired template: wait for the one starting, or start one (after the
/// checks a new template must pass).
pub(super) fn starts(desired: &Desired, observed: &Observed) -> Option<Step> {
    if old_kcp_serves(observed) {
        return None;
    }
    let current: Vec<&SlotObservation> = observed
        .slots
        .iter()
        .filter(|s| s.running && !s.stopping() && s.template == desired.template)
        .collect();
    if let Some(starting) = current
        .iter()
        .find(|s| !s.health.ever_ready && !observed.front.forwards_to(&s.name))
    {
        return Some(not_ready_yet(desired, observed, starting));
    }
    if current.len() >= desired.slots {
        return None;
    }
    if let Some(blocked) = &observed.blocked
        && blocked.template == desired.template
        && !blocked.cause.lifted_by(desired)
    {
        return Some(Step::Blocked {
            cause: blocked.cause.clone(),
        });
    }
    if let Some(message) = &desired.version_refused {
        return Some(Step::Blocked {
            cause: BlockCause::VersionRefused {
                message: message.clone(),
            },
        });
    }
    if let Some(message) = &desired.root_not_ready {
        return Some(Step::Blocked {
            cause: BlockCause::RootShardNotReady {
                message: message.clone(),
            },
        });
    }
    if !desired.binary_present {
        return Some(Step::Blocked {
            cause: BlockCause::NoBinary {
                path: desired.template.binary.clone(),
            },
        });
    }
    let version_changes = version_changes(desired, observed);
    if desired.snapshot_before_version_change
        && current.is_empty()
        && version_changes
        && observed.snapshot_for.as_ref() != Some(&desired.template)
    {
        let dump = JobKind::Snapshot {
            template: Box::new(desired.template.clone()),
        };
        return Some(job::towards(observed, &dump, Step::Snapshot));
    }
    if desired.preflight
        && current.is_empty()
        && version_changes
        && let Some(step) = preflight(desired, observed)
    {
        return Some(with_interim(desired, observed, step));
    }
    let running = observed.slots.iter().filter(|s| s.running).count();
    if running > desired.slots {
        // A roll runs one slot more than spec.slots, never two: wait for one to go.
        let leaving = observed.slots.iter().find(|s| s.running && s.stopping())?;
        return Some(Step::Wait(Wait::Exit {
            slot: leaving.name.clone(),
        }));
    }
    Some(Step::StartSlot {
        name: free_slot_name(observed),
    })
}

/// The first slot name no slot has.
pub(super) fn free_slot_name(observed: &Observed) -> String {
    SLOT_NAMES
        .iter()
        .find(|n| observed.slots.iter().all(|s| s.name != **n))
        .expect("at most four slots have records")
        .to_string()
}

/// A new slot that has not answered `/readyz` yet: waited for, started again once after a store
/// outage or a missed readinessTimeout, then given up on.
fn not_ready_yet(desired: &Desired, observed: &Observed, slot: &SlotObservation) -> Step {
    let roll = observed.roll.as_ref();
    if started_across_a_store_outage(observed, slot) {
        return Step::RestartSlot {
            name: slot.name.clone(),
            cause: RestartCause::StoreOutage,
        };
    }
    let allowed = NOT_READY_RESTARTS * desired.slots as u32;
    if slot.health.broken() {
        // kcp redoes no lost bootstrap step: waiting for readinessTimeout cannot help.
        if roll.is_some_and(|r| r.not_ready_restarts < allowed) {
            return Step::RestartSlot {
                name: slot.name.clone(),
                cause: RestartCause::Broken,
            };
        }
        return Step::AbortRoll {
            name: slot.name.clone(),
            cause: BlockCause::SlotBroken {
                slot: slot.name.clone(),
                detail: slot.health.problem.clone(),
            },
        };
    }
    if elapsed(observed.now, slot.started_at) <= desired.readiness_timeout {
        return Step::Wait(Wait::Ready {
            slot: slot.name.clone(),
        });
    }
    if roll.is_some_and(|r| r.not_ready_restarts < allowed) {
        return Step::RestartSlot {
            name: slot.name.clone(),
            cause: RestartCause::NotReady {
                timeout_seconds: desired.readiness_timeout.as_secs(),
            },
        };
    }
    Step::AbortRoll {
        name: slot.name.clone(),
        cause: BlockCause::SlotNotReady {
            slot: slot.name.clone(),
            timeout_seconds: desired.readiness_timeout.as_secs(),
        },
    }
}

/// A slot not ready yet whose start-up a store outage overlapped: the roll saw the store down
/// after it started, or a store process it needs started after it. Such a kcp may never get ready,
/// or answer 404 for its own APIs, so it is started again, whatever its looks say.
pub fn started_across_a_store_outage(observed: &Observed, slot: &SlotObservation) -> bool {
    let outage_seen = observed
        .roll
        .as_ref()
        .and_then(|r| r.store_down_at)
        .is_some_and(|down| down >= slot.started_at);
    let store_restarted = observed.store_started_at.is_some_and(|up| up > slot.started_at);
    !slot.health.ever_ready && (outage_seen || store_restarted)
}
