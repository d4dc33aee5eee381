//! The plan: a pure function from the desired state (the spec) and the observed state (processes,
//! their health, the front's serving set, who holds the controllers' Lease, the persisted roll
//! record) to the ONE next step.
//!
//! `spec.slots` (N) ready slots serve behind the front at once; a roll starts one new slot at a time
//! (at most N+1 run), adds it to the front as it takes one old slot out, lets the old one settle,
//! sends it SIGTERM and lets it drain. Old slots that do not lead go first, so the Lease moves once.
//! The invariants, each checked by the property tests (`simulation.rs`):
//! - the front only ever gains a slot that is running and answered `/readyz` on its own port
//!   (docs/background.md section 5);
//! - no slot that served is sent SIGTERM while no other slot that can serve is in the front;
//! - at most N+1 slots run, and a new slot takes a free name;
//! - the Lease is deleted only when its holder is gone, or has stopped listening after SIGTERM: a
//!   live leader would renew it (docs/background.md section 3), but kcp's leader election and
//!   controllers reach kcp through its own listener, so once that is closed it can no longer lead;
//! - a roll that failed for a spec is not retried until the spec changes (no crash loop);
//! - with spec.rollout.preflight, no slot of a new version starts while another version serves or
//!   last served the data, until that version ran alone on a copy of the data, passed, and
//!   everything of that run is removed; a preflight runs once per template. While it runs and
//!   nothing serves, a slot of the version that last served the data serves (an interim slot);
//! - a restore of a store snapshot (a planned outage) runs only once no slot runs: the front
//!   serves none, every slot and its own kine stop, then the snapshot is restored and slots of
//!   its version start as on a first start;
//! - a move of the data to another store (plan/migration.rs) runs only while the shard is
//!   steady; its slot on the new store never joins the front, nor carries a Lease release, before
//!   the switch; its switch is the one time an old slot is sent SIGTERM with no slot in the front:
//!   the front holds new connections meanwhile;
//! - an adopted kcp (plan/adoption.rs) is a slot that serves on its own store until the move's
//!   switch; no slot of kcpshard's starts on that store, and the move begins only once the
//!   controllers Lease says the old kcp leads;
//! - nothing waits: a step sends a signal or a request and returns; its effect is observed later.
mod adoption;
#[cfg(test)]
mod adoption_tests;
mod cleanup;
mod desired;
mod identities;
mod job;
mod migration;
#[cfg(test)]
mod migration_tests;
mod observed;
mod preflight;
mod records;
mod restore;
mod serving;
#[cfg(test)]
mod simulation;
mod starting;
mod step;
mod stopping;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeSet;
use std::time::Duration;

pub use adoption::*;
pub use desired::*;
pub use identities::*;
pub use job::*;
pub use migration::*;
pub use observed::*;
pub use records::*;
pub use step::*;
pub use stopping::*;

use cleanup::*;
use preflight::*;
use restore::*;
use serving::*;
pub use starting::started_across_a_store_outage;
use starting::*;

/// How long a slot that left the front keeps its connections untouched before SIGTERM: long enough
/// for a connection the front accepted just before the change to finish its TLS handshake and send
/// its first request (p99 of a whole request under the roll bench's load: 0.18-0.26 s,
/// docs/benchmarks.md "Rolls under load").
pub const SWITCH_SETTLE: Duration = Duration::from_millis(500);

/// The longest a slot that left the front waits, before SIGTERM, for the front to close its
/// kept-alive HTTP/1.1 connections between two requests (kcp answers /readyz 500 after SIGTERM on
/// a connection that stays).
pub const RETIRE_WAIT: Duration = Duration::from_secs(2);

/// How long requests a slot admitted before it stopped listening get to finish before the front
/// closes that slot's connections. Watches never finish, and kcp stays alive while they are open.
pub const IN_FLIGHT_GRACE: Duration = Duration::from_secs(1);

