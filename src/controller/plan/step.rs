//! What the plan answers: the one next step.
use std::time::Duration;

use super::*;

/// Why the front's serving set changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontChange {
    /// The slots new connections go to after the change.
    pub backends: Vec<String>,
    pub joined: Vec<String>,
    /// The slots that leave, each with why.
    pub left: Vec<(String, LeaveCause)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveCause {
    /// A newer slot took its place, or it is one more than spec.slots.
    Replaced,
    /// It does not answer ([`super::Health::unresponsive`]).
    Unresponsive,
    /// Its process is gone.
    Exited,
}

/// Why a slot is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillCause {
    /// It served, and has not answered `/readyz` for livenessTimeout.
    Unresponsive { seconds: u64 },
    /// It holds the controllers' Lease, does not answer `/readyz`, and has not renewed the Lease
    /// within kcp's renew deadline ([`super::LEADER_RENEW_DEADLINE`]) while another slot serves.
    HungLeader { seconds: u64 },
    /// It served, and now answers `/readyz` but not kcp's own APIs.
    Broken,
    /// Sent SIGTERM, it did not exit within drainTimeout.
    DrainTimeout { seconds: u64 },
}

/// Why a new slot, not ready yet, is started again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartCause {
    /// Its start-up overlapped a store outage, after which kcp's informers may never sync.
    StoreOutage,
    /// It did not answer /readyz within readinessTimeout.
    NotReady { timeout_seconds: u64 },
    /// It answers `/readyz` but not kcp's own APIs.
    Broken,
}

/// What is waited for, when nothing can be done now.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// The store's kine, started, to accept connections.
    Store,
    /// A new slot's `/readyz`.
    Ready { slot: String },
    /// kcpshard's front, started, to answer on its control socket.
    Front,
    /// A successor of kcpshard's front (UpgradeFront) to take its listening socket over.
    FrontUpgrade,
    /// Connections pinned to a slot that left the front, before it gets SIGTERM.
    Settle { slot: String, remaining: Duration },
    /// A slot sent SIGTERM: it stops listening, drains and exits.
    Exit { slot: String },
    /// A leader that cannot lead (stopped, or silent) to miss kcp's renew deadline for the
    /// controllers' Lease, when it is killed.
    RenewDeadline { slot: String, remaining: Duration },
    /// The probe workspace to reach Ready.
    Probe,
    /// The preflight's kcp to answer `/readyz`, or its probe workspace to reach Ready.
    Preflight,
    /// The running job (a dump, a restore: its [`JobKind::name`]) to end.
    Job { job: &'static str },
    /// The time to try a job that failed again (job.rs, [`super::JobFailure`]).
    JobRetry {
        job: &'static str,
        at: chrono::DateTime<chrono::Utc>,
    },
    /// Processes asked to stop to exit.
    Stopping { what: Stopping },
    /// The answer to a request the step made (to kcp, to PostgreSQL): the step takes it up once
    /// it comes (controller/requests.rs).
    Answer(Box<Step>),
}

/// Why a preflight failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreflightFailure {
    /// Its kcp exited (with its last error line and log).
    Exited { last_words: String },
    /// Its kcp did not answer `/readyz` within readinessTimeout.
    NotReady { timeout_seconds: u64 },
    /// Its controllers did not take their Lease within readinessTimeout of its release.
    ControllersNotLeading { timeout_seconds: u64 },
}

