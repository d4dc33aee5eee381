//! The steps that finish a roll: the controllers' Lease, the probe workspace, the record.

use chrono::Utc;
use kube::ResourceExt;

use super::Actor;
use super::Notes;
use crate::controller::Note;
use crate::controller::clients::Identity;
use crate::controller::error::Error;
use crate::controller::plan::{GoneSlot, ProbeRecord};
use crate::controller::state::CompletedRoll;
use crate::slot;

/// What ReleaseLease did to the controllers' Lease.
enum Released {
    Handed,
    TakenMeanwhile,
    Deleted,
    NoLease,
}

impl Actor<'_> {
    pub(super) async fn release_lease(&self, holder: Option<&str>, to: &str) -> Result<Notes, Error> {
        let client = self.world.slot_client(self.ctx, to, Identity::ShardAdmin).await?;
        let successor = match self.world.slot(to).and_then(|s| s.process.as_ref()) {
            Some(process) => self.ctx.identity(process).await,
            None => None,
        };
        let release = async move {
            Ok(match &successor {
                Some(identity) if slot::access::hand_controllers_lease(&client, identity).await? => Released::Handed,
                Some(_) => Released::TakenMeanwhile,
                // Every slot that answered /readyz has logged its identity (controller/lease.rs):
                // should one not have, the first candidate to try after the DELETE leads.
                None if slot::access::release_controllers_lease(&client).await? => Released::Deleted,
                None => Released::NoLease,
            })
        };
        let Some(released) = self.ask(to, release).await? else {
            return Ok(vec![]);
        };
        // The holder stopped listening (or exited): from then on no slot could lead until now.
        let stopped_listening = holder
            .and_then(|h| self.world.observed.slot(h))
            .and_then(|h| h.stopped_listening_at);
        self.update_roll(|roll| {
            roll.lease_released_at = Some(Utc::now());
            if let Some(at) = stopped_listening {
                roll.old_slot_stopped_listening_at = Some(at);
            }
        })?;
        let whose = match holder.and_then(|h| self.world.observed.slot(h)) {
            Some(h) if !h.running => format!("held by slot {}, which is gone", h.name),
            Some(h) => format!(
                "held by slot {}, which stopped listening and can no longer renew it",
                h.name
            ),
            None => "held by a kcp that no longer runs".to_string(),
        };
        let lease = "Lease kube-system/kcp-controllers";
        let message = match released {
            Released::Handed => format!(
                "handed {lease} ({whose}) to slot {to}, which serves: it leads at its next election retry (2-4.4 s), before any slot that starts meanwhile"
            ),
            Released::TakenMeanwhile => {
                format!("{lease} ({whose}) changed while it was handed to slot {to}: a kcp took it")
            }
            Released::Deleted => format!(
                "deleted {lease} ({whose}) through slot {to}, whose identity is not known, so that a serving slot leads at once"
            ),
            Released::NoLease => format!("no {lease} to release"),
        };
        Ok(vec![Note::normal("LeaseReleased", message)])
    }

    pub(super) async fn probe(&self) -> Result<Notes, Error> {
        // A non-root shard serves no `root` workspace to create one in: its new leader is proven
        // by the controllers Lease it holds (an empty probe workspace; observe.rs).
        if self.desired.template.sharded.as_ref().is_some_and(|s| !s.is_root()) {
            self.update_roll(|roll| {
                roll.probe = Some(ProbeRecord {
                    workspace: String::new(),
                    created_at: Utc::now(),
                })
            })?;
            return Ok(vec![]);
        }
        let (through, client) = self.world.serving_client(self.ctx, Identity::Admin).await?;
        let stale = self.world.state.roll.as_ref().and_then(|r| r.probe.clone());
        let create = {
            let client = client.clone();
            async move { Ok(slot::access::create_probe_workspace(&client).await?) }
        };
        let Some(workspace) = self.ask(&through, create).await? else {
            return Ok(vec![]);
        };
        self.update_roll(|roll| {
            roll.probe = Some(ProbeRecord {
                workspace,
                created_at: Utc::now(),
            })
        })?;
        if let Some(stale) = stale {
            delete_probe_workspace(client, stale.workspace.clone());
            return Ok(vec![Note::warning(
                "ProbeSlow",
                format!(
                    "probe workspace {} did not reach Ready within {:?}: is a slot leading kcp's controllers? Trying a new one",
                    stale.workspace,
                    crate::controller::plan::PROBE_TIMEOUT
                ),
            )]);
        }
        Ok(vec![])
    }

    pub(super) async fn probe_succeeded(&self) -> Result<Notes, Error> {
        let Some(probe) = self.world.state.roll.as_ref().and_then(|r| r.probe.clone()) else {
            return Ok(vec![]);
        };
        let now = Utc::now();
        self.update_roll(|roll| roll.probe_succeeded_at = Some(now))?;
        if probe.workspace.is_empty() {
            return Ok(vec![Note::normal(
                "ProbeSucceeded",
                format!(
                    "a new slot holds the controllers Lease {:.2}s after the probe began: it leads kcp's controllers",
                    (now - probe.created_at).num_milliseconds() as f64 / 1000.0
                ),
            )]);
        }
        if let Ok((_, client)) = self.world.serving_client(self.ctx, Identity::Admin).await {
            delete_probe_workspace(client, probe.workspace.clone());
        }
        Ok(vec![Note::normal(
            "ProbeSucceeded",
            format!(
                "a probe workspace reached Ready {:.2}s after it was created: a leader runs kcp's controllers",
                (now - probe.created_at).num_milliseconds() as f64 / 1000.0
            ),
        )])
    }

    pub(super) fn complete_roll(&self) -> Result<Notes, Error> {
        let mut state = self.dirs.load_state()?;
        let Some(mut roll) = state.roll.take() else {
            return Ok(vec![]);
        };
        // The spec may have changed mid-roll: the record names what serves now.
        if let Some(serving) = self.world.serving_version() {
            roll.to_version = serving;
        }
        let completed = CompletedRoll {
            roll,
            completed_at: Utc::now(),
        };
        let serving = self.world.observed.front.backends().join(", ");
        if let Some(gone) = &completed.roll.replaces {
            let message = replacement_summary(&completed, gone, &serving);
            state.last_replacement = Some(completed);
            self.dirs.save_state(&state)?;
            return Ok(vec![Note::normal("SlotReplaced", message)]);
        }
        let message = roll_summary(&completed, &serving);
        state.last_roll = Some(completed);
        self.dirs.save_state(&state)?;
        // Counted once it is recorded: a failed save retries the step, and must not count twice.
        if let Some(completed) = &state.last_roll {
            self.ctx.metrics.roll_completed(&self.shard.name_any(), completed);
        }
        Ok(vec![Note::normal("RollComplete", message)])
    }
}

