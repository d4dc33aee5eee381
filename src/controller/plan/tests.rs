//! The plan as a table of situations: each test names what a user would see happen.
//!
//! Longer than 600 lines on purpose: one plan, one table. Its situations share the helpers below
//! (and `simulation.rs` and the steps' tests use them), and a change to one rule is read against
//! the neighbouring rules' cases.
use super::*;
use chrono::{DateTime, TimeZone, Utc};

pub(crate) fn template(version: &str) -> SlotTemplate {
    SlotTemplate {
        version: version.into(),
        binary: format!("bin/kcp-{version}"),
        extra_args: vec![],
        shutdown_delay: "0s".into(),
        front_url: "https://127.0.0.1:6443".into(),
        restarted_at: None,
        accepted_identities: vec![],
        sharded: None,
    }
}

pub(crate) fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
}

pub(crate) fn at_ms(millis: i64) -> DateTime<Utc> {
    at(0) + chrono::Duration::milliseconds(millis)
}

pub(crate) fn desired(version: &str) -> Desired {
    Desired {
        template: template(version),
        slots: 1,
        binary_present: true,
        readiness_timeout: Duration::from_secs(120),
        liveness_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(30),
        deleting: false,
        version_refused: None,
        store_move: None,
        root_not_ready: None,
        snapshot_before_version_change: false,
        preflight: false,
        allow_schema_change: false,
        restore: None,
        restore_stops_store: false,
        snapshot_request: None,
        backup_interval: None,
        interim: None,
        rotation_request: None,
        adopt: None,
    }
}

/// A running slot that answers `/readyz` (or, with `ready` false, one that is still starting).
pub(crate) fn slot(name: &str, version: &str, ready: bool) -> SlotObservation {
    SlotObservation {
        name: name.into(),
        template: template(version),
        running: true,
        started_at: at(0),
        health: Health {
            ever_ready: ready,
            ready,
            failures: 0,
            broken_looks: 0,
            last_ok_at: ready.then(|| at(9)),
            last_alive_at: ready.then(|| at(9)),
            problem: None,
            silent_in_front: false,
            stopped: false,
        },
        listening: true,
        stopped_listening_at: None,
        stop: None,
        left_front_at: None,
        own_store_running: false,
        on_other_store: false,
        last_words: None,
    }
}

pub(crate) fn observed(backends: &[&str], slots: Vec<SlotObservation>) -> Observed {
    Observed {
        now: at(10),
        store_up: true,
        store_problem: None,
        store_unresponsive: false,
        store_processes_up: true,
        store_starting: false,
        slot_stores_starting: BTreeSet::new(),
        answer_awaited: None,
        answered: None,
        snapshot_for: None,
        last_backup_at: None,
        snapshot_request_answered: None,
        front: FrontObservation::serving(backends),
        front_problem: None,
        front_outdated: false,
        front_upgrading: false,
        front_ours: true,
        front_elsewhere: false,
        slots,
        unrecorded: vec![],
        lease: LeaseHolder::Free,
        lease_renewed_at: None,
        leader_backlog: None,
        probe_ready: false,
        disk: None,
        store_started_at: None,
        roll: None,
        blocked: None,
        preflight: None,
        restore: None,
        data_version: None,
        interim_crashed_for: None,
        store_refused: None,
        orphaned_kines: vec![],
        job: None,
        job_failure: None,
        stopping: vec![],
        killed_and_gone: vec![],
        front_check: None,
        migration: None,
        adoption: None,
        // The shard's admin identity is made and the kubeconfig is current: the identity steps
        // (plan/identities.rs) have nothing to do.
        identities: IdentitiesObservation {
            ids: vec!["id".into()],
            ..Default::default()
        },
        sharded_trust_stale: false,
    }
}

fn roll() -> RollRecord {
    RollRecord {
        from_version: Some("v1".into()),
        to_version: "v2".into(),
        started_at: at(0),
        ..Default::default()
    }
}

pub(crate) fn set_front(backends: &[&str], joined: &[&str], left: &[(&str, LeaveCause)]) -> Step {
    Step::SetFront(FrontChange {
        backends: backends.iter().map(|s| s.to_string()).collect(),
        joined: joined.iter().map(|s| s.to_string()).collect(),
        left: left.iter().map(|(s, c)| (s.to_string(), *c)).collect(),
    })
}

fn stopped(cause: StopCause, seconds: i64) -> Option<StopRecord> {
    Some(StopRecord {
        cause,
        at: at(seconds),
        killed: false,
    })
}

#[test]
fn a_new_shard_gets_its_store_then_its_front_then_slot_a() {
    let mut o = observed(&[], vec![]);
    o.store_up = false;
    o.front = FrontObservation::Down;
    assert_eq!(plan(&desired("v1"), &o), Step::EnsureStore);
    // Its kine was started and does not accept yet: waited for, not started again.
    o.store_starting = true;
    assert_eq!(plan(&desired("v1"), &o), Step::Wait(Wait::Store));
    o.store_starting = false;
    o.store_up = true;
    assert_eq!(plan(&desired("v1"), &o), Step::EnsureFront);
    // Started, not answering on its control socket yet: waited for, not started again.
    o.front = FrontObservation::Starting;
    assert_eq!(plan(&desired("v1"), &o), Step::Wait(Wait::Front));
    o.front = FrontObservation::serving(&[]);
    assert_eq!(plan(&desired("v1"), &o), Step::StartSlot { name: "a".into() });
}

/// While a front starts, slots that die or hang are acted on; one that runs another binary than
/// serve's is upgraded by a step of its own; one that stops while it is asked to is waited for,
/// not killed as unresponsive.
#[test]
fn a_check_of_a_caddy_front_s_change_ends_once_it_passes_or_once_it_has_failed_for_5s() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.now = at(10);
    let due = |outcome: Result<(), String>| FrontCheckObservation {
        check: FrontCheck { since: at(8) },
        outcome,
    };
    o.front_check = Some(due(Ok(())));
    assert_eq!(plan(&d, &o), Step::FinishFrontCheck { failure: None });
    o.front_check = Some(due(Err("/readyz through 127.0.0.1:1 failed".into())));
    assert_eq!(plan(&d, &o), Step::Idle, "caddy's health checks get their time");
    o.now = at(13);
    assert_eq!(
        plan(&d, &o),
        Step::FinishFrontCheck {
            failure: Some("/readyz through 127.0.0.1:1 failed".into())
        }
    );
    // A slot that dies meanwhile leaves the front first.
    o.slots[0].running = false;
    assert!(matches!(plan(&d, &o), Step::SetFront(_)), "{:?}", plan(&d, &o));
}

#[test]
fn a_starting_or_upgrading_front_is_waited_for_while_slots_are_acted_on_and_an_outdated_one_is_upgraded() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.front = FrontObservation::Starting;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Front));
    o.slots[0].running = false;
    let step = plan(&d, &o);
    assert!(matches!(&step, Step::RemoveSlot { crashed: true, .. }), "{step:?}");
    o.slots[0].running = true;
    o.front = FrontObservation::serving(&["a"]);
    o.front_outdated = true;
    assert_eq!(plan(&d, &o), Step::UpgradeFront);
    // Its successor starts: waited for, while a slot that dies is acted on.
    o.front_upgrading = true;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::FrontUpgrade));
    o.slots[0].running = false;
    let step = plan(&d, &o);
    assert!(matches!(&step, Step::RemoveSlot { crashed: true, .. }), "{step:?}");
    o.slots[0].running = true;
    // The successor took over (it runs serve's binary), or failed and was marked: nothing to do.
    o.front_outdated = false;
    assert_eq!(plan(&d, &o), Step::Idle);
    o.front_upgrading = false;
    o.stopping = vec![stop_sent(Stopping::Front, 9, 40)];
    o.front = FrontObservation::Unresponsive;
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Stopping { what: Stopping::Front }),
        "a front asked to stop is given its grace, not killed as unresponsive"
    );
}

#[test]
fn a_slot_whose_own_kine_starts_waits_for_it_and_starts_once_it_accepts() {
    let d = desired("v1");
    // StartSlot started slot a's own kine (KinePostgres), which does not accept yet.
    let mut o = observed(&[], vec![]);
    o.slot_stores_starting.insert("a".into());
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Store));
    o.slot_stores_starting.clear();
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });

    // A roll's new slot b: only b's kine is waited for.
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.slot_stores_starting.insert("b".into());
    assert_eq!(plan(&desired("v2"), &o), Step::Wait(Wait::Store));
    o.slot_stores_starting = BTreeSet::from(["c".to_string()]);
    assert_eq!(plan(&desired("v2"), &o), Step::StartSlot { name: "b".into() });

    // A running slot's own kine was started again: the store is down and starting, so the
    // controller waits instead of starting it once more.
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.store_up = false;
    o.store_starting = true;
    o.slot_stores_starting.insert("a".into());
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Store));
}

