//! The steps that stop the shard's processes other than its kcp slots (plan/stopping.rs): each
//! records which processes it asks to stop and until when they may take, sends the stop and
//! returns; later looks see them exit, and KillStopping sends SIGKILL to one past its grace.
use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;

use super::Note;
use super::act::{Actor, Notes};
use super::error::Error;
use super::plan::{ProcessStop, Stopping};
use crate::front;
use crate::process::{ProcessRecord, Runtime, UnitName};
use crate::store::kine;

/// StopStore: the shard-wide store's processes (a KineSqlite store's kine, a managed PostgreSQL).
pub async fn stop_store(actor: &Actor<'_>) -> Result<Notes, Error> {
    let processes = actor.store()?.processes(&actor.ctx.runtime)?;
    send(actor, Stopping::Store, processes).await?;
    Ok(vec![])
}

/// StopSlotStore: the own kine of slot `name`, whose kcp is gone.
pub async fn stop_slot_store(actor: &Actor<'_>, name: &str) -> Result<Notes, Error> {
    let slot_dir = actor.dirs.slot(name).store();
    let processes = actor
        .slot_store(name)?
        .slot_processes(&actor.ctx.runtime, &slot_dir, name)?;
    let what = Stopping::SlotStore { slot: name.to_string() };
    send(actor, what, processes).await?;
    Ok(vec![])
}

/// StopOrphanedKine: a kine of the shard that serves nothing it uses, and its record (the stop's
/// record names it until it exits). Its data stays.
pub async fn stop_orphaned_kine(actor: &Actor<'_>, record: &str) -> Result<Notes, Error> {
    let Some(kine) = Runtime::load(Path::new(record))?.filter(|k| actor.ctx.runtime.is_running(k)) else {
        return Ok(vec![]);
    };
    let pid = kine.pid;
    let what = Stopping::OrphanedKine {
        record: record.to_string(),
    };
    send(actor, what, vec![(kine, kine::STOP_GRACE)]).await?;
    crate::fsutil::remove_if_there(Path::new(record))?;
    Ok(vec![Note::normal(
        "OrphanedKineStopped",
        format!("stopping kine (pid {pid}, {record}), which serves no store or slot the shard uses; its data stays"),
    )])
}

/// StopFront: the last of a deletion. The front drains its connections, then exits.
pub async fn stop_front(actor: &Actor<'_>) -> Result<Notes, Error> {
    let front = actor.ctx.front(actor.shard, actor.dirs)?;
    match front.process() {
        Some(process) => send(actor, Stopping::Front, vec![(process, front::STOP_TIMEOUT)]).await?,
        // A unit between a crash and its restart has no process to stop, and would come back.
        None => {
            actor
                .ctx
                .runtime
                .stop_unit(&UnitName::front(&actor.shard.name_any()))
                .await
        }
    }
    Ok(vec![Note::normal(
        "Stopped",
        format!(
            "stopped the slots and the store's processes and asked the front to stop (it drains its connections first); the data stays in {}",
            actor.dirs.root().display()
        ),
    )])
}

/// MoveFront: spec.front.listen names another address than the front's. Once the new address is
/// known to be free, the old front is asked to stop: it closes its listening socket at once and
/// drains its open connections; EnsureFront starts the new one once it is gone.
pub async fn move_front(actor: &Actor<'_>) -> Result<Notes, Error> {
    let front = actor.ctx.front(actor.shard, actor.dirs)?;
    let listen = front.listen();
    super::front::address_free(listen)?;
    let Some(process) = front.process() else {
        return Ok(vec![]);
    };
    send(actor, Stopping::Front, vec![(process, front::STOP_TIMEOUT)]).await?;
    Ok(vec![Note::normal(
        "FrontMoving",
        format!(
            "the front moves to {listen}: the old one stopped accepting and drains its open connections (it is killed if it has not exited within {}s), then the new one starts",
            front::STOP_TIMEOUT.as_secs()
        ),
    )])
}

/// Records that `processes` are asked to stop, then sends each its stop: a serve that stops in
/// between finds the record, and the plan kills what outlives its grace.
pub(super) async fn send(
    actor: &Actor<'_>,
    what: Stopping,
    processes: Vec<(ProcessRecord, Duration)>,
) -> Result<(), Error> {
    let now = Utc::now();
    let mut state = actor.dirs.load_state()?;
    // Stops whose process has exited are done with (ForgetKilled takes those it killed); this
    // thing's earlier ones are replaced.
    let (stopping, killed) = (&actor.world.observed.stopping, &actor.world.observed.killed_and_gone);
    state
        .stops
        .retain(|s| killed.contains(s) || (s.what != what && stopping.contains(s)));
    state.stops.extend(processes.iter().map(|(process, grace)| ProcessStop {
        what: what.clone(),
        pid: process.pid,
        start_time: process.start_time,
        sent_at: now,
        kill_at: now + *grace,
        killed: false,
        unit: process.unit.clone(),
    }));
    actor.dirs.save_state(&state)?;
    for (process, _) in &processes {
        tracing::info!(pid = process.pid, %what, "asking to stop");
        actor.ctx.runtime.send_stop(process).await?;
    }
    Ok(())
}

/// KillStopping: SIGKILL to the processes of `what` that outlived their grace.
pub async fn kill(actor: &Actor<'_>, what: &Stopping) -> Result<Notes, Error> {
    let now = Utc::now();
    let overdue: Vec<ProcessStop> = actor
        .world
        .observed
        .stopping
        .iter()
        .filter(|s| &s.what == what && !s.killed && now >= s.kill_at)
        .cloned()
        .collect();
    let mut state = actor.dirs.load_state()?;
    for stop in state.stops.iter_mut().filter(|s| overdue.contains(s)) {
        stop.killed = true;
    }
    actor.dirs.save_state(&state)?;
    let mut notes = Vec::new();
    for stop in overdue {
        let Some(process) = Runtime::observe(stop.pid).filter(|p| p.start_time == stop.start_time) else {
            continue;
        };
        actor.ctx.runtime.kill(&process).await?;
        let grace = (stop.kill_at - stop.sent_at).num_seconds();
        notes.push(Note::warning(
            "KilledAfterGrace",
            format!(
                "{what} (pid {}) did not exit within {grace}s of its stop signal; sent it SIGKILL",
                stop.pid
            ),
        ));
    }
    Ok(notes)
}

/// ForgetKilled: drops the records of stops that ended in SIGKILL whose process has exited, and
/// under systemd resets the failed state the kill left on each one's unit (a failed unit stays
/// listed by `systemctl --failed` and in monitoring that alerts on failed units).
pub async fn forget_killed(actor: &Actor<'_>) -> Result<Notes, Error> {
    let gone = &actor.world.observed.killed_and_gone;
    for unit in gone
        .iter()
        .filter_map(|s| s.unit.as_deref())
        .filter_map(UnitName::parse)
    {
        actor.ctx.runtime.forget_unit(&unit).await;
    }
    let mut state = actor.dirs.load_state()?;
    state.stops.retain(|s| !gone.contains(s));
    actor.dirs.save_state(&state)?;
    Ok(vec![])
}
