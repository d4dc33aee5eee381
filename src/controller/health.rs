//! Health checks that run beside the loop, one task per running slot (and per kine kcpshard runs):
//! what observe reads of a slot's health was seen by them, so a look never waits for a slot that
//! hangs, and a change that matters wakes the controller for that shard at once.
//!
//! - A slot: `/readyz` on its own port with the shard admin, [`LOOK_TIMEOUT`] per look, every
//!   [`SERVING_INTERVAL`] once it answered ([`STARTING_INTERVAL`] while it starts), and again at once
//!   after a failed look, so that a hung slot fails [`super::plan::UNRESPONSIVE_AFTER`] looks in about
//!   2 x LOOK_TIMEOUT, and a stopped one (state `T` in `/proc`: SIGSTOP, a debugger) in about 2 x
//!   [`STARTING_INTERVAL`], without being asked. A slot kcpshard sent SIGTERM is also watched for the moment its port stops
//!   listening (every [`LISTEN_POLL`]): from then on it can no longer lead (docs/background.md
//!   section 3), which is when the Lease may go.
//! - A kine: one etcd read with [`LOOK_TIMEOUT`] (store::kine_read), at the same pace.
//!
//! A task ends when its process is gone (its pid no longer has the start time it was started with).
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;

use super::plan::Health;
use crate::api::KcpShard;
use crate::process::exits::ExitNotices;

/// How long one look may take before it counts as failed.
pub const LOOK_TIMEOUT: Duration = Duration::from_secs(1);
/// Between looks at a slot or kine that answers.
pub const SERVING_INTERVAL: Duration = Duration::from_millis(250);
/// Between looks at a slot that has not answered yet, and after a failed look that came back at
/// once (a refused connection), so that a slot that is not up is not hammered.
pub const STARTING_INTERVAL: Duration = Duration::from_millis(200);
/// How often a slot sent SIGTERM is checked for its listener.
pub const LISTEN_POLL: Duration = Duration::from_millis(10);
/// How long observe waits for the first look at a process it has just found.
const FIRST_LOOK: Duration = Duration::from_millis(1_500);
/// A process that used at least this share of one core between two looks is working: a failed
/// look of it counts as alive, not hung. A kcp catching up on 1,000 workspaces while another starts
/// beside it on two cores answered nothing, not even its store-free ping within [`LOOK_TIMEOUT`],
/// for 10 s and more while busy (`ps`: 72-94% of a core); a stopped one, or one blocked on a stuck
/// disk, uses next to none. One that spins while its server is wedged is not told from busy:
/// killing a busy kcp restarts its catch-up, which on a big shard is the worse mistake.
pub const WORKING_SHARE: f64 = 0.1;

/// What a look found: Ok, or what failed.
pub type LookResult = Result<(), Failure>;

/// A failed look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    /// The answer shows the process broken, not slow: a slot whose `/readyz` is ok and whose kcp
    /// answers 404 for its own APIs (`slot::serving`).
    pub broken: bool,
    /// The process answered something (an HTTP status, or its store-free ping), or it worked
    /// meanwhile ([`WORKING_SHARE`]): not ready, but not wedged either (a kcp whose store is away,
    /// or one too busy to answer).
    pub alive: bool,
    /// The process is stopped (state `T` in `/proc`): it answers nothing until it is continued.
    pub stopped: bool,
}

impl Failure {
    /// A failure that says nothing more (a timeout, a refused connection).
    pub fn slow(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            broken: false,
            alive: false,
            stopped: false,
        }
    }
}

/// One health-checked process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub shard: String,
    /// `slot-a`, `kine`, `slot-a-kine`: unique within the shard.
    pub name: String,
    pub pid: u32,
    pub start_time: u64,
}

/// What the checks have seen of one process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    pub health: Health,
    /// At least one look has finished.
    pub looked: bool,
    /// Its port has a listener (slots only).
    pub listening: bool,
    pub stopped_listening_at: Option<DateTime<Utc>>,
}

