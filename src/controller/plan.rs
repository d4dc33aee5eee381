//! The plan: a pure function from the desired state (the spec) and the observed state (processes,
//! readiness, the front's backend, the persisted roll record) to the ONE next step.
//!
//! The order is the roll of docs/architecture.md ("The steps"); the invariants it keeps, each
//! checked by the property tests below:
//! - the front is only ever switched to a slot that is running and answered `/readyz` on its own
//!   port (docs/background.md section 5: switching before that failed 8 polls);
//! - the slot the front forwards to is never stopped while no other slot is ready (the last ready
//!   slot keeps serving whatever else fails);
//! - at most two slots run, and a slot is only started when fewer than two run;
//! - the Lease is released only when no slot but the new one runs, or the other one has stopped
//!   listening after SIGTERM: a live old leader would renew it (docs/background.md section 3), but kcp's
//!   leader election and controllers talk to kcp through its own listener, and kcp cancels them when
//!   it closes that listener (`pkg/server/server.go`, the `kcp-start-controllers` post-start hook);
//! - a roll that failed for a spec is not retried until the spec changes (no crash loop).
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a slot runs: everything that, when changed, needs a new slot. Two slots with equal
/// templates are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotTemplate {
    pub version: String,
    /// The kcp binary, resolved from the spec's template.
    pub binary: String,
    pub extra_args: Vec<String>,
    pub shutdown_delay: String,
    /// The URL every slot advertises (the front's).
    pub front_url: String,
    /// The `kcpshard.io/restartedAt` annotation: a new value asks for a fresh slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// The ids of the shard's admin identities this slot accepts, oldest first (its
    /// `--token-auth-file`; controller/credentials.rs decides them). A rotation changes them,
    /// which rolls the shard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_identities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub template: SlotTemplate,
    /// Whether the binary for the template exists.
    pub binary_present: bool,
    pub readiness_timeout: Duration,
    /// The object is being deleted.
    pub deleting: bool,
    /// Why spec.rollout refuses a roll from the serving slot's version to this one, if it does
    /// (a minor change or a downgrade that is not allowed).
    pub version_refused: Option<String>,
    /// Snapshot the store before a roll that changes the version (spec.rollout, and a store that
    /// takes snapshots).
    pub snapshot_before_version_change: bool,
}

/// The front, as observed through its control socket.
#[derive(Debug, Clone, PartialEq)]
pub enum FrontObservation {
    /// Not running (or not answering).
    Down,
    /// Running; the slot new connections go to, if any.
    Up { backend: Option<String> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SlotObservation {
    pub name: String,
    pub template: SlotTemplate,
    /// The recorded process is alive (same pid, same start time).
    pub running: bool,
    /// It answered `/readyz` on its own port just now.
    pub ready: bool,
    pub started_at: DateTime<Utc>,
}

/// A roll that could not go on, kept until the spec changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocked {
    pub template: SlotTemplate,
    pub cause: BlockCause,
}

/// Why a roll cannot go on. Each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum BlockCause {
    /// The binary for the version does not exist.
    NoBinary { path: String },
    /// The new slot did not answer `/readyz` in time.
    SlotNotReady { slot: String, timeout_seconds: u64 },
    /// The new slot's process exited before it was ready.
    SlotCrashed { slot: String },
    /// spec.rollout does not allow this version change.
    VersionRefused { message: String },
}

impl BlockCause {
    /// The CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            BlockCause::NoBinary { .. } => "BinaryMissing",
            BlockCause::SlotNotReady { .. } => "SlotNotReady",
            BlockCause::SlotCrashed { .. } => "SlotCrashed",
            BlockCause::VersionRefused { .. } => "VersionChangeRefused",
        }
    }

    /// The spec changed in a way that answers this cause without a new template: a slot that was
    /// not ready in time is tried again once spec.rollout.readinessTimeout is raised.
    pub fn lifted_by(&self, desired: &Desired) -> bool {
        match self {
            BlockCause::SlotNotReady { timeout_seconds, .. } => desired.readiness_timeout.as_secs() > *timeout_seconds,
            _ => false,
        }
    }

    /// What happened and what to do about it.
    pub fn message(&self) -> String {
        match self {
            BlockCause::NoBinary { path } => format!(
                "no kcp binary at {path}: install it (hack/install-deps.sh builds bin/kcp-<version>) or set spec.version or spec.kcp.binary to one that exists; the running slot keeps serving"
            ),
            BlockCause::SlotNotReady { slot, timeout_seconds } => format!(
                "slot {slot} did not answer /readyz on its own port within {timeout_seconds}s and was stopped; the old slot keeps serving. See the slot's log under the state dir, then fix spec.version, spec.kcp or raise spec.rollout.readinessTimeout to retry"
            ),
            BlockCause::SlotCrashed { slot } => format!(
                "slot {slot} exited before it was ready; the old slot keeps serving. See the slot's log under the state dir, then fix spec.version or spec.kcp to retry"
            ),
            BlockCause::VersionRefused { message } => format!("{message}; the running slot keeps serving"),
        }
    }
}