#[test]
fn a_step_whose_request_is_unanswered_waits_for_it_while_a_slot_that_dies_is_acted_on() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.roll = Some(RollRecord {
        from_version: None,
        ..roll()
    });
    assert_eq!(plan(&d, &o), Step::Probe);
    // Probe asked kcp for a workspace and returned before the answer: planned again, it waits.
    o.answer_awaited = Some("Probe");
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Answer(Box::new(Step::Probe))));
    // The answer came: Probe takes it up (controller/requests.rs), without asking again.
    o.answer_awaited = None;
    assert_eq!(plan(&d, &o), Step::Probe);
    // An answered request is taken up first, even when its own effect means the plan would not
    // choose its step again (ReleaseLease deleted the Lease; its record is still to be written).
    let mut released = o.clone();
    let release = Step::ReleaseLease {
        holder: None,
        to: "a".into(),
    };
    released.answered = Some(release.clone());
    assert_eq!(plan(&d, &released), release);
    // A request of another step does not hold this one back.
    o.answer_awaited = Some("ReleaseLease");
    assert_eq!(plan(&d, &o), Step::Probe);
    // A slot that dies meanwhile is acted on at once, whatever was asked.
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.roll = Some(roll());
    o.lease = LeaseHolder::Free;
    o.answer_awaited = Some("Probe");
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Answer(Box::new(Step::Probe))));
    o.slots[0].running = false;
    o.slots[0].listening = false;
    assert_eq!(plan(&d, &o), set_front(&["b"], &[], &[("a", LeaveCause::Exited)]));
}

#[test]
fn the_first_slot_is_waited_for_then_joins_the_front_then_the_probe_runs() {
    let d = desired("v1");
    let mut o = observed(&[], vec![slot("a", "v1", false)]);
    o.roll = Some(RollRecord {
        from_version: None,
        ..roll()
    });
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Ready { slot: "a".into() }));
    o.slots[0] = slot("a", "v1", true);
    assert_eq!(plan(&d, &o), set_front(&["a"], &["a"], &[]));
    o.front = FrontObservation::serving(&["a"]);
    assert_eq!(plan(&d, &o), Step::Probe, "a first start has no Lease to release");
}

#[test]
fn a_version_change_with_one_slot_walks_the_whole_roll() {
    let d = desired("v2");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.lease = LeaseHolder::Slot("a".into());
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    o.roll = Some(roll());
    o.slots.push(slot("b", "v2", false));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Ready { slot: "b".into() }));
    o.slots[1] = slot("b", "v2", true);
    assert_eq!(
        plan(&d, &o),
        set_front(&["b"], &["b"], &[("a", LeaveCause::Replaced)]),
        "the new slot joins as the old one leaves: never fewer than one ready slot behind the front"
    );
    o.front = FrontObservation::serving(&["b"]);
    o.slots[0].left_front_at = Some(at(10));
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Settle {
            slot: "a".into(),
            remaining: SWITCH_SETTLE
        })
    );
    o.now = at_ms(10_500);
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
    o.slots[0].stop = stopped(StopCause::Retired, 10);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Exit { slot: "a".into() }),
        "it listens: it may still lead"
    );
    // It stopped listening: the Lease goes, the probe runs while it drains.
    o.slots[0].listening = false;
    o.slots[0].stopped_listening_at = Some(at(11));
    o.now = at_ms(11_200);
    assert_eq!(
        plan(&d, &o),
        Step::ReleaseLease {
            holder: Some("a".into()),
            to: "b".into()
        }
    );
    o.lease = LeaseHolder::Free;
    assert_eq!(plan(&d, &o), Step::Probe);
    o.roll.as_mut().unwrap().probe = Some(ProbeRecord {
        workspace: "probe-1".into(),
        created_at: at(11),
    });
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Probe));
    o.probe_ready = true;
    assert_eq!(plan(&d, &o), Step::ProbeSucceeded);
    o.roll.as_mut().unwrap().probe_succeeded_at = Some(at(12));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Exit { slot: "a".into() }));
    // Connections it still holds are closed once what it admitted had a second to finish.
    o.front = FrontObservation::Up {
        backends: vec!["b".into()],
        open: vec![("a".into(), 3)],
        retiring: vec![],
    };
    o.now = at(13);
    assert_eq!(plan(&d, &o), Step::CloseConnections { name: "a".into() });
    o.front = FrontObservation::serving(&["b"]);
    o.slots[0].running = false;
    assert_eq!(
        plan(&d, &o),
        Step::RemoveSlot {
            name: "a".into(),
            crashed: false
        }
    );
    o.slots.remove(0);
    assert_eq!(plan(&d, &o), Step::CompleteRoll);
    o.roll = None;
    assert_eq!(plan(&d, &o), Step::Idle);
}

#[test]
fn a_slot_that_left_the_front_waits_for_its_kept_alive_connections_to_close_at_most_two_seconds() {
    let d = desired("v2");
    let mut a = slot("a", "v1", true);
    a.left_front_at = Some(at(10));
    let mut o = observed(&["b"], vec![a, slot("b", "v2", true)]);
    o.front = FrontObservation::Up {
        backends: vec!["b".into()],
        open: vec![("a".into(), 1)],
        retiring: vec![("a".into(), 1)],
    };
    o.now = at_ms(10_600);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Settle {
            slot: "a".into(),
            remaining: Duration::from_millis(1_400)
        })
    );
    o.now = at(12);
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
}

#[test]
fn a_roll_of_two_slots_replaces_the_one_that_does_not_lead_first_and_never_runs_more_than_three() {
    let mut d = desired("v2");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.lease = LeaseHolder::Slot("b".into());
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "c".into() });
    o.roll = Some(roll());
    o.slots.push(slot("c", "v2", true));
    assert_eq!(
        plan(&d, &o),
        set_front(&["b", "c"], &["c"], &[("a", LeaveCause::Replaced)]),
        "a, which does not lead, goes first"
    );
    o.front = FrontObservation::serving(&["b", "c"]);
    o.slots[0].left_front_at = Some(at(10));
    o.now = at(11);
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
    o.slots[0].stop = stopped(StopCause::Retired, 11);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Exit { slot: "a".into() }),
        "three run: the next new slot waits for a to go"
    );
    o.slots[0].listening = false;
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Exit { slot: "a".into() }),
        "a did not lead: no Lease to release, and b may still lead"
    );
    o.slots.remove(0);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
    o.slots.push(slot("a", "v2", true));
    assert_eq!(
        plan(&d, &o),
        set_front(&["a", "c"], &["a"], &[("b", LeaveCause::Replaced)])
    );
}

#[test]
fn two_slots_both_serve() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    o.slots.push(slot("b", "v1", true));
    assert_eq!(plan(&d, &o), set_front(&["a", "b"], &["b"], &[]));
}

#[test]
fn a_serving_slot_that_stops_answering_leaves_the_front_after_two_looks_and_rejoins_when_it_answers() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = 1;
    assert_eq!(plan(&d, &o), Step::Idle, "one failed look is not enough");
    o.slots[0].health.failures = 2;
    assert_eq!(plan(&d, &o), set_front(&["b"], &[], &[("a", LeaveCause::Unresponsive)]));
    o.front = FrontObservation::serving(&["b"]);
    assert_eq!(
        plan(&d, &o),
        Step::Idle,
        "connections pinned to it stay; no replacement before livenessTimeout"
    );
    o.slots[0].health = Health {
        ever_ready: true,
        ready: true,
        failures: 0,
        broken_looks: 0,
        last_ok_at: Some(at(10)),
        last_alive_at: Some(at(10)),
        problem: None,
        silent_in_front: false,
        stopped: false,
    };
    assert_eq!(plan(&d, &o), set_front(&["a", "b"], &["a"], &[]));
}