/// The one thing to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A slot's kcp runs without a record: rebuild the record from its command line (it is then
    /// replaced by a roll, since what argv does not tell is lost).
    AdoptSlot {
        name: String,
    },
    /// Make the shard's admin identity (none is recorded), or a second one for a new rotation
    /// request, and record it before any slot is started with it.
    IssueIdentity,
    /// Record that a rotation reached its second half, or drop identities no slot accepts.
    UpdateIdentities,
    /// Write the kubeconfig through the front for the identity every listening slot accepts.
    WriteKubeconfig,
    /// Make what is missing of a sharded kcp's trust in its root shard, before a slot starts.
    WriteTrust,
    EnsureStore,
    /// A kine kcpshard runs does not answer reads: kill it (EnsureStore starts it again on the same
    /// port).
    KillStore,
    /// Start kcpshard's front (looks wait until it answers on its control socket), or check that
    /// caddy's admin API answers.
    EnsureFront,
    /// kcpshard's front runs another binary than serve's: start a front of this binary that takes
    /// its listening socket over (docs/front.md, Upgrades); looks wait until it has, or it failed.
    UpgradeFront,
    /// kcpshard's front listens on another address than spec.front.listen: ask it to stop (it
    /// closes its listening socket at once and drains its connections); EnsureFront starts the
    /// new one once it is gone.
    MoveFront,
    /// A check of a caddy front's change through the front passed (`failure` None), or still
    /// failed after `FRONT_CHECK_TIMEOUT`: forget it, telling a failure.
    FinishFrontCheck {
        failure: Option<String>,
    },
    /// kcpshard's front does not answer on its control socket: kill it by its recorded pid
    /// (EnsureFront starts it again).
    KillFront,
    /// Start a snapshot of the store before a roll to a new version (docs/background.md section
    /// 6): a job (job.rs), whose end FinishJob takes up.
    Snapshot,
    /// Start a snapshot of the store asked for (kcpshard.io/snapshotRequestedAt) or due
    /// (spec.backup.interval): a job, whose end FinishJob takes up. `request` is the annotation's
    /// value it answers (None: due by the interval).
    Backup {
        request: Option<String>,
    },
    /// A job ended: take up its result (a dump kept and recorded, a restore's version recorded),
    /// or report how it failed; the record goes.
    FinishJob,
    /// Kill the running job: the spec no longer wants it (another version, the shard deleted) or
    /// another job must run.
    CancelJob,
    /// Record a preflight of the desired template with kcp's own schemas as a serving slot has
    /// them (for a store that is not copied, record it as skipped).
    StartPreflight,
    /// Start the next job of the preflight's copy of the data: a dump (KinePostgres, when none
    /// was taken for the version change), then the copy (pg_restore into a scratch database, or
    /// sqlite's VACUUM INTO).
    CopyPreflight,
    /// The copy is complete: start a kine on it and the new kcp on that.
    LaunchPreflight,
    /// The preflight's kcp answers `/readyz`: free the copied controllers' Lease (its holder runs
    /// on the real data, not on the copy), so that the preflight's own controllers take it.
    ReleasePreflightLease,
    /// The preflight's controllers lead on the copy: compare kcp's own schemas on the copy with
    /// the serving slots' and record the result.
    ComparePreflight,
    /// Record the preflight as failed.
    FailPreflight {
        cause: PreflightFailure,
    },
    /// Ask the preflight's kcp and kine to stop.
    StopPreflight,
    /// Once neither runs: remove the copy and the scratch database; a preflight that never started
    /// is forgotten (and started again).
    RemovePreflight,
    /// Take up a restore request: record it (the shard goes down for it) and drop the annotation.
    BeginRestore(Restorable),
    /// Drop a restore request that cannot be done, saying why.
    RefuseRestore {
        message: String,
    },
    /// Every slot is gone: start restoring the snapshot into the store (a job; FinishJob records
    /// its version as the data's).
    RestoreSnapshot,
    /// A slot of the restored version serves: the restore is complete.
    CompleteRestore,
    /// spec.store names another store than the data is in: record the move (MigrationStarted).
    BeginMigration,
    /// Start what the move's new store needs shard-wide (a managed PostgreSQL, its database; a
    /// KineSqlite store's kine once the mirror raised its revisions).
    EnsureTargetStore,
    /// Start the mirror of the old store into the new one (a job: store/mirror.rs).
    StartMirror,
    /// The mirror follows the old store: start a slot on the new store, out of the front
    /// (MigrationCaughtUp).
    StartWarmSlot {
        name: String,
    },
    /// The new store's slot is ready and the mirror close behind: record the switch; the front
    /// then holds new connections while every old slot stops.
    BeginSwitch,
    /// Every old slot has exited: tell the mirror that the old store takes no more writes; it
    /// ends once it has applied the last of them (FinishJob records the switch).
    EndMirror,
    /// Stop what kcpshard ran of the old store (its data is left as it was).
    StopOldStore,
    /// The move is complete (MigrationComplete).
    CompleteMigration,
    /// Stop the move before its switch ended: the mirror and the new store's slot stop, the old
    /// store serves on (MigrationFailed).
    FailMigration {
        cause: MigrationFailure,
    },
    /// spec.adopt names a kcp not taken over yet: inspect it; take over its key material, tokens,
    /// process (as a slot) and store, or record why it cannot be.
    AdoptKcp,
    /// The adopted kcp serves as a slot: make the controllers Lease say it leads (unless it leads
    /// with one already), so that a slot on the new store follows until the switch.
    HoldControllersLease,
    /// A caddy in front of the adopted kcp (spec.adopt.caddyAdminAddress) sends to the front what
    /// it sent to the kcp, before the move begins.
    RedirectProxy,
    /// The move of the adopted kcp's data is complete.
    CompleteAdoption,
    /// spec.store names the data's store again after a move failed: the failed move's record
    /// goes, so that a move to that store later is tried afresh.
    ForgetMigration,
    /// Start a slot with the desired template.
    StartSlot {
        name: String,
    },
    /// Nothing serves while the preflight of a new version runs (the old slot exited, or none ran:
    /// a re-created shard): start a slot of the template that last served the data, which serves
    /// until the roll replaces it. It begins no roll.
    StartInterim {
        name: String,
    },
    /// Change the slots the front sends new connections to.
    SetFront(FrontChange),
    /// SIGTERM a slot that left the front; it stops listening after its shutdown delay and drains.
    TerminateSlot {
        name: String,
    },
    /// SIGKILL a slot.
    KillSlot {
        name: String,
        cause: KillCause,
    },
    /// A slot that stopped listening has had time to finish what it admitted: close the front's
    /// connections to it (watches re-watch through the serving slots).
    CloseConnections {
        name: String,
    },
    /// Ask what only this slot used of the store (its own kine) to stop, after its kcp exited.
    StopSlotStore {
        name: String,
    },
    /// A slot's process is gone (and its own store): drop its records. `crashed` when kcpshard did
    /// not stop it.
    RemoveSlot {
        name: String,
        crashed: bool,
    },
    /// Stop a new slot, not ready yet, for the reason given; it is started again for the same roll.
    RestartSlot {
        name: String,
        cause: RestartCause,
    },
    /// Stop the new slot and remember that this spec cannot roll.
    AbortRoll {
        name: String,
        cause: BlockCause,
    },
    /// Hand the controllers' Lease, whose holder is gone or can no longer renew it (it stopped
    /// listening), to serving slot `to`, so that it leads at its next election retry instead of
    /// after 60 s, and no slot that starts meanwhile leads first.
    ReleaseLease {
        holder: Option<String>,
        to: String,
    },
    /// Create the probe workspace.
    Probe,
    /// The probe workspace is Ready: record it and remove the workspace.
    ProbeSucceeded,
    CompleteRoll,
    /// Deleting: ask what kcpshard runs for the shard-wide store to stop, then the front.
    StopStore,
    /// Deleting: ask a kine of the shard that serves nothing it uses (its record's path) to stop.
    StopOrphanedKine {
        record: String,
    },
    StopFront,
    /// SIGKILL to the processes asked to stop for `what` whose grace is over.
    KillStopping {
        what: Stopping,
    },
    /// Forget the stops that ended in SIGKILL once their process has exited (and reset the
    /// failed state such a kill leaves on a systemd unit).
    ForgetKilled,
    /// Nothing to do until the spec changes; the running slots keep serving.
    Blocked {
        cause: BlockCause,
    },
    /// Nothing to do now: look again when it may have happened.
    Wait(Wait),
    /// Converged.
    Idle,
}