/// The roll in progress, persisted so that a restarted controller carries on where it stopped.
/// Steps that cannot be observed (the Lease released, the probe passed) are recorded here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollRecord {
    /// The slot that served when the roll began, if any.
    pub from: Option<String>,
    pub from_version: Option<String>,
    pub to: String,
    pub to_version: String,
    pub started_at: DateTime<Utc>,
    pub new_slot_started_at: Option<DateTime<Utc>>,
    pub new_slot_ready_at: Option<DateTime<Utc>>,
    pub front_switched_at: Option<DateTime<Utc>>,
    /// When the old slot, sent SIGTERM, stopped listening: from then on it can neither reach its
    /// own API nor lead controllers, so the Lease can go to the new slot while it drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_slot_stopped_listening_at: Option<DateTime<Utc>>,
    pub old_slot_exited_at: Option<DateTime<Utc>>,
    pub lease_released_at: Option<DateTime<Utc>>,
    pub probe_succeeded_at: Option<DateTime<Utc>>,
    /// The store snapshot taken before this roll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// When the store was last seen down while the new slot was not ready yet. A kcp whose store
    /// goes away during its start-up may never get ready once the store is back (its informers
    /// never sync: seen with PostgreSQL restarted mid-roll, docs/reliability.md), so that slot is
    /// started again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_down_at: Option<DateTime<Utc>>,
    /// How often the new slot was started again after it missed readinessTimeout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_ready_restarts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub now: DateTime<Utc>,
    /// The store accepts connections (and every running slot's own kine, for KinePostgres).
    pub store_up: bool,
    /// Why the store is not up (PostgreSQL's own error, a kine that is down), for StoreReady.
    pub store_problem: Option<String>,
    /// kcpshard runs processes for the shard-wide store (kine over sqlite, a managed PostgreSQL)
    /// and they are up: deleting the shard stops them. An external store is not ours to stop.
    pub store_processes_up: bool,
    /// The template the latest store snapshot was taken for.
    pub snapshot_for: Option<SlotTemplate>,
    pub front: FrontObservation,
    /// Why the front is down (caddy's admin API does not answer, ...), for FrontReady.
    pub front_problem: Option<String>,
    /// kcpshard's front runs an older binary than this controller: EnsureFront upgrades it.
    pub front_outdated: bool,
    /// kcpshard runs the front (Tcp); a caddy is the user's, and deleting the shard leaves it.
    pub front_ours: bool,
    /// The front runs, but on another address than spec.front.listen (the spec changed).
    pub front_elsewhere: bool,
    pub slots: Vec<SlotObservation>,
    pub roll: Option<RollRecord>,
    pub blocked: Option<Blocked>,
}

/// The one thing to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Deleting: stop the slots, the store's processes and the front; keep the data.
    Cleanup,
    EnsureStore,
    EnsureFront,
    /// Dump the store before a roll to a new version (docs/background.md section 6).
    Snapshot,
    /// Start a slot with the desired template.
    StartSlot {
        name: String,
    },
    /// A new slot runs but is not ready yet: look again soon.
    AwaitReady {
        name: String,
    },
    SwitchFront {
        to: String,
    },
    /// The front just switched: give connections pinned to the old slot a moment before it stops.
    AwaitSettle {
        name: String,
        /// Until the settle time is over.
        remaining: Duration,
    },
    /// SIGTERM the roll's old slot and wait until it stops listening (after its shutdownDelay);
    /// it drains its open connections while the Lease goes to the new slot.
    TerminateSlot {
        name: String,
    },
    /// Stop a slot that is no longer needed (SIGTERM, bounded wait, SIGKILL), then its own store.
    StopSlot {
        name: String,
    },
    /// Stop the new slot, not ready yet, for the reason given; the next step starts it again for
    /// the same roll.
    RestartSlot {
        name: String,
        cause: RestartCause,
    },
    /// A slot's process is gone: drop its record (and report it if it served).
    ForgetSlot {
        name: String,
        was_active: bool,
    },
    /// Stop the new slot and remember that this spec cannot roll.
    AbortRoll {
        name: String,
        cause: BlockCause,
    },
    ReleaseLease,
    Probe,
    CompleteRoll,
    /// Nothing to do until the spec changes; the old slot keeps serving.
    Blocked {
        cause: BlockCause,
    },
    /// Converged.
    Idle,
}

