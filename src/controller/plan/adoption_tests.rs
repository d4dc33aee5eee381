//! The plan of an adoption (plan/adoption.rs), as a table of situations: what a user would see
//! happen from spec.adopt to AdoptionComplete.
use std::path::PathBuf;

use super::tests::*;
use super::*;
use crate::api::StoreSpec;
use crate::store::mirror::MirrorPhase;

const ROOT: &str = "/var/lib/kcp";

fn sqlite() -> StoreSpec {
    serde_json::from_value(serde_json::json!({ "type": "KineSqlite" })).unwrap()
}

fn embedded_etcd() -> StoreSpec {
    serde_json::from_value(serde_json::json!({ "type": "Etcd", "etcd": { "endpoints": ["https://localhost:2379"] } }))
        .unwrap()
}

fn adopting() -> Desired {
    let mut d = desired("v1");
    d.adopt = Some(PathBuf::from(ROOT));
    d
}

fn record() -> AdoptionRecord {
    AdoptionRecord {
        root_directory: PathBuf::from(ROOT),
        version: "v1".into(),
        started_at: at(1),
        inspected_at: at(1),
        from: "kcp v1 (pid 42) at https://127.0.0.1:6443 on its embedded etcd".into(),
        slot: Some("a".into()),
        data_dir: Some(PathBuf::from(ROOT).join("etcd-server")),
        lease_held_at: None,
        address: "127.0.0.1:6443".into(),
        caddy_admin_address: None,
        proxy_moved_at: None,
        takes_address: false,
        switched_at: None,
        completed_at: None,
        refused: None,
    }
}

/// Taken over: the old kcp serves as slot a behind the front, on its own store, and spec.store
/// names another.
fn taken_over() -> (Desired, Observed) {
    let mut d = adopting();
    d.store_move = Some(StoreMove {
        to: sqlite(),
        refused: None,
    });
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.adoption = Some(record());
    o.lease = LeaseHolder::Unmatched;
    (d, o)
}

/// The move of the adopted kcp's data in its switch: slot b on the new store, the front holding.
fn switching(mirror: Option<MirrorObservation>) -> Option<MigrationObservation> {
    let mut record = MigrationRecord::begun(embedded_etcd(), sqlite(), at(2));
    record.warm_slot = Some("b".into());
    record.switch_started_at = Some(at(9));
    Some(MigrationObservation {
        record,
        target_up: true,
        target_starting: false,
        mirror,
        old_store_running: false,
    })
}

#[test]
fn a_new_shard_with_spec_adopt_takes_the_kcp_over_before_anything_starts() {
    let mut o = observed(&[], vec![]);
    o.store_up = false;
    o.front = FrontObservation::Down;
    assert_eq!(
        plan(&adopting(), &o),
        Step::AdoptKcp,
        "not EnsureStore: no empty kcp starts"
    );
    assert_eq!(
        plan(&desired("v1"), &o),
        Step::EnsureStore,
        "without spec.adopt: a first start"
    );
}

#[test]
fn a_refused_adoption_blocks_every_start_until_the_spec_says_something_else() {
    let mut o = observed(&[], vec![]);
    o.adoption = Some(AdoptionRecord {
        slot: None,
        refused: Some("kcp v0 runs on /var/lib/kcp, and the shard is to run v1".into()),
        ..record()
    });
    let blocked = plan(&adopting(), &o);
    assert!(
        matches!(&blocked, Step::Blocked { cause: BlockCause::AdoptionRefused { message } } if message.contains("v0")),
        "{blocked:?}"
    );
    // 30 s later: inspected again (the kcp may run now).
    o.now = at(1) + chrono::Duration::seconds(30);
    assert_eq!(plan(&adopting(), &o), Step::AdoptKcp);
    o.now = at(10);
    // Another version, or another directory: inspected again at once.
    let mut d = adopting();
    d.template.version = "v0".into();
    assert_eq!(plan(&d, &o), Step::AdoptKcp);
    let mut d = adopting();
    d.adopt = Some(PathBuf::from("/srv/kcp"));
    assert_eq!(plan(&d, &o), Step::AdoptKcp);
    // spec.adopt removed: a shard like any other.
    assert_eq!(plan(&desired("v1"), &o), Step::StartSlot { name: "a".into() });
}