/// How long the probe workspace may take to become Ready before another is made.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times a new slot that missed readinessTimeout is started again for the same roll, per
/// serving slot, before the roll stops. kcp's start-up sometimes never finishes: a post-start hook
/// (crd-informer-synced, kcp-start-informers) waits forever, and /readyz fails until the process
/// ends; a fresh start gets ready. Seen in 2 of 20 KinePostgres rolls on 2026-11-30
/// (docs/benchmarks.md, "Rolls under load").
pub const NOT_READY_RESTARTS: u32 = 1;

/// The slot names, used in turn: a new slot takes the first name no slot has. spec.slots is at most
/// 3, and a roll runs one more.
pub const SLOT_NAMES: [&str; 4] = ["a", "b", "c", "d"];

pub fn plan(desired: &Desired, observed: &Observed) -> Step {
    match next_step(desired, observed) {
        // The slot's own kine was started and does not accept yet: its kcp starts once it does.
        Step::StartSlot { name } | Step::StartInterim { name } | Step::StartWarmSlot { name }
            if observed.slot_stores_starting.contains(&name) =>
        {
            Step::Wait(Wait::Store)
        }
        step if observed.answer_awaited == Some(step.name()) => Step::Wait(Wait::Answer(Box::new(step))),
        step => step,
    }
}