impl Step {
    /// The step's kind, as logs and metrics name it.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Cleanup => "Cleanup",
            Step::EnsureStore => "EnsureStore",
            Step::EnsureFront => "EnsureFront",
            Step::Snapshot => "Snapshot",
            Step::StartSlot { .. } => "StartSlot",
            Step::AwaitReady { .. } => "AwaitReady",
            Step::SwitchFront { .. } => "SwitchFront",
            Step::AwaitSettle { .. } => "AwaitSettle",
            Step::TerminateSlot { .. } => "TerminateSlot",
            Step::StopSlot { .. } => "StopSlot",
            Step::RestartSlot { .. } => "RestartSlot",
            Step::ForgetSlot { .. } => "ForgetSlot",
            Step::AbortRoll { .. } => "AbortRoll",
            Step::ReleaseLease => "ReleaseLease",
            Step::Probe => "Probe",
            Step::CompleteRoll => "CompleteRoll",
            Step::Blocked { .. } => "Blocked",
            Step::Idle => "Idle",
        }
    }
}

/// How long the old slot keeps serving, untouched, after the front switched away from it: long
/// enough for a connection the front accepted just before the switch to finish its TLS handshake
/// and send its first request (p99 of a whole request under the roll bench's load: 0.18-0.26 s,
/// docs/benchmarks.md "Rolls under load").
pub const SWITCH_SETTLE: Duration = Duration::from_millis(500);

/// How many times a new slot that missed readinessTimeout is started again for the same roll
/// before the roll stops. kcp's start-up sometimes never finishes: a post-start hook
/// (crd-informer-synced, kcp-start-informers) waits forever, and /readyz fails until the process
/// ends; a fresh start gets ready. Seen in 2 of 20 KinePostgres rolls on 2026-11-30
/// (docs/benchmarks.md, "Rolls under load").
pub const NOT_READY_RESTARTS: u32 = 1;

/// Why a new slot, not ready yet, is started again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartCause {
    /// Its start-up overlapped a store outage, after which kcp's informers may never sync.
    StoreOutage,
    /// It did not answer /readyz within readinessTimeout.
    NotReady { timeout_seconds: u64 },
}

/// The slot names, used in turn: the new slot takes the name no running slot has.
pub const SLOT_NAMES: [&str; 2] = ["a", "b"];