/// A stopped kcp's kernel still accepts: the front replays what it leaves unanswered, and says when.
/// With that word, one failed look is enough; without it, a slow slot keeps its place.
#[test]
fn a_serving_slot_the_front_saw_silent_leaves_after_one_failed_look() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.slots[0].health.silent_in_front = true;
    assert_eq!(plan(&d, &o), Step::Idle, "silent once to the front, but its looks pass");
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = 1;
    assert_eq!(plan(&d, &o), set_front(&["b"], &[], &[("a", LeaveCause::Unresponsive)]));
    o.slots[0].health.silent_in_front = false;
    assert_eq!(plan(&d, &o), Step::Idle, "one failed look alone is not enough");
}

#[test]
fn a_slot_that_does_not_answer_for_the_liveness_timeout_is_killed_even_when_it_is_the_only_one() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.slots[0].health = Health {
        ever_ready: true,
        ready: false,
        failures: 12,
        broken_looks: 0,
        last_ok_at: Some(at(2)),
        last_alive_at: Some(at(2)),
        problem: Some("no answer within 1s".into()),
        silent_in_front: false,
        stopped: false,
    };
    o.now = at(11);
    assert_eq!(
        plan(&d, &o),
        Step::Idle,
        "nothing better than the front forwarding to it for now"
    );
    o.now = at(13);
    assert_eq!(
        plan(&d, &o),
        Step::KillSlot {
            name: "a".into(),
            cause: KillCause::Unresponsive { seconds: 10 }
        }
    );
}

#[test]
fn a_leader_that_dies_leaves_the_front_at_once_its_lease_goes_then_a_replacement_starts() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.lease = LeaseHolder::Slot("a".into());
    o.slots[0].running = false;
    o.slots[0].listening = false;
    assert_eq!(plan(&d, &o), set_front(&["b"], &[], &[("a", LeaveCause::Exited)]));
    o.front = FrontObservation::serving(&["b"]);
    assert_eq!(
        plan(&d, &o),
        Step::ReleaseLease {
            holder: Some("a".into()),
            to: "b".into()
        }
    );
    o.lease = LeaseHolder::Slot("b".into());
    assert_eq!(
        plan(&d, &o),
        Step::RemoveSlot {
            name: "a".into(),
            crashed: true
        }
    );
    o.slots.remove(0);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
}

#[test]
fn a_hung_leader_is_killed_once_it_missed_kcps_renew_deadline_while_another_slot_serves() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    o.lease = LeaseHolder::Slot("a".into());
    o.lease_renewed_at = Some(at(6));
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = 1;
    o.slots[0].health.stopped = true;
    o.now = at_ms(9_500);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::RenewDeadline {
            slot: "a".into(),
            remaining: Duration::from_millis(1_500)
        }),
        "stopped, renewed 3.5 s ago: looked at again at the deadline, not at the idle pace"
    );
    o.now = at(12);
    let killed = Step::KillSlot {
        name: "a".into(),
        cause: KillCause::HungLeader { seconds: 5 },
    };
    assert_eq!(plan(&d, &o), killed, "stopped");

    let mut busy = o.clone();
    busy.slots[0].health.stopped = false;
    busy.slots[0].health.last_alive_at = Some(at(11));
    assert_eq!(
        plan(&d, &busy),
        Step::Idle,
        "a new leader catching up answers slowly or not at all but works (uses CPU), and its renewals look \
         late: it leads, and a kill would start the catch-up over"
    );
    let mut silent = busy.clone();
    silent.slots[0].health.last_alive_at = Some(at(6));
    assert_eq!(
        plan(&d, &silent),
        killed,
        "nothing answered, not even its ping, and next to no CPU used, for the renew deadline: wedged"
    );

    let mut answers = o.clone();
    answers.slots[0].health.ready = true;
    answers.slots[0].health.failures = 0;
    assert_eq!(
        plan(&d, &answers),
        Step::Idle,
        "a leader that answers is slow with its store, not hung: it gives up leading by itself"
    );
    let mut follower_hangs = o.clone();
    follower_hangs.lease = LeaseHolder::Slot("b".into());
    assert_eq!(
        plan(&d, &follower_hangs),
        Step::Idle,
        "only the leader's hang stops the controllers"
    );
    let mut nobody_else = o.clone();
    nobody_else.slots[1].health.ready = false;
    nobody_else.slots[1].health.failures = 1;
    assert!(
        !matches!(plan(&d, &nobody_else), Step::KillSlot { .. }),
        "no other slot serves to lead: left to livenessTimeout"
    );
    let mut renewal_unknown = o.clone();
    renewal_unknown.lease_renewed_at = None;
    assert_eq!(plan(&d, &renewal_unknown), Step::Idle);
}

#[test]
fn a_dead_leader_s_lease_is_handed_to_a_slot_the_front_serves_never_to_one_that_starts() {
    let mut d = desired("v1");
    d.slots = 2;
    // a led and died; c, its replacement, runs and listens but is not ready yet; b serves.
    let mut o = observed(
        &["b"],
        vec![slot("a", "v1", true), slot("c", "v1", false), slot("b", "v1", true)],
    );
    o.slots[0].running = false;
    o.slots[0].listening = false;
    o.slots[1].listening = true;
    o.lease = LeaseHolder::Slot("a".into());
    let handed_to = |d: &Desired, o: &Observed| match plan(d, o) {
        Step::ReleaseLease { to, .. } => to,
        other => panic!("planned {other:?}"),
    };
    assert_eq!(handed_to(&d, &o), "b");
    // Two serve: the front's first, whatever the order of the records.
    d.slots = 3;
    o.slots[1] = slot("c", "v1", true);
    o.front = FrontObservation::serving(&["b", "c"]);
    assert_eq!(handed_to(&d, &o), "b");
}

#[test]
fn a_lease_is_never_deleted_while_its_holder_listens_nor_when_it_may_be_a_slot_not_yet_known() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.lease = LeaseHolder::Slot("a".into());
    assert_eq!(plan(&d, &o), Step::Idle);
    o.lease = LeaseHolder::Unmatched;
    assert_eq!(plan(&d, &o), Step::Idle);
    o.lease = LeaseHolder::Gone;
    assert_eq!(
        plan(&d, &o),
        Step::ReleaseLease {
            holder: None,
            to: "a".into()
        }
    );
}

#[test]
fn a_slot_that_does_not_exit_within_the_drain_timeout_is_killed() {
    let d = desired("v2");
    let mut a = slot("a", "v1", true);
    a.stop = stopped(StopCause::Retired, 0);
    a.listening = false;
    let mut o = observed(&["b"], vec![a, slot("b", "v2", true)]);
    o.now = at(31);
    assert_eq!(
        plan(&d, &o),
        Step::KillSlot {
            name: "a".into(),
            cause: KillCause::DrainTimeout { seconds: 30 }
        }
    );
    o.slots[0].stop.as_mut().unwrap().killed = true;
    assert_ne!(
        plan(&d, &o),
        Step::KillSlot {
            name: "a".into(),
            cause: KillCause::DrainTimeout { seconds: 30 }
        },
        "killed once"
    );
}

#[test]
fn a_version_change_snapshots_the_store_first_and_only_once() {
    let mut d = desired("v2");
    d.snapshot_before_version_change = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::Snapshot);
    o.snapshot_for = Some(template("v2"));
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    o.snapshot_for = Some(template("v3"));
    assert_eq!(
        plan(&d, &o),
        Step::Snapshot,
        "a snapshot for another target does not count"
    );
}

pub(crate) fn job(kind: JobKind, state: JobState) -> Option<JobObservation> {
    Some(JobObservation {
        record: JobRecord {
            kind,
            started_at: at(0),
            output: None,
            cancelled_at: None,
        },
        state,
    })
}