struct Check {
    seen: watch::Sender<Seen>,
    /// Set when kcpshard sent the process SIGTERM: its listener is then watched closely.
    stopping: watch::Sender<bool>,
    /// When the process was found gone; what was seen of it is kept a while for the steps that
    /// follow its exit (when it stopped listening).
    ended: Mutex<Option<std::time::Instant>>,
}

/// How long what was seen of a process is kept after it is gone.
const KEEP_ENDED: Duration = Duration::from_secs(300);

/// Every check of this serve. Cheap to clone.
#[derive(Clone)]
pub struct HealthChecks {
    checks: Arc<Mutex<HashMap<Target, Arc<Check>>>>,
    wakes: Arc<ExitNotices<(ObjectRef<KcpShard>, super::Wake)>>,
}

impl HealthChecks {
    pub fn new(wakes: Arc<ExitNotices<(ObjectRef<KcpShard>, super::Wake)>>) -> HealthChecks {
        HealthChecks {
            checks: Default::default(),
            wakes,
        }
    }

    /// What was last seen of `target`, if it was checked (also after it is gone).
    pub fn last(&self, target: &Target) -> Option<Seen> {
        let checks = self.checks.lock().expect("health checks lock");
        checks.get(target).map(|c| c.seen.borrow().clone())
    }

    /// What the checks have seen of `target`, starting them if they do not run yet (and waiting up
    /// to [`FIRST_LOOK`] for their first look). `look` makes one look; `port` is the slot's port
    /// whose listener is watched once `stopping` (None for a kine).
    pub async fn seen<F, Fut>(
        &self,
        target: Target,
        shard: ObjectRef<KcpShard>,
        port: Option<u16>,
        stopping: bool,
        look: F,
    ) -> Seen
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = LookResult> + Send,
    {
        let (check, new) = {
            let mut checks = self.checks.lock().expect("health checks lock");
            match checks.get(&target) {
                Some(check) => (check.clone(), false),
                None => {
                    let check = Arc::new(Check {
                        seen: watch::channel(Seen {
                            listening: true,
                            ..Seen::default()
                        })
                        .0,
                        stopping: watch::channel(stopping).0,
                        ended: Mutex::new(None),
                    });
                    checks.insert(target.clone(), check.clone());
                    (check, true)
                }
            }
        };
        check
            .stopping
            .send_if_modified(|s| std::mem::replace(s, stopping) != stopping);
        if new {
            let checks = self.checks.clone();
            let wakes = self.wakes.clone();
            let running = check.clone();
            let target_ = target.clone();
            tokio::spawn(async move {
                run(&running, &target_, port, look, || {
                    wakes.wake((shard.clone(), super::Wake::Health))
                })
                .await;
                *running.ended.lock().expect("health check lock") = Some(std::time::Instant::now());
                checks.lock().expect("health checks lock").retain(|_, c| {
                    c.ended
                        .lock()
                        .expect("health check lock")
                        .is_none_or(|at| at.elapsed() < KEEP_ENDED)
                });
            });
            let mut rx = check.seen.subscribe();
            let _ = tokio::time::timeout(FIRST_LOOK, rx.wait_for(|s| s.looked)).await;
        }
        check.seen.borrow().clone()
    }
}

/// Looks until the process is gone; `wake` is called when what the plan reads changes: a slot
/// gets ready, stops answering (the failure that makes it unresponsive), answers again, or stops
/// listening. Its listener is watched beside the looks, not between them: a look of a stopping
/// slot can take 2 x LOOK_TIMEOUT, and a slot may exit within that.
async fn run<F, Fut>(check: &Check, target: &Target, port: Option<u16>, look: F, wake: impl Fn())
where
    F: Fn() -> Fut,
    Fut: Future<Output = LookResult>,
{
    tokio::select! {
        () = looks(check, target, look, &wake) => {}
        () = watch_listener(check, port, &wake) => {}
    }
    // Gone: a process that was sent SIGTERM and is gone no longer listens. If its listener closed
    // between two polls and it exited right after, this is the first the checks know of it.
    if *check.stopping.borrow() {
        record_stopped_listening(check, &wake);
    }
}

