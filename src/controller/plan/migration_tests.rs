//! The plan of a move of the data to another store (plan/migration.rs), as a table of
//! situations: what a user would see happen at each phase.
use super::tests::*;
use super::*;
use crate::api::StoreSpec;
use crate::store::mirror::MirrorPhase;

fn postgres() -> StoreSpec {
    serde_json::from_value(serde_json::json!({
        "type": "KinePostgres",
        "kinePostgres": { "host": "db.example", "port": 5432, "database": "kcp", "user": "kcp" }
    }))
    .unwrap()
}

fn sqlite() -> StoreSpec {
    serde_json::from_value(serde_json::json!({ "type": "KineSqlite" })).unwrap()
}

/// A shard of one slot `a` serving on sqlite, whose spec now names PostgreSQL.
fn wanting_postgres() -> (Desired, Observed) {
    let mut d = desired("v1");
    d.store_move = Some(StoreMove {
        to: postgres(),
        refused: None,
    });
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.lease = LeaseHolder::Slot("a".into());
    (d, o)
}

fn record() -> MigrationRecord {
    MigrationRecord::begun(sqlite(), postgres(), at(0))
}

fn under_way(record: MigrationRecord, mirror: Option<(MirrorPhase, i64)>) -> Option<MigrationObservation> {
    Some(MigrationObservation {
        record,
        target_up: true,
        target_starting: false,
        mirror: mirror.map(|(phase, lag)| MirrorObservation {
            phase,
            copied_keys: 1200,
            lag,
            verified_keys: None,
        }),
        old_store_running: true,
    })
}

fn mirroring() -> Option<JobObservation> {
    job(JobKind::Mirror, JobState::Running)
}

/// The slot on the new store.
fn warm(name: &str, ready: bool) -> SlotObservation {
    SlotObservation {
        on_other_store: true,
        ..slot(name, "v1", ready)
    }
}

#[test]
fn a_store_change_on_a_steady_shard_begins_a_move_and_none_begins_while_a_roll_or_job_runs() {
    let (d, mut o) = wanting_postgres();
    assert_eq!(plan(&d, &o), Step::BeginMigration);

    o.roll = Some(RollRecord {
        to_version: "v1".into(),
        started_at: at(0),
        ..Default::default()
    });
    assert_ne!(plan(&d, &o), Step::BeginMigration, "a roll runs to its end first");
    o.roll = None;
    o.job = job(JobKind::Backup { request: None }, JobState::Running);
    assert_ne!(plan(&d, &o), Step::BeginMigration, "a backup ends first");
    o.job = None;
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = UNRESPONSIVE_AFTER;
    assert_ne!(plan(&d, &o), Step::BeginMigration, "not while a slot does not serve");
}

#[test]
fn a_move_under_way_with_no_slot_on_the_old_store_starts_one_there_first() {
    let (d, _) = wanting_postgres();
    // Slot a died (its records went): only the warm slot on the new store runs, out of the front.
    let mut o = observed(&[], vec![warm("b", true)]);
    o.migration = under_way(
        MigrationRecord {
            warm_slot: Some("b".into()),
            ..record()
        },
        Some((MirrorPhase::Following, 0)),
    );
    o.job = mirroring();
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
    // The target unreachable and no slot at all (the shard created again on the same data).
    o.slots.clear();
    o.job = None;
    o.migration.as_mut().unwrap().target_up = false;
    assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
    // Its roll (a first start) ends before the move goes on: the probe says a leader runs.
    let mut o = observed(&["a"], vec![slot("a", "v1", true)]);
    o.migration = under_way(record(), None);
    o.migration.as_mut().unwrap().target_up = false;
    o.roll = Some(RollRecord {
        to_version: "v1".into(),
        started_at: at(0),
        ..Default::default()
    });
    assert_eq!(plan(&d, &o), Step::Probe);
    o.roll = None;
    assert_eq!(plan(&d, &o), Step::EnsureTargetStore);
}

#[test]
fn a_refused_move_or_one_that_failed_for_the_same_store_does_not_begin() {
    let (mut d, mut o) = wanting_postgres();
    d.store_move.as_mut().unwrap().refused = Some("no".into());
    assert_eq!(plan(&d, &o), Step::Idle);

    d.store_move.as_mut().unwrap().refused = None;
    o.migration = under_way(
        MigrationRecord {
            failure: Some("the mirror failed".into()),
            ..record()
        },
        None,
    );
    assert_eq!(plan(&d, &o), Step::Idle, "not again until spec.store changes");
    let wanted = d.store_move.clone();
    d.store_move.as_mut().unwrap().to = sqlite();
    assert_eq!(plan(&d, &o), Step::BeginMigration, "another target begins");
    // spec.store back on the data's store: the failure is forgotten, and the same target is
    // tried afresh once named again (after the user cleared it).
    d.store_move = None;
    assert_eq!(plan(&d, &o), Step::ForgetMigration);
    o.migration = None;
    d.store_move = wanted;
    assert_eq!(plan(&d, &o), Step::BeginMigration);
}