/// A snapshot asked for (kcpshard.io/snapshotRequestedAt) or due (spec.backup.interval) is taken
/// once nothing else is to be done, as a job during which a crash is still acted on first; a store
/// that is down takes none, and a version change goes first.
#[test]
fn a_snapshot_asked_for_or_due_is_taken_once_the_shard_is_steady() {
    let mut d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::Idle);

    d.snapshot_request = Some("t1".into());
    assert_eq!(
        plan(&d, &o),
        Step::Backup {
            request: Some("t1".into())
        },
        "asked for"
    );
    let asked = JobKind::Backup {
        request: Some("t1".into()),
    };
    o.job = job(asked.clone(), JobState::Running);
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "backup" }));
    o.slots[0].running = false;
    assert_eq!(
        plan(&d, &o),
        set_front(&[], &[], &[("a", LeaveCause::Exited)]),
        "a crash during the snapshot is acted on at once"
    );
    o.slots[0].running = true;
    o.job = job(asked, JobState::Succeeded);
    assert_eq!(plan(&d, &o), Step::FinishJob);
    o.job = None;
    o.last_backup_at = Some(at(5));
    o.snapshot_request_answered = Some("t1".into());
    assert_eq!(plan(&d, &o), Step::Idle, "taken for that request");

    d.backup_interval = Some(Duration::from_secs(60));
    assert_eq!(plan(&d, &o), Step::Idle, "the last one is 5 s old");
    o.now = at(65);
    assert_eq!(
        plan(&d, &o),
        Step::Backup { request: None },
        "due a minute after the last one, the request answered before"
    );
    o.now = at(70);
    o.last_backup_at = Some(at(66));
    assert_eq!(
        plan(&d, &o),
        Step::Idle,
        "a scheduled snapshot leaves the request answered"
    );
    o.now = at(130);
    o.job = job(dump_for("v0"), JobState::Running);
    assert_eq!(plan(&d, &o), Step::CancelJob, "one job at a time");
    o.job = job(JobKind::Backup { request: None }, JobState::Running);
    d.snapshot_request = Some("t2".into());
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Job { job: "backup" }),
        "a request during a scheduled snapshot waits for it"
    );
    o.job = None;

    o.store_up = false;
    assert!(
        !matches!(plan(&d, &o), Step::Backup { .. }),
        "nothing to copy from a store that is down"
    );
    o.store_up = true;
    let mut v2 = d.clone();
    v2.template = template("v2");
    assert_eq!(
        plan(&v2, &o),
        Step::StartSlot { name: "b".into() },
        "a version change goes first"
    );
}

fn dump_for(version: &str) -> JobKind {
    JobKind::Snapshot {
        template: Box::new(template(version)),
    }
}

#[test]
fn a_dump_is_a_job_the_roll_waits_for_while_everything_else_goes_on() {
    let mut d = desired("v2");
    d.snapshot_before_version_change = true;
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    d.slots = 2;
    assert_eq!(plan(&d, &o), Step::Snapshot, "started as a job");
    o.job = job(dump_for("v2"), JobState::Running);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Job { job: "snapshot" }),
        "the roll waits for it"
    );
    // A serving slot crashes during a long dump: acted on now, not after the dump.
    o.slots[1].running = false;
    assert_eq!(
        plan(&d, &o),
        set_front(&["a"], &[], &[("b", LeaveCause::Exited)]),
        "the crashed slot leaves the front at once"
    );
    o.front = FrontObservation::serving(&["a"]);
    assert_eq!(
        plan(&d, &o),
        Step::RemoveSlot {
            name: "b".into(),
            crashed: true
        }
    );
    o.slots.pop();
    o.job = job(dump_for("v2"), JobState::Succeeded);
    assert_eq!(
        plan(&d, &o),
        Step::FinishJob,
        "its end is taken up before anything else"
    );
    o.job = None;
    o.snapshot_for = Some(template("v2"));
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
}

#[test]
fn a_job_that_failed_or_was_lost_is_finished_then_started_again() {
    let mut d = desired("v2");
    d.snapshot_before_version_change = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    for ended in [
        JobState::Failed {
            message: "pg_dump (exit status: 1)".into(),
        },
        JobState::Lost,
    ] {
        o.job = job(dump_for("v2"), ended);
        assert_eq!(plan(&d, &o), Step::FinishJob);
    }
    o.job = None;
    assert_eq!(plan(&d, &o), Step::Snapshot);
}

#[test]
fn a_job_that_keeps_failing_is_tried_again_after_10s_then_less_often_and_another_job_is_not_held_back() {
    let mut d = desired("v2");
    d.snapshot_before_version_change = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    let failed = |times, seconds| JobFailure {
        kind: dump_for("v2"),
        at: at(seconds),
        message: "snapshot (exit status: 1): pg_dump: error: connection refused".into(),
        times,
    };
    o.job_failure = Some(failed(1, 100));
    o.now = at(105);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::JobRetry {
            job: "snapshot",
            at: at(110)
        }),
        "not started again as fast as it fails"
    );
    let status = crate::controller::conditions::verdicts(&d, &o, &plan(&d, &o), None);
    let degraded = status.iter().find(|v| v.type_ == "Degraded").unwrap();
    assert_eq!((degraded.status, degraded.reason.as_str()), (true, "JobFailed"));
    assert!(
        degraded.message.contains("connection refused; it runs again at"),
        "{}",
        degraded.message
    );
    o.now = at(110);
    assert_eq!(plan(&d, &o), Step::Snapshot, "tried again 10 s after it failed");

    o.job_failure = Some(failed(3, 100));
    o.now = at(139);
    assert!(
        matches!(plan(&d, &o), Step::Wait(Wait::JobRetry { .. })),
        "40 s after a third failure"
    );
    o.now = at(140);
    assert_eq!(plan(&d, &o), Step::Snapshot);
    o.job_failure = Some(failed(20, 100));
    o.now = at(399);
    assert!(
        matches!(plan(&d, &o), Step::Wait(Wait::JobRetry { .. })),
        "at most 5 minutes apart"
    );
    o.now = at(400);
    assert_eq!(plan(&d, &o), Step::Snapshot);

    // Another version asked for: its snapshot is another job, which starts at once.
    let d3 = {
        let mut d3 = desired("v3");
        d3.snapshot_before_version_change = true;
        d3
    };
    o.now = at(101);
    assert_eq!(plan(&d3, &o), Step::Snapshot);
    // A backup asked for meanwhile is another job too.
    let mut idle = desired("v1");
    idle.snapshot_request = Some("t1".into());
    assert_eq!(
        plan(&idle, &o),
        Step::Backup {
            request: Some("t1".into())
        }
    );
}

#[test]
fn a_job_nothing_wants_is_cancelled_and_one_at_a_time_runs() {
    let mut d = desired("v3");
    d.snapshot_before_version_change = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.job = job(dump_for("v2"), JobState::Running);
    assert_eq!(
        plan(&d, &o),
        Step::CancelJob,
        "a dump for a version no longer asked for"
    );
    o.job.as_mut().unwrap().record.cancelled_at = Some(at(1));
    assert_eq!(plan(&d, &o), Step::CancelJob, "killed again until it is gone");
    o.job.as_mut().unwrap().state = JobState::Failed {
        message: "killed".into(),
    };
    assert_eq!(plan(&d, &o), Step::FinishJob);
    // Back to the version that serves: a running dump goes.
    let d = desired("v1");
    o.job = job(dump_for("v2"), JobState::Running);
    assert_eq!(plan(&d, &o), Step::CancelJob);
    // Deleting: the job goes first.
    let mut d = desired("v1");
    d.deleting = true;
    assert_eq!(plan(&d, &o), Step::CancelJob);
}

#[test]
fn restarts_and_first_starts_do_not_snapshot() {
    let mut d = desired("v1");
    d.snapshot_before_version_change = true;
    d.template.restarted_at = Some("now".into());
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    assert_eq!(plan(&d, &observed(&[], vec![])), Step::StartSlot { name: "a".into() });
}

#[test]
fn a_caddy_front_that_is_down_lets_the_first_slot_start_and_holds_the_switch() {
    let d = desired("v1");
    let mut o = observed(&[], vec![]);
    o.front = FrontObservation::Down;
    o.front_ours = false;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
    o.slots = vec![slot("a", "v1", true)];
    assert_eq!(plan(&d, &o), Step::EnsureFront);
}

#[test]
fn a_front_or_a_kine_that_does_not_answer_is_killed_and_started_again() {
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.front = FrontObservation::Unresponsive;
    assert_eq!(plan(&desired("v1"), &o), Step::KillFront);
    o.front = FrontObservation::Down;
    assert_eq!(plan(&desired("v1"), &o), Step::EnsureFront);
    o.store_unresponsive = true;
    o.store_up = false;
    assert_eq!(plan(&desired("v1"), &o), Step::KillStore);
    o.store_unresponsive = false;
    assert_eq!(plan(&desired("v1"), &o), Step::EnsureStore);
}

#[test]
fn a_slot_running_without_a_record_is_adopted_before_anything_else() {
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.unrecorded = vec!["b".into()];
    o.store_up = false;
    assert_eq!(plan(&desired("v1"), &o), Step::AdoptSlot { name: "b".into() });
}

