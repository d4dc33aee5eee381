//! What the plan reads of the world: the observation of slots, store, front and Lease.

use chrono::{DateTime, Utc};

use super::*;
pub use crate::slot::backlog::Backlog;

/// The front, as observed through its control socket (or caddy's admin API).
#[derive(Debug, Clone, PartialEq)]
pub enum FrontObservation {
    /// Not running.
    Down,
    /// kcpshard's front process was started a moment ago (`front::START_TIMEOUT`) and does not
    /// answer on its control socket yet.
    Starting,
    /// kcpshard's front process runs but its control socket does not answer (stopped, wedged).
    Unresponsive,
    /// Running; the slots new connections go to, and what it holds per slot.
    Up {
        backends: Vec<String>,
        /// Per slot: connections still open.
        open: Vec<(String, u64)>,
        /// Per slot that left the serving set: kept-alive HTTP/1.1 connections still open that the
        /// front closes between two requests. Before SIGTERM the controller waits for these.
        retiring: Vec<(String, u64)>,
    },
}

impl FrontObservation {
    /// A front with these backends and no connection counts.
    pub fn serving(backends: &[&str]) -> FrontObservation {
        FrontObservation::Up {
            backends: backends.iter().map(|b| b.to_string()).collect(),
            open: vec![],
            retiring: vec![],
        }
    }

    pub fn backends(&self) -> &[String] {
        match self {
            FrontObservation::Up { backends, .. } => backends,
            _ => &[],
        }
    }

    pub fn forwards_to(&self, slot: &str) -> bool {
        self.backends().iter().any(|b| b == slot)
    }

    fn count(list: &[(String, u64)], slot: &str) -> u64 {
        list.iter().find(|(s, _)| s == slot).map_or(0, |(_, n)| *n)
    }

    /// Client connections pinned to `slot` now.
    pub fn open_to(&self, slot: &str) -> u64 {
        match self {
            FrontObservation::Up { open, .. } => Self::count(open, slot),
            _ => 0,
        }
    }

    /// Kept-alive connections to `slot` the front is still closing between requests.
    pub fn retiring_to(&self, slot: &str) -> u64 {
        match self {
            FrontObservation::Up { retiring, .. } => Self::count(retiring, slot),
            _ => 0,
        }
    }
}

/// What the health checks have seen of one slot since its process started (`/readyz` on its own
/// port, 1 s per look, every 0.25 s; at once again after a failure).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// It answered ok at least once: it got ready and may serve.
    pub ever_ready: bool,
    /// Its last answer was ok.
    pub ready: bool,
    /// Looks in a row that failed (timed out or not ok) since the last ok.
    pub failures: u32,
    /// Looks in a row whose answer showed it broken: `/readyz` ok, 404 for kcp's own APIs.
    pub broken_looks: u32,
    /// When it last answered ok.
    pub last_ok_at: Option<DateTime<Utc>>,
    /// When it last answered anything (a failing `/readyz`, or its store-free ping): a kcp whose
    /// store is away answers, a wedged one does not.
    pub last_alive_at: Option<DateTime<Utc>>,
    /// What the last failed look saw.
    pub problem: Option<String>,
    /// The front replayed a new connection because this slot left it unanswered (for its answer
    /// wait, 1 s) after the slot's last ok look: with one failed look, hung, not slow.
    pub silent_in_front: bool,
    /// Its last look found the process stopped (state `T` in `/proc`: SIGSTOP, a debugger): hung,
    /// not slow, whatever it answered before.
    pub stopped: bool,
}

impl Health {
    /// The health of a slot whose look at `now` found it serving.
    pub fn serving(now: DateTime<Utc>) -> Health {
        Health {
            ever_ready: true,
            ready: true,
            failures: 0,
            broken_looks: 0,
            last_ok_at: Some(now),
            last_alive_at: Some(now),
            problem: None,
            silent_in_front: false,
            stopped: false,
        }
    }

