//! Observe: what runs now. Slot processes (by their records: same pid, same start time), each
//! slot's `/readyz` on its own port, the front's backend through its control socket, the store
//! (its shard-wide part, and each running slot's own kine for KinePostgres), and the controller's
//! own record of the roll.
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::runtime::reflector::ObjectRef;

use super::Context;
use super::clients::Identity;
use super::plan::{FrontObservation, Observed, SlotObservation};
use super::state::{ControllerState, ShardDirs, SlotDirs, SlotRecord};
use crate::front::Backend;
use crate::process::{ProcessRecord, Runtime};
use crate::slot::access;

/// How long one `/readyz` may take before the slot counts as not ready.
const READYZ_TIMEOUT: Duration = Duration::from_secs(2);

/// The observation, and the details status shows that the plan does not need.
pub struct World {
    pub observed: Observed,
    pub state: ControllerState,
    pub slots: Vec<ObservedSlot>,
    /// What the front forwards new connections to, as it says (possibly a slot that is gone).
    pub front_backend: Option<Backend>,
    /// The etcd-protocol endpoints the slots dial now (never a password).
    pub store_endpoints: Vec<String>,
}

impl World {
    /// The version of the slot the front forwards to.
    pub fn serving_version(&self) -> Option<String> {
        let FrontObservation::Up { backend: Some(active) } = &self.observed.front else {
            return None;
        };
        self.slots
            .iter()
            .find(|s| &s.record.name == active)
            .map(|s| s.record.template.version.clone())
    }
}

/// A slot with its record and process.
pub struct ObservedSlot {
    pub record: SlotRecord,
    pub process: ProcessRecord,
}

/// The slot's process record; if the controller stopped between starting the process and writing
/// its record, the process is found by its root directory argument and adopted.
fn process_of(slot: &SlotDirs) -> anyhow::Result<Option<ProcessRecord>> {
    if let Some(record) = Runtime::load(&slot.process())? {
        return Ok(Some(record));
    }
    let marker = format!("--root-directory={}", slot.root().display());
    let Some(record) = Runtime::find_by_argument(&marker)
        .into_iter()
        .find_map(Runtime::observe)
    else {
        return Ok(None);
    };
    tracing::info!(pid = record.pid, root = %slot.root().display(), "adopting a slot process that has no record");
    record.save(&slot.process())?;
    Ok(Some(record))
}

/// The version in a kcp binary's path (`bin/kcp-v0.31.2`, `/opt/kcp/v0.31.2/kcp`), if it names one.
fn version_in_path(program: &std::path::Path) -> Option<String> {
    program
        .to_string_lossy()
        .split(['/', '-', '_'])
        .find(|part| crate::api::KcpVersion::parse(part).is_ok())
        .map(str::to_string)
}

/// A slot that has no record while its kcp runs (its `slot.json` was moved aside because it did
/// not parse): the record is rebuilt from the process's argv (port, binary, front URL, shutdown
/// delay) and saved. What argv does not tell (the restartedAt annotation, which arguments were
/// extra) is lost, so the rebuilt template matches no spec and the plan replaces the slot by a
/// roll: starting a slot under its name instead would stop it first, and the shard with it.
fn rebuild_record(ctx: &Context, slot: &SlotDirs, name: &str) -> anyhow::Result<Option<SlotRecord>> {
    let Some(process) = process_of(slot)? else {
        return Ok(None);
    };
    if !ctx.runtime.is_running(&process) {
        return Ok(None);
    }
    let Some(record) = record_from_argv(name, &process) else {
        return Ok(None);
    };
    tracing::warn!(
        slot = name,
        pid = process.pid,
        port = record.port,
        "a slot runs without a record: rebuilt it from its process; it will be replaced by a roll"
    );
    slot.save(&record)?;
    Ok(Some(record))
}