fn next_step(desired: &Desired, observed: &Observed) -> Step {
    if let Some(name) = observed.unrecorded.first() {
        return Step::AdoptSlot { name: name.clone() };
    }
    // A request's answer is taken up before anything else: the request may have changed what is
    // observed (ReleaseLease's deleted Lease), and its step would then not be planned again.
    if let Some(step) = &observed.answered {
        return step.clone();
    }
    if observed.job.as_ref().is_some_and(|j| !j.running()) {
        return Step::FinishJob;
    }
    if let Some(step) = overdue(observed).or_else(|| killed_and_gone(observed)) {
        return step;
    }
    if desired.deleting {
        return cleanup(desired, observed);
    }
    if let Some(step) = identities_step(desired, observed) {
        return step;
    }
    if observed.sharded_trust_stale {
        return Step::WriteTrust;
    }
    if let Some(step) = adoption(desired, observed) {
        return step;
    }
    if let Some(request) = &desired.restore {
        return take_restore_request(request, observed);
    }
    if observed
        .restore
        .as_ref()
        .is_some_and(|r| r.phase == RestorePhase::Stopping)
    {
        return restoring(desired, observed);
    }
    if observed.store_unresponsive {
        return Step::KillStore;
    }
    if !observed.store_up && !store_gone_with_old_kcp(observed) {
        return towards_store(observed);
    }
    // The front moves (spec.front.listen changed): the old one is asked to stop, which closes its
    // listening socket at once and drains its open connections; the new one starts once it is
    // gone. Meanwhile a slot that dies or hangs is still acted on.
    // A front that starts is waited for the same way, until it answers on its control socket.
    let front_waits = front_waits_for_switch(observed);
    let front_stopping = observed.stopping.iter().any(|s| s.what == Stopping::Front);
    let meanwhile = |wait: Wait| {
        gone_slots(desired, observed)
            .or_else(|| kills(desired, observed))
            .unwrap_or(Step::Wait(wait))
    };
    match observed.front {
        // An adopted kcp listens where the front is to: the front starts at the switch.
        _ if front_waits => {}
        FrontObservation::Down | FrontObservation::Starting | FrontObservation::Unresponsive
            if observed.front_ours && front_stopping =>
        {
            return meanwhile(Wait::Stopping { what: Stopping::Front });
        }
        FrontObservation::Unresponsive => return Step::KillFront,
        FrontObservation::Starting => return meanwhile(Wait::Front),
        FrontObservation::Down if observed.front_ours => return Step::EnsureFront,
        _ if observed.front_elsewhere => return towards_stopped(observed, Stopping::Front, Step::MoveFront),
        _ if observed.front_outdated && observed.front_upgrading => return meanwhile(Wait::FrontUpgrade),
        _ if observed.front_outdated => return Step::UpgradeFront,
        _ => {}
    }
    let wanted = wanted_front(desired, observed);
    if !front_waits && !same_set(&wanted, observed.front.backends()) {
        // A caddy serves the shard's certificate, which the first slot makes: slots may start before
        // it runs; only a change of its upstreams waits for it.
        if observed.front == FrontObservation::Down {
            return Step::EnsureFront;
        }
        return Step::SetFront(front_change(desired, observed, wanted));
    }
    // A move's switch: the moment its old slots have exited, the mirror takes their last changes
    // (their records go after; the front holds new connections meanwhile).
    if let Some(step) = switch_ending(observed) {
        return step;
    }
    if let Some(step) = gone_slots(desired, observed) {
        return step;
    }
    if let Some(step) = kills(desired, observed) {
        return step;
    }
    if let Some(step) = front_checked(observed) {
        return step;
    }
    if let Some(step) = lease_release(observed) {
        return step;
    }
    if let Some(step) = closes(observed) {
        return step;
    }
    if let Some(step) = migration(desired, observed) {
        return step;
    }
    if let Some(step) = retirements(desired, observed, &wanted) {
        return step;
    }
    if observed
        .preflight
        .as_ref()
        .is_some_and(|p| p.leftovers && p.template != desired.template)
    {
        // The spec moved on: what a preflight of an older spec left goes.
        return remove_preflight(observed);
    }
    if let Some(step) = starts(desired, observed) {
        return step;
    }
    if let Some(step) = roll_progress(desired, observed) {
        return step;
    }
    if observed.preflight.as_ref().is_some_and(|p| p.leftovers) {
        // A preflight no roll waits for any more (the old slots went away during it).
        return remove_preflight(observed);
    }
    if let Some(step) = backup(desired, observed) {
        return step;
    }
    if observed.job.as_ref().is_some_and(JobObservation::running) {
        // A job nothing waits for any more (the spec went back to the version that serves).
        return Step::CancelJob;
    }
    match observed.slots.iter().find(|s| s.running && s.stopping()) {
        Some(s) => Step::Wait(Wait::Exit { slot: s.name.clone() }),
        None if observed
            .restore
            .as_ref()
            .is_some_and(|r| r.phase == RestorePhase::Starting) =>
        {
            Step::CompleteRestore
        }
        None => renew_deadline(observed).map_or(Step::Idle, Step::Wait),
    }
}

/// A snapshot asked for (a kcpshard.io/snapshotRequestedAt value none was taken for) or due
/// (spec.backup.interval after the last one, or none yet), once the shard is steady: nothing
/// started, rolled or left above. It runs as a job while every rule above still applies; a roll
/// that begins meanwhile cancels it, and it is taken again once the roll is done.
fn backup(desired: &Desired, observed: &Observed) -> Option<Step> {
    if !observed.store_up {
        return None;
    }
    let asked = desired.snapshot_request.is_some() && desired.snapshot_request != observed.snapshot_request_answered;
    let scheduled = desired.backup_interval.is_some_and(|every| {
        observed
            .last_backup_at
            .is_none_or(|at| elapsed(observed.now, at) >= every)
    });
    if !asked && !scheduled {
        return None;
    }
    match &observed.job {
        Some(job) if job.running() && matches!(job.record.kind, JobKind::Backup { .. }) => {
            Some(Step::Wait(Wait::Job { job: "backup" }))
        }
        _ => {
            let request = desired.snapshot_request.clone().filter(|_| asked);
            let wanted = JobKind::Backup {
                request: request.clone(),
            };
            Some(job::towards(observed, &wanted, Step::Backup { request }))
        }
    }
}