#[test]
fn a_missing_binary_or_a_refused_version_change_blocks_and_leaves_the_old_slot_alone() {
    let mut d = desired("v9");
    d.binary_present = false;
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert!(matches!(
        plan(&d, &o),
        Step::Blocked {
            cause: BlockCause::NoBinary { .. }
        }
    ));
    let mut d = desired("v0");
    d.version_refused = Some("v0 is older".into());
    assert!(matches!(
        plan(&d, &o),
        Step::Blocked {
            cause: BlockCause::VersionRefused { .. }
        }
    ));
}

#[test]
fn a_shard_whose_root_is_not_ready_starts_no_slot_and_says_why() {
    let mut d = desired("v1");
    d.root_not_ready = Some("the root shard, KcpShard root, is not Ready yet".into());
    let o = observed(&[], vec![]);
    match plan(&d, &o) {
        Step::Blocked {
            cause: cause @ BlockCause::RootShardNotReady { .. },
        } => {
            assert_eq!(cause.reason(), "RootShardNotReady");
            assert!(cause.message().contains("not Ready yet"), "{}", cause.message());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_first_slot_refused_by_the_data_s_version_is_never_started() {
    // A re-created shard over data a newer kcp served: the store and front come up, no kcp.
    let mut d = desired("v1");
    d.version_refused = Some("no slot runs, and kcp v2 last served this shard's data".into());
    let o = observed(&[], vec![]);
    assert!(matches!(
        plan(&d, &o),
        Step::Blocked {
            cause: BlockCause::VersionRefused { .. }
        }
    ));
    d.version_refused = None;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
}

#[test]
fn a_new_slot_that_is_not_ready_in_time_is_started_once_more_then_the_roll_stops() {
    let mut d = desired("v2");
    d.readiness_timeout = Duration::from_secs(5);
    let mut o = observed(&["a"], vec![slot("a", "v1", true), slot("b", "v2", false)]);
    o.roll = Some(roll());
    assert_eq!(
        plan(&d, &o),
        Step::RestartSlot {
            name: "b".into(),
            cause: RestartCause::NotReady { timeout_seconds: 5 }
        }
    );
    o.roll.as_mut().unwrap().not_ready_restarts = NOT_READY_RESTARTS;
    assert!(matches!(
        plan(&d, &o),
        Step::AbortRoll { ref name, cause: BlockCause::SlotNotReady { .. } } if name == "b"
    ));
}

#[test]
fn a_new_slot_whose_start_overlapped_a_store_outage_is_started_again_once_the_store_is_back() {
    let d = desired("v2");
    let mut o = observed(&["a"], vec![slot("a", "v1", true), slot("b", "v2", false)]);
    o.roll = Some(RollRecord {
        store_down_at: Some(at(3)),
        ..roll()
    });
    o.store_up = false;
    assert_eq!(plan(&d, &o), Step::EnsureStore, "the store first");
    o.store_up = true;
    assert_eq!(
        plan(&d, &o),
        Step::RestartSlot {
            name: "b".into(),
            cause: RestartCause::StoreOutage
        }
    );
    o.slots[1].started_at = at(5);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Ready { slot: "b".into() }),
        "started after the outage"
    );
}

#[test]
fn a_slot_not_ready_in_time_is_retried_once_the_readiness_timeout_is_raised() {
    let mut d = desired("v2");
    d.readiness_timeout = Duration::from_secs(5);
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.blocked = Some(Blocked {
        template: template("v2"),
        cause: BlockCause::SlotNotReady {
            slot: "b".into(),
            timeout_seconds: 5,
        },
    });
    assert!(matches!(plan(&d, &o), Step::Blocked { .. }));
    d.readiness_timeout = Duration::from_secs(300);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    o.blocked.as_mut().unwrap().cause = BlockCause::SlotCrashed {
        slot: "b".into(),
        detail: None,
    };
    assert!(
        matches!(plan(&d, &o), Step::Blocked { .. }),
        "only a new spec retries a crash"
    );
}

#[test]
fn a_new_slot_that_crashes_stops_the_roll_and_is_not_retried_until_the_spec_changes() {
    let d = desired("v2");
    let mut b = slot("b", "v2", false);
    b.running = false;
    let mut o = observed(&["a"], vec![slot("a", "v1", true), b]);
    o.roll = Some(roll());
    assert!(matches!(
        plan(&d, &o),
        Step::AbortRoll {
            cause: BlockCause::SlotCrashed { .. },
            ..
        }
    ));
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.blocked = Some(Blocked {
        template: template("v2"),
        cause: BlockCause::SlotCrashed {
            slot: "b".into(),
            detail: None,
        },
    });
    assert!(matches!(plan(&d, &o), Step::Blocked { .. }));
    assert_eq!(plan(&desired("v3"), &o), Step::StartSlot { name: "b".into() });
}

#[test]
fn a_spec_change_mid_roll_stops_the_slot_that_never_served_at_once() {
    let d = desired("v3");
    let o = observed(&["a"], vec![slot("a", "v1", true), slot("b", "v2", false)]);
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "b".into() });
}

#[test]
fn fewer_slots_in_the_spec_retire_the_spares() {
    let d = desired("v1");
    let mut o = observed(&["a", "b"], vec![slot("a", "v1", true), slot("b", "v1", true)]);
    assert_eq!(plan(&d, &o), set_front(&["a"], &[], &[("b", LeaveCause::Replaced)]));
    o.front = FrontObservation::serving(&["a"]);
    o.slots[1].left_front_at = Some(at(9));
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "b".into() });
}

#[test]
fn a_front_that_lost_its_set_gets_back_what_can_serve() {
    let d = desired("v2");
    let o = observed(&[], vec![slot("a", "v1", true), slot("b", "v2", false)]);
    assert_eq!(plan(&d, &o), set_front(&["a"], &["a"], &[]));
}

#[test]
fn after_a_serve_restart_a_slot_in_the_front_is_not_taken_for_one_that_never_got_ready() {
    let d = desired("v1");
    let mut a = slot("a", "v1", false);
    a.started_at = at(-3600);
    let o = observed(&["a"], vec![a]);
    assert_eq!(plan(&d, &o), Step::Idle);
}

/// A stop of `what` sent at `sent` (seconds, see [`at`]) to a process that still runs, which is
/// killed `grace` seconds later.
fn stop_sent(what: Stopping, sent: i64, grace: i64) -> ProcessStop {
    ProcessStop {
        what,
        pid: 42,
        start_time: 7,
        sent_at: at(sent),
        kill_at: at(sent + grace),
        killed: false,
        unit: None,
    }
}

#[test]
fn deletion_stops_the_slots_their_stores_the_store_and_the_front_and_nothing_waits() {
    let mut d = desired("v1");
    d.deleting = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    stop_slot_a(&d, &mut o, StopCause::Deleting);
    assert_eq!(plan(&d, &o), Step::StopStore);
    // Asked to stop: waited for, while it still serves and once it no longer does.
    o.stopping = vec![stop_sent(Stopping::Store, 9, 10)];
    let waiting = Step::Wait(Wait::Stopping { what: Stopping::Store });
    assert_eq!(plan(&d, &o), waiting);
    o.store_processes_up = false;
    assert_eq!(
        plan(&d, &o),
        Step::StopFront,
        "a store that no longer serves exits beside the front"
    );
    o.stopping.clear();
    assert_eq!(plan(&d, &o), Step::StopFront);
    o.stopping = vec![stop_sent(Stopping::Front, 9, 40)];
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Stopping { what: Stopping::Front }));
    o.front = FrontObservation::Down;
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Stopping { what: Stopping::Front }),
        "not done while the front's process drains"
    );
    o.stopping.clear();
    assert_eq!(plan(&d, &o), Step::Idle);
}

#[test]
fn a_process_asked_to_stop_is_killed_once_its_grace_is_over_and_then_waited_for() {
    let mut d = desired("v1");
    d.deleting = true;
    let mut o = observed(&[], vec![]);
    o.stopping = vec![stop_sent(Stopping::Store, 5, 10)];
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Stopping { what: Stopping::Store }));
    o.now = at(15);
    assert_eq!(plan(&d, &o), Step::KillStopping { what: Stopping::Store });
    o.stopping[0].killed = true;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Stopping { what: Stopping::Store }));
    // Not deleting: a slot's own kine that outlives its grace is killed as well.
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    let kine = Stopping::SlotStore { slot: "b".into() };
    o.stopping = vec![stop_sent(kine.clone(), 5, 10)];
    assert_eq!(plan(&d, &o), Step::Idle);
    o.now = at(16);
    assert_eq!(plan(&d, &o), Step::KillStopping { what: kine });
}

