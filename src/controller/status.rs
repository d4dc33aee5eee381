//! The status the controller writes: the user's window on the shard.
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::conditions::{self, k8s_time};
use super::observe::World;
use super::plan::{
    AdoptionRecord, Desired, LeaseHolder, MigrationObservation, RestoreRecord, RollRecord, SlotObservation, Step,
};
use super::state::{CompletedRoll, ControllerState};
use crate::api::{
    AdoptionStatus, FrontStatus, KcpShard, KcpShardStatus, MigrationStatus, PreflightStatus, RestoreStatus, RollStatus,
    SlotStatus, SnapshotStatus, StoreStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

pub fn build(
    shard: &KcpShard,
    stored: Option<&KcpShardStatus>,
    desired: &Desired,
    world: &World,
    next: &Step,
    failure: Option<&str>,
) -> KcpShardStatus {
    let observed = &world.observed;
    let verdicts = conditions::verdicts(desired, observed, next, failure);
    let previous = stored.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = shard.metadata.generation;
    let backends = observed.front.backends();
    let slots = world
        .slots
        .iter()
        .zip(&observed.slots)
        .map(|(slot, seen)| SlotStatus {
            name: seen.name.clone(),
            version: seen.template.version.clone(),
            pid: slot.process.as_ref().filter(|_| seen.running).map(|p| p.pid),
            port: Some(slot.record.port),
            ready: seen.health.ready,
            serving: backends.contains(&seen.name),
            leader: observed.lease == LeaseHolder::Slot(seen.name.clone()),
            message: slot_message(seen),
            started_at: Some(k8s_time(seen.started_at)),
            restarted_at: seen.template.restarted_at.clone(),
        })
        .collect();
    let (last_roll, last_replacement) = rolls(&world.state);
    KcpShardStatus {
        observed_generation: generation,
        phase: Some(conditions::phase(&verdicts, desired.deleting)),
        active_slot: (!backends.is_empty()).then(|| backends.join(",")),
        version: world.serving_version(),
        slots,
        front: Some(FrontStatus {
            listen: Some(shard.spec.front.listen.clone()),
            backend: (!world.front_backends.is_empty()).then(|| {
                world
                    .front_backends
                    .iter()
                    .map(|b| b.address.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        }),
        store: Some(StoreStatus {
            type_: world.store.store.type_,
            data_since: world.store.since.map(conditions::k8s_time),
            endpoints: world.store_endpoints.clone(),
            ready: observed.store_up,
            message: observed.store_problem.clone(),
        }),
        last_roll,
        last_replacement,
        preflight: world.state.preflight.as_ref().map(|p| PreflightStatus {
            version: p.template.version.clone(),
            result: p.result,
            changes: p.changes.clone(),
            started_at: Some(micro_time(p.started_at)),
            copied_at: p.copied_at.map(micro_time),
            launched_at: p.launched_at.map(micro_time),
            completed_at: p.completed_at.map(micro_time),
            message: p.message.clone(),
        }),
        last_snapshot: world.state.backup.as_ref().map(|b| SnapshotStatus {
            request: b.request.clone(),
            path: b.path.clone(),
            bytes: b.bytes,
            taken_at: micro_time(b.taken_at),
        }),
        last_restore: world.state.restore.as_ref().map(restore_status),
        migration: world.observed.migration.as_ref().map(migration_status),
        adoption: world
            .observed
            .adoption
            .as_ref()
            .map(|a| adoption_status(a, world.observed.migration.as_ref())),
        conditions: conditions::merge(previous, &verdicts, generation, observed.now),
    }
}

/// What status says is wrong with a slot, if anything.
fn slot_message(seen: &SlotObservation) -> Option<String> {
    if !seen.running {
        return Some("exited".into());
    }
    if let Some(stop) = seen.stop {
        let what = if stop.killed { "killed" } else { "sent SIGTERM" };
        let listening = if seen.listening {
            ", still listening"
        } else {
            ", stopped listening; draining"
        };
        return Some(format!("{what} ({:?}){listening}", stop.cause));
    }
    if seen.health.unresponsive() {
        return Some(format!(
            "does not answer: it {} ({})",
            seen.health.unresponsive_looks(),
            seen.health.problem.as_deref().unwrap_or("no answer")
        ));
    }
    if !seen.health.ever_ready {
        return Some("starting".into());
    }
    None
}

/// Why a shard whose state file cannot be read is Degraded, and what the user can do about it.
pub const UNREADABLE_REASON: &str = "StateFileUnreadable";

/// The status when the controller cannot read one of its own files (`message` names it): the
/// status last written, with Degraded=True saying why and the phase Degraded. Nothing else is
/// claimed, because nothing else was observed.
pub fn unreadable(
    stored: Option<&KcpShardStatus>,
    generation: Option<i64>,
    message: &str,
    now: DateTime<Utc>,
) -> KcpShardStatus {
    let mut status = stored.cloned().unwrap_or_default();
    let degraded = conditions::Verdict {
        type_: "Degraded",
        status: true,
        reason: UNREADABLE_REASON.into(),
        message: message.into(),
    };
    let condition = conditions::merge(&status.conditions, &[degraded], generation, now).remove(0);
    match status.conditions.iter_mut().find(|c| c.type_ == "Degraded") {
        Some(c) => *c = condition,
        None => status.conditions.push(condition),
    }
    status.phase = Some(crate::api::Phase::Degraded);
    status
}

/// status.lastRoll and status.lastReplacement: the record under way is a replacement's or a
/// roll's, and shows in its own field; the other shows its latest completed one.
fn rolls(state: &ControllerState) -> (Option<RollStatus>, Option<RollStatus>) {
    let shown = |replacement: bool, last: &Option<CompletedRoll>| match (
        state.roll.as_ref().filter(|r| r.replaces.is_some() == replacement),
        last,
    ) {
        (Some(roll), _) => Some(roll_status(roll, None)),
        (None, Some(done)) => Some(roll_status(&done.roll, Some(done.completed_at))),
        (None, None) => None,
    };
    (shown(false, &state.last_roll), shown(true, &state.last_replacement))
}

fn roll_status(roll: &RollRecord, completed_at: Option<DateTime<Utc>>) -> RollStatus {
    RollStatus {
        started_at: Some(micro_time(roll.started_at)),
        new_slot_started_at: roll.new_slot_started_at.map(micro_time),
        new_slot_ready_at: roll.new_slot_ready_at.map(micro_time),
        front_switched_at: roll.front_switched_at.map(micro_time),
        old_slot_stopped_listening_at: roll.old_slot_stopped_listening_at.map(micro_time),
        old_slot_exited_at: roll.old_slot_exited_at.map(micro_time),
        lease_released_at: roll.lease_released_at.map(micro_time),
        probe_succeeded_at: roll.probe_succeeded_at.map(micro_time),
        completed_at: completed_at.map(micro_time),
        from_version: roll.from_version.clone(),
        to_version: Some(roll.to_version.clone()),
        snapshot: roll.snapshot.clone(),
        replaced_slot: roll.replaces.as_ref().map(|g| g.slot.clone()),
        cause: roll.replaces.as_ref().map(|g| g.cause.clone()),
        gone_at: roll.replaces.as_ref().map(|g| micro_time(g.gone_at)),
    }
}

fn restore_status(restore: &RestoreRecord) -> RestoreStatus {
    let known = |s: &str| (!s.is_empty()).then(|| s.to_string());
    RestoreStatus {
        request: restore.request.clone(),
        snapshot: known(&restore.snapshot),
        version: known(&restore.version),
        phase: restore.phase.as_str().into(),
        message: restore.message.clone(),
        requested_at: Some(micro_time(restore.requested_at)),
        restored_at: restore.restored_at.map(micro_time),
        completed_at: restore.completed_at.map(micro_time),
    }
}

fn migration_status(seen: &MigrationObservation) -> MigrationStatus {
    let m = &seen.record;
    let mirror = seen.mirror.as_ref();
    let phase = if m.failure.is_some() {
        "Failed"
    } else if m.completed_at.is_some() {
        "Complete"
    } else if m.switched_at.is_some() {
        "Switched"
    } else if m.switch_started_at.is_some() {
        "Switching"
    } else if mirror.is_some_and(|p| p.phase != crate::store::mirror::MirrorPhase::Copying) {
        "Following"
    } else {
        "Copying"
    };
    let write_pause = m
        .switch_started_at
        .zip(m.switched_at)
        .map(|(from, to)| format!("{:.1}s", (to - from).num_milliseconds() as f64 / 1000.0));
    MigrationStatus {
        phase: phase.into(),
        from: m.from.describe(),
        to: m.to.describe(),
        started_at: micro_time(m.started_at),
        completed_at: m.completed_at.map(micro_time),
        copied_keys: mirror.map(|p| p.copied_keys),
        verified_keys: mirror.and_then(|p| p.verified_keys),
        lag: mirror.filter(|_| m.switched_at.is_none()).map(|p| p.lag),
        write_pause,
        old_store: m.switched_at.map(|_| m.from.describe()),
        message: m.failure.clone(),
    }
}

fn adoption_status(adoption: &AdoptionRecord, migration: Option<&MigrationObservation>) -> AdoptionStatus {
    let move_failure = migration
        .map(|m| &m.record)
        .filter(|m| m.started_at >= adoption.started_at)
        .and_then(|m| m.failure.as_ref());
    let (phase, message) = match (&adoption.refused, move_failure) {
        (Some(refused), _) => ("Failed", Some(refused.clone())),
        (None, Some(failure)) if adoption.switched_at.is_none() => (
            "Failed",
            Some(format!(
                "the move of its data failed, and the old kcp serves on behind the front ({failure})"
            )),
        ),
        _ if adoption.completed_at.is_some() => ("Complete", None),
        _ if adoption.switched_at.is_some() => ("Switched", None),
        _ => ("Serving", None),
    };
    AdoptionStatus {
        phase: phase.into(),
        from: if adoption.from.is_empty() {
            adoption.root_directory.display().to_string()
        } else {
            adoption.from.clone()
        },
        started_at: micro_time(adoption.started_at),
        completed_at: adoption.completed_at.map(micro_time),
        message,
    }
}

/// A merge patch that turns the `previous` status into `status`: every field `previous` has and
/// `status` lacks, at any depth, is sent as null, which a merge patch reads as "remove" (else a new
/// roll would show the last roll's later timestamps). An unchanged status is a no-op on the server.
pub fn as_patch(previous: Option<&KcpShardStatus>, status: &KcpShardStatus) -> Value {
    let new = serde_json::to_value(status).expect("a status serialises");
    let old = previous
        .map(|p| serde_json::to_value(p).expect("a status serialises"))
        .unwrap_or(Value::Null);
    json!({ "status": with_removals(&old, new) })
}

fn with_removals(old: &Value, new: Value) -> Value {
    match (old, new) {
        (Value::Object(old), Value::Object(mut new)) => {
            for (key, old_value) in old {
                match new.remove(key) {
                    Some(new_value) => new.insert(key.clone(), with_removals(old_value, new_value)),
                    None => new.insert(key.clone(), Value::Null),
                };
            }
            Value::Object(new)
        }
        (_, new) => new,
    }
}

fn micro_time(t: DateTime<Utc>) -> MicroTime {
    MicroTime(k8s_time(t).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_state_file_turns_degraded_and_keeps_the_rest_of_the_status() {
        use chrono::TimeZone;
        let t0 = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let stored = KcpShardStatus {
            active_slot: Some("a".into()),
            phase: Some(crate::api::Phase::Ready),
            conditions: conditions::merge(
                &[],
                &[
                    conditions::Verdict {
                        type_: "Ready",
                        status: true,
                        reason: "SlotServing".into(),
                        message: "slot a serves".into(),
                    },
                    conditions::Verdict {
                        type_: "Degraded",
                        status: false,
                        reason: "AsExpected".into(),
                        message: "nothing is blocked".into(),
                    },
                ],
                Some(1),
                t0,
            ),
            ..Default::default()
        };
        let t1 = t0 + chrono::Duration::seconds(5);
        let status = unreadable(
            Some(&stored),
            Some(2),
            "x/controller.json does not parse: move it aside",
            t1,
        );
        assert_eq!(status.phase, Some(crate::api::Phase::Degraded));
        assert_eq!(status.active_slot.as_deref(), Some("a"));
        let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", UNREADABLE_REASON)
        );
        assert!(degraded.message.contains("controller.json"));
        assert_eq!(degraded.last_transition_time, k8s_time(t1));
        assert_eq!(degraded.observed_generation, Some(2));
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready, &stored.conditions[0], "the other conditions stay as they were");
        // Reported again: the transition time stays.
        let again = unreadable(
            Some(&status),
            Some(2),
            &degraded.message,
            t1 + chrono::Duration::seconds(2),
        );
        assert_eq!(again, status);
    }

    #[test]
    fn a_replacement_under_way_or_done_shows_apart_from_the_last_roll() {
        use chrono::TimeZone;
        let t0 = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let roll = |to: &str| RollRecord {
            to_version: to.into(),
            started_at: t0,
            ..Default::default()
        };
        let done = |roll: RollRecord| CompletedRoll {
            roll,
            completed_at: t0 + chrono::Duration::seconds(9),
        };
        let replacement = RollRecord {
            replaces: Some(crate::controller::plan::GoneSlot {
                slot: "a".into(),
                cause: "crashed: signal: 9 (SIGKILL)".into(),
                gone_at: t0,
                template: crate::controller::plan::tests::template("v2"),
            }),
            ..roll("v2")
        };
        let mut state = ControllerState {
            roll: Some(replacement.clone()),
            last_roll: Some(done(roll("v2"))),
            ..Default::default()
        };
        let (last_roll, last_replacement) = rolls(&state);
        assert!(last_roll.unwrap().completed_at.is_some(), "the last roll, done");
        let under_way = last_replacement.unwrap();
        assert_eq!(
            (under_way.replaced_slot.as_deref(), under_way.completed_at),
            (Some("a"), None)
        );
        assert!(under_way.cause.unwrap().starts_with("crashed: "));

        // Done, then a roll begins: each field shows its own.
        state.last_replacement = Some(done(replacement));
        state.roll = Some(roll("v3"));
        let (last_roll, last_replacement) = rolls(&state);
        let last_roll = last_roll.unwrap();
        assert_eq!(
            (last_roll.to_version.as_deref(), last_roll.completed_at),
            (Some("v3"), None)
        );
        assert!(last_roll.replaced_slot.is_none());
        assert!(last_replacement.unwrap().completed_at.is_some());
    }

    #[test]
    fn fields_gone_at_any_depth_are_removed_by_the_patch() {
        let old =
            json!({"activeSlot": "a", "lastRoll": {"startedAt": "t0", "completedAt": "t9"}, "slots": [{"name": "a"}]});
        let new = json!({"lastRoll": {"startedAt": "t1"}, "slots": [{"name": "b"}]});
        let patch = with_removals(&old, new);
        assert_eq!(
            patch,
            json!({"activeSlot": null, "lastRoll": {"startedAt": "t1", "completedAt": null}, "slots": [{"name": "b"}]})
        );
        let mut merged = old.clone();
        json_patch::merge(&mut merged, &patch);
        assert_eq!(
            merged,
            json!({"lastRoll": {"startedAt": "t1"}, "slots": [{"name": "b"}]})
        );
    }
}