/// A slot record from a slot's kcp command line (see [`rebuild_record`]); None without a port.
fn record_from_argv(name: &str, process: &ProcessRecord) -> Option<SlotRecord> {
    let flag = |name: &str| {
        let prefix = format!("--{name}=");
        process
            .args
            .iter()
            .find_map(|a| a.strip_prefix(&prefix))
            .map(str::to_string)
    };
    Some(SlotRecord {
        name: name.to_string(),
        template: super::plan::SlotTemplate {
            version: version_in_path(&process.program).unwrap_or_else(|| "unknown".into()),
            binary: process.program.display().to_string(),
            extra_args: vec![],
            shutdown_delay: flag("shutdown-delay-duration").unwrap_or_default(),
            front_url: flag("shard-base-url").unwrap_or_default(),
            restarted_at: Some(REBUILT.into()),
        },
        port: flag("secure-port")?.parse().ok()?,
        created_at: process.started_at.parse().unwrap_or_else(|_| Utc::now()),
    })
}

/// The restartedAt of a rebuilt slot record: no spec has it, so the slot is rolled away.
pub const REBUILT: &str = "unknown: the slot record was rebuilt from the running process";

pub async fn observe(ctx: &Context, shard: &crate::api::KcpShard, dirs: &ShardDirs) -> anyhow::Result<World> {
    let state = dirs.load_state()?;
    let store = ctx.store(shard, dirs).map_err(|e| e.to_string());
    let mut store_status = match &store {
        Ok(store) => store.check(&ctx.runtime).await,
        Err(e) => Err(e.clone()),
    };
    let front = ctx.front(shard, dirs)?;
    let front_seen = front.observe().await;
    let front_elsewhere = front_seen.as_ref().is_ok_and(|seen| seen.listen != front.listen());
    let mut front_backend = front_seen.as_ref().ok().and_then(|seen| seen.backend.clone());
    let mut slots = Vec::new();
    let mut observations = Vec::new();
    let mut records = dirs.slot_records()?;
    for name in super::plan::SLOT_NAMES {
        if records.iter().all(|r| r.name != name)
            && let Some(record) = rebuild_record(ctx, &dirs.slot(name), name)?
        {
            records.push(record);
        }
    }
    for record in records {
        let slot_dirs = dirs.slot(&record.name);
        let Some(process) = process_of(&slot_dirs)? else {
            // Decided but never started (the controller stopped in between): nothing runs.
            slot_dirs.forget()?;
            continue;
        };
        let running = ctx.runtime.is_running(&process);
        // A running slot whose own kine is down has no store (KinePostgres): EnsureStore brings
        // the kine back on the port the slot dials.
        if running && let (Ok(store), Ok(seen)) = (&store, &mut store_status) {
            match store
                .running_slot_kine(&ctx.runtime, &slot_dirs.store(), &record.name)
                .await
            {
                Some(own) => own.iter().for_each(|kine| seen.add(kine)),
                None => store_status = Err(format!("the kine of slot {} does not run", record.name)),
            }
        }
        if running {
            ctx.exits.watch(process.pid, ObjectRef::from_obj(shard));
        }
        let ready = running && slot_ready(ctx, &slot_dirs.admin_kubeconfig(), record.port).await;
        let started_at = process.started_at.parse::<DateTime<Utc>>().unwrap_or(record.created_at);
        observations.push(SlotObservation {
            name: record.name.clone(),
            template: record.template.clone(),
            running,
            ready,
            started_at,
        });
        slots.push(ObservedSlot { record, process });
    }
    // A caddy names an address, not a slot: the slot is the one recorded on that port.
    if let Some(backend) = front_backend.as_mut().filter(|b| b.slot.is_empty())
        && let Some(slot) = slots.iter().find(|s| s.record.port == backend.address.port())
    {
        backend.slot = slot.record.name.clone();
    }
    // The front forwards to a slot only if that slot, as recorded now, listens where the front
    // sends: a slot replaced under the same name (after a crash) is on another port.
    let front_observation = match &front_seen {
        Err(_) => FrontObservation::Down,
        Ok(_) => FrontObservation::Up {
            backend: front_backend
                .as_ref()
                .filter(|b| {
                    slots
                        .iter()
                        .any(|s| s.record.name == b.slot && b.address.port() == s.record.port)
                })
                .map(|b| b.slot.clone()),
        },
    };
    // Any of these exiting wakes the controller for this shard at once (see process::exits).
    let store_pids = store_status.iter().flat_map(|seen| &seen.pids);
    let front_pid = front_seen.as_ref().ok().and_then(|seen| seen.pid);
    for pid in store_pids.chain(&front_pid) {
        ctx.exits.watch(*pid, ObjectRef::from_obj(shard));
    }
    let observed = Observed {
        now: Utc::now(),
        store_up: store_status.is_ok(),
        store_processes_up: store_status.is_ok() && store.as_ref().is_ok_and(|s| s.runs_processes()),
        store_problem: store_status.as_ref().err().cloned(),
        snapshot_for: state.snapshot.as_ref().map(|s| s.template.clone()),
        front: front_observation,
        front_outdated: front_seen.as_ref().is_ok_and(|seen| seen.outdated),
        front_problem: front_seen.err(),
        front_ours: front.is_ours(),
        front_elsewhere,
        slots: observations,
        roll: state.roll.clone(),
        blocked: state.blocked.clone(),
    };
    Ok(World {
        observed,
        state,
        slots,
        front_backend,
        store_endpoints: store_status.map(|seen| seen.endpoints).unwrap_or_default(),
    })
}

