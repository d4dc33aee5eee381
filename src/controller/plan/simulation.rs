//! Property tests of the plan over random histories: a small model of slots, front and Lease takes
//! each planned step as the real act would, while crashes, hangs, slow starts, store outages and
//! spec changes happen at any point. Every step is checked against the plan's invariants, and once
//! the faults stop the shard must converge. The preflight of a new version is part of the model:
//! v1 passes it, v2 changes kcp's schemas (it rolls once schema changes are allowed), v3's kcp
//! exits on the copy. The data keeps the version that last started on it, as data-version.json
//! does, and the preflight's invariant is checked against it. A version change dumps the store
//! first, as a job that runs while everything else goes on. In some histories kcp answers the
//! requests of steps slowly: the step returns without its answer and takes it up when planned
//! again (controller/requests.rs).
//!
//! Longer than 600 lines on purpose: the model has to take every step as act does, and one step's
//! model next to the others is what keeps it honest.
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::tests::{at, desired, template};
use super::*;

const TICK: Duration = Duration::from_millis(100);
/// The steps that make a request to kcp or the front (controller/requests.rs).
const ASKING: [&str; 6] = [
    "Probe",
    "SetFront",
    "ReleaseLease",
    "StartPreflight",
    "ReleasePreflightLease",
    "ComparePreflight",
];

#[derive(Debug, Clone)]
enum Fault {
    Crash(usize),
    Hang(usize),
    Recover(usize),
    Spec {
        version: &'static str,
        slots: usize,
    },
    StoreDown,
    /// spec.rollout.allowMinorVersionChange flips.
    AllowSchemaChange(bool),
    /// serve stopped between recording a preflight and starting its kcp.
    PreflightInterrupted,
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        (0usize..4).prop_map(Fault::Crash),
        (0usize..4).prop_map(Fault::Hang),
        (0usize..4).prop_map(Fault::Recover),
        (prop::sample::select(vec!["v1", "v2", "v3"]), 1usize..=3)
            .prop_map(|(version, slots)| Fault::Spec { version, slots }),
        Just(Fault::StoreDown),
        any::<bool>().prop_map(Fault::AllowSchemaChange),
        Just(Fault::PreflightInterrupted),
    ]
}

struct ModelSlot {
    seen: SlotObservation,
    /// When its kcp starts answering `/readyz`.
    ready_at: chrono::DateTime<chrono::Utc>,
    hung_since: Option<chrono::DateTime<chrono::Utc>>,
    /// After SIGTERM: when it stops listening, and when it exits.
    closes_at: Option<chrono::DateTime<chrono::Utc>>,
    exits_at: Option<chrono::DateTime<chrono::Utc>>,
}

struct Model {
    desired: Desired,
    observed: Observed,
    slots: Vec<ModelSlot>,
    /// The Lease's holder: a slot name, or a holder that no longer exists.
    lease: Option<String>,
    start_delay_ms: i64,
    /// When the preflight's kcp answers `/readyz` (or, for v3, exits).
    preflight_ready_at: chrono::DateTime<chrono::Utc>,
    /// The template the last slot started on the data ran (data-version.json).
    data: Option<SlotTemplate>,
    /// When the running job (a dump) ends.
    job_ends_at: chrono::DateTime<chrono::Utc>,
    /// When the store's kine, started, accepts.
    store_accepts_at: chrono::DateTime<chrono::Utc>,
    /// When the kine over the preflight's copy, started, accepts (None: not started).
    copy_accepts_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the preflight's kcp and kine, asked to stop, have exited.
    preflight_exits_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Each slot's own kine (as on KinePostgres), by slot name: when it, started, accepts.
    slot_kines: BTreeMap<String, chrono::DateTime<chrono::Utc>>,
    /// How long kcp takes to answer a step's request (none: within the step).
    answer_after: Option<chrono::Duration>,
    /// The request under way or answered: its step, and when it is answered.
    asked: Option<(Step, chrono::DateTime<chrono::Utc>)>,
}

