use super::*;
use crate::controller::plan::BlockCause;
use crate::controller::plan::tests::{at, desired, observed, slot};

fn status_of(verdicts: &[Verdict], type_: &str) -> bool {
    verdicts.iter().find(|v| v.type_ == type_).unwrap().status
}

fn find<'a>(verdicts: &'a [Verdict], type_: &str) -> &'a Verdict {
    verdicts.iter().find(|v| v.type_ == type_).unwrap()
}

#[test]
fn a_serving_shard_mid_roll_is_ready_and_progressing() {
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    let v = verdicts(&desired("v2"), &o, &Step::StartSlot { name: "b".into() }, None);
    assert!(status_of(&v, "Ready") && status_of(&v, "Progressing") && !status_of(&v, "Degraded"));
    assert_eq!(phase(&v, false), Phase::Progressing);
}

#[test]
fn a_blocked_roll_is_degraded_with_what_to_fix_while_the_old_slot_serves() {
    let cause = BlockCause::NoBinary {
        path: "bin/kcp-v9.9.9".into(),
    };
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    let v = verdicts(&desired("v9.9.9"), &o, &Step::Blocked { cause }, None);
    let degraded = find(&v, "Degraded");
    assert!(degraded.status);
    assert_eq!(degraded.reason, "BinaryMissing");
    assert!(degraded.message.contains("bin/kcp-v9.9.9") && degraded.message.contains("install"));
    assert!(status_of(&v, "Ready"));
    assert_eq!(phase(&v, false), Phase::Degraded);
}

#[test]
fn a_spec_store_that_is_not_followed_is_degraded_while_the_shard_serves() {
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.store_refused = Some("spec.store.type names KinePostgres but the shard's data is in KineSqlite".into());
    let v = verdicts(&desired("v1"), &o, &Step::Idle, None);
    let degraded = find(&v, "Degraded");
    assert_eq!(
        (degraded.status, degraded.reason.as_str()),
        (true, "StoreChangeRefused")
    );
    assert!(degraded.message.contains("data is in KineSqlite"));
    assert!(status_of(&v, "Ready") && status_of(&v, "StoreReady"));
}

#[test]
fn a_first_start_is_ready_once_a_probe_workspace_is() {
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.roll = Some(crate::controller::plan::RollRecord {
        to_version: "v1".into(),
        started_at: at(0),
        ..Default::default()
    });
    let v = verdicts(&desired("v1"), &o, &Step::Probe, None);
    let ready = find(&v, "Ready");
    assert_eq!((ready.status, ready.reason.as_str()), (false, "FirstStart"));
    assert!(
        ready.message.starts_with("slot a (v1) serves through the front, but"),
        "{}",
        ready.message
    );
    // A shard of a sharded kcp: its root's probe needs the other shards, which wait for Ready.
    let mut sharded = desired("v1");
    sharded.template.sharded = Some(crate::controller::plan::ShardedTemplate {
        shard_name: "root".into(),
        external_url: "https://127.0.0.1:6443".into(),
        root_kcp_shard: "root".into(),
        root_front_url: None,
        cache_kubeconfig: None,
        root_identities: vec![],
    });
    assert!(status_of(&verdicts(&sharded, &o, &Step::Probe, None), "Ready"));
    o.roll.as_mut().unwrap().probe_succeeded_at = Some(at(5));
    assert!(status_of(
        &verdicts(&desired("v1"), &o, &Step::CompleteRoll, None),
        "Ready"
    ));
    // A roll from a version that served: Ready throughout.
    o.roll.as_mut().unwrap().probe_succeeded_at = None;
    o.roll.as_mut().unwrap().from_version = Some("v0".into());
    assert!(status_of(&verdicts(&desired("v1"), &o, &Step::Probe, None), "Ready"));
}

#[test]
fn a_new_leader_catching_up_says_its_backlog_and_how_long_since_the_lease_release() {
    let mut o = observed(&["b"], vec![slot("b", "v2", true)]);
    o.now = at(95);
    o.roll = Some(crate::controller::plan::RollRecord {
        from_version: Some("v1".into()),
        to_version: "v2".into(),
        started_at: at(0),
        lease_released_at: Some(at(20)),
        ..Default::default()
    });
    o.lease = LeaseHolder::Slot("b".into());
    o.leader_backlog = Some(crate::slot::backlog::Backlog {
        queued: 59,
        deepest: vec![("kcp-workspace".into(), 46), ("gc-*".into(), 7)],
    });
    let v = verdicts(&desired("v2"), &o, &Step::Wait(Wait::Probe), None);
    let progressing = find(&v, "Progressing");
    assert_eq!(
        (
            progressing.status,
            progressing.reason.as_str(),
            progressing.message.as_str()
        ),
        (
            true,
            "ControllersCatchingUp",
            "slot b leads kcp's controllers, which work through their backlog: 59 keys queued (kcp-workspace 46, gc-* 7), 75s after the controllers' Lease was released; the roll completes once a probe workspace gets Ready"
        )
    );
    assert!(status_of(&v, "Ready") && !status_of(&v, "Degraded"));
    // Nothing queued (or not read): the probe is waited for as before.
    o.leader_backlog.as_mut().unwrap().queued = 0;
    let v = verdicts(&desired("v2"), &o, &Step::Wait(Wait::Probe), None);
    assert_eq!(find(&v, "Progressing").reason, "Probing");
}