#[test]
fn a_killed_process_that_exited_is_forgotten_before_anything_else_but_a_kill() {
    let killed = ProcessStop {
        killed: true,
        unit: Some("kcpshard-dev-kine.service".into()),
        ..stop_sent(Stopping::Store, 5, 10)
    };
    for deleting in [false, true] {
        let mut d = desired("v1");
        d.deleting = deleting;
        let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
        o.killed_and_gone = vec![killed.clone()];
        assert_eq!(plan(&d, &o), Step::ForgetKilled, "deleting: {deleting}");
        // Another process past its grace is killed first.
        o.now = at(30);
        o.stopping = vec![stop_sent(Stopping::Front, 5, 10)];
        assert_eq!(plan(&d, &o), Step::KillStopping { what: Stopping::Front });
        o.stopping[0].killed = true;
        assert_eq!(plan(&d, &o), Step::ForgetKilled, "deleting: {deleting}");
        o.killed_and_gone.clear();
        assert_ne!(plan(&d, &o), Step::ForgetKilled);
    }
}

#[test]
fn deletion_stops_every_kine_of_the_shard_that_still_runs_before_the_front() {
    let mut d = desired("v1");
    d.deleting = true;
    let mut o = observed(&["a"], vec![]);
    o.store_processes_up = false;
    o.orphaned_kines = vec![
        "/s/shards/dev/store/kine.json".into(),
        "/s/shards/dev/slots/b/store/kine.json".into(),
    ];
    assert_eq!(
        plan(&d, &o),
        Step::StopOrphanedKine {
            record: "/s/shards/dev/store/kine.json".into()
        }
    );
    o.orphaned_kines.remove(0);
    assert_eq!(
        plan(&d, &o),
        Step::StopOrphanedKine {
            record: "/s/shards/dev/slots/b/store/kine.json".into()
        }
    );
    o.orphaned_kines.clear();
    assert_eq!(plan(&d, &o), Step::StopFront);
    // Not deleting: a kine that may still serve a slot (an older kcpshard's) is left alone.
    d.deleting = false;
    o.orphaned_kines = vec!["/s/shards/dev/store/kine.json".into()];
    o.front = FrontObservation::serving(&["a"]);
    o.slots = vec![slot("a", "v1", true)];
    assert_eq!(plan(&d, &o), Step::Idle);
}

#[test]
fn a_slot_that_answers_but_is_not_ready_because_its_store_is_away_is_not_killed() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.slots[0].health = Health {
        ever_ready: true,
        ready: false,
        failures: 30,
        broken_looks: 0,
        last_ok_at: Some(at(-60)),
        last_alive_at: Some(at(10)),
        problem: Some("GET /readyz: HTTP 500: [-]etcd failed".into()),
        silent_in_front: false,
        stopped: false,
    };
    o.now = at(11);
    assert_eq!(plan(&d, &o), Step::Idle, "it answers: it waits for its store");
}

fn preflight_of(version: &str, run: PreflightRun) -> PreflightObservation {
    let processes_running = matches!(run, PreflightRun::Running { .. });
    PreflightObservation {
        template: template(version),
        started_at: at(0),
        launched_at: matches!(run, PreflightRun::Running { .. } | PreflightRun::Exited { .. }).then(|| at(0)),
        run,
        result: None,
        detail: vec![],
        leftovers: true,
        processes_running,
    }
}

fn running(ready: bool, lease_released: Option<i64>, controllers_lead: bool) -> PreflightRun {
    PreflightRun::Running {
        ready,
        lease_released_at: lease_released.map(at),
        controllers_lead,
    }
}

fn finished(version: &str, result: PreflightResult, leftovers: bool) -> PreflightObservation {
    PreflightObservation {
        result: Some(result),
        detail: vec!["CRD x: storedVersions [v1] -> [v1 v2]".into()],
        leftovers,
        ..preflight_of(
            version,
            PreflightRun::Exited {
                last_words: "killed".into(),
            },
        )
    }
}

#[test]
fn a_version_change_runs_the_preflight_after_the_snapshot_and_before_the_new_slot() {
    let mut d = desired("v2");
    d.snapshot_before_version_change = true;
    d.preflight = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::Snapshot, "the snapshot comes first");
    o.snapshot_for = Some(template("v2"));
    assert_eq!(plan(&d, &o), Step::StartPreflight);
    o.preflight = Some(preflight_of("v2", PreflightRun::Copying));
    assert_eq!(plan(&d, &o), Step::CopyPreflight, "the data is copied by a job");
    let copy = JobKind::PreflightCopy {
        template: Box::new(template("v2")),
    };
    o.job = job(copy, JobState::Running);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Job { job: "preflight-copy" }),
        "the copy is waited for"
    );
    o.job = None;
    o.preflight = Some(preflight_of("v2", PreflightRun::Copied));
    assert_eq!(plan(&d, &o), Step::LaunchPreflight, "its kine starts on the copy");
    o.preflight = Some(preflight_of("v2", PreflightRun::StoreStarting));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight), "the copy's kine is starting");
    o.preflight = Some(preflight_of("v2", PreflightRun::Copied));
    assert_eq!(
        plan(&d, &o),
        Step::LaunchPreflight,
        "its kine accepts: its kcp starts on the copy"
    );
    o.preflight = Some(preflight_of("v2", running(false, None, false)));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight), "its kcp is starting");
    o.preflight = Some(preflight_of("v2", running(true, None, false)));
    assert_eq!(plan(&d, &o), Step::ReleasePreflightLease);
    o.preflight = Some(preflight_of("v2", running(true, Some(9), false)));
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Preflight),
        "its controllers take the Lease"
    );
    o.preflight = Some(preflight_of("v2", running(true, Some(9), true)));
    assert_eq!(plan(&d, &o), Step::ComparePreflight);
    o.preflight = Some(finished("v2", PreflightResult::Compatible, true));
    assert_eq!(plan(&d, &o), Step::RemovePreflight, "removed before the roll goes on");
    o.preflight = Some(finished("v2", PreflightResult::Compatible, false));
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
}

#[test]
fn a_preflight_whose_kcp_exits_or_misses_its_timeouts_fails_and_blocks_the_roll() {
    let mut d = desired("v2");
    d.preflight = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.preflight = Some(preflight_of(
        "v2",
        PreflightRun::Exited {
            last_words: "exit status: 1; it printed \"Error: unknown flag\"".into(),
        },
    ));
    assert_eq!(
        plan(&d, &o),
        Step::FailPreflight {
            cause: PreflightFailure::Exited {
                last_words: "exit status: 1; it printed \"Error: unknown flag\"".into()
            }
        }
    );
    o.now = at(121);
    o.preflight = Some(preflight_of("v2", running(false, None, false)));
    assert_eq!(
        plan(&d, &o),
        Step::FailPreflight {
            cause: PreflightFailure::NotReady { timeout_seconds: 120 }
        }
    );
    o.preflight.as_mut().unwrap().launched_at = Some(at(30));
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Preflight),
        "readinessTimeout counts from its kcp's start, not the copy's"
    );
    o.preflight.as_mut().unwrap().launched_at = Some(at(0));
    o.preflight = Some(preflight_of("v2", running(true, Some(60), false)));
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Preflight),
        "its controllers get readinessTimeout to take the Lease"
    );
    o.preflight = Some(preflight_of("v2", running(true, Some(0), false)));
    assert_eq!(
        plan(&d, &o),
        Step::FailPreflight {
            cause: PreflightFailure::ControllersNotLeading { timeout_seconds: 120 }
        }
    );
    o.preflight = Some(finished("v2", PreflightResult::Failed, true));
    assert_eq!(plan(&d, &o), Step::RemovePreflight);
    o.preflight = Some(finished("v2", PreflightResult::Failed, false));
    let Step::Blocked { cause } = plan(&d, &o) else {
        panic!("a failed preflight blocks the roll: {:?}", plan(&d, &o));
    };
    assert_eq!(cause.reason(), "PreflightFailed");
    assert!(
        cause.message().contains("old slots keep serving"),
        "{}",
        cause.message()
    );
    assert!(!cause.lifted_by(&d), "not rerun in a loop: only a spec change retries");
    d.template = template("v3");
    assert_eq!(plan(&d, &o), Step::StartPreflight, "a new spec gets a new preflight");
}