#[test]
fn the_adopted_kcp_serves_then_the_lease_is_held_then_the_move_begins() {
    let (d, mut o) = taken_over();
    // Just taken over: the front gains it once it answered /readyz.
    o.front = FrontObservation::serving(&[]);
    o.slots[0].health = Health::default();
    assert_eq!(
        plan(&d, &o),
        Step::Idle,
        "its health looks see it ready (it is not a slot that starts)"
    );
    // Once it answers, the Lease is held through it (the move waits for that), and the front
    // gains it.
    o.slots[0].health = Health::serving(at(9));
    assert_eq!(plan(&d, &o), Step::HoldControllersLease);
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    assert_eq!(plan(&d, &o), set_front(&["a"], &["a"], &[]));
    o.front = FrontObservation::serving(&["a"]);
    assert_eq!(plan(&d, &o), Step::BeginMigration);
    o.adoption.as_mut().unwrap().lease_held_at = None;
    assert_eq!(
        plan(&d, &o),
        Step::HoldControllersLease,
        "no move while the Lease is not held"
    );
}

#[test]
fn no_slot_of_kcpshard_starts_on_the_old_kcps_store_while_it_serves() {
    let (mut d, mut o) = taken_over();
    d.slots = 2;
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    assert_eq!(
        plan(&d, &o),
        Step::BeginMigration,
        "not StartSlot b on the embedded etcd"
    );
    // After the switch, spec.slots applies.
    let mut o = observed(&["b"], vec![slot("b", "v1", true)]);
    o.adoption = Some(AdoptionRecord {
        lease_held_at: Some(at(5)),
        switched_at: Some(at(8)),
        ..record()
    });
    d.store_move = None;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
}

#[test]
fn the_adoption_completes_with_the_move_of_its_data_and_then_nothing_more_is_done() {
    let (mut d, mut o) = taken_over();
    d.store_move = None;
    o.slots = vec![slot("b", "v1", true)];
    o.front = FrontObservation::serving(&["b"]);
    o.lease = LeaseHolder::Free;
    let mut migration = MigrationRecord::begun(embedded_etcd(), sqlite(), at(2));
    migration.switched_at = Some(at(8));
    o.adoption = Some(AdoptionRecord {
        lease_held_at: Some(at(5)),
        switched_at: Some(at(8)),
        ..record()
    });
    o.migration = Some(MigrationObservation {
        record: migration.clone(),
        target_up: true,
        target_starting: false,
        mirror: Some(MirrorObservation {
            phase: MirrorPhase::Done,
            copied_keys: 10,
            lag: 0,
            verified_keys: Some(10),
        }),
        old_store_running: false,
    });
    assert_eq!(plan(&d, &o), Step::CompleteMigration);
    o.migration.as_mut().unwrap().record.completed_at = Some(at(9));
    assert_eq!(plan(&d, &o), Step::CompleteAdoption);
    o.adoption.as_mut().unwrap().completed_at = Some(at(9));
    assert_eq!(plan(&d, &o), Step::Idle);
}