/// Records the moment a slot that listened no longer does (once), and wakes the controller.
fn record_stopped_listening(check: &Check, wake: &impl Fn()) {
    let stopped = check.seen.send_if_modified(|seen| {
        let was = seen.listening;
        if was {
            seen.listening = false;
            seen.stopped_listening_at = Some(Utc::now());
        }
        was
    });
    if stopped {
        wake();
    }
}

async fn looks<F, Fut>(check: &Check, target: &Target, look: F, wake: &impl Fn())
where
    F: Fn() -> Fut,
    Fut: Future<Output = LookResult>,
{
    let stopping = check.stopping.subscribe();
    let mut cpu_before: Option<(Duration, tokio::time::Instant)> = None;
    loop {
        // One read of /proc/<pid>/stat a look: whether the process still runs, whether it is
        // stopped, and how much CPU it used since the last look.
        let Some(stat) = running_stat(target) else {
            return;
        };
        let started = tokio::time::Instant::now();
        let share = cpu_before.map(|(cpu, at)| core_share(stat.cpu_time().saturating_sub(cpu), started - at));
        cpu_before = Some((stat.cpu_time(), started));
        if *stopping.borrow() && !check.seen.borrow().listening {
            // Sent SIGTERM and no longer listening: nothing to ask; only its exit is awaited.
            tokio::time::sleep(SERVING_INTERVAL).await;
            continue;
        }
        // A stopped process fails its look at once: asking it would only wait out the timeout.
        // A look of a slot asks twice in a row (`/readyz`, then kcp's own API), each bounded by
        // LOOK_TIMEOUT; this bounds the whole.
        let outcome = if stat.is_stopped() {
            Err(Failure {
                stopped: true,
                ..Failure::slow(format!(
                    "the process is stopped (state T in /proc/{}/stat: SIGSTOP, or held by a debugger)",
                    target.pid
                ))
            })
        } else {
            match tokio::time::timeout(2 * LOOK_TIMEOUT, look()).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Failure::slow(format!("no answer within {LOOK_TIMEOUT:?}"))),
            }
        };
        let outcome = outcome.map_err(|failure| working(failure, share));
        let now = Utc::now();
        let mut changed = false;
        check.seen.send_modify(|seen| {
            let before = (seen.health.ready, seen.health.unresponsive(), seen.health.broken());
            record(&mut seen.health, outcome, now);
            seen.looked = true;
            let after = (seen.health.ready, seen.health.unresponsive(), seen.health.broken());
            changed = (after.0 && !before.0) || after.1 != before.1 || after.2 != before.2;
        });
        if changed {
            wake();
        }
        let failed = !check.seen.borrow().health.ready;
        let pause = match check.seen.borrow().health.ever_ready {
            true if failed => STARTING_INTERVAL.saturating_sub(started.elapsed()),
            true => SERVING_INTERVAL,
            false => STARTING_INTERVAL,
        };
        tokio::time::sleep(pause).await;
    }
}

/// Once the slot was sent SIGTERM, polls its port every [`LISTEN_POLL`] until no listener is left
/// (the moment from which it can no longer lead), then rests. Never returns for a kine (no port).
async fn watch_listener(check: &Check, port: Option<u16>, wake: &impl Fn()) {
    let Some(port) = port else {
        return std::future::pending().await;
    };
    let mut stopping = check.stopping.subscribe();
    loop {
        if !*stopping.borrow_and_update() {
            if stopping.changed().await.is_err() {
                return std::future::pending().await;
            }
            continue;
        }
        if !crate::process::procfs::tcp_listening(port) {
            record_stopped_listening(check, wake);
            return std::future::pending().await;
        }
        tokio::time::sleep(LISTEN_POLL).await;
    }
}

/// The share of one core that `used` CPU time is over `wall` time (0 over no time).
fn core_share(used: Duration, wall: Duration) -> f64 {
    match wall.is_zero() {
        true => 0.0,
        false => used.as_secs_f64() / wall.as_secs_f64(),
    }
}

