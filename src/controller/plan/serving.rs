//! The plan's rules for the serving set: which slots new connections go to, and the change that
//! gets the front there.
use super::*;

/// How long a change of a caddy front's upstreams may take to answer `/readyz` through the front
/// (caddy's active health checks let a new upstream in after their interval).
pub const FRONT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The end of a due check of a caddy front's change: it passed, or it still fails
/// [`FRONT_CHECK_TIMEOUT`] after the change.
pub fn front_checked(observed: &Observed) -> Option<Step> {
    let seen = observed.front_check.as_ref()?;
    match &seen.outcome {
        Ok(()) => Some(Step::FinishFrontCheck { failure: None }),
        Err(failure) if elapsed(observed.now, seen.check.since) >= FRONT_CHECK_TIMEOUT => {
            Some(Step::FinishFrontCheck {
                failure: Some(failure.clone()),
            })
        }
        Err(_) => None,
    }
}

/// The slots new connections should go to: up to N slots of the desired template that can serve,
/// then old slots already in the front to make up N (the leader kept longest, so that the Lease
/// moves once); if none, any slot that answers; if none, what the front has now and still runs
/// (there is nothing better).
pub fn wanted_front(desired: &Desired, observed: &Observed) -> Vec<String> {
    if observed
        .migration
        .as_ref()
        .is_some_and(|m| m.record.under_way() && m.record.switching())
    {
        // A move's switch: the front holds new connections until the new store's slot takes them.
        return Vec::new();
    }
    let current = observed.front.backends();
    let in_front = |s: &SlotObservation| current.contains(&s.name);
    let fits = |s: &SlotObservation| !s.on_other_store && if in_front(s) { s.can_stay() } else { s.can_join() };
    let mut new: Vec<&SlotObservation> = observed
        .slots
        .iter()
        .filter(|s| s.template == desired.template && fits(s))
        .collect();
    new.sort_by_key(|s| (!in_front(s), s.started_at, s.name.clone()));
    let mut wanted: Vec<String> = new.iter().take(desired.slots).map(|s| s.name.clone()).collect();
    if wanted.len() < desired.slots {
        let mut old: Vec<&SlotObservation> = observed
            .slots
            .iter()
            .filter(|s| s.template != desired.template && in_front(s) && s.can_stay())
            .collect();
        old.sort_by_key(|s| (!leads(observed, &s.name), s.name.clone()));
        let room = desired.slots - wanted.len();
        wanted.extend(old.iter().take(room).map(|s| s.name.clone()));
    }
    if wanted.is_empty() {
        wanted = observed
            .slots
            .iter()
            .filter(|s| s.can_join() && !s.on_other_store)
            .take(desired.slots)
            .map(|s| s.name.clone())
            .collect();
    }
    if wanted.is_empty() {
        wanted = current
            .iter()
            .filter(|b| observed.slot(b).is_some_and(|s| s.running && !s.stopping()))
            .cloned()
            .collect();
    }
    wanted.sort();
    wanted
}

pub(super) fn same_set(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

pub(super) fn front_change(desired: &Desired, observed: &Observed, wanted: Vec<String>) -> FrontChange {
    let current = observed.front.backends();
    let joined = wanted.iter().filter(|w| !current.contains(w)).cloned().collect();
    let left = current
        .iter()
        .filter(|c| !wanted.contains(c))
        .map(|c| {
            let cause = match observed.slot(c) {
                None => LeaveCause::Exited,
                Some(s) if !s.running => LeaveCause::Exited,
                Some(s) if s.health.unresponsive() && s.template == desired.template => LeaveCause::Unresponsive,
                Some(_) => LeaveCause::Replaced,
            };
            (c.clone(), cause)
        })
        .collect();
    FrontChange {
        backends: wanted,
        joined,
        left,
    }
}