fn leads(observed: &Observed, slot: &str) -> bool {
    observed.lease == LeaseHolder::Slot(slot.to_string())
}

/// A slot whose process is gone: its Lease first (if it led), then a new slot that crashed before
/// it was ready stops the roll; otherwise its own store stops and its records go.
fn gone_slots(desired: &Desired, observed: &Observed) -> Option<Step> {
    let gone = observed.slots.iter().find(|s| !s.running)?;
    if leads(observed, &gone.name)
        && let Some(successor) = successor(observed)
    {
        return Some(Step::ReleaseLease {
            holder: Some(gone.name.clone()),
            to: successor.name.clone(),
        });
    }
    if gone.stop.is_none() && !gone.health.ever_ready && gone.template == desired.template && observed.roll.is_some() {
        return Some(Step::AbortRoll {
            name: gone.name.clone(),
            cause: BlockCause::SlotCrashed {
                slot: gone.name.clone(),
                detail: gone.last_words.clone(),
            },
        });
    }
    if gone.own_store_running {
        return Some(stop_slot_store(observed, &gone.name));
    }
    Some(Step::RemoveSlot {
        name: gone.name.clone(),
        crashed: gone.stop.is_none(),
    })
}

/// kcp's leader election gives up leading once it could not renew the controllers' Lease for this
/// long (`RenewDeadline`, kcp v0.31 pkg/server/server.go:771-773; LeaseDuration 60 s, RetryPeriod
/// 2 s, no flags), but a stopped process renews nothing and gives up nothing: the Lease names it for
/// another 60 s, and no other slot's controllers run meanwhile.
pub const LEADER_RENEW_DEADLINE: Duration = Duration::from_secs(5);

/// SIGKILL for a slot past drainTimeout after SIGTERM, or one that served and has answered nothing
/// and done next to no work for livenessTimeout (not even its store-free ping, and no CPU: wedged,
/// neither waiting for its store nor busy), or, at
/// once, a leader that cannot be leading ([`cannot_lead`]) and has not renewed the controllers'
/// Lease within [`LEADER_RENEW_DEADLINE`] while another slot serves: its Lease goes once it is gone
/// ([`lease_release`]) and the other slot leads within kcp's retry period.
fn kills(desired: &Desired, observed: &Observed) -> Option<Step> {
    let now = observed.now;
    // An adopted kcp is stopped at the switch only: nothing could serve in its place before.
    let adopted = observed
        .adoption
        .as_ref()
        .filter(|a| a.before_switch())
        .and_then(|a| a.slot.as_deref());
    observed.slots.iter().filter(|s| s.running).find_map(|s| {
        let cause = match s.stop {
            Some(stop) if stop.killed => return None,
            Some(stop) if elapsed(now, stop.at) > desired.drain_timeout => KillCause::DrainTimeout {
                seconds: desired.drain_timeout.as_secs(),
            },
            Some(_) => return None,
            None if adopted == Some(s.name.as_str()) => return None,
            None if s.health.ever_ready && s.health.broken() => KillCause::Broken,
            None if s.health.ever_ready && cannot_lead(&s.health, now) && hung_leader(observed, &s.name) => {
                KillCause::HungLeader {
                    seconds: LEADER_RENEW_DEADLINE.as_secs(),
                }
            }
            None if s.health.ever_ready
                && s.health.failures > 0
                && s.health
                    .last_alive_at
                    .is_some_and(|at| elapsed(now, at) > desired.liveness_timeout) =>
            {
                KillCause::Unresponsive {
                    seconds: desired.liveness_timeout.as_secs(),
                }
            }
            None => return None,
        };
        Some(Step::KillSlot {
            name: s.name.clone(),
            cause,
        })
    })
}