    /// A slot that served and has failed [`UNRESPONSIVE_AFTER`] looks in a row, or one look while
    /// the front saw it leave a connection unanswered: a slot that is only slow answers the front
    /// within its answer wait, a stopped or wedged one never does.
    pub fn unresponsive(&self) -> bool {
        self.ever_ready && (self.failures >= UNRESPONSIVE_AFTER || (self.failures >= 1 && self.silent_in_front))
    }

    /// Why it counts as [`Self::unresponsive`], for messages: "failed 2 looks at /readyz on its
    /// own port in a row" and what else told.
    pub fn unresponsive_looks(&self) -> String {
        let looks = match self.failures {
            1 => "failed a look at /readyz on its own port".to_string(),
            n => format!("failed {n} looks at /readyz on its own port in a row"),
        };
        if self.silent_in_front && self.failures < UNRESPONSIVE_AFTER {
            format!("{looks} and left a new connection through the front unanswered for 1s")
        } else {
            looks
        }
    }

    /// [`UNRESPONSIVE_AFTER`] looks in a row showed it broken: it will never serve (kcp redoes no
    /// lost bootstrap step; docs/reliability.md), so it is replaced at once.
    pub fn broken(&self) -> bool {
        self.broken_looks >= UNRESPONSIVE_AFTER
    }
}

/// Failed looks in a row that take a serving slot out of the front.
pub const UNRESPONSIVE_AFTER: u32 = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct SlotObservation {
    pub name: String,
    pub template: SlotTemplate,
    /// The recorded process is alive (same pid, same start time).
    pub running: bool,
    pub started_at: DateTime<Utc>,
    pub health: Health,
    /// Its port has a listener (it stops listening after SIGTERM, once its shutdown delay ends).
    pub listening: bool,
    /// When it was first seen not listening after SIGTERM.
    pub stopped_listening_at: Option<DateTime<Utc>>,
    /// What kcpshard sent it, if anything.
    pub stop: Option<StopRecord>,
    /// When the front last stopped sending it new connections.
    pub left_front_at: Option<DateTime<Utc>>,
    /// What only this slot uses of the store runs (its own kine, on KinePostgres).
    pub own_store_running: bool,
    /// It runs on the store a move goes to, not yet the shard's (plan/migration.rs): it stays
    /// out of the front and carries no Lease request until the switch.
    pub on_other_store: bool,
    /// A slot that is gone: how it ended (exit status, the last error it printed, its log), for
    /// the events and conditions that report it.
    pub last_words: Option<String>,
}

impl SlotObservation {
    /// Sent SIGTERM (or SIGKILL) by kcpshard.
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// Answers `/readyz` now and was not told to stop: may join the front.
    pub fn can_join(&self) -> bool {
        self.running && !self.stopping() && self.health.ready
    }

    /// May stay in the front: it served and has not failed too many looks in a row.
    pub fn can_stay(&self) -> bool {
        self.running && !self.stopping() && self.health.ever_ready && !self.health.unresponsive()
    }
}

/// Who holds the controllers' Lease (`kube-system/kcp-controllers` in `system:admin`), matched
/// against the identity each slot's kcp logged when its leader election started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseHolder {
    /// Not read (no slot answers to read it through).
    Unknown,
    /// No Lease, or no holder: nothing to release.
    Free,
    /// This slot holds it.
    Slot(String),
    /// A holder that is none of the running slots, and every running slot's identity is known: a
    /// process that is gone.
    Gone,
    /// A holder that matches no slot whose identity is known, while some running slot's is not:
    /// it may be that slot, so it is left alone.
    Unmatched,
}

/// The outcome of a preflight, as the plan reads it.
pub use crate::api::PreflightResult;