impl Step {
    /// The slot the step acts on, if one: for the step's log span.
    pub fn slot(&self) -> Option<&str> {
        match self {
            Step::AdoptSlot { name }
            | Step::StartSlot { name }
            | Step::StartInterim { name }
            | Step::TerminateSlot { name }
            | Step::KillSlot { name, .. }
            | Step::CloseConnections { name }
            | Step::StopSlotStore { name }
            | Step::RemoveSlot { name, .. }
            | Step::RestartSlot { name, .. }
            | Step::AbortRoll { name, .. }
            | Step::StartWarmSlot { name } => Some(name),
            _ => None,
        }
    }

    /// The step's kind, as logs and metrics name it.
    pub fn name(&self) -> &'static str {
        match self {
            Step::AdoptSlot { .. } => "AdoptSlot",
            Step::IssueIdentity => "IssueIdentity",
            Step::UpdateIdentities => "UpdateIdentities",
            Step::WriteKubeconfig => "WriteKubeconfig",
            Step::WriteTrust => "WriteTrust",
            Step::EnsureStore => "EnsureStore",
            Step::KillStore => "KillStore",
            Step::EnsureFront => "EnsureFront",
            Step::UpgradeFront => "UpgradeFront",
            Step::MoveFront => "MoveFront",
            Step::KillFront => "KillFront",
            Step::FinishFrontCheck { .. } => "FinishFrontCheck",
            Step::Snapshot => "Snapshot",
            Step::Backup { .. } => "Backup",
            Step::StartPreflight => "StartPreflight",
            Step::CopyPreflight => "CopyPreflight",
            Step::LaunchPreflight => "LaunchPreflight",
            Step::ReleasePreflightLease => "ReleasePreflightLease",
            Step::ComparePreflight => "ComparePreflight",
            Step::FailPreflight { .. } => "FailPreflight",
            Step::StopPreflight => "StopPreflight",
            Step::RemovePreflight => "RemovePreflight",
            Step::BeginRestore(_) => "BeginRestore",
            Step::RefuseRestore { .. } => "RefuseRestore",
            Step::RestoreSnapshot => "RestoreSnapshot",
            Step::CompleteRestore => "CompleteRestore",
            Step::FinishJob => "FinishJob",
            Step::CancelJob => "CancelJob",
            Step::StartSlot { .. } => "StartSlot",
            Step::StartInterim { .. } => "StartInterim",
            Step::SetFront(_) => "SetFront",
            Step::TerminateSlot { .. } => "TerminateSlot",
            Step::KillSlot { .. } => "KillSlot",
            Step::CloseConnections { .. } => "CloseConnections",
            Step::StopSlotStore { .. } => "StopSlotStore",
            Step::RemoveSlot { .. } => "RemoveSlot",
            Step::RestartSlot { .. } => "RestartSlot",
            Step::AbortRoll { .. } => "AbortRoll",
            Step::ReleaseLease { .. } => "ReleaseLease",
            Step::Probe => "Probe",
            Step::ProbeSucceeded => "ProbeSucceeded",
            Step::CompleteRoll => "CompleteRoll",
            Step::StopStore => "StopStore",
            Step::StopOrphanedKine { .. } => "StopOrphanedKine",
            Step::StopFront => "StopFront",
            Step::KillStopping { .. } => "KillStopping",
            Step::ForgetKilled => "ForgetKilled",
            Step::BeginMigration => "BeginMigration",
            Step::EnsureTargetStore => "EnsureTargetStore",
            Step::StartMirror => "StartMirror",
            Step::StartWarmSlot { .. } => "StartWarmSlot",
            Step::BeginSwitch => "BeginSwitch",
            Step::EndMirror => "EndMirror",
            Step::StopOldStore => "StopOldStore",
            Step::CompleteMigration => "CompleteMigration",
            Step::FailMigration { .. } => "FailMigration",
            Step::ForgetMigration => "ForgetMigration",
            Step::AdoptKcp => "AdoptKcp",
            Step::HoldControllersLease => "HoldControllersLease",
            Step::RedirectProxy => "RedirectProxy",
            Step::CompleteAdoption => "CompleteAdoption",
            Step::Blocked { .. } => "Blocked",
            Step::Wait(_) => "Wait",
            Step::Idle => "Idle",
        }
    }
}