#[test]
fn a_schema_change_rolls_only_with_allow_minor_version_change() {
    let mut d = desired("v2");
    d.preflight = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.preflight = Some(finished("v2", PreflightResult::SchemaChanged, false));
    let Step::Blocked { cause } = plan(&d, &o) else {
        panic!("{:?}", plan(&d, &o));
    };
    assert_eq!(cause.reason(), "PreflightSchemaChanged");
    assert!(
        cause.message().contains("allowMinorVersionChange") && cause.message().contains("storedVersions"),
        "{}",
        cause.message()
    );
    d.allow_schema_change = true;
    assert!(cause.lifted_by(&d));
    assert_eq!(
        plan(&d, &o),
        Step::StartSlot { name: "b".into() },
        "no second preflight"
    );
    o.preflight = Some(finished("v2", PreflightResult::Skipped, false));
    d.allow_schema_change = false;
    assert_eq!(
        plan(&d, &o),
        Step::StartSlot { name: "b".into() },
        "a store not copied is not checked"
    );
}

#[test]
fn a_preflight_left_by_a_crash_or_an_older_spec_is_removed() {
    let mut d = desired("v2");
    d.preflight = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.preflight = Some(preflight_of("v2", PreflightRun::Copying));
    assert_eq!(
        plan(&d, &o),
        Step::CopyPreflight,
        "recorded, its copy lost or never started: the copy starts again"
    );
    o.preflight = Some(preflight_of("v2", PreflightRun::Copied));
    assert_eq!(
        plan(&d, &o),
        Step::LaunchPreflight,
        "copied, its kcp never started: it starts"
    );
    o.preflight = Some(preflight_of("v3", PreflightRun::Copying));
    let copy = JobKind::PreflightCopy {
        template: Box::new(template("v3")),
    };
    o.job = job(copy, JobState::Running);
    assert_eq!(
        plan(&d, &o),
        Step::CancelJob,
        "the spec moved on: the copy's job stops before the copy is removed"
    );
    o.job = None;
    assert_eq!(plan(&d, &o), Step::RemovePreflight, "the spec moved on");
    o.preflight = Some(preflight_of("v3", running(true, None, false)));
    assert_eq!(
        plan(&d, &o),
        Step::StopPreflight,
        "the spec moved on: its kcp stops first"
    );
    d.template = template("v1");
    assert_eq!(plan(&d, &o), Step::StopPreflight, "the spec went back");
    o.preflight.as_mut().unwrap().processes_running = false;
    assert_eq!(plan(&d, &o), Step::RemovePreflight, "its kcp is gone: the copy goes");
    o.preflight.as_mut().unwrap().leftovers = false;
    assert_eq!(plan(&d, &o), Step::Idle);
    d.deleting = true;
    o.slots.clear();
    o.front = FrontObservation::Down;
    o.preflight.as_mut().unwrap().leftovers = true;
    assert_eq!(plan(&d, &o), Step::RemovePreflight, "deleting the shard removes it too");
}

/// Its kcp and kine are asked to stop and returned from; the copy goes only once both are gone,
/// and SIGKILL follows at once (they serve nobody), on a roll and on a deletion alike.
#[test]
fn a_preflight_s_copy_goes_only_once_its_kcp_and_kine_have_exited() {
    let mut d = desired("v2");
    d.preflight = true;
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.now = at(30);
    o.preflight = Some(PreflightObservation {
        processes_running: true,
        ..finished("v2", PreflightResult::Compatible, true)
    });
    assert_eq!(plan(&d, &o), Step::StopPreflight);
    o.stopping = vec![stop_sent(Stopping::Preflight, 30, 0)];
    o.now = at(31);
    assert_eq!(
        plan(&d, &o),
        Step::KillStopping {
            what: Stopping::Preflight
        },
        "no grace: they serve nobody"
    );
    o.stopping[0].killed = true;
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Stopping {
            what: Stopping::Preflight
        }),
        "SIGKILLed, not gone yet: the copy stays"
    );
    o.stopping.clear();
    o.preflight.as_mut().unwrap().processes_running = false;
    assert_eq!(plan(&d, &o), Step::RemovePreflight);

    d.deleting = true;
    o.slots.clear();
    o.front = FrontObservation::Down;
    o.preflight.as_mut().unwrap().processes_running = true;
    assert_eq!(plan(&d, &o), Step::StopPreflight, "a deletion stops them too");
}

#[test]
fn no_preflight_without_a_version_change_or_with_it_off() {
    let mut d = desired("v1");
    d.preflight = true;
    d.template.restarted_at = Some("now".into());
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() }, "a restart");
    assert_eq!(
        plan(&d, &observed(&[], vec![])),
        Step::StartSlot { name: "a".into() },
        "a first start"
    );
    let mut d = desired("v2");
    d.preflight = false;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() }, "turned off");
}

#[test]
fn a_first_slot_on_data_another_version_served_waits_for_the_preflight_while_an_interim_slot_serves() {
    // A re-created KcpShard at v2 over data v1 served last: nothing runs.
    let mut d = desired("v2");
    d.preflight = true;
    d.interim = Some(template("v1"));
    let mut o = observed(&[], vec![]);
    o.data_version = Some("v1".into());
    assert_eq!(
        plan(&d, &o),
        Step::StartInterim { name: "a".into() },
        "v1 serves meanwhile"
    );
    o.slots = vec![slot("a", "v1", false)];
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Ready { slot: "a".into() }),
        "one interim slot, not two, not retired; the preflight reads kcp's schemas from it once it answers"
    );
    o.slots = vec![slot("a", "v1", true)];
    assert_eq!(plan(&d, &o), set_front(&["a"], &["a"], &[]), "the interim slot joins");
    o.front = FrontObservation::serving(&["a"]);
    assert_eq!(plan(&d, &o), Step::StartPreflight);
    o.preflight = Some(preflight_of("v2", running(false, None, false)));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight));
    o.preflight = Some(finished("v2", PreflightResult::Compatible, false));
    assert_eq!(
        plan(&d, &o),
        Step::StartSlot { name: "b".into() },
        "the roll replaces it once the preflight passed"
    );

    // One that does not answer within readinessTimeout holds the preflight no longer.
    let mut o = observed(&[], vec![slot("a", "v1", false)]);
    o.data_version = Some("v1".into());
    o.now = at(121);
    assert_eq!(plan(&d, &o), Step::StartPreflight);

    // Without a recorded template (an older record) or its binary, no interim slot: the
    // preflight still comes first.
    d.interim = None;
    let mut o = observed(&[], vec![]);
    o.data_version = Some("v1".into());
    assert_eq!(plan(&d, &o), Step::StartPreflight);
    o.preflight = Some(preflight_of("v2", running(true, Some(9), false)));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight), "no v2 slot before it passed");
    // The data's own version starts with no preflight.
    o.data_version = Some("v2".into());
    o.preflight = None;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
}

#[test]
fn the_old_slot_gone_mid_preflight_is_replaced_by_an_interim_slot_and_a_failed_preflight_keeps_it() {
    let mut d = desired("v2");
    d.preflight = true;
    d.interim = Some(template("v1"));
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.data_version = Some("v1".into());
    o.preflight = Some(preflight_of("v2", running(true, Some(9), false)));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight), "v1 serves: no interim slot");
    // Slot a was killed: once it left the front and its records went, v1 starts again, not v2.
    o.slots.clear();
    o.front = FrontObservation::serving(&[]);
    assert_eq!(plan(&d, &o), Step::StartInterim { name: "a".into() });
    o.slots = vec![slot("a", "v1", true)];
    o.front = FrontObservation::serving(&["a"]);
    o.preflight = Some(finished("v2", PreflightResult::Failed, false));
    let Step::Blocked { cause } = plan(&d, &o) else {
        panic!("{:?}", plan(&d, &o));
    };
    assert_eq!(
        cause.reason(),
        "PreflightFailed",
        "blocked, and the interim slot serves on"
    );
}

#[test]
fn an_interim_slot_that_crashed_is_not_started_again_for_the_same_spec_and_the_preflight_goes_on() {
    let mut d = desired("v2");
    d.preflight = true;
    d.interim = Some(template("v1"));
    let mut a = slot("a", "v1", false);
    a.running = false;
    let mut o = observed(&[], vec![a]);
    o.data_version = Some("v1".into());
    o.preflight = Some(preflight_of("v2", running(false, None, false)));
    assert_eq!(
        plan(&d, &o),
        Step::RemoveSlot {
            name: "a".into(),
            crashed: true
        },
        "its records go (act remembers the crash)"
    );
    o.slots.clear();
    o.interim_crashed_for = Some(template("v2"));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Preflight), "no second interim slot");
    o.preflight = Some(finished("v2", PreflightResult::Compatible, false));
    assert_eq!(
        plan(&d, &o),
        Step::StartSlot { name: "a".into() },
        "the roll goes on once the preflight passed"
    );
    let mut next = desired("v3");
    next.preflight = true;
    next.interim = Some(template("v1"));
    o.preflight = None;
    assert_eq!(
        plan(&next, &o),
        Step::StartInterim { name: "a".into() },
        "another spec tries an interim slot again"
    );
}

