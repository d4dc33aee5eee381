//! Conditions and phase: what a user reads with `kubectl get ks` and `kubectl describe`, computed
//! from what was observed and the step the plan chose. Pure, so the rules are tested as a table.
//!
//! - Ready: the front forwards to a slot that answers `/readyz`. It stays True during a roll, because
//!   the shard keeps serving through the old slot.
//! - Progressing: a step is under way (a roll, a first start, a replacement).
//! - Degraded: a roll is blocked, or a step failed; the message says what to fix.
//! - StoreReady, FrontReady: the store accepts connections; the front runs and has a backend.
//!
//! `lastTransitionTime` changes only when a condition's status does (metav1.Condition rules), and
//! every condition carries the generation it describes.
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::Phase;

use super::plan::{FrontObservation, Observed, RestartCause, Step};

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

/// The five conditions, from the observation, the chosen step, and the error of the last step if it
/// failed.
pub fn verdicts(observed: &Observed, step: &Step, failure: Option<&str>) -> Vec<Verdict> {
    let backend = match &observed.front {
        FrontObservation::Up { backend } => backend.clone(),
        FrontObservation::Down => None,
    };
    let serving = backend
        .as_ref()
        .and_then(|b| observed.slots.iter().find(|s| &s.name == b && s.running && s.ready));
    let ready = match serving {
        Some(slot) => verdict(
            "Ready",
            true,
            "SlotServing",
            format!(
                "slot {} ({}) serves through the front",
                slot.name, slot.template.version
            ),
        ),
        None if observed.front == FrontObservation::Down => {
            verdict("Ready", false, "FrontDown", "the front is not running")
        }
        None => verdict("Ready", false, "NoSlotReady", "no ready slot behind the front yet"),
    };
    let (progressing, degraded) = match step {
        Step::Blocked { cause } | Step::AbortRoll { cause, .. } => (
            verdict("Progressing", false, "RollBlocked", cause.message()),
            verdict("Degraded", true, cause.reason(), cause.message()),
        ),
        Step::Idle => (
            verdict("Progressing", false, "RollComplete", "the shard runs the desired spec"),
            healthy(),
        ),
        Step::Cleanup => (
            verdict(
                "Progressing",
                true,
                "Deleting",
                "stopping the slots, the store's processes and the front",
            ),
            healthy(),
        ),
        other => (
            verdict("Progressing", true, progress_reason(other), progress_message(other)),
            healthy(),
        ),
    };
    let degraded = match failure {
        Some(message) => verdict("Degraded", true, "StepFailed", message),
        None => degraded,
    };
    let store = if observed.store_up {
        verdict("StoreReady", true, "StoreUp", "the store accepts connections")
    } else {
        verdict(
            "StoreReady",
            false,
            "StoreDown",
            observed
                .store_problem
                .clone()
                .unwrap_or_else(|| "the store does not accept connections".into()),
        )
    };
    let front = match &backend {
        Some(b) => verdict(
            "FrontReady",
            true,
            "Forwarding",
            format!("the front forwards new connections to slot {b}"),
        ),
        None if observed.front == FrontObservation::Down => verdict(
            "FrontReady",
            false,
            "FrontDown",
            observed
                .front_problem
                .clone()
                .unwrap_or_else(|| "the front is not running".into()),
        ),
        None => verdict(
            "FrontReady",
            false,
            "NoBackend",
            "the front runs but has no slot to forward to yet",
        ),
    };
    vec![ready, progressing, degraded, store, front]
}

fn healthy() -> Verdict {
    verdict("Degraded", false, "AsExpected", "nothing is blocked")
}

fn progress_reason(step: &Step) -> &'static str {
    match step {
        Step::EnsureStore => "StoreStarting",
        Step::Snapshot => "TakingSnapshot",
        Step::EnsureFront => "FrontStarting",
        Step::StartSlot { .. } => "SlotStarting",
        Step::AwaitReady { .. } => "AwaitingReadiness",
        Step::SwitchFront { .. } => "SwitchingFront",
        Step::AwaitSettle { .. } | Step::TerminateSlot { .. } | Step::StopSlot { .. } => "SlotStopping",
        Step::RestartSlot { .. } => "SlotRestarting",
        Step::ForgetSlot { .. } => "SlotReplacing",
        Step::ReleaseLease => "ReleasingLease",
        Step::Probe => "Probing",
        Step::CompleteRoll => "RollComplete",
        Step::Cleanup | Step::Idle | Step::Blocked { .. } | Step::AbortRoll { .. } => "Idle",
    }
}