fn replacement_summary(done: &CompletedRoll, gone: &GoneSlot, serving: &str) -> String {
    let r = &done.roll;
    let since = |t: Option<chrono::DateTime<Utc>>| {
        t.map(|t| format!("{:.2}s", (t - gone.gone_at).num_milliseconds() as f64 / 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "replaced slot {} ({}) with a slot of kcp {}, slots {serving} serve; after its records went: new slot started {}, ready {}, in the front {}, done {}",
        gone.slot,
        gone.cause,
        r.to_version,
        since(r.new_slot_started_at),
        since(r.new_slot_ready_at),
        since(r.front_switched_at),
        since(Some(done.completed_at)),
    )
}

fn roll_summary(done: &CompletedRoll, serving: &str) -> String {
    let r = &done.roll;
    let since = |t: Option<chrono::DateTime<Utc>>| {
        t.map(|t| format!("{:.2}s", (t - r.started_at).num_milliseconds() as f64 / 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    let what = match &r.from_version {
        Some(from) => format!("rolled {from} to {}", r.to_version),
        None => format!("started {}", r.to_version),
    };
    format!(
        "{what}, slots {serving} serve: new slot ready {}, front switched {}, old slot stopped listening {}, lease released {}, probe Ready {}, old slot exited {}, done {}",
        since(r.new_slot_ready_at),
        since(r.front_switched_at),
        since(r.old_slot_stopped_listening_at),
        since(r.lease_released_at),
        since(r.probe_succeeded_at),
        since(r.old_slot_exited_at),
        since(Some(done.completed_at)),
    )
}

/// Deletes a probe workspace nothing waits for, beside the reconcile: a failure is only logged
/// (it stays as an empty workspace).
fn delete_probe_workspace(client: kube::Client, workspace: String) {
    tokio::spawn(async move {
        if let Err(e) = slot::access::delete_workspace(&client, &workspace).await {
            tracing::warn!(%workspace, error = %e, "could not delete the probe workspace");
        }
    });
}