impl Model {
    fn new() -> Model {
        let mut d = desired("v1");
        d.readiness_timeout = Duration::from_secs(5);
        d.preflight = true;
        d.snapshot_before_version_change = true;
        let mut observed = super::tests::observed(&[], vec![]);
        observed.now = at(0);
        // A new shard of a sharded kcp's root: no admin identity and no trust yet.
        observed.identities = IdentitiesObservation::default();
        observed.sharded_trust_stale = true;
        Model {
            desired: d,
            observed,
            slots: Vec::new(),
            lease: None,
            start_delay_ms: 1_500,
            preflight_ready_at: at(0),
            data: None,
            job_ends_at: at(0),
            store_accepts_at: at(0),
            copy_accepts_at: None,
            preflight_exits_at: None,
            slot_kines: BTreeMap::new(),
            answer_after: None,
            asked: None,
        }
    }

    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.observed.now
    }

    /// What observe would see now.
    fn observe(&mut self) {
        let now = self.now();
        self.observed.answer_awaited = self
            .asked
            .as_ref()
            .filter(|(_, at)| now < *at)
            .map(|(step, _)| step.name());
        self.observed.answered = self
            .asked
            .as_ref()
            .filter(|(_, at)| now >= *at)
            .map(|(step, _)| step.clone());
        // The front made the change it was asked for when it answered.
        if let Some(Step::SetFront(change)) = self.observed.answered.clone() {
            self.switch_front(&change);
        }
        for m in &mut self.slots {
            let s = &mut m.seen;
            if let Some(exits) = m.exits_at
                && now >= exits
            {
                s.running = false;
            }
            if m.closes_at.is_some_and(|c| now >= c) || !s.running {
                if s.listening && s.stopping() {
                    s.stopped_listening_at = Some(now);
                }
                s.listening = false;
            }
            let answers = s.running && s.listening && now >= m.ready_at && m.hung_since.is_none();
            if answers {
                s.health = Health::serving(now);
            } else if s.running {
                s.health.ready = false;
                if s.health.ever_ready {
                    s.health.failures += 1;
                }
            }
        }
        // kcp's election: a free Lease goes to a slot that answers; a held one stays held, however
        // dead its holder (kcp never releases it).
        if self.lease.is_none()
            && let Some(s) = self.slots.iter().find(|m| m.seen.can_join() && m.seen.listening)
        {
            self.lease = Some(s.seen.name.clone());
        }
        self.observed.lease = match &self.lease {
            None => LeaseHolder::Free,
            Some(h) if self.slots.iter().any(|m| &m.seen.name == h) => LeaseHolder::Slot(h.clone()),
            Some(_) => LeaseHolder::Gone,
        };
        let leader_runs = self
            .slots
            .iter()
            .any(|m| Some(&m.seen.name) == self.lease.as_ref() && m.seen.running && m.seen.listening);
        self.observed.probe_ready = leader_runs && self.observed.roll.as_ref().is_some_and(|r| r.probe.is_some());
        self.observed.slots = self.slots.iter().map(|m| m.seen.clone()).collect();
        self.observed.slot_stores_starting = self
            .slot_kines
            .iter()
            .filter(|(_, accepts_at)| now < **accepts_at)
            .map(|(name, _)| name.clone())
            .collect();
        if self.observed.store_starting && now >= self.store_accepts_at {
            self.observed.store_starting = false;
            self.observed.store_up = true;
        }
        if let Some(job) = self.observed.job.as_mut().filter(|j| j.running())
            && now >= self.job_ends_at
        {
            job.state = JobState::Succeeded;
        }
        if let Some(p) = self.observed.preflight.as_mut()
            && p.run == PreflightRun::StoreStarting
            && self.copy_accepts_at.is_some_and(|at| now >= at)
        {
            p.run = PreflightRun::Copied;
        }
        if self.preflight_exits_at.is_some_and(|at| now >= at) {
            self.preflight_exits_at = None;
            let (exited, running) = std::mem::take(&mut self.observed.stopping)
                .into_iter()
                .partition(|s| s.what == Stopping::Preflight);
            self.observed.stopping = running;
            self.observed
                .killed_and_gone
                .extend(exited.into_iter().filter(|s: &ProcessStop| s.killed));
            if let Some(p) = self.observed.preflight.as_mut() {
                p.processes_running = false;
            }
        }
        let ready_at = self.preflight_ready_at;
        if let Some(p) = self.observed.preflight.as_mut().filter(|p| p.result.is_none())
            && let PreflightRun::Running {
                ready,
                lease_released_at,
                controllers_lead,
            } = &mut p.run
        {
            if now >= ready_at && p.template.version == "v3" {
                p.run = PreflightRun::Exited {
                    last_words: "unknown flag".into(),
                };
            } else {
                *ready |= now >= ready_at;
                *controllers_lead |=
                    lease_released_at.is_some_and(|at| now >= at + chrono::Duration::milliseconds(500));
            }
        }
    }

    fn fault(&mut self, fault: &Fault) {
        let now = self.now();
        let pick = |i: usize, n: usize| (n > 0).then(|| i % n);
        match *fault {
            Fault::Crash(i) => {
                if let Some(i) = pick(i, self.slots.len()) {
                    self.slots[i].seen.running = false;
                }
            }
            Fault::Hang(i) => {
                if let Some(i) = pick(i, self.slots.len()) {
                    self.slots[i].hung_since.get_or_insert(now);
                }
            }
            Fault::Recover(i) => {
                if let Some(i) = pick(i, self.slots.len()) {
                    self.slots[i].hung_since = None;
                }
            }
            Fault::Spec { version, slots } => {
                self.desired.template = template(version);
                self.desired.slots = slots;
            }
            Fault::StoreDown => {
                self.observed.store_up = false;
                self.observed.store_starting = false;
            }
            Fault::AllowSchemaChange(allow) => self.desired.allow_schema_change = allow,
            Fault::PreflightInterrupted => {
                // serve restarted mid-preflight: the copy's job, if any, is lost, and a kcp that
                // had not been started yet is not.
                if let Some(p) = self.observed.preflight.as_mut().filter(|p| p.result.is_none())
                    && p.run == PreflightRun::Copying
                    && let Some(job) = self.observed.job.as_mut().filter(|j| j.running())
                {
                    job.state = JobState::Lost;
                }
            }
        }
    }

    fn slot_mut(&mut self, name: &str) -> &mut ModelSlot {
        self.slots
            .iter_mut()
            .find(|m| m.seen.name == name)
            .expect("planned for a known slot")
    }

    fn stop(&mut self, name: &str, cause: StopCause, killed: bool) {
        let now = self.now();
        let m = self.slot_mut(name);
        m.seen.stop = Some(StopRecord { cause, at: now, killed });
        if killed {
            m.seen.running = false;
        } else if m.hung_since.is_none() {
            m.closes_at.get_or_insert(now + chrono::Duration::milliseconds(300));
            m.exits_at.get_or_insert(now + chrono::Duration::milliseconds(1_500));
        }
    }

    /// As StartSlot does first: starts slot `name`'s own kine if it has none (true: the step ends
    /// there); a kcp never starts before its kine accepts.
    fn starts_own_kine(&mut self, name: &str, now: chrono::DateTime<chrono::Utc>) -> Result<bool, TestCaseError> {
        match self.slot_kines.get(name) {
            None => {
                self.slot_kines
                    .insert(name.to_string(), now + chrono::Duration::milliseconds(200));
                Ok(true)
            }
            Some(accepts_at) => {
                prop_assert!(
                    now >= *accepts_at,
                    "slot {name}'s kcp started before its own kine accepts"
                );
                Ok(false)
            }
        }
    }

    /// Takes `step` as act would, after checking it against the invariants.
    fn apply(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let now = self.now();
        let o = &self.observed.clone();
        match step {
            Step::EnsureStore => {
                if let Some(roll) = self.observed.roll.as_mut()
                    && self.slots.iter().any(|m| m.seen.running && !m.seen.health.ever_ready)
                {
                    roll.store_down_at = Some(now);
                }
                prop_assert!(!o.store_starting, "a second kine started beside one that starts");
                self.observed.store_starting = true;
                self.store_accepts_at = now + chrono::Duration::milliseconds(300);
            }
            Step::Snapshot => {
                prop_assert!(
                    o.job.as_ref().is_none_or(|j| !j.running()),
                    "a dump started beside another job: {:?}",
                    o.job
                );
                self.job_ends_at = now + chrono::Duration::milliseconds(800);
                self.observed.job = Some(JobObservation {
                    record: JobRecord {
                        kind: JobKind::Snapshot {
                            template: Box::new(self.desired.template.clone()),
                        },
                        started_at: now,
                        output: None,
                        cancelled_at: None,
                    },
                    state: JobState::Running,
                });
            }
            Step::FinishJob => {
                let job = self.observed.job.take().expect("a job");
                prop_assert!(!job.running(), "finished a job that runs");
                match (job.record.kind, job.state, job.record.cancelled_at) {
                    (JobKind::Snapshot { template }, JobState::Succeeded, None) => {
                        self.observed.snapshot_for = Some(*template);
                    }
                    (JobKind::PreflightCopy { template }, JobState::Succeeded, None) => {
                        if let Some(p) = self.observed.preflight.as_mut().filter(|p| p.template == *template) {
                            p.run = PreflightRun::Copied;
                        }
                    }
                    _ => {}
                }
            }
            Step::CancelJob => {
                let job = self.observed.job.as_mut().expect("a job");
                job.record.cancelled_at.get_or_insert(now);
                job.state = JobState::Failed {
                    message: "killed".into(),
                };
            }
            Step::StartPreflight => {
                prop_assert!(
                    o.preflight.as_ref().is_none_or(|p| !p.leftovers),
                    "a preflight started over another's leftovers: {:?}",
                    o.preflight
                );
                self.copy_accepts_at = None;
                self.observed.preflight = Some(PreflightObservation {
                    template: self.desired.template.clone(),
                    started_at: now,
                    launched_at: None,
                    run: PreflightRun::Copying,
                    result: None,
                    detail: vec![],
                    leftovers: true,
                    processes_running: false,
                });
            }
            Step::CopyPreflight => {
                prop_assert!(
                    o.job.as_ref().is_none_or(|j| !j.running()),
                    "a preflight copy started beside another job: {:?}",
                    o.job
                );
                let p = self.observed.preflight.as_ref().expect("a preflight");
                prop_assert_eq!(&p.run, &PreflightRun::Copying, "copied a preflight twice");
                self.job_ends_at = now + chrono::Duration::milliseconds(600);
                self.observed.job = Some(JobObservation {
                    record: JobRecord {
                        kind: JobKind::PreflightCopy {
                            template: Box::new(p.template.clone()),
                        },
                        started_at: now,
                        output: None,
                        cancelled_at: None,
                    },
                    state: JobState::Running,
                });
            }
            Step::LaunchPreflight => {
                let p = self.observed.preflight.as_mut().expect("a preflight");
                prop_assert_eq!(
                    &p.run,
                    &PreflightRun::Copied,
                    "launched a preflight before its copy was complete"
                );
                // The first launch starts the copy's kine; the one after it accepts, its kcp.
                if self.copy_accepts_at.is_none_or(|at| now < at) {
                    self.copy_accepts_at = Some(now + chrono::Duration::milliseconds(200));
                    p.run = PreflightRun::StoreStarting;
                    p.processes_running = true;
                    return Ok(());
                }
                self.preflight_ready_at = now + chrono::Duration::milliseconds(1_000);
                p.launched_at = Some(now);
                p.run = PreflightRun::Running {
                    ready: false,
                    lease_released_at: None,
                    controllers_lead: false,
                };
            }
            Step::ReleasePreflightLease => {
                let p = self.observed.preflight.as_mut().expect("a preflight");
                prop_assert!(
                    matches!(p.run, PreflightRun::Running { ready: true, .. }),
                    "released the Lease through a preflight kcp that is not ready"
                );
                p.run = PreflightRun::Running {
                    ready: true,
                    lease_released_at: Some(now),
                    controllers_lead: false,
                };
            }
            Step::ComparePreflight => {
                let p = self.observed.preflight.as_mut().expect("a preflight");
                let leading = matches!(
                    p.run,
                    PreflightRun::Running {
                        controllers_lead: true,
                        ..
                    }
                );
                prop_assert!(leading, "compared a preflight whose controllers do not lead");
                p.result = Some(if p.template.version == "v2" {
                    p.detail = vec!["CRD x: storedVersions changed".into()];
                    PreflightResult::SchemaChanged
                } else {
                    PreflightResult::Compatible
                });
            }
            Step::FailPreflight { .. } => {
                let p = self.observed.preflight.as_mut().expect("a preflight");
                p.result = Some(PreflightResult::Failed);
            }
            Step::StopPreflight => {
                prop_assert!(
                    o.preflight.as_ref().is_some_and(|p| p.processes_running),
                    "stopped a preflight of which nothing runs"
                );
                self.observed.stopping.push(ProcessStop {
                    what: Stopping::Preflight,
                    pid: 4242,
                    start_time: 1,
                    sent_at: now,
                    kill_at: now,
                    killed: false,
                    unit: None,
                });
                self.preflight_exits_at = Some(now + chrono::Duration::milliseconds(300));
            }
            Step::ForgetKilled => self.observed.killed_and_gone.clear(),
            Step::KillStopping {
                what: Stopping::Preflight,
            } => {
                for stop in self.observed.stopping.iter_mut() {
                    stop.killed = true;
                }
                self.preflight_exits_at = Some(now);
            }
            Step::RemovePreflight => {
                prop_assert!(
                    o.preflight.as_ref().is_none_or(|p| !p.processes_running),
                    "removed a preflight's copy while its kcp or kine runs"
                );
                prop_assert!(
                    o.job
                        .as_ref()
                        .is_none_or(|j| !j.running() || j.record.kind.preflight_of().is_none()),
                    "removed a preflight's copy while its job writes it"
                );
                let p = self.observed.preflight.as_mut().expect("a preflight");
                if p.result.is_none() {
                    self.observed.preflight = None;
                } else {
                    p.leftovers = false;
                    p.run = PreflightRun::Exited {
                        last_words: "removed".into(),
                    };
                }
            }
            Step::StartSlot { name } | Step::StartInterim { name } if self.starts_own_kine(name, now)? => {}
            Step::StartSlot { name } => {
                let version = &self.desired.template.version;
                let other_version_serves = o
                    .front
                    .backends()
                    .iter()
                    .filter_map(|b| o.slot(b))
                    .any(|s| &s.template.version != version);
                let other_version_served = self.data.as_ref().is_some_and(|d| &d.version != version);
                let first_of_its_template = !o
                    .slots
                    .iter()
                    .any(|s| s.running && !s.stopping() && s.template == self.desired.template);
                // The first slot of a new version (against what serves, or the data's own
                // version) waits for the preflight; the roll it began goes on.
                if (other_version_serves || other_version_served) && first_of_its_template {
                    let passed = o.preflight.as_ref().is_some_and(|p| {
                        p.template == self.desired.template
                            && !p.leftovers
                            && match p.result {
                                Some(PreflightResult::Compatible) => true,
                                Some(PreflightResult::SchemaChanged) => self.desired.allow_schema_change,
                                _ => false,
                            }
                    });
                    prop_assert!(
                        passed,
                        "{name} of a new version started without a passed preflight: {:?}",
                        o.preflight
                    );
                }
                self.observed.roll.get_or_insert(RollRecord {
                    to_version: version.clone(),
                    started_at: now,
                    ..Default::default()
                });
                self.observed.blocked = None;
                self.launch(name, self.desired.template.clone())?;
            }
            Step::StartInterim { name } => {
                prop_assert!(!o.front_serves(), "an interim {name} started while a slot serves");
                let interim = self.desired.interim.clone().expect("an interim template");
                prop_assert_eq!(
                    Some(&interim),
                    self.data.as_ref(),
                    "an interim slot of another template than the data's"
                );
                self.launch(name, interim)?;
            }
            Step::SetFront(change) => {
                self.check_front_change(change)?;
                self.switch_front(change);
            }
            Step::TerminateSlot { name } => {
                let s = o.slot(name).expect("a known slot");
                if s.health.ever_ready {
                    let others_serve = o
                        .front
                        .backends()
                        .iter()
                        .filter(|b| *b != name)
                        .filter_map(|b| o.slot(b))
                        .any(|b| b.can_stay());
                    prop_assert!(others_serve, "SIGTERM to {name} while no other slot serves");
                }
                prop_assert!(
                    !o.front.forwards_to(name),
                    "SIGTERM to {name} while the front sends to it"
                );
                self.stop(name, StopCause::Retired, false);
            }
            Step::KillSlot { name, .. } => self.stop(name, StopCause::Unresponsive, true),
            Step::RestartSlot { name, cause } => {
                if matches!(cause, RestartCause::NotReady { .. })
                    && let Some(roll) = self.observed.roll.as_mut()
                {
                    roll.not_ready_restarts += 1;
                }
                self.stop(name, StopCause::Restart, true);
            }
            Step::AbortRoll { name, cause } => {
                self.observed.blocked = Some(Blocked {
                    template: self.desired.template.clone(),
                    cause: cause.clone(),
                });
                self.observed.roll = None;
                if o.slot(name).is_some_and(|s| s.running) {
                    self.stop(name, StopCause::Abort, true);
                }
            }
            Step::RemoveSlot { name, crashed } => {
                let gone = o.slot(name).unwrap();
                prop_assert!(!gone.running, "removed {name} while it runs");
                // As act does: an interim slot that never got ready is not started again.
                if *crashed && !gone.health.ever_ready && self.desired.interim.as_ref() == Some(&gone.template) {
                    self.observed.interim_crashed_for = Some(self.desired.template.clone());
                }
                self.slots.retain(|m| &m.seen.name != name);
                // Its own kine is stopped with it (StopSlotStore).
                self.slot_kines.remove(name);
            }
            Step::ReleaseLease { to, .. } => {
                let holder = self.lease.as_ref().and_then(|h| o.slot(h));
                if let Some(h) = holder {
                    prop_assert!(
                        !h.running || (h.stopping() && !h.listening),
                        "took the Lease from {h:?}"
                    );
                }
                // With slow answers the hand-over was checked when it was asked; the successor
                // may have gone since (a slot that leads while gone is handed on).
                if self.answer_after.is_none() {
                    check_successor(o, to)?;
                }
                self.lease = Some(to.clone());
            }
            Step::Probe => {
                self.observed.roll.as_mut().expect("a roll").probe = Some(ProbeRecord {
                    workspace: "probe".into(),
                    created_at: now,
                })
            }
            Step::ProbeSucceeded => self.observed.roll.as_mut().expect("a roll").probe_succeeded_at = Some(now),
            Step::CompleteRoll => self.observed.roll = None,
            Step::IssueIdentity => {
                prop_assert!(
                    o.identities.ids.is_empty(),
                    "a second identity without a rotation request"
                );
                self.observed.identities.ids.push("id-1".into());
            }
            Step::WriteTrust => self.observed.sharded_trust_stale = false,
            Step::Blocked { .. } | Step::Wait(_) | Step::Idle => {}
            other => prop_assert!(false, "the model has no {other:?}"),
        }
        Ok(())
    }

    /// The front only ever gains a slot that answers `/readyz`, as observed when the change is made.
    fn check_front_change(&self, change: &FrontChange) -> Result<(), TestCaseError> {
        for joined in &change.joined {
            let s = self.observed.slot(joined).expect("joins a known slot");
            prop_assert!(s.can_join(), "{joined} joined the front without answering /readyz");
        }
        Ok(())
    }

    /// The front serves `change.backends` from now on.
    fn switch_front(&mut self, change: &FrontChange) {
        let now = self.now();
        for m in &mut self.slots {
            if change.backends.contains(&m.seen.name) {
                m.seen.left_front_at = None;
            } else if self.observed.front.forwards_to(&m.seen.name) {
                m.seen.left_front_at = Some(now);
            }
        }
        self.observed.front = FrontObservation::Up {
            backends: change.backends.clone(),
            open: vec![],
            retiring: vec![],
        };
    }

    /// Starts slot `name` of `template` on the data, as act's start_slot does.
    fn launch(&mut self, name: &str, template: SlotTemplate) -> Result<(), TestCaseError> {
        let now = self.now();
        let o = &self.observed;
        let running = o.slots.iter().filter(|s| s.running).count();
        prop_assert!(running <= self.desired.slots, "started {name} with {running} running");
        prop_assert!(
            !o.identities.ids.is_empty() && !o.sharded_trust_stale,
            "started {name} before the shard's identity and trust were written"
        );
        prop_assert!(o.slots.iter().all(|s| s.name != name), "{name} is taken");
        self.data = Some(template.clone());
        self.start_delay_ms = 700 + (self.start_delay_ms * 7) % 2_300;
        self.slots.push(ModelSlot {
            seen: SlotObservation {
                started_at: now,
                template,
                ..super::tests::slot(name, "", false)
            },
            ready_at: now + chrono::Duration::milliseconds(self.start_delay_ms),
            hung_since: None,
            closes_at: None,
            exits_at: None,
        });
        Ok(())
    }

    fn tick(&mut self) -> Result<Step, TestCaseError> {
        self.observed.now = self.now() + chrono::Duration::from_std(TICK).unwrap();
        self.observe();
        // What step() takes from data-version.json.
        self.observed.data_version = self.data.as_ref().map(|t| t.version.clone());
        self.desired.interim = self.data.clone().filter(|t| t.version != self.desired.template.version);
        let step = plan(&self.desired, &self.observed);
        // At most N+1 slots ever run.
        let running = self.observed.slots.iter().filter(|s| s.running).count();
        prop_assert!(running <= self.desired.slots.max(3) + 1, "{running} slots run");
        if let Some(after) = self.answer_after
            && ASKING.contains(&step.name())
        {
            match &self.asked {
                // Its answer came: the step takes it up. A front's change was made when it was
                // answered (observe), as it was asked: taking it up only records it.
                Some((asked, at)) if asked.name() == step.name() && self.now() >= *at => {
                    self.asked = None;
                    if matches!(step, Step::SetFront(_)) {
                        return Ok(step);
                    }
                }
                // Asked now (another request is dropped): the step returns without an answer.
                _ => {
                    match &step {
                        Step::SetFront(change) => self.check_front_change(change)?,
                        Step::ReleaseLease { to, .. } => check_successor(&self.observed, to)?,
                        _ => {}
                    }
                    self.asked = Some((step.clone(), self.now() + after));
                    return Ok(step);
                }
            }
        }
        self.apply(&step)?;
        Ok(step)
    }
}