/// `/readyz` on the slot's own port with the shard-admin credentials, never through the front
/// (docs/background.md section 5: readiness read through the front flipped clients to a slot that
/// was not ready).
async fn slot_ready(ctx: &Context, admin_kubeconfig: &std::path::Path, port: u16) -> bool {
    let Ok(client) = ctx.slot_clients.get(admin_kubeconfig, port, Identity::ShardAdmin).await else {
        return false;
    };
    matches!(
        tokio::time::timeout(READYZ_TIMEOUT, access::readyz(&client)).await,
        Ok(Ok(true))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_record_is_rebuilt_from_its_kcp_command_line_and_matches_no_spec() {
        let process = ProcessRecord {
            pid: 4242,
            start_time: 1,
            program: "/work/bin/kcp-v0.31.2".into(),
            args: [
                "start",
                "--root-directory=/s/shards/dev/slots/b/root",
                "--bind-address=127.0.0.1",
                "--secure-port=40123",
                "--shard-base-url=https://127.0.0.1:6443",
                "--shutdown-delay-duration=2s",
                "--v=2",
            ]
            .map(String::from)
            .to_vec(),
            started_at: "2026-05-01T10:00:00Z".into(),
            unit: None,
            log: None,
            stop_signal: None,
        };
        let record = record_from_argv("b", &process).unwrap();
        assert_eq!((record.name.as_str(), record.port), ("b", 40123));
        assert_eq!(record.template.version, "v0.31.2");
        assert_eq!(record.template.binary, "/work/bin/kcp-v0.31.2");
        assert_eq!(record.template.front_url, "https://127.0.0.1:6443");
        assert_eq!(record.template.shutdown_delay, "2s");
        assert_eq!(record.template.restarted_at.as_deref(), Some(REBUILT));
        assert_eq!(record.created_at.to_rfc3339(), "2026-05-01T10:00:00+00:00");

        assert_eq!(
            version_in_path(std::path::Path::new("/opt/kcp/v0.32.3/kcp")).as_deref(),
            Some("v0.32.3")
        );
        assert_eq!(version_in_path(std::path::Path::new("/usr/local/bin/kcp")), None);
        let no_port = ProcessRecord {
            args: vec!["start".into()],
            ..process
        };
        assert!(record_from_argv("b", &no_port).is_none(), "no port, no slot");
    }
}