#[test]
fn a_move_starts_the_new_store_then_the_mirror_and_waits_for_its_copy() {
    let (d, mut o) = wanting_postgres();
    o.migration = under_way(record(), None);
    o.migration.as_mut().unwrap().target_up = false;
    assert_eq!(plan(&d, &o), Step::EnsureTargetStore);
    o.migration.as_mut().unwrap().target_starting = true;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Store));
    o.migration.as_mut().unwrap().target_starting = false;
    o.migration.as_mut().unwrap().target_up = true;
    assert_eq!(plan(&d, &o), Step::StartMirror);

    // Another job (a backup begun a moment before) goes first.
    o.job = job(JobKind::Backup { request: None }, JobState::Running);
    assert_eq!(plan(&d, &o), Step::CancelJob);

    o.job = mirroring();
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "store-mirror" }));
    o.migration = under_way(record(), Some((MirrorPhase::Copying, 0)));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "store-mirror" }));
}

#[test]
fn a_move_into_kine_sqlite_starts_its_kine_once_the_mirror_has_readied_the_file() {
    let (mut d, mut o) = wanting_postgres();
    d.store_move.as_mut().unwrap().to = sqlite();
    let into_sqlite = MigrationRecord::begun(postgres(), sqlite(), at(0));
    o.migration = under_way(into_sqlite.clone(), None);
    o.migration.as_mut().unwrap().target_up = false;
    assert_eq!(
        plan(&d, &o),
        Step::StartMirror,
        "no kine runs on the file while the mirror raises its revisions"
    );
    o.job = mirroring();
    o.migration = under_way(into_sqlite.clone(), Some((MirrorPhase::Copying, 0)));
    o.migration.as_mut().unwrap().target_up = false;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "store-mirror" }));
    o.migration = under_way(into_sqlite.clone(), Some((MirrorPhase::Following, 3)));
    o.migration.as_mut().unwrap().target_up = false;
    assert_eq!(plan(&d, &o), Step::EnsureTargetStore);
    o.migration.as_mut().unwrap().target_starting = true;
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Store));
    o.migration = under_way(into_sqlite, Some((MirrorPhase::Following, 3)));
    assert_eq!(plan(&d, &o), Step::StartWarmSlot { name: "b".into() });
}

#[test]
fn once_the_mirror_follows_a_slot_starts_on_the_new_store_and_stays_out_of_the_front() {
    let (d, mut o) = wanting_postgres();
    o.job = mirroring();
    o.migration = under_way(record(), Some((MirrorPhase::Following, 3)));
    assert_eq!(plan(&d, &o), Step::StartWarmSlot { name: "b".into() });

    o.migration.as_mut().unwrap().record.warm_slot = Some("b".into());
    o.slots.push(warm("b", false));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Ready { slot: "b".into() }));

    // Ready, it does not join the front, and the Lease is never released through it.
    o.slots[1] = warm("b", true);
    assert_eq!(wanted_front(&d, &o), vec!["a".to_string()]);
    o.slots[0].health.ready = false;
    o.slots[0].health.failures = UNRESPONSIVE_AFTER;
    o.slots[0].stop = Some(StopRecord {
        cause: StopCause::Retired,
        at: at(5),
        killed: false,
    });
    o.slots[0].listening = false;
    assert!(
        !matches!(plan(&d, &o), Step::ReleaseLease { .. }),
        "a Lease released on the new store would let its slot lead before the switch"
    );
}

#[test]
fn the_switch_begins_once_the_new_slot_is_ready_and_the_mirror_is_close_behind() {
    let (d, mut o) = wanting_postgres();
    o.job = mirroring();
    let warm_record = MigrationRecord {
        warm_slot: Some("b".into()),
        ..record()
    };
    o.migration = under_way(warm_record.clone(), Some((MirrorPhase::Following, SWITCH_LAG + 1)));
    o.slots.push(warm("b", true));
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "store-mirror" }));
    o.migration = under_way(warm_record, Some((MirrorPhase::Following, SWITCH_LAG)));
    assert_eq!(plan(&d, &o), Step::BeginSwitch);
}