#[test]
fn in_the_switch_the_old_kcps_embedded_etcd_stops_with_it_and_that_is_no_store_outage() {
    let (d, mut o) = taken_over();
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    o.migration = switching(Some(MirrorObservation {
        phase: MirrorPhase::Following,
        copied_keys: 10,
        lag: 0,
        verified_keys: None,
    }));
    o.job = job(JobKind::Mirror, JobState::Running);
    o.front = FrontObservation::serving(&[]);
    o.slots[0].stop = Some(StopRecord {
        cause: StopCause::Retired,
        at: at(9),
        killed: false,
    });
    o.slots.push(SlotObservation {
        on_other_store: true,
        ..slot("b", "v1", true)
    });
    o.store_up = false;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Exit { slot: "a".into() }));
    o.slots[0].running = false;
    assert_eq!(plan(&d, &o), Step::EndMirror);
    // Not in a switch, with the kcp running: the store being down is an outage.
    o.migration.as_mut().unwrap().record.switch_started_at = None;
    o.slots[0].running = true;
    o.slots[0].stop = None;
    assert_eq!(plan(&d, &o), Step::EnsureStore);
}

#[test]
fn a_caddy_in_front_of_the_old_kcp_is_sent_to_the_front_once_the_front_serves_it_and_before_the_move() {
    let (d, mut o) = taken_over();
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    o.adoption.as_mut().unwrap().caddy_admin_address = Some("127.0.0.1:2019".into());
    o.front = FrontObservation::serving(&[]);
    assert_eq!(
        plan(&d, &o),
        set_front(&["a"], &["a"], &[]),
        "the front serves it first"
    );
    o.front = FrontObservation::serving(&["a"]);
    assert_eq!(plan(&d, &o), Step::RedirectProxy);
    o.adoption.as_mut().unwrap().proxy_moved_at = Some(at(6));
    assert_eq!(plan(&d, &o), Step::BeginMigration);
}

#[test]
fn a_front_that_takes_the_old_kcps_address_starts_only_at_the_switch() {
    let (d, mut o) = taken_over();
    o.adoption.as_mut().unwrap().takes_address = true;
    o.front = FrontObservation::Down;
    assert_eq!(
        plan(&d, &o),
        Step::HoldControllersLease,
        "not EnsureFront: kcp listens there"
    );
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    assert_eq!(plan(&d, &o), Step::BeginMigration, "steady without a front");
    // The switch began (BeginSwitch started the front on kcp's socket): it is waited for.
    o.migration = switching(None);
    o.front = FrontObservation::Starting;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Front));
}

#[test]
fn the_adopted_kcp_is_never_restarted_nor_killed_and_one_that_exited_before_the_switch_is_taken_over_again() {
    let (d, mut o) = taken_over();
    o.adoption.as_mut().unwrap().lease_held_at = Some(at(5));
    // Not ready for longer than readinessTimeout: no RestartSlot (it cannot be started again).
    o.front = FrontObservation::serving(&[]);
    o.slots[0].health = Health::default();
    o.now = at(1000);
    assert_eq!(plan(&d, &o), Step::Idle);
    // Unresponsive for longer than livenessTimeout: no KillSlot.
    o.front = FrontObservation::serving(&["a"]);
    o.slots[0].health = Health {
        ever_ready: true,
        failures: 5,
        last_alive_at: Some(at(1)),
        ..Health::default()
    };
    assert!(!matches!(plan(&d, &o), Step::KillSlot { .. }), "{:?}", plan(&d, &o));
    // It exited: taken over again, not replaced.
    o.slots[0].running = false;
    assert_eq!(plan(&d, &o), Step::AdoptKcp);
    // In the switch its exit is the point: the move goes on.
    o.migration = switching(None);
    assert_ne!(plan(&d, &o), Step::AdoptKcp);
    // It could not be taken over again (it does not run): blocked, and tried again 30 s later,
    // even with spec.adopt removed meanwhile.
    o.migration = None;
    o.adoption.as_mut().unwrap().refused = Some("the adopted kcp exited before the switch".into());
    o.adoption.as_mut().unwrap().inspected_at = at(990);
    assert!(matches!(plan(&d, &o), Step::Blocked { .. }));
    let mut without = d.clone();
    without.adopt = None;
    assert!(matches!(plan(&without, &o), Step::Blocked { .. }));
    o.now = at(1020);
    assert_eq!(plan(&without, &o), Step::AdoptKcp);
}