/// The Lease is handed only to a slot that serves.
fn check_successor(observed: &Observed, to: &str) -> Result<(), TestCaseError> {
    let successor = observed.slot(to).expect("handed to a recorded slot");
    prop_assert!(
        successor.running && successor.listening && successor.health.ready,
        "handed the Lease to {successor:?}, which does not serve"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_plan_keeps_its_invariants_through_any_faults_and_converges_once_they_stop(
        faults in prop::collection::vec((0u32..40, fault()), 0..12),
        slow_answers in any::<bool>(),
    ) {
        let mut model = Model::new();
        model.answer_after = slow_answers.then(|| chrono::Duration::milliseconds(300));
        for (ticks, fault) in &faults {
            for _ in 0..*ticks {
                model.tick()?;
            }
            model.fault(fault);
        }
        for m in &mut model.slots {
            m.hung_since = None;
        }
        let mut last = Step::Idle;
        for _ in 0..2_000 {
            last = model.tick()?;
            if matches!(last, Step::Idle | Step::Blocked { .. }) {
                break;
            }
        }
        prop_assert!(matches!(last, Step::Idle | Step::Blocked { .. }), "did not converge: {last:?}");
        if last == Step::Idle {
            let o = &model.observed;
            let serving: Vec<_> = o.front.backends().iter().filter_map(|b| o.slot(b)).collect();
            prop_assert_eq!(serving.len(), model.desired.slots, "front: {:?}", o.front);
            prop_assert!(serving.iter().all(|s| s.template == model.desired.template && s.health.ready));
            prop_assert!(o.slots.iter().all(|s| s.running && !s.stopping()));
            prop_assert!(o.roll.is_none());
        }
    }
}
