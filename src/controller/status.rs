//! The status the controller writes: the user's window on the shard.
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::conditions::{self, k8s_time};
use super::observe::World;
use super::plan::{Desired, FrontObservation, RollRecord, Step};
use crate::api::{FrontStatus, KcpShard, KcpShardStatus, RollStatus, SlotStatus, StoreStatus};
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
    let verdicts = conditions::verdicts(observed, next, failure);
    let previous = stored.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = shard.metadata.generation;
    let active = match &observed.front {
        FrontObservation::Up { backend } => backend.clone(),
        FrontObservation::Down => None,
    };
    let slots = world
        .slots
        .iter()
        .zip(&observed.slots)
        .map(|(slot, seen)| SlotStatus {
            name: slot.record.name.clone(),
            version: slot.record.template.version.clone(),
            pid: seen.running.then_some(slot.process.pid),
            port: Some(slot.record.port),
            ready: seen.ready,
            started_at: Some(k8s_time(seen.started_at)),
        })
        .collect();
    let last_roll = match (&world.state.roll, &world.state.last_roll) {
        (Some(roll), _) => Some(roll_status(roll, None)),
        (None, Some(done)) => Some(roll_status(&done.roll, Some(done.completed_at))),
        (None, None) => None,
    };
    KcpShardStatus {
        observed_generation: generation,
        phase: Some(conditions::phase(&verdicts, desired.deleting)),
        active_slot: active,
        slots,
        front: Some(FrontStatus {
            listen: Some(shard.spec.front.listen.clone()),
            backend: world.front_backend.as_ref().map(|b| b.address.to_string()),
        }),
        store: Some(StoreStatus {
            type_: shard.spec.store.type_,
            endpoints: world.store_endpoints.clone(),
            ready: observed.store_up,
            message: observed.store_problem.clone(),
        }),
        last_roll,
        conditions: conditions::merge(previous, &verdicts, generation, observed.now),
    }
}

fn roll_status(roll: &RollRecord, completed_at: Option<DateTime<Utc>>) -> RollStatus {
    RollStatus {
        started_at: Some(micro_time(roll.started_at)),
        new_slot_started_at: roll.new_slot_started_at.map(micro_time),
        new_slot_ready_at: roll.new_slot_ready_at.map(micro_time),
        front_switched_at: roll.front_switched_at.map(micro_time),
        old_slot_exited_at: roll.old_slot_exited_at.map(micro_time),
        lease_released_at: roll.lease_released_at.map(micro_time),
        probe_succeeded_at: roll.probe_succeeded_at.map(micro_time),
        completed_at: completed_at.map(micro_time),
        from_version: roll.from_version.clone(),
        to_version: Some(roll.to_version.clone()),
        snapshot: roll.snapshot.clone(),
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