/// Walks slot "a", the only one, from serving to gone as a deletion or a restore stops it (it was
/// sent SIGTERM for `cause`): SIGTERM, its exit, its own kine, its records.
fn stop_slot_a(d: &Desired, o: &mut Observed, cause: StopCause) {
    assert_eq!(plan(d, o), Step::TerminateSlot { name: "a".into() });
    o.slots[0].stop = stopped(cause, 10);
    assert_eq!(plan(d, o), Step::Wait(Wait::Exit { slot: "a".into() }));
    o.slots[0].running = false;
    o.slots[0].own_store_running = true;
    assert_eq!(plan(d, o), Step::StopSlotStore { name: "a".into() });
    let kine = Stopping::SlotStore { slot: "a".into() };
    o.stopping = vec![stop_sent(kine.clone(), 10, 10)];
    assert_eq!(plan(d, o), Step::Wait(Wait::Stopping { what: kine }));
    o.stopping.clear();
    o.slots[0].own_store_running = false;
    assert_eq!(
        plan(d, o),
        Step::RemoveSlot {
            name: "a".into(),
            crashed: false
        }
    );
    o.slots.clear();
}

fn restore_record(phase: RestorePhase) -> RestoreRecord {
    RestoreRecord {
        request: "kcp-v1-to-v2-t.dump".into(),
        snapshot: "/s/shards/dev/snapshots/kcp-v1-to-v2-t.dump".into(),
        version: "v1".into(),
        phase,
        message: None,
        requested_at: at(0),
        restored_at: None,
        completed_at: None,
    }
}

#[test]
fn a_restore_takes_the_shard_down_restores_with_no_slot_running_then_starts_the_snapshots_version() {
    let mut d = desired("v1");
    let restorable = Restorable {
        path: "/s/shards/dev/snapshots/kcp-v1-to-v2-t.dump".into(),
        version: "v1".into(),
    };
    d.restore = Some(RestoreRequest {
        value: "kcp-v1-to-v2-t.dump".into(),
        verdict: Ok(restorable.clone()),
    });
    let mut o = observed(&["a"], vec![slot("a", "v2", true)]);
    assert_eq!(plan(&d, &o), Step::BeginRestore(restorable), "asked: taken up first");
    d.restore = None;
    o.restore = Some(restore_record(RestorePhase::Stopping));
    assert_eq!(
        plan(&d, &o),
        set_front(&[], &[], &[("a", LeaveCause::Replaced)]),
        "the front serves no slot: new connections are refused, not sent to a slot that stops"
    );
    o.front = FrontObservation::serving(&[]);
    stop_slot_a(&d, &mut o, StopCause::Restore);
    o.store_up = false;
    assert_eq!(plan(&d, &o), Step::EnsureStore, "pg_restore needs the database");
    o.store_up = true;
    assert_eq!(plan(&d, &o), Step::RestoreSnapshot, "no slot runs: restore");
    let restoring = JobKind::Restore {
        snapshot: o.restore.as_ref().unwrap().snapshot.clone(),
    };
    o.job = job(restoring.clone(), JobState::Running);
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "restore" }));
    o.job = job(dump_for("v2"), JobState::Running);
    assert_eq!(
        plan(&d, &o),
        Step::CancelJob,
        "one job at a time: a dump goes before a restore"
    );
    o.job = job(restoring, JobState::Succeeded);
    assert_eq!(plan(&d, &o), Step::FinishJob, "FinishJob records the restored version");
    o.job = None;
    o.restore = Some(restore_record(RestorePhase::Starting));
    assert_eq!(
        plan(&d, &o),
        Step::StartSlot { name: "a".into() },
        "restored: the snapshot's version starts as on a first start"
    );
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.restore = Some(restore_record(RestorePhase::Starting));
    assert_eq!(plan(&d, &o), Step::CompleteRestore, "a slot serves the restored data");
    o.restore = Some(restore_record(RestorePhase::Complete));
    assert_eq!(plan(&d, &o), Step::Idle);
}

/// A KineSqlite restore puts a copy in place of state.db: the store's own kine stops first, and
/// starts again only once the copy is in place.
#[test]
fn a_restore_that_replaces_the_stores_files_stops_the_store_first_and_starts_it_after() {
    let mut d = desired("v1");
    d.restore_stops_store = true;
    let mut o = observed(&["a"], vec![slot("a", "v2", true)]);
    o.restore = Some(restore_record(RestorePhase::Stopping));
    o.front = FrontObservation::serving(&[]);
    o.store_processes_up = true;
    stop_slot_a(&d, &mut o, StopCause::Restore);
    assert_eq!(plan(&d, &o), Step::StopStore, "kine has state.db open");
    o.stopping = vec![stop_sent(Stopping::Store, 10, 10)];
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Stopping { what: Stopping::Store }));
    o.stopping.clear();
    o.store_processes_up = false;
    o.store_up = false;
    assert_eq!(
        plan(&d, &o),
        Step::RestoreSnapshot,
        "the store stays down while its files are replaced"
    );
    o.job = job(
        JobKind::Restore {
            snapshot: o.restore.as_ref().unwrap().snapshot.clone(),
        },
        JobState::Running,
    );
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "restore" }));
    o.job = None;
    o.restore = Some(restore_record(RestorePhase::Starting));
    assert_eq!(
        plan(&d, &o),
        Step::EnsureStore,
        "restored: the store starts again first"
    );
}

#[test]
fn a_restore_that_cannot_be_done_is_refused_and_a_second_one_waits_for_the_first() {
    let mut d = desired("v2");
    d.restore = Some(RestoreRequest {
        value: "kcp-v1-to-v2-t.dump".into(),
        verdict: Err("spec.version is v2".into()),
    });
    let mut o = observed(&["a"], vec![slot("a", "v2", true)]);
    assert_eq!(
        plan(&d, &o),
        Step::RefuseRestore {
            message: "spec.version is v2".into()
        }
    );
    d.restore = Some(RestoreRequest {
        value: "other.dump".into(),
        verdict: Ok(Restorable {
            path: "/x/other.dump".into(),
            version: "v2".into(),
        }),
    });
    o.restore = Some(restore_record(RestorePhase::Stopping));
    assert!(
        matches!(plan(&d, &o), Step::RefuseRestore { message } if message.contains("under way")),
        "one restore at a time"
    );
    // Deleting wins over a restore: the shard's processes stop, the data stays.
    d.deleting = true;
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
}

#[test]
fn a_front_that_moves_is_asked_to_stop_the_new_one_starts_once_it_is_gone_and_a_crash_meanwhile_is_acted_on() {
    let d = desired("v1");
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.front_elsewhere = true;
    assert_eq!(plan(&d, &o), Step::MoveFront);
    // Asked to stop, it closed its listening and control sockets and drains its connections.
    o.front_elsewhere = false;
    o.front = FrontObservation::Down;
    o.stopping = vec![stop_sent(Stopping::Front, 9, 40)];
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Stopping { what: Stopping::Front }));
    // A slot that dies meanwhile is acted on at once; one that hangs past livenessTimeout too.
    o.slots[0].running = false;
    assert_eq!(
        plan(&d, &o),
        Step::RemoveSlot {
            name: "a".into(),
            crashed: true
        }
    );
    o.slots[0].running = true;
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = 10;
    o.slots[0].health.last_alive_at = Some(at(-60));
    assert!(matches!(plan(&d, &o), Step::KillSlot { .. }), "{:?}", plan(&d, &o));
    // Gone: the new front starts; one that outlives its grace is killed first.
    o.slots[0] = slot("a", "v1", true);
    o.stopping.clear();
    assert_eq!(plan(&d, &o), Step::EnsureFront);
    o.stopping = vec![stop_sent(Stopping::Front, -40, 40)];
    assert!(matches!(plan(&d, &o), Step::KillStopping { .. }), "{:?}", plan(&d, &o));
}