pub fn plan(desired: &Desired, observed: &Observed) -> Step {
    if desired.deleting {
        let anything_runs = observed.store_processes_up
            || (observed.front_ours && observed.front != FrontObservation::Down)
            || observed.slots.iter().any(|s| s.running);
        return if anything_runs { Step::Cleanup } else { Step::Idle };
    }
    if !observed.store_up {
        return Step::EnsureStore;
    }
    let backend = match &observed.front {
        FrontObservation::Down if observed.front_ours => return Step::EnsureFront,
        // A caddy serves the shard's certificate, which the first slot makes: slots may start
        // before it runs; only the switch waits for it.
        FrontObservation::Down => None,
        FrontObservation::Up { backend } => backend.as_deref(),
    };
    if observed.front_elsewhere || observed.front_outdated {
        return Step::EnsureFront;
    }
    let roll_target = observed.roll.as_ref().map(|r| r.to.as_str());

    // A slot whose process is gone: the new slot of a roll failed; any other is forgotten (and a
    // replacement started below).
    if let Some(dead) = observed.slots.iter().find(|s| !s.running) {
        if is_terminated(observed, &dead.name) {
            return Step::StopSlot {
                name: dead.name.clone(),
            };
        }
        if roll_target == Some(dead.name.as_str())
            && backend != Some(dead.name.as_str())
            && dead.template == desired.template
        {
            return Step::AbortRoll {
                name: dead.name.clone(),
                cause: BlockCause::SlotCrashed {
                    slot: dead.name.clone(),
                },
            };
        }
        return Step::ForgetSlot {
            name: dead.name.clone(),
            was_active: backend == Some(dead.name.as_str()),
        };
    }

    let running: Vec<&SlotObservation> = observed.slots.iter().collect();
    let current = running
        .iter()
        .find(|s| s.template == desired.template && !is_terminated(observed, &s.name))
        .copied();
    let Some(current) = current else {
        if let Some(blocked) = &observed.blocked
            && blocked.template == desired.template
            && !blocked.cause.lifted_by(desired)
        {
            return Step::Blocked {
                cause: blocked.cause.clone(),
            };
        }
        if let Some(message) = &desired.version_refused {
            return Step::Blocked {
                cause: BlockCause::VersionRefused {
                    message: message.clone(),
                },
            };
        }
        if !desired.binary_present {
            return Step::Blocked {
                cause: BlockCause::NoBinary {
                    path: desired.template.binary.clone(),
                },
            };
        }
        let serving_version = running
            .iter()
            .find(|s| Some(s.name.as_str()) == backend)
            .map(|s| s.template.version.as_str());
        if desired.snapshot_before_version_change
            && serving_version.is_some_and(|v| v != desired.template.version)
            && observed.snapshot_for.as_ref() != Some(&desired.template)
        {
            return Step::Snapshot;
        }
        if running.len() >= 2 {
            // Two slots of older templates (the spec changed again mid-roll): stop the one that does
            // not serve before starting a third.
            let spare = running
                .iter()
                .find(|s| Some(s.name.as_str()) != backend)
                .expect("two slots, one backend");
            return Step::StopSlot {
                name: spare.name.clone(),
            };
        }
        let name = SLOT_NAMES
            .iter()
            .find(|n| running.iter().all(|s| s.name != **n))
            .expect("fewer than two slots run");
        return Step::StartSlot { name: name.to_string() };
    };

    if !current.ready {
        let outage_during_start = observed
            .roll
            .as_ref()
            .and_then(|r| r.store_down_at.filter(|_| r.to == current.name))
            .is_some_and(|down| down >= current.started_at);
        if outage_during_start && backend != Some(current.name.as_str()) {
            return Step::RestartSlot {
                name: current.name.clone(),
                cause: RestartCause::StoreOutage,
            };
        }
        let waited = (observed.now - current.started_at).to_std().unwrap_or_default();
        if waited > desired.readiness_timeout && backend != Some(current.name.as_str()) {
            let restarts = observed
                .roll
                .as_ref()
                .filter(|r| r.to == current.name)
                .map(|r| r.not_ready_restarts);
            if restarts.is_some_and(|n| n < NOT_READY_RESTARTS) {
                return Step::RestartSlot {
                    name: current.name.clone(),
                    cause: RestartCause::NotReady {
                        timeout_seconds: desired.readiness_timeout.as_secs(),
                    },
                };
            }
            return Step::AbortRoll {
                name: current.name.clone(),
                cause: BlockCause::SlotNotReady {
                    slot: current.name.clone(),
                    timeout_seconds: desired.readiness_timeout.as_secs(),
                },
            };
        }
        return Step::AwaitReady {
            name: current.name.clone(),
        };
    }
    if backend != Some(current.name.as_str()) {
        if observed.front == FrontObservation::Down {
            return Step::EnsureFront;
        }
        return Step::SwitchFront {
            to: current.name.clone(),
        };
    }
    let roll = observed.roll.as_ref();
    if let Some(old) = running.iter().find(|s| s.name != current.name) {
        if is_terminated(observed, &old.name) {
            // It drains its open connections meanwhile; it is stopped once a leader runs.
            return match roll {
                Some(roll) if roll.lease_released_at.is_none() => Step::ReleaseLease,
                Some(roll) if roll.probe_succeeded_at.is_none() => Step::Probe,
                _ => Step::StopSlot { name: old.name.clone() },
            };
        }
        // Connections the front accepted just before the switch are pinned to the old slot and may
        // still be in their TLS handshake: let their first request land before the old slot turns
        // its /readyz to 500 at SIGTERM (seen by the end-to-end poller; the spike waited 5 s).
        let settled_for = roll
            .and_then(|r| r.front_switched_at)
            .map(|switched| (observed.now - switched).to_std().unwrap_or_default());
        if let Some(settled_for) = settled_for
            && settled_for < SWITCH_SETTLE
        {
            return Step::AwaitSettle {
                name: old.name.clone(),
                remaining: SWITCH_SETTLE - settled_for,
            };
        }
        if roll.is_some_and(|r| r.from.as_deref() == Some(old.name.as_str())) {
            return Step::TerminateSlot { name: old.name.clone() };
        }
        return Step::StopSlot { name: old.name.clone() };
    }
    match roll {
        // Only a roll from an earlier slot has a leader's Lease to hand over.
        Some(roll) if roll.from.is_some() && roll.lease_released_at.is_none() => Step::ReleaseLease,
        Some(roll) if roll.probe_succeeded_at.is_none() => Step::Probe,
        Some(_) => Step::CompleteRoll,
        None => Step::Idle,
    }
}