/// A slot whose controllers cannot be running: its process is stopped, or it has answered nothing,
/// not even its store-free ping, and done next to no work (CPU, [`crate::controller::health::WORKING_SHARE`]) for
/// [`LEADER_RENEW_DEADLINE`]. A new leader catching up on hundreds of workspaces answers slowly or
/// not at all (at 1,000 workspaces on two cores, beside a kcp starting, no ping within 1 s for
/// over 10 s) and may renew its Lease late: it leads, or takes its Lease again at its next try
/// (kcp re-runs its election, v0.31.2 pkg/server/server.go:758-768), and killing it would start
/// the catch-up over.
fn cannot_lead(health: &Health, now: chrono::DateTime<chrono::Utc>) -> bool {
    health.failures > 0
        && (health.stopped
            || health
                .last_alive_at
                .is_some_and(|at| elapsed(now, at) > LEADER_RENEW_DEADLINE))
}

/// A leader that cannot lead while another slot serves, whose renew deadline is still to come:
/// waited for to the moment ([`kills`] kills it then), not at the idle pace of a look every 2 s.
fn renew_deadline(observed: &Observed) -> Option<Wait> {
    let LeaseHolder::Slot(name) = &observed.lease else {
        return None;
    };
    let leader = observed.slot(name)?;
    let renewed_at = observed.lease_renewed_at?;
    let waits = leader.running
        && leader.stop.is_none()
        && leader.health.ever_ready
        && cannot_lead(&leader.health, observed.now)
        && another_answers(observed, name);
    waits.then(|| Wait::RenewDeadline {
        slot: name.clone(),
        remaining: LEADER_RENEW_DEADLINE.saturating_sub(elapsed(observed.now, renewed_at)),
    })
}

/// `name` holds the controllers' Lease and has not renewed it within [`LEADER_RENEW_DEADLINE`],
/// while another slot serves (the Lease was read through one) to lead in its place.
fn hung_leader(observed: &Observed, name: &str) -> bool {
    observed.lease == LeaseHolder::Slot(name.to_string())
        && observed
            .lease_renewed_at
            .is_some_and(|at| elapsed(observed.now, at) > LEADER_RENEW_DEADLINE)
        && another_answers(observed, name)
}

/// A slot other than `name` answers on the shard's store: it can lead in its place.
fn another_answers(observed: &Observed, name: &str) -> bool {
    observed
        .slots
        .iter()
        .any(|s| s.name != name && answers_on_this_store(s))
}

/// The slot a released Lease is handed to (through itself): one that answers on the shard's store,
/// the front's first.
fn successor(observed: &Observed) -> Option<&SlotObservation> {
    let answering = |name: &String| observed.slot(name).filter(|s| answers_on_this_store(s));
    let first_in_front = observed.front.backends().iter().find_map(answering);
    first_in_front.or_else(|| observed.slots.iter().find(|s| answers_on_this_store(s)))
}

/// A slot that runs, listens and is ready, on the shard's store: one that can read or write the
/// shard's objects (a Lease among them) and lead its controllers.
fn answers_on_this_store(slot: &SlotObservation) -> bool {
    slot.running && slot.listening && slot.health.ready && !slot.on_other_store
}

/// The Lease held by a slot that can no longer renew it (stopped listening), or by a process that
/// is gone.
fn lease_release(observed: &Observed) -> Option<Step> {
    let to = successor(observed)?.name.clone();
    match &observed.lease {
        LeaseHolder::Slot(name) => {
            let holder = observed.slot(name)?;
            (holder.stopping() && !holder.listening).then(|| Step::ReleaseLease {
                holder: Some(name.clone()),
                to,
            })
        }
        LeaseHolder::Gone => Some(Step::ReleaseLease { holder: None, to }),
        _ => None,
    }
}

/// Connections the front still holds to a slot that stopped listening a while ago.
fn closes(observed: &Observed) -> Option<Step> {
    observed
        .slots
        .iter()
        .find(|s| {
            s.running
                && s.stopping()
                && s.stopped_listening_at
                    .is_some_and(|at| elapsed(observed.now, at) >= IN_FLIGHT_GRACE)
                && observed.front.open_to(&s.name) > 0
        })
        .map(|s| Step::CloseConnections { name: s.name.clone() })
}