#[test]
fn a_failed_step_is_degraded_with_its_error() {
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    let v = verdicts(&desired("v1"), &o, &Step::EnsureFront, Some("front address in use"));
    let degraded = find(&v, "Degraded");
    assert_eq!((degraded.status, degraded.reason.as_str()), (true, "StepFailed"));
}

#[test]
fn a_converged_shard_is_ready_and_a_first_start_pending() {
    let o = observed(&["a"], vec![slot("a", "v1", true)]);
    assert_eq!(
        phase(&verdicts(&desired("v1"), &o, &Step::Idle, None), false),
        Phase::Ready
    );
    let o = observed(&[], vec![slot("a", "v1", false)]);
    let v = verdicts(&desired("v1"), &o, &Step::Wait(Wait::Ready { slot: "a".into() }), None);
    assert_eq!(phase(&v, false), Phase::Pending);
}

#[test]
fn the_only_slot_hung_is_not_ready_and_degraded_never_nothing_is_blocked() {
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = 3;
    o.slots[0].health.problem = Some("no answer within 1s".into());
    let v = verdicts(&desired("v1"), &o, &Step::Idle, None);
    assert_eq!(
        (find(&v, "Ready").status, find(&v, "Ready").reason.as_str()),
        (false, "SlotUnresponsive")
    );
    let degraded = find(&v, "Degraded");
    assert!(
        degraded.status && degraded.message.contains("no answer within 1s"),
        "{degraded:?}"
    );
    assert_eq!(phase(&v, false), Phase::Degraded);
}

#[test]
fn one_slot_of_two_serving_is_ready_and_degraded_with_what_is_missing() {
    let mut d = desired("v1");
    d.slots = 2;
    let mut b = slot("b", "v1", true);
    b.running = false;
    let mut o = observed(&["a"], vec![slot("a", "v1", true), b]);
    o.roll = None;
    let v = verdicts(&d, &o, &Step::StartSlot { name: "b".into() }, None);
    assert!(status_of(&v, "Ready"));
    let degraded = find(&v, "Degraded");
    assert_eq!(degraded.reason, "FewerSlots");
    assert!(
        degraded.message.starts_with("1 of 2 slots serve (slot b exited)"),
        "{degraded:?}"
    );
}

#[test]
fn a_new_slot_answering_404_is_broken_unless_a_store_outage_caught_its_start() {
    let mut b = slot("b", "v2", false);
    b.health.broken_looks = 2;
    b.health.problem = Some("HTTP 404".into());
    let mut o = observed(&["a"], vec![slot("a", "v1", true), b]);
    o.roll = Some(crate::controller::plan::RollRecord::default());
    let v = verdicts(&desired("v2"), &o, &Step::Idle, None);
    assert_eq!(find(&v, "Degraded").reason, "SlotBroken");
    // The store went away after b started: b is started again for the outage, not replaced.
    o.roll.as_mut().unwrap().store_down_at = Some(at(5));
    let restart = Step::RestartSlot {
        name: "b".into(),
        cause: RestartCause::StoreOutage,
    };
    let v = verdicts(&desired("v2"), &o, &restart, None);
    assert!(!find(&v, "Degraded").status, "{:?}", find(&v, "Degraded"));
}

#[test]
fn last_transition_time_moves_only_when_the_status_does() {
    let (t0, t1) = (at(0), at(100));
    let d = desired("v1");
    let up = observed(&["a"], vec![slot("a", "v1", true)]);
    let first = merge(&[], &verdicts(&d, &up, &Step::Idle, None), Some(1), t0);
    let same = merge(&first, &verdicts(&d, &up, &Step::Idle, None), Some(2), t1);
    let ready = |cs: &[Condition]| cs.iter().find(|c| c.type_ == "Ready").unwrap().clone();
    assert_eq!(ready(&same).last_transition_time, ready(&first).last_transition_time);
    assert_eq!(ready(&same).observed_generation, Some(2));
    let down = observed(&[], vec![slot("a", "v1", false)]);
    let flipped = merge(&same, &verdicts(&d, &down, &Step::Idle, None), Some(2), t1);
    assert_eq!(ready(&flipped).last_transition_time, k8s_time(t1));
}