fn progress_message(step: &Step) -> String {
    match step {
        Step::EnsureStore => "starting the store".into(),
        Step::Snapshot => "dumping the store before the version changes".into(),
        Step::EnsureFront => "starting the front".into(),
        Step::StartSlot { name } => format!("starting slot {name}"),
        Step::AwaitReady { name } => format!("waiting for slot {name} to answer /readyz on its own port"),
        Step::SwitchFront { to } => format!("switching the front to slot {to}"),
        Step::AwaitSettle { name, .. } => format!("letting connections pinned to slot {name} settle before it stops"),
        Step::TerminateSlot { name } => format!("stopping slot {name}: waiting for it to stop listening"),
        Step::StopSlot { name } => format!("stopping slot {name}"),
        Step::RestartSlot {
            name,
            cause: RestartCause::StoreOutage,
        } => format!("starting slot {name} again: the store went down while it started"),
        Step::RestartSlot {
            name,
            cause: RestartCause::NotReady { timeout_seconds },
        } => format!("starting slot {name} again: it did not get ready within {timeout_seconds}s"),
        Step::ForgetSlot { name, .. } => format!("slot {name} exited; replacing it"),
        Step::ReleaseLease => "releasing the kcp-controllers Lease so the new slot leads".into(),
        Step::Probe => "checking that a workspace reaches Ready".into(),
        Step::CompleteRoll => "finishing the roll".into(),
        _ => String::new(),
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
mod tests {
    use super::*;
    use crate::controller::plan::{BlockCause, SlotObservation, SlotTemplate};
    use chrono::TimeZone;

    fn observed(backend: Option<&str>, ready: bool) -> Observed {
        let template = SlotTemplate {
            version: "v0.32.3".into(),
            binary: "bin/kcp".into(),
            extra_args: vec![],
            shutdown_delay: "2s".into(),
            front_url: "https://127.0.0.1:6443".into(),
            restarted_at: None,
            accepted_identities: vec!["0a1b2c3d".into()],
        };
        Observed {
            now: Utc.timestamp_opt(1_800_000_000, 0).unwrap(),
            store_up: true,
            store_problem: None,
            store_processes_up: true,
            snapshot_for: None,
            front: FrontObservation::Up {
                backend: backend.map(str::to_string),
            },
            front_ours: true,
            front_problem: None,
            front_outdated: false,
            front_elsewhere: false,
            slots: vec![SlotObservation {
                name: "a".into(),
                template,
                running: true,
                ready,
                started_at: Utc.timestamp_opt(1_800_000_000, 0).unwrap(),
            }],
            roll: None,
            blocked: None,
        }
    }

    fn status_of(verdicts: &[Verdict], type_: &str) -> bool {
        verdicts.iter().find(|v| v.type_ == type_).unwrap().status
    }

    #[test]
    fn a_serving_shard_mid_roll_is_ready_and_progressing() {
        let v = verdicts(&observed(Some("a"), true), &Step::StartSlot { name: "b".into() }, None);
        assert!(status_of(&v, "Ready") && status_of(&v, "Progressing") && !status_of(&v, "Degraded"));
        assert_eq!(phase(&v, false), Phase::Progressing);
    }

    #[test]
    fn a_blocked_roll_is_degraded_with_what_to_fix_while_the_old_slot_serves() {
        let cause = BlockCause::NoBinary {
            path: "bin/kcp-v9.9.9".into(),
        };
        let v = verdicts(&observed(Some("a"), true), &Step::Blocked { cause }, None);
        let degraded = v.iter().find(|v| v.type_ == "Degraded").unwrap();
        assert!(degraded.status);
        assert_eq!(degraded.reason, "BinaryMissing");
        assert!(degraded.message.contains("bin/kcp-v9.9.9") && degraded.message.contains("install"));
        assert!(status_of(&v, "Ready"));
        assert_eq!(phase(&v, false), Phase::Degraded);
    }

    #[test]
    fn a_failed_step_is_degraded_with_its_error() {
        let v = verdicts(
            &observed(Some("a"), true),
            &Step::EnsureFront,
            Some("front address 127.0.0.1:6443 is in use"),
        );
        let degraded = v.iter().find(|v| v.type_ == "Degraded").unwrap();
        assert_eq!((degraded.status, degraded.reason.as_str()), (true, "StepFailed"));
    }

    #[test]
    fn a_converged_shard_is_ready() {
        let v = verdicts(&observed(Some("a"), true), &Step::Idle, None);
        assert_eq!(phase(&v, false), Phase::Ready);
        let v = verdicts(&observed(None, false), &Step::AwaitReady { name: "a".into() }, None);
        assert_eq!(phase(&v, false), Phase::Pending);
    }

    #[test]
    fn last_transition_time_moves_only_when_the_status_does() {
        let t0 = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let t1 = Utc.timestamp_opt(1_800_000_100, 0).unwrap();
        let first = merge(
            &[],
            &verdicts(&observed(Some("a"), true), &Step::Idle, None),
            Some(1),
            t0,
        );
        let same = merge(
            &first,
            &verdicts(&observed(Some("a"), true), &Step::Idle, None),
            Some(2),
            t1,
        );
        let ready = |cs: &[Condition]| cs.iter().find(|c| c.type_ == "Ready").unwrap().clone();
        assert_eq!(ready(&same).last_transition_time, ready(&first).last_transition_time);
        assert_eq!(ready(&same).observed_generation, Some(2));
        let flipped = merge(
            &same,
            &verdicts(&observed(Some("a"), false), &Step::Idle, None),
            Some(2),
            t1,
        );
        assert_eq!(ready(&flipped).last_transition_time, k8s_time(t1));
    }
}