/// A failed look of a process that was not stopped and used at least [`WORKING_SHARE`] of a core
/// since its last look (`share`) is alive: busy, not wedged, whatever it answered.
fn working(failure: Failure, share: Option<f64>) -> Failure {
    match share {
        Some(share) if !failure.stopped && !failure.alive && share >= WORKING_SHARE => Failure {
            alive: true,
            message: format!(
                "{}; its process works meanwhile (uses CPU): busy, not hung",
                failure.message
            ),
            ..failure
        },
        _ => failure,
    }
}

/// Folds one look into the health.
pub fn record(health: &mut Health, outcome: LookResult, now: DateTime<Utc>) {
    match outcome {
        Ok(()) => *health = Health::serving(now),
        Err(failure) => {
            health.ready = false;
            if health.ever_ready {
                health.failures += 1;
            }
            health.broken_looks = if failure.broken { health.broken_looks + 1 } else { 0 };
            health.stopped = failure.stopped;
            if failure.alive {
                health.last_alive_at = Some(now);
            }
            health.problem = Some(failure.message);
        }
    }
}

/// The target's process state, while it is the same process (not a reused pid) and not dead.
fn running_stat(target: &Target) -> Option<crate::process::procfs::Stat> {
    crate::process::procfs::stat(target.pid).filter(|s| s.start_time == target.start_time && !s.is_dead())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slot a of shard dev, as the running process `pid`.
    fn slot_a(pid: u32) -> Target {
        Target {
            shard: "dev".into(),
            name: "slot-a".into(),
            pid,
            start_time: crate::process::procfs::stat(pid).unwrap().start_time,
        }
    }

    #[test]
    fn a_slot_counts_failures_only_once_it_served_and_an_answer_clears_them() {
        let mut h = Health::default();
        let t = Utc::now();
        record(&mut h, Err(Failure::slow("connection refused")), t);
        assert_eq!((h.ever_ready, h.failures), (false, 0), "a starting slot is not failing");
        record(&mut h, Ok(()), t);
        assert!(h.ready && h.ever_ready);
        record(&mut h, Err(Failure::slow("no answer within 1s")), t);
        record(&mut h, Err(Failure::slow("no answer within 1s")), t);
        assert!(!h.broken(), "slow is not broken");
        assert!(h.unresponsive());
        assert_eq!(h.last_ok_at, Some(t));
        assert_eq!(h.problem.as_deref(), Some("no answer within 1s"));
        record(&mut h, Ok(()), t);
        assert!(!h.unresponsive() && h.problem.is_none());
        let broken = || {
            Err(Failure {
                message: "GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1: HTTP 404".into(),
                broken: true,
                alive: true,
                stopped: false,
            })
        };
        record(&mut h, broken(), t);
        assert!(!h.broken(), "one broken look is not enough");
        record(&mut h, broken(), t);
        assert!(h.broken() && h.unresponsive());
    }

    #[tokio::test]
    async fn a_stopped_process_is_unresponsive_after_two_short_looks_without_being_asked() {
        let (wakes, mut woken) = ExitNotices::new();
        let checks = HealthChecks::new(Arc::new(wakes));
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        let target = slot_a(pid);
        let shard = ObjectRef::new("dev");
        // Would answer at once: only the process's state can fail these looks.
        let look = || async { Ok(()) };
        let seen = checks.seen(target.clone(), shard.clone(), None, false, look).await;
        assert!(seen.health.ready, "the first look is waited for");
        let _ = woken.recv().await; // ready
        let stop = |signal| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
        stop(nix::sys::signal::Signal::SIGSTOP);
        let stopped = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(2), woken.recv())
            .await
            .expect("woken once unresponsive");
        let took = stopped.elapsed();
        assert!(
            took < SERVING_INTERVAL + 2 * STARTING_INTERVAL + Duration::from_millis(200),
            "{took:?}"
        );
        let seen = checks.seen(target.clone(), shard.clone(), None, false, look).await;
        assert!(seen.health.unresponsive(), "{seen:?}");
        assert!(
            seen.health.stopped && seen.health.problem.as_deref().is_some_and(|p| p.contains("stopped")),
            "{seen:?}"
        );
        stop(nix::sys::signal::Signal::SIGCONT);
        tokio::time::timeout(Duration::from_secs(2), woken.recv())
            .await
            .expect("woken once it answers again");
        let seen = checks.seen(target, shard, None, false, look).await;
        assert!(seen.health.ready && !seen.health.unresponsive(), "{seen:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_failed_look_of_a_process_that_works_is_alive_and_of_a_stopped_or_idle_one_is_not() {
        let timed_out = || Failure::slow("GET /readyz: no answer: none within 1s");
        let busy = working(timed_out(), Some(0.9));
        assert!(busy.alive && busy.message.contains("busy, not hung"), "{busy:?}");
        assert_eq!(working(timed_out(), Some(0.02)), timed_out(), "next to no CPU: wedged");
        assert_eq!(
            working(timed_out(), None),
            timed_out(),
            "the first look has nothing to compare"
        );
        let stopped = Failure {
            stopped: true,
            ..timed_out()
        };
        assert_eq!(working(stopped.clone(), Some(0.9)), stopped);
        assert_eq!(core_share(Duration::from_millis(300), Duration::from_secs(1)), 0.3);
        assert_eq!(core_share(Duration::from_millis(300), Duration::ZERO), 0.0);
    }

    /// Real processes, real time: CPU time is the kernel's.
    #[tokio::test]
    async fn a_busy_process_that_answers_nothing_is_alive_and_an_idle_one_is_not() {
        let (wakes, _woken) = ExitNotices::new();
        let checks = HealthChecks::new(Arc::new(wakes));
        let spawn = |script: &str| std::process::Command::new("sh").args(["-c", script]).spawn().unwrap();
        let (mut busy, mut idle) = (spawn("while :; do :; done"), spawn("exec sleep 60"));
        let (busy_target, idle_target) = (slot_a(busy.id()), slot_a(idle.id()));
        let look = || async { Err(Failure::slow("no answer within 1s")) };
        let shard = ObjectRef::new("dev");
        checks.seen(busy_target.clone(), shard.clone(), None, false, look).await;
        checks.seen(idle_target.clone(), shard, None, false, look).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let alive = |target: &Target| checks.last(target).and_then(|seen| seen.health.last_alive_at);
        while alive(&busy_target).is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(STARTING_INTERVAL).await;
        }
        let seen = checks.last(&busy_target).unwrap();
        assert!(seen.health.last_alive_at.is_some(), "a busy loop is alive: {seen:?}");
        assert!(
            seen.health
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("busy, not hung")),
            "{seen:?}"
        );
        let seen = checks.last(&idle_target).unwrap();
        assert!(
            seen.health.last_alive_at.is_none(),
            "an idle process that answers nothing: {seen:?}"
        );
        for child in [&mut busy, &mut idle] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[tokio::test]
    async fn a_process_that_stops_answering_wakes_the_controller_after_two_looks_that_time_out() {
        let (wakes, mut woken) = ExitNotices::new();
        let checks = HealthChecks::new(Arc::new(wakes));
        let answers = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let target = slot_a(std::process::id());
        let shard = ObjectRef::new("dev");
        let look = {
            let answers = answers.clone();
            move || {
                let answers = answers.clone();
                async move {
                    if answers.load(std::sync::atomic::Ordering::SeqCst) {
                        Ok(())
                    } else {
                        std::future::pending().await
                    }
                }
            }
        };
        let seen = checks
            .seen(target.clone(), shard.clone(), None, false, look.clone())
            .await;
        assert!(seen.health.ready, "the first look is waited for");
        let _ = woken.recv().await; // ready
        answers.store(false, std::sync::atomic::Ordering::SeqCst);
        let hung = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), woken.recv())
            .await
            .expect("woken once unresponsive");
        let took = hung.elapsed();
        assert!(
            took >= 4 * LOOK_TIMEOUT - Duration::from_millis(100)
                && took < 4 * LOOK_TIMEOUT + SERVING_INTERVAL + Duration::from_millis(300),
            "{took:?}"
        );
        let seen = checks.seen(target, shard, None, false, look).await;
        assert!(seen.health.unresponsive(), "{seen:?}");
    }
}
