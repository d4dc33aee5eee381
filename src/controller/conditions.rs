//! Conditions and phase: what a user reads with `kubectl get ks` and `kubectl describe`, computed
//! from what was observed and the step the plan chose. Pure, so the rules are tested as a table.
//!
//! - Ready: the front forwards to a slot that answers `/readyz`; on a first start (nothing served
//!   before it) of a lone shard, also a probe workspace got Ready (reason FirstStart until then).
//!   It stays True
//!   during a roll, because the shard keeps serving through the old slot.
//! - Progressing: a step is under way (a roll, a first start, a replacement).
//! - Degraded: a roll is blocked, or a step failed; the message says what to fix.
//! - StoreReady, FrontReady: the store accepts connections; the front runs and has a backend.
//!
//! `lastTransitionTime` changes only when a condition's status does (metav1.Condition rules), and
//! every condition carries the generation it describes.
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::Phase;

use super::plan::{
    Desired, FrontObservation, KillCause, LeaseHolder, Observed, RestartCause, RestorePhase, SlotObservation, Step,
    Stopping, Wait, started_across_a_store_outage,
};

/// A condition as computed, before times and generation are stamped on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

fn verdict(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Verdict {
    Verdict {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

fn names(slots: &[&SlotObservation]) -> String {
    slots.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
}

/// The five conditions, from the observation, the chosen step, and the error of the last step if it
/// failed.
pub fn verdicts(desired: &Desired, observed: &Observed, step: &Step, failure: Option<&str>) -> Vec<Verdict> {
    let behind: Vec<&SlotObservation> = observed
        .front
        .backends()
        .iter()
        .filter_map(|b| observed.slot(b))
        .collect();
    let serving: Vec<&SlotObservation> = behind.iter().copied().filter(|s| s.can_stay()).collect();
    let unresponsive: Vec<&SlotObservation> = behind.iter().copied().filter(|s| s.health.unresponsive()).collect();
    let hung_alone = serving.is_empty() && !unresponsive.is_empty();
    let hung_message = || {
        let s = unresponsive[0];
        format!(
            "slot {} is the only slot behind the front and fails /readyz on its own port ({}); the front keeps forwarding to it, and it is killed and replaced once it has answered nothing at all (not even /livez/ping) and done next to no work (CPU) for spec.rollout.livenessTimeout",
            s.name,
            s.health.problem.as_deref().unwrap_or("no answer")
        )
    };
    let ready = if !serving.is_empty() {
        let mut versions: Vec<&str> = serving.iter().map(|s| s.template.version.as_str()).collect();
        versions.dedup();
        verdict(
            "Ready",
            true,
            "SlotServing",
            format!(
                "{} {} ({}) {} through the front",
                if serving.len() == 1 { "slot" } else { "slots" },
                names(&serving),
                versions.join(", "),
                if serving.len() == 1 { "serves" } else { "serve" },
            ),
        )
    } else if hung_alone {
        verdict("Ready", false, "SlotUnresponsive", hung_message())
    } else if matches!(
        observed.front,
        FrontObservation::Down | FrontObservation::Starting | FrontObservation::Unresponsive
    ) {
        verdict(
            "Ready",
            false,
            "FrontDown",
            "the front is not running or does not answer",
        )
    } else {
        verdict("Ready", false, "NoSlotReady", "no ready slot behind the front yet")
    };
    // A first start (nothing served before it) is Ready once a probe workspace got Ready: kcp may
    // answer /readyz and still refuse workspaces for a moment (kcp v0.30.0 under load answered 403
    // "parent type cannot be resolved: workspacetypes.tenancy.kcp.io \"root:root\" not found"
    // after its /readyz turned ok), and a user who waited for Ready means to use it. Not for a
    // shard of a sharded kcp: the other shards start once the root is Ready, and the root's probe
    // workspace did not get Ready before they ran (e2e_sharded, 2026-12-04: 4 min without).
    let lone = desired.template.sharded.is_none();
    let ready = match &observed.roll {
        Some(roll) if ready.status && lone && roll.from_version.is_none() && roll.probe_succeeded_at.is_none() => {
            verdict(
                "Ready",
                false,
                "FirstStart",
                format!(
                    "{}, but kcp's controllers are not known to run yet: Ready once a probe workspace is",
                    ready.message
                ),
            )
        }
        _ => ready,
    };
    // A restore is a planned outage: until a slot serves the restored data, Ready says so.
    let restoring = observed.restore.as_ref().filter(|r| r.under_way());
    let ready = match restoring {
        Some(r) if serving.is_empty() => verdict(
            "Ready",
            false,
            "Restoring",
            format!(
                "the shard is down for a restore of {}: {}",
                r.file_name(),
                match r.phase {
                    RestorePhase::Stopping => "every slot stops, then the snapshot is restored".to_string(),
                    _ => format!("restored; kcp {} starts on the restored data", r.version),
                }
            ),
        ),
        _ => ready,
    };
    let first_start = observed.roll.as_ref().is_some_and(|r| r.from_version.is_none());
    let (progressing, mut degraded) = match step {
        Step::Blocked { cause } | Step::AbortRoll { cause, .. } => (
            verdict("Progressing", false, "RollBlocked", cause.message()),
            verdict("Degraded", true, cause.reason(), cause.message()),
        ),
        Step::Idle => (
            verdict("Progressing", false, "RollComplete", "the shard runs the desired spec"),
            healthy(),
        ),
        Step::Wait(Wait::JobRetry { .. }) => {
            let message = progress_message(step, observed);
            (
                verdict("Progressing", true, "AwaitingJobRetry", message.clone()),
                verdict("Degraded", true, "JobFailed", message),
            )
        }
        other => match restoring {
            Some(r) => (
                verdict(
                    "Progressing",
                    true,
                    "Restoring",
                    format!("restoring {}: {}", r.file_name(), progress_message(other, observed)),
                ),
                healthy(),
            ),
            None => match catching_up(observed, other) {
                Some(message) => (
                    verdict("Progressing", true, "ControllersCatchingUp", message),
                    healthy(),
                ),
                None => (
                    verdict(
                        "Progressing",
                        true,
                        progress_reason(other),
                        progress_message(other, observed),
                    ),
                    healthy(),
                ),
            },
        },
    };
    // A new slot that a store outage caught mid-start is started again (plan's not_ready_yet),
    // not replaced as broken: its 404s are the outage's.
    let broken: Vec<&SlotObservation> = observed
        .slots
        .iter()
        .filter(|s| s.running && s.health.broken() && !started_across_a_store_outage(observed, s))
        .collect();
    if degraded == healthy() {
        if let Some(refused) = &observed.store_refused {
            degraded = verdict("Degraded", true, "StoreChangeRefused", refused.clone());
        } else if let Some(s) = broken.first() {
            degraded = verdict(
                "Degraded",
                true,
                "SlotBroken",
                format!(
                    "slot {} answers /readyz but not kcp's own APIs ({}); it is replaced",
                    s.name,
                    s.health.problem.as_deref().unwrap_or("404")
                ),
            );
        } else if hung_alone {
            degraded = verdict("Degraded", true, "SlotUnresponsive", hung_message());
        } else if !serving.is_empty() && serving.len() < desired.slots && !first_start && !desired.deleting {
            let missing: Vec<String> = observed
                .slots
                .iter()
                .filter(|s| !serving.iter().any(|v| v.name == s.name) && s.template == desired.template)
                .map(|s| match (&s.health.problem, s.running) {
                    (_, false) => format!("slot {} exited", s.name),
                    (Some(p), _) if s.health.unresponsive() => format!("slot {} does not answer ({p})", s.name),
                    _ => format!("slot {} starts", s.name),
                })
                .collect();
            degraded = verdict(
                "Degraded",
                true,
                "FewerSlots",
                format!(
                    "{} of {} slots serve{}; a replacement starts where one is missing",
                    serving.len(),
                    desired.slots,
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", missing.join("; "))
                    }
                ),
            );
        }
    }
    let degraded = match failure {
        Some(message) => verdict("Degraded", true, "StepFailed", message),
        None => match observed.disk.as_ref() {
            Some(low) if degraded == healthy() && low.level == crate::store::disk::Level::Low => {
                verdict("Degraded", true, low.reason(), low.message.clone())
            }
            _ => degraded,
        },
    };
    let disk = observed.disk.as_ref();
    let full = disk.filter(|d| d.level == crate::store::disk::Level::Full);
    let store = if let Some(full) = full {
        verdict("StoreReady", false, full.reason(), full.message.clone())
    } else if observed.store_up {
        verdict(
            "StoreReady",
            true,
            "StoreUp",
            "the store accepts connections and answers reads",
        )
    } else {
        verdict(
            "StoreReady",
            false,
            if observed.store_unresponsive {
                "StoreUnresponsive"
            } else {
                "StoreDown"
            },
            observed
                .store_problem
                .clone()
                .unwrap_or_else(|| "the store does not accept connections".into()),
        )
    };
    let front = match &observed.front {
        FrontObservation::Up { backends, .. } if !backends.is_empty() => verdict(
            "FrontReady",
            true,
            "Forwarding",
            format!("the front forwards new connections to {}", backends.join(", ")),
        ),
        FrontObservation::Up { .. } => verdict(
            "FrontReady",
            false,
            "NoBackend",
            "the front runs but has no slot to forward to yet",
        ),
        FrontObservation::Down | FrontObservation::Starting | FrontObservation::Unresponsive => verdict(
            "FrontReady",
            false,
            match observed.front {
                FrontObservation::Down => "FrontDown",
                FrontObservation::Starting => "FrontStarting",
                _ => "FrontUnresponsive",
            },
            observed
                .front_problem
                .clone()
                .unwrap_or_else(|| "the front is not running".into()),
        ),
    };
    vec![ready, progressing, degraded, store, front]
}

fn healthy() -> Verdict {
    verdict("Degraded", false, "AsExpected", "nothing is blocked")
}

/// While a roll waits for its probe workspace and the leading slot's controllers have work
/// queued: who leads, their backlog, and how long since the Lease was released.
fn catching_up(observed: &Observed, step: &Step) -> Option<String> {
    let (Step::Wait(Wait::Probe), LeaseHolder::Slot(leader)) = (step, &observed.lease) else {
        return None;
    };
    let backlog = observed.leader_backlog.as_ref().filter(|b| b.queued > 0)?;
    let since = match observed.roll.as_ref().and_then(|r| r.lease_released_at) {
        Some(at) => format!(
            ", {:.0}s after the controllers' Lease was released",
            (observed.now - at).num_milliseconds().max(0) as f64 / 1000.0
        ),
        None => String::new(),
    };
    Some(format!(
        "slot {leader} leads kcp's controllers, which work through their backlog: {}{since}; the roll completes once a probe workspace gets Ready",
        backlog.describe()
    ))
}

fn progress_reason(step: &Step) -> &'static str {
    match step {
        Step::Wait(Wait::Answer(step)) => progress_reason(step),
        Step::AdoptSlot { .. } => "SlotAdopting",
        Step::IssueIdentity | Step::UpdateIdentities | Step::WriteKubeconfig | Step::WriteTrust => "KeepingCredentials",
        Step::EnsureStore | Step::Wait(Wait::Store) => "StoreStarting",
        Step::KillStore => "StoreRestarting",
        Step::Snapshot
        | Step::Backup { .. }
        | Step::Wait(Wait::Job {
            job: "snapshot" | "backup",
        }) => "TakingSnapshot",
        Step::StartPreflight
        | Step::CopyPreflight
        | Step::LaunchPreflight
        | Step::Wait(Wait::Job {
            job: "preflight-dump" | "preflight-copy",
        })
        | Step::ReleasePreflightLease
        | Step::ComparePreflight
        | Step::FailPreflight { .. }
        | Step::StopPreflight
        | Step::RemovePreflight
        | Step::Wait(Wait::Stopping {
            what: Stopping::Preflight,
        })
        | Step::KillStopping {
            what: Stopping::Preflight,
        }
        | Step::Wait(Wait::Preflight) => "Preflight",
        Step::BeginMigration
        | Step::EnsureTargetStore
        | Step::StartMirror
        | Step::StartWarmSlot { .. }
        | Step::BeginSwitch
        | Step::EndMirror
        | Step::StopOldStore
        | Step::CompleteMigration
        | Step::ForgetMigration
        | Step::Wait(Wait::Job { job: "store-mirror" }) => "Migrating",
        Step::FailMigration { .. } => "MigrationFailed",
        Step::AdoptKcp | Step::HoldControllersLease | Step::RedirectProxy | Step::CompleteAdoption => "Adopting",
        Step::Wait(Wait::Job { .. }) | Step::FinishJob | Step::CancelJob => "RunningJob",
        Step::Wait(Wait::JobRetry { .. }) => "AwaitingJobRetry",
        Step::BeginRestore(_) | Step::RestoreSnapshot | Step::CompleteRestore => "Restoring",
        Step::RefuseRestore { .. } => "RestoreRefused",
        Step::EnsureFront | Step::Wait(Wait::Front) => "FrontStarting",
        Step::UpgradeFront | Step::Wait(Wait::FrontUpgrade) => "FrontUpgrading",
        Step::MoveFront => "FrontMoving",
        Step::KillFront => "FrontRestarting",
        Step::StartSlot { .. } => "SlotStarting",
        Step::StartInterim { .. } => "InterimSlotStarting",
        Step::Wait(Wait::Ready { .. }) => "AwaitingReadiness",
        Step::SetFront(_) | Step::FinishFrontCheck { .. } => "SwitchingFront",
        Step::Wait(Wait::Settle { .. } | Wait::Exit { .. })
        | Step::TerminateSlot { .. }
        | Step::CloseConnections { .. }
        | Step::StopSlotStore { .. }
        | Step::Wait(Wait::Stopping {
            what: Stopping::SlotStore { .. },
        })
        | Step::KillStopping {
            what: Stopping::SlotStore { .. },
        }
        | Step::RemoveSlot { .. } => "SlotStopping",
        Step::KillSlot { .. } | Step::Wait(Wait::RenewDeadline { .. }) => "SlotKilling",
        Step::RestartSlot { .. } => "SlotRestarting",
        Step::ReleaseLease { .. } => "ReleasingLease",
        Step::Probe | Step::ProbeSucceeded | Step::Wait(Wait::Probe) => "Probing",
        Step::CompleteRoll => "RollComplete",
        Step::Wait(Wait::Stopping {
            what: Stopping::OldStore,
        })
        | Step::KillStopping {
            what: Stopping::OldStore,
        } => "Migrating",
        Step::StopStore
        | Step::StopOrphanedKine { .. }
        | Step::StopFront
        | Step::Wait(Wait::Stopping { .. })
        | Step::KillStopping { .. } => "Deleting",
        Step::ForgetKilled => "ForgettingKilled",
        Step::Idle | Step::Blocked { .. } | Step::AbortRoll { .. } => "Idle",
    }
}

fn progress_message(step: &Step, observed: &Observed) -> String {
    match step {
        Step::Wait(Wait::Answer(step)) => progress_message(step, observed),
        Step::AdoptSlot { name } => format!("recording slot {name}, which runs without a record"),
        Step::IssueIdentity => "issuing an admin identity for the shard".into(),
        Step::UpdateIdentities => "updating the shard's admin identities".into(),
        Step::WriteKubeconfig => "writing the kubeconfig through the front".into(),
        Step::WriteTrust => "writing the sharded kcp's trust".into(),
        Step::EnsureStore => "starting the store".into(),
        Step::KillStore => "restarting a kine that does not answer reads".into(),
        Step::Snapshot => "taking a snapshot of the store before the version changes".into(),
        Step::Backup { .. } => "taking a snapshot of the store (asked for, or due by spec.backup.interval)".into(),
        Step::Wait(Wait::Job { job }) => {
            format!("waiting for the {job} job to end (its output: job/job.log in the shard's directory)")
        }
        Step::Wait(Wait::JobRetry { job, at }) => {
            let failure = observed.job_failure.as_ref();
            format!(
                "the {job} job failed{}: {}; it runs again at {}",
                match failure.map_or(1, |f| f.times) {
                    1 => String::new(),
                    times => format!(" {times} times in a row"),
                },
                failure.map_or("", |f| f.message.as_str()),
                at.format("%H:%M:%SZ"),
            )
        }
        Step::FinishJob => "taking up what the job did".into(),
        Step::BeginMigration => "beginning to move the shard's data to the store spec.store names".into(),
        Step::EnsureTargetStore => "starting the store the data moves to".into(),
        Step::StartMirror => "starting the mirror of the data into the new store (a job)".into(),
        Step::StartWarmSlot { name } => format!("starting slot {name} on the new store, out of the front"),
        Step::BeginSwitch => {
            "switching to the new store: the front holds new connections while the old slots stop".into()
        }
        Step::EndMirror => "the old slots have exited: the mirror applies their last changes".into(),
        Step::StopOldStore => "stopping what ran the store the data left (its data stays)".into(),
        Step::CompleteMigration => "the move of the data is complete".into(),
        Step::FailMigration { .. } => "stopping the move of the data; the old store serves on".into(),
        Step::ForgetMigration => "spec.store names the data's store again: the failed move is forgotten".into(),
        Step::AdoptKcp => "taking over the kcp spec.adopt names: its key material, tokens, process and store".into(),
        Step::HoldControllersLease => {
            "making the controllers Lease say that the adopted kcp leads, so that a slot on the new store follows it"
                .into()
        }
        Step::RedirectProxy => {
            "making the caddy in front of the adopted kcp send to the front what it sent to the kcp".into()
        }
        Step::CompleteAdoption => "the adopted kcp's data is in spec.store and the shard's slots serve it".into(),
        Step::CancelJob => "stopping a job nothing needs any more".into(),
        Step::StartPreflight => "starting a preflight: the new version alone on a copy of the data".into(),
        Step::CopyPreflight => "copying the data for the preflight (a job)".into(),
        Step::LaunchPreflight => "starting the new version alone on the copy of the data (preflight)".into(),
        Step::Wait(Wait::Preflight) => {
            "waiting for the preflight's kine and kcp to answer, and its controllers to lead".into()
        }
        Step::ReleasePreflightLease => "releasing the copied controllers' Lease on the preflight's kcp".into(),
        Step::ComparePreflight => "comparing kcp's own schemas on the copy with the serving slots'".into(),
        Step::FailPreflight { .. } => "recording the preflight as failed".into(),
        Step::StopPreflight => "stopping the preflight's kcp and kine".into(),
        Step::RemovePreflight => "removing the preflight's copy of the data".into(),
        Step::BeginRestore(r) => format!("taking up the restore of {}", r.path),
        Step::RefuseRestore { message } => format!("refusing a restore: {message}"),
        Step::RestoreSnapshot => "restoring the snapshot into the store".into(),
        Step::CompleteRestore => "a slot serves the restored data".into(),
        Step::EnsureFront => "starting the front".into(),
        Step::Wait(Wait::Front) => "waiting for the front it started to answer on its control socket".into(),
        Step::Wait(Wait::FrontUpgrade) => {
            "waiting for a front of serve's binary to take the front's listening socket over".into()
        }
        Step::UpgradeFront => "handing the front's listening socket over to a front of this kcpshard binary".into(),
        Step::MoveFront => "moving the front to spec.front.listen: the old one drains its connections and stops".into(),
        Step::KillFront => "restarting the front, which does not answer on its control socket".into(),
        Step::StartSlot { name } => format!("starting slot {name}"),
        Step::StartInterim { name } => {
            format!("starting slot {name} of the version that last served the data, to serve while the preflight runs")
        }
        Step::Wait(Wait::Store) => {
            "waiting for the store it started (a kine, a managed PostgreSQL) to accept connections".into()
        }
        Step::Wait(Wait::Ready { slot }) => format!("waiting for slot {slot} to answer /readyz on its own port"),
        Step::SetFront(change) => format!("the front forwards new connections to {}", change.backends.join(", ")),
        Step::FinishFrontCheck { .. } => "checking the front's change as a client would".into(),
        Step::Wait(Wait::Settle { slot, .. }) => {
            format!("letting connections pinned to slot {slot} settle before it stops")
        }
        Step::TerminateSlot { name } => format!("stopping slot {name}"),
        Step::Wait(Wait::Exit { slot }) => format!("slot {slot} drains its connections and exits"),
        Step::Wait(Wait::RenewDeadline { slot, remaining }) => format!(
            "slot {slot} leads kcp's controllers but cannot run them (stopped, or answering nothing): killing it in {:.1}s, when it has missed kcp's renew deadline for their Lease",
            remaining.as_secs_f64()
        ),
        Step::CloseConnections { name } => format!("closing the front's connections to slot {name}"),
        Step::StopSlotStore { name } => format!("stopping the kine of slot {name}"),
        Step::RemoveSlot { name, .. } => format!("slot {name} exited; dropping its records"),
        Step::KillSlot {
            name,
            cause: KillCause::Unresponsive { seconds },
        } => format!("killing slot {name}: it has not answered /readyz for {seconds}s"),
        Step::KillSlot {
            name,
            cause: KillCause::HungLeader { seconds },
        } => format!(
            "killing slot {name}: it leads but has not renewed the controllers' Lease for {seconds}s and does not answer /readyz"
        ),
        Step::KillSlot {
            name,
            cause: KillCause::Broken,
        } => format!("killing slot {name}: it answers /readyz but not kcp's own APIs"),
        Step::KillSlot {
            name,
            cause: KillCause::DrainTimeout { seconds },
        } => format!("killing slot {name}: it did not exit within {seconds}s of SIGTERM"),
        Step::RestartSlot {
            name,
            cause: RestartCause::StoreOutage,
        } => format!("starting slot {name} again: the store went down while it started"),
        Step::RestartSlot {
            name,
            cause: RestartCause::Broken,
        } => format!("starting slot {name} again: it answers /readyz but not kcp's own APIs"),
        Step::RestartSlot {
            name,
            cause: RestartCause::NotReady { timeout_seconds },
        } => format!("starting slot {name} again: it did not get ready within {timeout_seconds}s"),
        Step::ReleaseLease { .. } => "handing the kcp-controllers Lease to a serving slot so that it leads".into(),
        Step::Probe | Step::Wait(Wait::Probe) => "checking that a workspace reaches Ready".into(),
        Step::ProbeSucceeded => "a probe workspace reached Ready".into(),
        Step::CompleteRoll => "finishing the roll".into(),
        Step::StopStore | Step::StopFront => "stopping the slots, the store's processes and the front".into(),
        Step::StopOrphanedKine { record } => format!("stopping a kine the shard no longer uses ({record})"),
        Step::Wait(Wait::Stopping { what }) => format!("waiting for {what} to exit"),
        Step::KillStopping { what } => {
            format!("killing {what}: it did not exit within its grace after its stop signal")
        }
        Step::ForgetKilled => "forgetting processes killed after their grace, which have exited".into(),
        Step::Idle | Step::Blocked { .. } | Step::AbortRoll { .. } => String::new(),
    }
}

/// The phase shown in `kubectl get ks`.
pub fn phase(verdicts: &[Verdict], deleting: bool) -> Phase {
    let is = |t: &str| verdicts.iter().any(|v| v.type_ == t && v.status);
    if deleting {
        Phase::Deleting
    } else if is("Degraded") {
        Phase::Degraded
    } else if !is("Ready") {
        Phase::Pending
    } else if is("Progressing") {
        Phase::Progressing
    } else {
        Phase::Ready
    }
}

/// Merges the verdicts into the previous conditions: lastTransitionTime moves only when the status
/// changes; every condition names the generation it describes.
pub fn merge(
    previous: &[Condition],
    verdicts: &[Verdict],
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Vec<Condition> {
    verdicts
        .iter()
        .map(|v| {
            let status = if v.status { "True" } else { "False" }.to_string();
            let before = previous.iter().find(|c| c.type_ == v.type_);
            let last_transition_time = match before {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => k8s_time(now),
            };
            Condition {
                type_: v.type_.to_string(),
                status,
                reason: v.reason.clone(),
                message: v.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// A chrono time as the Kubernetes API types carry it.
pub fn k8s_time(t: DateTime<Utc>) -> Time {
    let timestamp = k8s_openapi::jiff::Timestamp::new(t.timestamp(), t.timestamp_subsec_nanos() as i32);
    Time(timestamp.expect("chrono times are within jiff's range"))
}

#[cfg(test)]
mod tests;
