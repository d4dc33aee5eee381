//! The status the controller writes: the user's window on the shard.
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::conditions::{self, k8s_time};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use super::observe::World;
use super::plan::{Desired, FrontObservation, RollRecord, Step};
use crate::api::{FrontStatus, KcpShard, KcpShardStatus, RollStatus, SlotStatus, StoreStatus};

pub fn build(shard: &KcpShard, desired: &Desired, world: &World, next: &Step, failure: Option<&str>) -> KcpShardStatus {
    let observed = &world.observed;
    let verdicts = conditions::verdicts(observed, next, failure);
    let previous = shard.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
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
        front: Some(FrontStatus { listen: Some(shard.spec.front.listen.clone()), backend: world.front_backend_address.clone() }),
        store: Some(StoreStatus {
            type_: shard.spec.store.type_,
            endpoints: world.store_endpoint.clone().into_iter().collect(),
            ready: observed.store_up,
            message: None,
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
        snapshot: None,
    }
}

/// A merge patch that replaces the whole status: fields the status no longer has are sent as null,
/// which a merge patch reads as "remove". An unchanged status is a no-op on the server.
pub fn as_patch(status: &KcpShardStatus) -> Value {
    let mut value = serde_json::to_value(status).expect("a status serialises");
    for field in ["observedGeneration", "phase", "activeSlot", "slots", "front", "store", "lastRoll", "conditions"] {
        value.as_object_mut().expect("a status is an object").entry(field).or_insert(Value::Null);
    }
    json!({ "status": value })
}

fn micro_time(t: DateTime<Utc>) -> MicroTime {
    MicroTime(k8s_time(t).0)
}