/// The preflight of a template: its record (written before anything of it starts) and its kcp.
#[derive(Debug, Clone, PartialEq)]
pub struct PreflightObservation {
    /// The template whose version it runs.
    pub template: SlotTemplate,
    pub started_at: DateTime<Utc>,
    /// When its kcp started on the copy.
    pub launched_at: Option<DateTime<Utc>>,
    pub run: PreflightRun,
    /// Recorded once the checks ended (or failed).
    pub result: Option<PreflightResult>,
    /// What it left in the store (Failed) or changed (SchemaChanged), for the block's message.
    pub detail: Vec<String>,
    /// Not all of it is removed yet (its kcp, its kine, the copy, a scratch database): cleared
    /// only once everything is gone, so that a crash leaves nothing behind unnoticed.
    pub leftovers: bool,
    /// Its kcp or the kine over its copy runs.
    pub processes_running: bool,
}

/// Where the preflight's kcp is.
#[derive(Debug, Clone, PartialEq)]
pub enum PreflightRun {
    /// Recorded, and the data is being copied (its jobs), or the copy's next job is to start (the
    /// first, or one lost when serve stopped).
    Copying,
    /// The copy is complete; its kcp does not run yet (or never started: serve stopped in between).
    Copied,
    /// The copy is complete and the kine over it was started; it does not accept yet.
    StoreStarting,
    /// Its kcp runs.
    Running {
        /// It answered `/readyz` on its own port.
        ready: bool,
        /// When kcpshard deleted the copied controllers' Lease through it.
        lease_released_at: Option<DateTime<Utc>>,
        /// Its own controllers hold the Lease (taken after the release): kcp installed them at its
        /// start (or exited) and starts them once it leads (pkg/server/server.go:653, :775-783 at
        /// v0.31.2).
        controllers_lead: bool,
    },
    /// Its kcp is gone: how it ended (its last error line and log).
    Exited { last_words: String },
}

