//! Observe: what runs now. Slot processes (by their records: same pid, same start time), each
//! slot's `/readyz` on its own port, the front's backend through its control socket, the store
//! (its shard-wide part, and each running slot's own kine for KinePostgres), and the controller's
//! own record of the roll.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Context;
use super::clients::Identity;
use super::plan::{FrontObservation, Observed, SlotObservation};
use super::state::{ControllerState, ShardDirs, SlotDirs, SlotRecord};
use crate::front::{Backend, FrontClient};
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

pub async fn observe(
    ctx: &Context,
    shard: &crate::api::KcpShard,
    dirs: &ShardDirs,
    front_listen: std::net::SocketAddr,
) -> anyhow::Result<World> {
    let state = dirs.load_state()?;
    let store = ctx.store(shard, dirs).map_err(|e| e.to_string());
    let mut store_status = match &store {
        Ok(store) => store.check(&ctx.runtime).await,
        Err(e) => Err(e.clone()),
    };
    let front_status = match FrontClient::connect(&dirs.front()).await {
        Ok(client) => client.status().await.ok(),
        Err(_) => None,
    };
    let front_elsewhere = front_status
        .as_ref()
        .is_some_and(|status| status.listen != front_listen);
    let front_backend = front_status.as_ref().and_then(|status| status.backend.clone());
    let mut slots = Vec::new();
    let mut observations = Vec::new();
    for record in dirs.slot_records()? {
        let slot_dirs = dirs.slot(&record.name);
        let Some(process) = process_of(&slot_dirs)? else {
            // Decided but never started (the controller stopped in between): nothing runs.
            slot_dirs.forget()?;
            continue;
        };
        let running = ctx.runtime.is_running(&process);
        // A running slot whose own kine is down has no store (KinePostgres): EnsureStore brings
        // the kine back on the port the slot dials.
        if running && let (Ok(store), Ok(endpoints)) = (&store, &mut store_status) {
            match store
                .running_slot_kine(&ctx.runtime, &slot_dirs.store(), &record.name)
                .await
            {
                Some(own) => endpoints.extend(own),
                None => store_status = Err(format!("the kine of slot {} does not run", record.name)),
            }
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
    // The front forwards to a slot only if that slot, as recorded now, listens where the front
    // sends: a slot replaced under the same name (after a crash) is on another port.
    let front = match &front_status {
        None => FrontObservation::Down,
        Some(_) => FrontObservation::Up {
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
    let observed = Observed {
        now: Utc::now(),
        store_up: store_status.is_ok(),
        store_processes_up: store_status.is_ok() && store.as_ref().is_ok_and(|s| s.runs_processes()),
        store_problem: store_status.as_ref().err().cloned(),
        snapshot_for: state.snapshot.as_ref().map(|s| s.template.clone()),
        front,
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
        store_endpoints: store_status.unwrap_or_default(),
    })
}

/// `/readyz` on the slot's own port with the shard-admin credentials, never through the front
/// (research section 5, run 1: readiness read through the front flipped clients to a slot that was
/// not ready).
async fn slot_ready(ctx: &Context, admin_kubeconfig: &std::path::Path, port: u16) -> bool {
    let Ok(client) = ctx.slot_clients.get(admin_kubeconfig, port, Identity::ShardAdmin).await else {
        return false;
    };
    matches!(
        tokio::time::timeout(READYZ_TIMEOUT, access::readyz(&client)).await,
        Ok(Ok(true))
    )
}