/// A slot that is no longer wanted: of an older template (or one more than spec.slots), out of the
/// front. Once it has settled it gets SIGTERM; one that served only while another that can serve is
/// in the front.
fn retirements(desired: &Desired, observed: &Observed, wanted: &[String]) -> Option<Step> {
    let serving_stays = observed.front_serves();
    let mut settling = None;
    for s in &observed.slots {
        let spare = s.template == desired.template && s.can_join();
        let unwanted = s.template != desired.template || spare;
        if !s.running || s.stopping() || !unwanted || wanted.contains(&s.name) || observed.front.forwards_to(&s.name) {
            continue;
        }
        // While nothing else serves, one that served stays, and so does an interim slot on its way.
        let interim = desired.interim.as_ref() == Some(&s.template);
        if !serving_stays && (s.health.ever_ready || interim) {
            continue;
        }
        match settled_or_settling(observed, s) {
            terminate @ Step::TerminateSlot { .. } => return Some(terminate),
            settle => {
                settling.get_or_insert(settle);
            }
        }
    }
    settling
}

/// A slot that left the front gets SIGTERM once it has settled: the front closed its kept-alive
/// connections at their next request (up to [`RETIRE_WAIT`] while some are still open to it), or
/// [`SWITCH_SETTLE`] passed. Until then its clients' next requests reach it, and kcp answers
/// `/readyz` 500 from SIGTERM on.
fn settled_or_settling(observed: &Observed, s: &SlotObservation) -> Step {
    let remaining = match s.left_front_at {
        Some(left) if s.health.ever_ready => {
            let waited = elapsed(observed.now, left);
            let retiring = observed.front.retiring_to(&s.name) > 0;
            let until = if retiring { RETIRE_WAIT } else { SWITCH_SETTLE };
            until.saturating_sub(waited)
        }
        _ => Duration::ZERO,
    };
    if remaining.is_zero() {
        Step::TerminateSlot { name: s.name.clone() }
    } else {
        Step::Wait(Wait::Settle {
            slot: s.name.clone(),
            remaining,
        })
    }
}

/// A roll whose old slots can no longer lead (each stopped listening, or gone) and whose Lease has
/// moved: probe that a leader runs kcp's controllers, then complete once the old slots have exited.
fn roll_progress(desired: &Desired, observed: &Observed) -> Option<Step> {
    let roll = observed.roll.as_ref()?;
    let old_may_lead = observed
        .slots
        .iter()
        .any(|s| s.running && s.template != desired.template && s.listening);
    if old_may_lead {
        return None;
    }
    if roll.probe_succeeded_at.is_none() {
        if observed.probe_ready && roll.probe.is_some() {
            return Some(Step::ProbeSucceeded);
        }
        let timed_out = roll
            .probe
            .as_ref()
            .is_none_or(|p| elapsed(observed.now, p.created_at) > PROBE_TIMEOUT);
        return Some(if timed_out {
            Step::Probe
        } else {
            Step::Wait(Wait::Probe)
        });
    }
    if let Some(leaving) = observed.slots.iter().find(|s| s.running && s.stopping()) {
        return Some(Step::Wait(Wait::Exit {
            slot: leaving.name.clone(),
        }));
    }
    Some(Step::CompleteRoll)
}

fn elapsed(now: chrono::DateTime<chrono::Utc>, since: chrono::DateTime<chrono::Utc>) -> Duration {
    (now - since).to_std().unwrap_or_default()
}

/// The store is not up: start it, or wait for the kine that was started to accept.
fn towards_store(observed: &Observed) -> Step {
    match observed.store_starting {
        true => Step::Wait(Wait::Store),
        false => Step::EnsureStore,
    }
}