/// A due check of a caddy front's change, and how it went on this look.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontCheckObservation {
    pub check: FrontCheck,
    /// Ok once `/readyz` through the front answered ok; otherwise what a client saw.
    pub outcome: Result<(), String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub now: DateTime<Utc>,
    /// The store accepts connections and answers a read (and every running slot's own kine, for
    /// KinePostgres).
    pub store_up: bool,
    /// The store is not up, and what of it was started (its kine, a managed PostgreSQL, a running
    /// slot's own kine) is within its start timeout: waited for, not started again.
    pub store_starting: bool,
    /// Slots whose own kine (KinePostgres) was started and does not accept yet, within its ready
    /// timeout: a slot about to start waits for it.
    pub slot_stores_starting: BTreeSet<String>,
    /// The step whose request (to kcp, to PostgreSQL) is under way, unanswered: planned again, it
    /// waits for the answer instead of asking again.
    pub answer_awaited: Option<&'static str>,
    /// The step whose request was answered and not taken up yet: planned first.
    pub answered: Option<Step>,
    /// Why the store is not up (PostgreSQL's own error, a kine that is down), for StoreReady.
    pub store_problem: Option<String>,
    /// A kine kcpshard runs runs but does not answer reads: it is replaced.
    pub store_unresponsive: bool,
    /// A process kcpshard runs for the shard-wide store (kine over sqlite, a managed PostgreSQL)
    /// runs, answering or not: deleting the shard stops it. An external store is not ours to stop.
    pub store_processes_up: bool,
    /// The template the latest store snapshot was taken for.
    pub snapshot_for: Option<SlotTemplate>,
    /// When the latest snapshot taken on request or on schedule was taken.
    pub last_backup_at: Option<DateTime<Utc>>,
    /// The latest kcpshard.io/snapshotRequestedAt value a snapshot was taken for.
    pub snapshot_request_answered: Option<String>,
    pub front: FrontObservation,
    /// Why the front is down (caddy's admin API does not answer, ...), for FrontReady.
    pub front_problem: Option<String>,
    /// kcpshard's front runs an older binary than this controller: EnsureFront upgrades it.
    pub front_outdated: bool,
    /// A successor of serve's binary was started to take over from the front a moment ago
    /// (`front::START_TIMEOUT`), runs, and has not taken over yet.
    pub front_upgrading: bool,
    /// kcpshard runs the front (Tcp); a caddy is the user's, and deleting the shard leaves it.
    pub front_ours: bool,
    /// The front runs, but on another address than spec.front.listen (the spec changed).
    pub front_elsewhere: bool,
    pub slots: Vec<SlotObservation>,
    /// Slots whose kcp runs (found by its root directory) but whose record is missing or was moved
    /// aside: their record is rebuilt from the process before anything else.
    pub unrecorded: Vec<String>,
    pub lease: LeaseHolder,
    /// When the Lease's holder last renewed it (its `spec.renewTime`), as read with it.
    pub lease_renewed_at: Option<DateTime<Utc>>,
    /// Whether the roll's probe workspace is Ready.
    pub probe_ready: bool,
    /// While the roll's probe workspace is not Ready: the backlog of the leading slot's
    /// controllers (read from its `/metrics`), when it could be read.
    pub leader_backlog: Option<Backlog>,
    /// A filesystem of the state dir or the store's data below its watermark.
    pub disk: Option<crate::store::disk::DiskProblem>,
    /// When the store's processes kcpshard runs last started (a kine, a managed PostgreSQL's
    /// postmaster, a slot's own kine): one that started after a slot did went away during that
    /// slot's start-up, even if no look landed in the outage.
    pub store_started_at: Option<DateTime<Utc>>,
    pub roll: Option<RollRecord>,
    pub blocked: Option<Blocked>,
    /// The latest preflight, if any.
    pub preflight: Option<PreflightObservation>,
    /// The latest restore of a store snapshot, if any was asked for.
    pub restore: Option<RestoreRecord>,
    /// The kcp version that last served the shard's data (recorded beside the store before a
    /// slot of a new version starts), if any did.
    pub data_version: Option<String>,
    /// The spec whose interim slot exited before it was ready (see [`Desired::interim`]).
    pub interim_crashed_for: Option<SlotTemplate>,
    /// spec.store names another store than the one the shard's data is in, which the shard keeps
    /// running on: why, and what to do.
    pub store_refused: Option<String>,
    /// The records of kines of this shard that run but serve nothing it uses (observe.rs).
    pub orphaned_kines: Vec<String>,
    /// The shard's job (a dump, a restore), while it has one.
    pub job: Option<JobObservation>,
    /// The last job that failed, until one of its kind succeeds.
    pub job_failure: Option<JobFailure>,
    /// The processes asked to stop (the store's, a slot's kine, the front) that still run.
    pub stopping: Vec<ProcessStop>,
    /// A check of a caddy front's change through the front, while one is due.
    pub front_check: Option<FrontCheckObservation>,
    /// The move of the data to another store under way, or the latest one.
    pub migration: Option<MigrationObservation>,
    /// The take-over of a kcp that ran outside kcpshard (spec.adopt), as recorded.
    pub adoption: Option<AdoptionRecord>,
    /// The processes killed after their stop's grace (KillStopping) that have exited since.
    pub killed_and_gone: Vec<ProcessStop>,
    /// The shard's admin identities and whether the kubeconfig through the front is current.
    pub identities: IdentitiesObservation,
    /// The root shard of a sharded kcp: some of the sharded kcp's trust (its system identity,
    /// requestheader CA, kcp-front-proxy's files) is missing or out of date.
    pub sharded_trust_stale: bool,
}

impl Observed {
    pub fn slot(&self, name: &str) -> Option<&SlotObservation> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// The front sends new connections to a slot that may stay there.
    pub fn front_serves(&self) -> bool {
        self.front
            .backends()
            .iter()
            .filter_map(|b| self.slot(b))
            .any(|s| s.can_stay())
    }
}