/// Slot `name` is the roll's old slot and has stopped listening after SIGTERM.
fn is_terminated(observed: &Observed, name: &str) -> bool {
    observed
        .roll
        .as_ref()
        .is_some_and(|r| r.from.as_deref() == Some(name) && r.old_slot_stopped_listening_at.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn template(version: &str) -> SlotTemplate {
        SlotTemplate {
            version: version.into(),
            binary: format!("bin/kcp-{version}"),
            extra_args: vec![],
            shutdown_delay: "2s".into(),
            front_url: "https://127.0.0.1:6443".into(),
            restarted_at: None,
            accepted_identities: vec!["0a1b2c3d".into()],
        }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
    }

    fn desired(version: &str) -> Desired {
        Desired {
            template: template(version),
            binary_present: true,
            readiness_timeout: Duration::from_secs(120),
            deleting: false,
            version_refused: None,
            snapshot_before_version_change: false,
        }
    }

    fn slot(name: &str, version: &str, running: bool, ready: bool) -> SlotObservation {
        SlotObservation {
            name: name.into(),
            template: template(version),
            running,
            ready,
            started_at: at(0),
        }
    }

    fn observed(backend: Option<&str>, slots: Vec<SlotObservation>) -> Observed {
        Observed {
            now: at(10),
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
            slots,
            roll: None,
            blocked: None,
        }
    }

    fn roll(from: Option<&str>, to: &str) -> RollRecord {
        RollRecord {
            from: from.map(str::to_string),
            to: to.into(),
            to_version: "v2".into(),
            started_at: at(0),
            ..Default::default()
        }
    }

    #[test]
    fn a_version_change_snapshots_the_store_first_and_only_once() {
        let mut d = desired("v2");
        d.snapshot_before_version_change = true;
        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&d, &o), Step::Snapshot);
        o.snapshot_for = Some(template("v2"));
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
        // A snapshot for another target does not count.
        o.snapshot_for = Some(template("v3"));
        assert_eq!(plan(&d, &o), Step::Snapshot);
    }

    #[test]
    fn restarts_first_starts_and_stores_without_snapshots_do_not_snapshot() {
        let mut d = desired("v1");
        d.snapshot_before_version_change = true;
        d.template.restarted_at = Some("now".into());
        let o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
        let first = observed(None, vec![]);
        assert_eq!(plan(&d, &first), Step::StartSlot { name: "a".into() });
        let mut d = desired("v2");
        d.snapshot_before_version_change = false;
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    }

    #[test]
    fn a_caddy_front_that_is_down_lets_the_first_slot_start_and_holds_the_switch() {
        let d = desired("v1");
        let mut o = observed(None, vec![]);
        o.front = FrontObservation::Down;
        o.front_ours = false;
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
        o.slots = vec![slot("a", "v1", true, true)];
        assert_eq!(plan(&d, &o), Step::EnsureFront);
        o.front = FrontObservation::Up { backend: None };
        assert_eq!(plan(&d, &o), Step::SwitchFront { to: "a".into() });
    }

    #[test]
    fn a_new_shard_gets_its_store_then_its_front_then_slot_a() {
        let mut o = observed(None, vec![]);
        o.store_up = false;
        o.front = FrontObservation::Down;
        assert_eq!(plan(&desired("v1"), &o), Step::EnsureStore);
        o.store_up = true;
        assert_eq!(plan(&desired("v1"), &o), Step::EnsureFront);
        o.front = FrontObservation::Up { backend: None };
        assert_eq!(plan(&desired("v1"), &o), Step::StartSlot { name: "a".into() });
    }

    #[test]
    fn the_first_slot_is_waited_for_then_switched_to() {
        let o = observed(None, vec![slot("a", "v1", true, false)]);
        assert_eq!(plan(&desired("v1"), &o), Step::AwaitReady { name: "a".into() });
        let o = observed(None, vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&desired("v1"), &o), Step::SwitchFront { to: "a".into() });
    }

    #[test]
    fn a_version_change_walks_the_whole_roll() {
        let d = desired("v2");
        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
        o.roll = Some(roll(Some("a"), "b"));
        o.slots.push(slot("b", "v2", true, false));
        assert_eq!(plan(&d, &o), Step::AwaitReady { name: "b".into() });
        o.slots[1].ready = true;
        assert_eq!(plan(&d, &o), Step::SwitchFront { to: "b".into() });
        o.front = FrontObservation::Up {
            backend: Some("b".into()),
        };
        o.roll.as_mut().unwrap().front_switched_at = Some(at(10));
        assert_eq!(
            plan(&d, &o),
            Step::AwaitSettle {
                name: "a".into(),
                remaining: SWITCH_SETTLE
            }
        );
        o.now = at(12);
        assert_eq!(plan(&d, &o), Step::TerminateSlot { name: "a".into() });
        // The old slot stopped listening: the Lease and the probe go first, while it drains.
        o.roll.as_mut().unwrap().old_slot_stopped_listening_at = Some(at(12));
        o.slots[0].ready = false;
        assert_eq!(plan(&d, &o), Step::ReleaseLease);
        o.roll.as_mut().unwrap().lease_released_at = Some(at(12));
        assert_eq!(plan(&d, &o), Step::Probe);
        o.roll.as_mut().unwrap().probe_succeeded_at = Some(at(13));
        assert_eq!(plan(&d, &o), Step::StopSlot { name: "a".into() });
        o.slots.remove(0);
        assert_eq!(plan(&d, &o), Step::CompleteRoll);
        o.roll = None;
        assert_eq!(plan(&d, &o), Step::Idle);
    }

    #[test]
    fn the_settle_wait_asks_for_exactly_the_time_left() {
        let d = desired("v2");
        let mut o = observed(
            Some("b"),
            vec![slot("a", "v1", true, true), slot("b", "v2", true, true)],
        );
        o.roll = Some(RollRecord {
            front_switched_at: Some(o.now - chrono::Duration::milliseconds(200)),
            ..roll(Some("a"), "b")
        });
        assert_eq!(
            plan(&d, &o),
            Step::AwaitSettle {
                name: "a".into(),
                remaining: SWITCH_SETTLE - Duration::from_millis(200)
            }
        );
    }

    #[test]
    fn an_old_slot_that_exits_while_it_drains_is_stopped_not_reported_as_crashed() {
        let d = desired("v2");
        let mut o = observed(
            Some("b"),
            vec![slot("a", "v1", false, false), slot("b", "v2", true, true)],
        );
        o.roll = Some(RollRecord {
            front_switched_at: Some(at(1)),
            old_slot_stopped_listening_at: Some(at(2)),
            ..roll(Some("a"), "b")
        });
        assert_eq!(plan(&d, &o), Step::StopSlot { name: "a".into() });
        // Once it is forgotten, the hand-over goes on.
        o.slots.remove(0);
        assert_eq!(plan(&d, &o), Step::ReleaseLease);
    }

    #[test]
    fn a_draining_old_slot_is_not_taken_for_the_desired_one_when_the_spec_goes_back() {
        // The spec went back to the old slot's template after it was sent SIGTERM: it is not
        // waited for; the new slot (now outdated) and it are both stopped, then a fresh one starts.
        let d = desired("v1");
        let mut o = observed(
            Some("b"),
            vec![slot("a", "v1", true, false), slot("b", "v2", true, true)],
        );
        o.roll = Some(RollRecord {
            old_slot_stopped_listening_at: Some(at(2)),
            ..roll(Some("a"), "b")
        });
        assert_eq!(plan(&d, &o), Step::StopSlot { name: "a".into() });
    }

    #[test]
    fn a_new_front_address_moves_the_front_before_anything_else() {
        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        o.front_elsewhere = true;
        assert_eq!(plan(&desired("v1"), &o), Step::EnsureFront);
    }

    #[test]
    fn a_first_start_has_no_lease_to_release() {
        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        o.roll = Some(roll(None, "a"));
        assert_eq!(plan(&desired("v1"), &o), Step::Probe);
    }

    #[test]
    fn a_restart_request_is_a_roll_to_the_same_version() {
        let mut d = desired("v1");
        d.template.restarted_at = Some("2026-11-29T10:00:00Z".into());
        let o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
    }

    #[test]
    fn a_missing_binary_blocks_and_leaves_the_old_slot_alone() {
        let mut d = desired("v9");
        d.binary_present = false;
        let o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert!(matches!(
            plan(&d, &o),
            Step::Blocked {
                cause: BlockCause::NoBinary { .. }
            }
        ));
    }

    #[test]
    fn a_refused_version_change_blocks_and_leaves_the_old_slot_alone() {
        let mut d = desired("v2");
        d.version_refused = Some("v2 is older".into());
        let o = observed(Some("a"), vec![slot("a", "v3", true, true)]);
        assert!(matches!(
            plan(&d, &o),
            Step::Blocked {
                cause: BlockCause::VersionRefused { .. }
            }
        ));
    }

    #[test]
    fn a_new_slot_that_is_not_ready_in_time_is_aborted() {
        let mut d = desired("v2");
        d.readiness_timeout = Duration::from_secs(5);
        let mut o = observed(
            Some("a"),
            vec![slot("a", "v1", true, true), slot("b", "v2", true, false)],
        );
        o.roll = Some(roll(Some("a"), "b"));
        assert_eq!(
            plan(&d, &o),
            Step::RestartSlot {
                name: "b".into(),
                cause: RestartCause::NotReady { timeout_seconds: 5 }
            },
            "a kcp start-up that never finishes gets one more try"
        );
        o.roll.as_mut().unwrap().not_ready_restarts = NOT_READY_RESTARTS;
        assert!(
            matches!(plan(&d, &o), Step::AbortRoll { ref name, cause: BlockCause::SlotNotReady { .. } } if name == "b")
        );
        o.roll = None;
        assert!(
            matches!(plan(&d, &o), Step::AbortRoll { .. }),
            "without a roll record there is no count: stopped at once"
        );
    }

    #[test]
    fn a_new_slot_whose_start_overlapped_a_store_outage_is_started_again_once_the_store_is_back() {
        let d = desired("v2");
        let mut o = observed(
            Some("a"),
            vec![slot("a", "v1", true, true), slot("b", "v2", true, false)],
        );
        o.roll = Some(RollRecord {
            store_down_at: Some(at(3)),
            ..roll(Some("a"), "b")
        });
        o.store_up = false;
        assert_eq!(plan(&d, &o), Step::EnsureStore, "the store first");
        o.store_up = true;
        assert_eq!(
            plan(&d, &o),
            Step::RestartSlot {
                name: "b".into(),
                cause: RestartCause::StoreOutage
            }
        );
        // Started again after the outage: waited for as usual.
        o.slots[1].started_at = at(5);
        assert_eq!(plan(&d, &o), Step::AwaitReady { name: "b".into() });
        // An outage before the slot started, or one a ready slot went through, changes nothing.
        o.slots[1].started_at = at(0);
        o.slots[1].ready = true;
        assert_eq!(plan(&d, &o), Step::SwitchFront { to: "b".into() });
        // The slot the front serves from is never restarted this way.
        o.slots[1].ready = false;
        o.front = FrontObservation::Up {
            backend: Some("b".into()),
        };
        assert_eq!(plan(&d, &o), Step::AwaitReady { name: "b".into() });
    }

    #[test]
    fn a_slot_not_ready_in_time_is_retried_once_the_readiness_timeout_is_raised() {
        let mut d = desired("v2");
        d.readiness_timeout = Duration::from_secs(5);
        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        o.blocked = Some(Blocked {
            template: template("v2"),
            cause: BlockCause::SlotNotReady {
                slot: "b".into(),
                timeout_seconds: 5,
            },
        });
        assert!(matches!(
            plan(&d, &o),
            Step::Blocked {
                cause: BlockCause::SlotNotReady { .. }
            }
        ));
        d.readiness_timeout = Duration::from_secs(4);
        assert!(
            matches!(plan(&d, &o), Step::Blocked { .. }),
            "a lower timeout does not retry"
        );
        d.readiness_timeout = Duration::from_secs(300);
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "b".into() });
        // A crashed slot is not retried by a longer timeout: only a new spec helps.
        o.blocked.as_mut().unwrap().cause = BlockCause::SlotCrashed { slot: "b".into() };
        assert!(matches!(plan(&d, &o), Step::Blocked { .. }));
    }

    #[test]
    fn a_new_slot_that_crashes_is_aborted_and_not_retried_until_the_spec_changes() {
        let d = desired("v2");
        let mut o = observed(
            Some("a"),
            vec![slot("a", "v1", true, true), slot("b", "v2", false, false)],
        );
        o.roll = Some(roll(Some("a"), "b"));
        assert!(matches!(
            plan(&d, &o),
            Step::AbortRoll {
                cause: BlockCause::SlotCrashed { .. },
                ..
            }
        ));

        let mut o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        o.blocked = Some(Blocked {
            template: template("v2"),
            cause: BlockCause::SlotCrashed { slot: "b".into() },
        });
        assert!(matches!(plan(&d, &o), Step::Blocked { .. }));
        assert_eq!(
            plan(&desired("v3"), &o),
            Step::StartSlot { name: "b".into() },
            "a new spec retries"
        );
    }

    #[test]
    fn a_crashed_active_slot_is_forgotten_then_replaced() {
        let d = desired("v1");
        let o = observed(Some("a"), vec![slot("a", "v1", false, false)]);
        assert_eq!(
            plan(&d, &o),
            Step::ForgetSlot {
                name: "a".into(),
                was_active: true
            }
        );
        let o = observed(Some("a"), vec![]);
        assert_eq!(plan(&d, &o), Step::StartSlot { name: "a".into() });
    }

    #[test]
    fn a_second_spec_change_mid_roll_stops_the_spare_slot_first() {
        let d = desired("v3");
        let o = observed(
            Some("a"),
            vec![slot("a", "v1", true, true), slot("b", "v2", true, true)],
        );
        assert_eq!(plan(&d, &o), Step::StopSlot { name: "b".into() });
    }

    #[test]
    fn deletion_cleans_up_until_nothing_runs() {
        let mut d = desired("v1");
        d.deleting = true;
        let o = observed(Some("a"), vec![slot("a", "v1", true, true)]);
        assert_eq!(plan(&d, &o), Step::Cleanup);
        let mut o = observed(None, vec![]);
        o.store_up = false;
        o.store_processes_up = false;
        o.front = FrontObservation::Down;
        assert_eq!(plan(&d, &o), Step::Idle);
        // An external store (etcd, a PostgreSQL someone else runs) stays up: not ours to stop.
        o.store_up = true;
        assert_eq!(plan(&d, &o), Step::Idle);
        o.store_processes_up = true;
        assert_eq!(plan(&d, &o), Step::Cleanup);
    }

    fn arb_slot() -> impl Strategy<Value = SlotObservation> {
        (
            prop::sample::select(vec!["a", "b"]),
            prop::sample::select(vec!["v1", "v2", "v3"]),
            any::<bool>(),
            any::<bool>(),
            0i64..300,
        )
            .prop_map(|(name, version, running, ready, started)| SlotObservation {
                name: name.into(),
                template: template(version),
                running,
                ready: ready && running,
                started_at: at(started),
            })
    }

    fn arb_observed() -> impl Strategy<Value = Observed> {
        (
            any::<bool>(),
            prop::option::of(prop::option::of(prop::sample::select(vec!["a", "b"]))),
            prop::collection::vec(arb_slot(), 0..=2),
            prop::option::of((
                prop::sample::select(vec!["a", "b"]),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            )),
            0i64..400,
            prop::option::of(prop::sample::select(vec!["v1", "v2", "v3"])),
            any::<bool>(),
        )
            .prop_map(|(store_up, front, mut slots, rolling, now, snapshot_for, front_ours)| {
                slots.dedup_by(|a, b| a.name == b.name);
                Observed {
                    now: at(now),
                    store_up,
                    store_problem: None,
                    store_processes_up: store_up,
                    snapshot_for: snapshot_for.map(template),
                    front: match front {
                        None => FrontObservation::Down,
                        Some(backend) => FrontObservation::Up {
                            backend: backend.map(str::to_string),
                        },
                    },
                    front_ours,
                    front_problem: None,
                    front_outdated: false,
                    front_elsewhere: false,
                    slots,
                    roll: rolling.map(|(to, terminated, released, probed)| RollRecord {
                        front_switched_at: terminated.then(|| at(0)),
                        old_slot_stopped_listening_at: terminated.then(|| at(1)),
                        lease_released_at: released.then(|| at(1)),
                        probe_succeeded_at: (released && probed).then(|| at(2)),
                        ..roll(Some("a"), to)
                    }),
                    blocked: None,
                }
            })
    }

    proptest! {
        #[test]
        fn the_front_only_ever_switches_to_a_running_ready_slot(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            if let Step::SwitchFront { to } = plan(&desired(version), &o) {
                let target = o.slots.iter().find(|s| s.name == to).expect("switches to an observed slot");
                prop_assert!(target.running && target.ready);
            }
        }

        #[test]
        fn the_slot_the_front_serves_from_is_never_stopped_while_it_is_the_only_ready_one(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            let backend = match &o.front { FrontObservation::Up { backend } => backend.clone(), FrontObservation::Down => None };
            match plan(&desired(version), &o) {
                Step::StopSlot { name } | Step::TerminateSlot { name } | Step::AbortRoll { name, .. } | Step::RestartSlot { name, .. } => {
                    let serving = backend.as_deref() == Some(name.as_str()) && o.slots.iter().any(|s| s.name == name && s.ready);
                    let other_ready = o.slots.iter().any(|s| s.name != name && s.running && s.ready);
                    prop_assert!(!serving || other_ready, "stopped {name}, the last ready slot behind the front");
                }
                _ => {}
            }
        }

        #[test]
        fn a_slot_is_started_only_when_fewer_than_two_run_and_under_a_free_name(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            if let Step::StartSlot { name } = plan(&desired(version), &o) {
                prop_assert!(o.slots.iter().filter(|s| s.running).count() < 2);
                prop_assert!(o.slots.iter().all(|s| s.name != name));
            }
        }

        #[test]
        fn the_lease_is_released_only_when_every_other_slot_is_gone_or_stopped_listening(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            if plan(&desired(version), &o) == Step::ReleaseLease {
                let backend = match &o.front { FrontObservation::Up { backend } => backend.clone(), FrontObservation::Down => None };
                let others: Vec<_> = o.slots.iter().filter(|s| s.running && Some(&s.name) != backend.as_ref()).collect();
                prop_assert!(others.iter().all(|s| is_terminated(&o, &s.name)), "released while {others:?} may still lead");
                prop_assert!(o.slots.iter().any(|s| s.running && s.ready && Some(&s.name) == backend.as_ref()), "released with no ready slot behind the front to lead");
            }
        }

        #[test]
        fn nothing_runs_before_the_store_is_up(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            let step = plan(&desired(version), &o);
            if !o.store_up {
                prop_assert_eq!(step, Step::EnsureStore);
            }
        }

        #[test]
        fn no_slot_of_a_new_version_starts_before_the_snapshot(o in arb_observed(), version in prop::sample::select(vec!["v1", "v2", "v3"])) {
            let mut d = desired(version);
            d.snapshot_before_version_change = true;
            let serving = match &o.front {
                FrontObservation::Up { backend: Some(b) } => o.slots.iter().find(|s| &s.name == b && s.running),
                _ => None,
            };
            if let Step::StartSlot { .. } = plan(&d, &o)
                && let Some(serving) = serving
                && serving.template.version != version
            {
                prop_assert_eq!(o.snapshot_for, Some(template(version)));
            }
        }
    }
}