#[test]
fn the_switch_holds_the_front_stops_every_old_slot_then_ends_the_mirror() {
    let (d, mut o) = wanting_postgres();
    o.job = mirroring();
    let switching = MigrationRecord {
        warm_slot: Some("b".into()),
        switch_started_at: Some(at(9)),
        ..record()
    };
    o.migration = under_way(switching.clone(), Some((MirrorPhase::Following, 2)));
    o.slots.push(warm("b", true));
    // New connections wait in the front.
    assert_eq!(plan(&d, &o), set_front(&[], &[], &[("a", LeaveCause::Replaced)]));
    o.front = FrontObservation::serving(&[]);
    // As in a roll, a stops once it has settled: a request sent to it just before the switch is
    // answered before SIGTERM, after which kcp answers /readyz 500.
    o.slots[0].left_front_at = Some(o.now);
    assert_eq!(
        plan(&d, &o),
        Step::Wait(Wait::Settle {
            slot: "a".into(),
            remaining: SWITCH_SETTLE
        })
    );
    o.slots[0].left_front_at = Some(o.now - chrono::TimeDelta::milliseconds(500));
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
    o.slots[0].stop = Some(StopRecord {
        cause: StopCause::Retired,
        at: at(9),
        killed: false,
    });
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Exit { slot: "a".into() }));
    // a exited: the mirror is told at once that the old store takes no more writes; then a's
    // records go.
    o.slots[0].running = false;
    assert_eq!(plan(&d, &o), Step::EndMirror);
    o.migration.as_mut().unwrap().record.mirror_ending_at = Some(at(10));
    assert!(matches!(plan(&d, &o), Step::RemoveSlot { .. }));
    o.slots.remove(0);
    o.lease = LeaseHolder::Gone;
    o.migration = under_way(
        MigrationRecord {
            mirror_ending_at: Some(at(10)),
            ..switching
        },
        Some((MirrorPhase::Following, 0)),
    );
    assert_eq!(plan(&d, &o), Step::Wait(Wait::Job { job: "store-mirror" }));
    // The mirror ended: FinishJob records the switch.
    o.job = job(JobKind::Mirror, JobState::Succeeded);
    assert_eq!(plan(&d, &o), Step::FinishJob);
}

#[test]
fn after_the_switch_the_new_slot_takes_new_connections_the_old_store_stops_and_the_move_completes() {
    let (d, mut o) = wanting_postgres();
    o.migration = under_way(
        MigrationRecord {
            warm_slot: Some("b".into()),
            switch_started_at: Some(at(8)),
            mirror_ending_at: Some(at(9)),
            switched_at: Some(at(10)),
            ..record()
        },
        Some((MirrorPhase::Done, 0)),
    );
    // The store record names the new store: b runs on the shard's store now.
    o.slots = vec![slot("b", "v1", true)];
    o.front = FrontObservation::serving(&[]);
    o.lease = LeaseHolder::Gone;
    assert_eq!(plan(&d, &o), set_front(&["b"], &["b"], &[]));
    o.front = FrontObservation::serving(&["b"]);
    assert_eq!(
        plan(&d, &o),
        Step::ReleaseLease {
            holder: None,
            to: "b".into()
        }
    );
    o.lease = LeaseHolder::Slot("b".into());
    assert_eq!(plan(&d, &o), Step::StopOldStore);
    o.migration.as_mut().unwrap().old_store_running = false;
    assert_eq!(plan(&d, &o), Step::CompleteMigration);
}

#[test]
fn a_move_stops_when_the_spec_changes_before_the_switch_or_its_new_slot_exits() {
    let (mut d, mut o) = wanting_postgres();
    o.job = mirroring();
    o.migration = under_way(
        MigrationRecord {
            warm_slot: Some("b".into()),
            ..record()
        },
        Some((MirrorPhase::Following, 0)),
    );
    let mut b = warm("b", false);
    b.running = false;
    b.last_words = Some("exit status 1".into());
    o.slots.push(b);
    // A slot of the new store that exits is removed first, then the move stops.
    assert!(matches!(plan(&d, &o), Step::RemoveSlot { .. }));
    o.slots.pop();
    assert_eq!(
        plan(&d, &o),
        Step::FailMigration {
            cause: MigrationFailure::WarmSlotExited {
                slot: "b".into(),
                last_words: None
            }
        }
    );
    d.store_move = None;
    assert_eq!(
        plan(&d, &o),
        Step::FailMigration {
            cause: MigrationFailure::SpecChanged
        }
    );
}

#[test]
fn the_slot_a_stopped_move_started_on_the_new_store_is_stopped_and_the_old_store_serves_on() {
    let (d, mut o) = wanting_postgres();
    o.migration = under_way(
        MigrationRecord {
            warm_slot: Some("b".into()),
            failure: Some("the mirror failed".into()),
            ..record()
        },
        None,
    );
    o.slots.push(warm("b", true));
    assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "b".into() });
    o.slots[1].stop = Some(StopRecord {
        cause: StopCause::Retired,
        at: at(9),
        killed: false,
    });
    assert_eq!(wanted_front(&d, &o), vec!["a".to_string()], "a serves on");
}

#[test]
fn out_of_kine_postgres_the_old_slots_own_kines_stop_before_the_mirror_is_told_to_end() {
    let (d, mut o) = wanting_postgres();
    o.job = mirroring();
    o.migration = under_way(
        MigrationRecord {
            warm_slot: Some("b".into()),
            switch_started_at: Some(at(9)),
            ..MigrationRecord::begun(postgres(), sqlite(), at(0))
        },
        Some((MirrorPhase::Following, 2)),
    );
    o.front = FrontObservation::serving(&[]);
    o.slots[0].running = false;
    o.slots[0].own_store_running = true;
    o.slots.push(warm("b", true));
    assert_eq!(plan(&d, &o), Step::StopSlotStore { name: "a".into() });
    o.slots[0].own_store_running = false;
    assert_eq!(plan(&d, &o), Step::EndMirror);
}
