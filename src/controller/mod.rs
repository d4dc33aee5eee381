//! The controller: a kube-runtime `Controller` over the local API (in-process client). Each
//! reconcile of a `KcpShard` observes what runs ([`observe`]), asks the pure [`plan`] for the one
//! next step, performs it ([`act`]), then writes status (conditions, phase, slots, front, lastRoll)
//! and an event per thing that happened. It requeues at once after a step, shortly while a slot
//! starts, and every few seconds when idle; a process of the shard that exits wakes it at once.
//!
//! A finalizer makes deletion a step of its own: the slots, the store's processes and the front
//! stop; the data stays under the state dir.
pub mod act;
pub mod adoption;
pub mod assignment;
pub mod clients;
pub mod conditions;
pub mod credentials;
mod desired;
pub mod error;
pub mod front;
pub mod health;
pub mod heartbeat;
pub mod host_lease;
pub mod jobs;
pub mod lease;
pub mod metrics;
pub mod migration;
pub mod observe;
pub mod plan;
pub mod preflight;
mod report;
pub mod requests;
pub mod restore;
pub mod sharding;
pub mod state;
pub mod status;
pub mod stops;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use crate::api::{
    FINALIZER, KcpShard, RESTARTED_AT_ANNOTATION, ROTATE_CREDENTIALS_ANNOTATION, SNAPSHOT_REQUEST_ANNOTATION, StoreSpec,
};
use crate::process::exits::ExitNotices;
use crate::process::{ProcessRecord, Runtime};
use crate::store::{StoreBackend, StoreError, StorePaths};
pub use desired::desired;
use desired::interim;
pub use error::Error;
use plan::{Desired, SlotTemplate, Step, Wait};
use report::{publish, report_unreadable, stored_status, write_status};
use state::ShardDirs;

/// Requeue after a step that changed something: take the next one at once.
const NEXT_STEP: Duration = Duration::from_millis(10);
/// What a step may take: it starts something and returns (docs/architecture.md, "The steps").
const STEP_BUDGET: Duration = Duration::from_millis(100);
/// Requeue while the probe workspace gets Ready: how late the roll learns that a leader runs.
const WHILE_PROBING: Duration = Duration::from_millis(100);
/// Requeue while the store's kine or kcpshard's front starts: nothing wakes the controller when it
/// begins to accept (kine on an empty sqlite database takes about 0.1 s), and slots wait for it.
const WHILE_STARTING: Duration = Duration::from_millis(25);
/// Requeue while a slot starts or drains: its readiness, listener and exit wake the controller
/// (health checks, pidfds); this only bounds how late a timeout is noticed.
const WHILE_WAITING: Duration = Duration::from_secs(1);
/// Requeue when converged or blocked.
const WHEN_IDLE: Duration = Duration::from_secs(2);
/// The longest wait between retries of a step that keeps failing (an unreachable PostgreSQL):
/// the retry that finds it back is at most this late.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long to wait before retrying a step that has failed since `failing_since`: half the time it
/// has been failing, between [`WHEN_IDLE`] and [`MAX_BACKOFF`].
fn backoff(failing_for: Duration) -> Duration {
    (failing_for / 2).clamp(WHEN_IDLE, MAX_BACKOFF)
}

/// Something the user should hear about, as an event.
#[derive(Debug, Clone)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// Why the controller is woken for a shard between looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// One of its processes exited.
    Exit,
    /// A health check saw a change (a slot got ready, stopped answering, stopped listening).
    Health,
    /// A request a step made (to kcp, to PostgreSQL) was answered.
    Answer,
}

/// What every reconcile shares.
pub struct Context {
    pub client: kube::Client,
    pub reporter: Reporter,
    pub runtime: Runtime,
    pub state_dir: PathBuf,
    /// The kine binary the store runs (KineSqlite, KinePostgres).
    pub kine_binary: PathBuf,
    /// This binary, which runs `kcpshard front` and the jobs that are no program of their own
    /// (`kcpshard job`).
    pub kcpshard_binary: PathBuf,
    pub slot_clients: Arc<clients::SlotClients>,
    /// The last reading of each leading slot's backlog, reused for a few seconds.
    pub backlog_readings: observe::BacklogReadings,
    pub metrics: metrics::ControllerMetrics,
    /// Wakes the controller for a shard when one of its processes exits, or a health check saw
    /// a change.
    pub exits: Arc<ExitNotices<(ObjectRef<KcpShard>, Wake)>>,
    pub health: health::HealthChecks,
    /// Requests steps made that are not answered yet, or whose answers no step took up yet.
    pub requests: requests::Requests,
    /// Each slot process's leader-election identity, once its log has shown it.
    identities: Mutex<HashMap<(u32, u64), String>>,
    /// Reconciles that failed in a row, per shard, for the retry's backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Beaten at the end of every reconcile: serve's watchdog pings systemd only while it beats.
    pub heartbeat: heartbeat::Heartbeat,
    /// Which shards are this host's: the others are left alone.
    pub assignment: Arc<assignment::Assignment>,
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        reporter: Reporter,
        runtime: Runtime,
        state_dir: PathBuf,
        kine_binary: PathBuf,
        kcpshard_binary: PathBuf,
        metrics: metrics::ControllerMetrics,
        exits: ExitNotices<(ObjectRef<KcpShard>, Wake)>,
        heartbeat: heartbeat::Heartbeat,
        assignment: Arc<assignment::Assignment>,
    ) -> Context {
        let exits = Arc::new(exits);
        Context {
            client,
            reporter,
            runtime,
            state_dir,
            kine_binary,
            kcpshard_binary,
            slot_clients: Default::default(),
            backlog_readings: Default::default(),
            metrics,
            health: health::HealthChecks::new(exits.clone()),
            exits,
            requests: Default::default(),
            identities: Default::default(),
            failures: Default::default(),
            heartbeat,
            assignment,
        }
    }

    /// The front the spec asks for.
    pub fn front(&self, shard: &KcpShard, dirs: &ShardDirs) -> Result<front::Front, Error> {
        front::Front::from_spec(
            &shard.spec.front,
            self.kcpshard_binary.clone(),
            dirs.front(),
            &shard.name_any(),
            &self.runtime,
        )
    }

    /// The backend of `store` for `shard` (a password is read now).
    pub fn store(&self, shard: &KcpShard, store: &StoreSpec, dirs: &ShardDirs) -> Result<StoreBackend, StoreError> {
        let paths = StorePaths {
            state_dir: std::path::absolute(&self.state_dir).unwrap_or_else(|_| self.state_dir.clone()),
            store_dir: std::path::absolute(dirs.store()).unwrap_or_else(|_| dirs.store()),
        };
        StoreBackend::from_spec(store, &self.kine_binary, &paths, &shard.name_any())
    }

    /// The leader-election identity of a slot's kcp process, from its log (see [`lease`]).
    pub async fn identity(&self, process: &ProcessRecord) -> Option<String> {
        let key = (process.pid, process.start_time);
        if let Some(known) = self.identities.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Some(known.clone());
        }
        let found = lease::identity_in_log(&self.runtime.log_since_start(process).await)?;
        self.identities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, found.clone());
        Some(found)
    }

    /// Counts a failed reconcile of `shard`; the wait before the next try.
    fn failed(&self, shard: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(shard.to_string()).or_default();
        *n = n.saturating_add(1);
        backoff(WHEN_IDLE * (*n).min(10))
    }

    fn succeeded(&self, shard: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(shard);
    }
}

/// One reconcile of a shard. Its span names the shard for every line logged under it.
#[tracing::instrument(name = "reconcile", skip_all, fields(shard = %shard.name_any()))]
async fn reconcile(shard: Arc<KcpShard>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let name = shard.name_any();
    // Another host's shard (or, on a shared API, nobody's): no finalizer, status or event from
    // here. A change of spec.host wakes the watch.
    let runs_here = || ShardDirs::new(&ctx.state_dir, &name).root().is_dir();
    if !ctx.assignment.check(&shard, runs_here()) {
        return Ok(Action::await_change());
    }
    let finalizers = shard.finalizers();
    let ours = finalizers.iter().position(|f| f == FINALIZER);
    let deleting = shard.meta().deletion_timestamp.is_some();
    if !deleting && ours.is_none() {
        // Deletion must be able to stop what is started from now on: the finalizer first.
        let patch = if shard.meta().finalizers.is_none() {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        } else {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                   {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        };
        return patch_finalizers(&api, &name, patch).await;
    }
    if deleting && ours.is_none() {
        return Ok(Action::await_change());
    }
    let stepped = step(&shard, &ctx).await;
    ctx.heartbeat.beat(&name);
    let (action, done) = stepped?;
    if done {
        // Nothing of the shard runs any more: let the object go.
        ctx.requests.forget(&name);
        ctx.metrics.shard_gone(&name);
        let index = ours.expect("checked above");
        let patch = json!([{"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
                           {"op": "remove", "path": format!("/metadata/finalizers/{index}")}]);
        return patch_finalizers(&api, &name, patch).await;
    }
    Ok(action)
}

async fn patch_finalizers(api: &Api<KcpShard>, name: &str, patch: serde_json::Value) -> Result<Action, Error> {
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a valid JSON patch");
    api.patch::<KcpShard>(name, &PatchParams::default(), &Patch::Json(patch))
        .await
        .map_err(|cause| Error::Api {
            what: "update the finalizers",
            name: name.to_string(),
            cause,
        })?;
    Ok(Action::requeue(NEXT_STEP))
}

/// One observe-plan-act-report round: the action, and whether a deletion is done (nothing of the
/// shard runs any more).
async fn step(shard: &KcpShard, ctx: &Context) -> Result<(Action, bool), Error> {
    let name = shard.name_any();
    let dirs = ShardDirs::new(&ctx.state_dir, &name);
    let working_dir = std::env::current_dir()?;
    let mut desired = desired(shard, &working_dir)?;
    desired.restore = restore::request(shard, &dirs);
    let world = match observe::observe(ctx, shard, &dirs).await {
        Ok(world) => world,
        Err(e) => match state::corrupt_file(&e) {
            Some(path) => return report_unreadable(ctx, shard, &path, &e).await,
            None => return Err(e),
        },
    };
    let store_type = world.store.store.type_;
    desired.restore_stops_store = store_type == crate::api::StoreType::KineSqlite;
    desired.version_refused = desired::version_refused(shard, &world, &dirs);
    desired.store_move = shard.spec.store.moved_at(&world.store.store).map(|_| plan::StoreMove {
        to: shard.spec.store.clone(),
        refused: world.store.refused.clone(),
    });
    // The admin identities every slot must accept are part of the template: a rotation rolls.
    desired.template.accepted_identities = plan::accepted(&world.observed.identities, &world.observed);
    // A shard of a sharded kcp: its flags come from its root. While the root cannot take it,
    // slots that run keep what they started with, and none starts.
    if !desired.deleting {
        match sharding::resolve(&ctx.client, &ctx.state_dir, shard).await? {
            sharding::Resolved::Alone => {}
            sharding::Resolved::Sharded(sharded) => desired.template.sharded = Some(sharded),
            sharding::Resolved::RootNotReady(why) => {
                let running = world.observed.slots.iter().filter(|s| s.running);
                match running.filter_map(|s| s.template.sharded.clone()).next() {
                    Some(sharded) => desired.template.sharded = Some(sharded),
                    None => desired.root_not_ready = Some(why),
                }
            }
        }
    }
    desired.interim = interim(&desired, world.data_version.as_ref());
    let next = plan::plan(&desired, &world.observed);
    tracing::debug!(step = ?next, "planned");
    let actor = act::Actor {
        ctx,
        shard,
        dirs: &dirs,
        desired: &desired,
        world: &world,
        step: &next,
    };
    let acting = tokio::time::Instant::now();
    let span = tracing::info_span!("step", step = next.name(), slot = next.slot());
    let outcome = actor.act(&next).instrument(span).await;
    let took = acting.elapsed();
    if took > STEP_BUDGET {
        tracing::warn!(
            step = next.name(),
            ?took,
            "a step took longer than it should (docs/architecture.md, \"The steps\")"
        );
    }
    ctx.metrics
        .step_taken(&name, &next, took, outcome.as_ref().err().map(Error::metric_label));
    let (notes, failure) = match outcome {
        Ok(notes) => (notes, None),
        Err(e) => {
            // A record the step needed does not parse (a kine's, a slot's process record): as above.
            if let Some(path) = state::corrupt_file(&e) {
                return report_unreadable(ctx, shard, &path, &e).await;
            }
            tracing::warn!(step = ?next, error = %e, "step failed");
            ctx.requests.step_failed(&name, &next);
            (vec![Note::warning("StepFailed", e.to_string())], Some(e.to_string()))
        }
    };
    // The status as stored now (the watcher's copy may lag a write behind): the patch removes what
    // it has and the new status lacks, and repeated warnings are told apart from new ones.
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let stored = stored_status(&api, &name).await?;
    let degraded = stored.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    });
    // A filesystem below its watermark is told once, when the shard's status first says so.
    let disk_note = world.observed.disk.as_ref().and_then(|problem| {
        let told = stored
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == problem.reason()));
        (!told).then(|| {
            tracing::warn!(reason = problem.reason(), "{}", problem.message);
            Note::warning(problem.reason(), problem.message.clone())
        })
    });
    for note in disk_note.into_iter().chain(notes) {
        // A failing step is reported when it starts failing, not on every look.
        let repeat = note.reason == "StepFailed"
            && degraded.is_some_and(|c| c.reason == "StepFailed" && c.message == note.message);
        if !repeat {
            publish(ctx, shard, note).await;
        }
    }
    let waited = matches!(next, Step::Idle | Step::Blocked { .. } | Step::Wait(_));
    let world = if waited || failure.is_some() {
        world
    } else {
        observe::observe(ctx, shard, &dirs).await?
    };
    let upcoming = plan::plan(&desired, &world.observed);
    let mut status = status::build(shard, stored.as_ref(), &desired, &world, &upcoming, failure.as_deref());
    if !desired.deleting
        && let Some(verdict) = credentials::verdict(
            &world.observed.identities,
            desired.rotation_request.as_deref(),
            &plan::accepted(&world.observed.identities, &world.observed),
            &dirs.front_kubeconfig(),
        )
    {
        let previous = stored.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        status.conditions.extend(conditions::merge(
            previous,
            std::slice::from_ref(&verdict),
            shard.metadata.generation,
            world.observed.now,
        ));
    }
    write_status(&api, &name, stored.as_ref(), &status).await?;
    ctx.metrics.conditions_written(&name, &status.conditions);
    // A slot that stops answering while it is the only one behind the front takes no step until
    // livenessTimeout: the first status that says so is told as an event too.
    if let Some(hung) = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == "SlotUnresponsive")
        && degraded.is_none_or(|c| c.reason != hung.reason)
    {
        publish(ctx, shard, Note::warning("SlotUnresponsive", hung.message.clone())).await;
    }
    // A blocked roll is told once: with the first status that says Degraded for it.
    if let Step::Blocked { cause } = &upcoming
        && failure.is_none()
        && degraded.is_none_or(|c| c.reason != cause.reason())
    {
        publish(ctx, shard, Note::warning("RollBlocked", cause.message())).await;
    }
    let failing_for = degraded
        .filter(|c| c.reason == "StepFailed")
        .and_then(|c| {
            Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(c.last_transition_time.0)).ok()
        })
        .unwrap_or_default();
    ctx.succeeded(&name);
    let after = match (&next, failure) {
        (_, Some(_)) => backoff(failing_for),
        // A due check of a caddy front's change is looked at again soon.
        (Step::Idle | Step::Blocked { .. }, _) if world.observed.front_check.is_some() => WHILE_PROBING,
        (Step::Idle | Step::Blocked { .. }, _) => WHEN_IDLE,
        (Step::Wait(Wait::Settle { remaining, .. } | Wait::RenewDeadline { remaining, .. }), _) => {
            (*remaining).max(NEXT_STEP)
        }
        (Step::Wait(Wait::Probe | Wait::Preflight | Wait::Answer(_)), _) => WHILE_PROBING,
        (Step::Wait(Wait::Store | Wait::Front | Wait::FrontUpgrade), _) => WHILE_STARTING,
        (Step::Wait(_), _) => WHILE_WAITING,
        _ => NEXT_STEP,
    };
    // A serving slot that failed a look may be hung: the front's word that it left a connection
    // unanswered (which wakes nothing) takes it out of the front before its second failed look.
    let may_hang = world
        .observed
        .slots
        .iter()
        .any(|s| s.can_stay() && s.health.failures > 0);
    let action = Action::requeue(if may_hang { after.min(WHILE_PROBING) } else { after });
    Ok((action, desired.deleting && next == Step::Idle))
}

fn error_policy(shard: Arc<KcpShard>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = shard.name_any();
    let retry = ctx.failed(&name);
    ctx.metrics.step_failed_outside(&name, error.metric_label());
    tracing::warn!(shard = %name, %error, ?retry, "reconcile failed; retrying");
    Action::requeue(retry)
}

/// Runs the controller until `shutdown` resolves. `woken` carries the shards whose processes
/// exited or whose health changed (from `ctx.exits`): each is reconciled at once.
pub async fn run(
    ctx: Context,
    woken: tokio::sync::mpsc::UnboundedReceiver<(ObjectRef<KcpShard>, Wake)>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let metrics = ctx.metrics.clone();
    let exited = tokio_stream::wrappers::UnboundedReceiverStream::new(woken).map(move |(shard, wake)| {
        if wake == Wake::Exit {
            metrics.process_exited(&shard.name);
        }
        shard
    });
    Controller::new(api, watcher::Config::default())
        .reconcile_on(exited)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile ended with an error");
            }
        })
        .await;
}

/// The recorder's identity: controller `kcpshard`, instance the host name (serve's --host-name).
pub fn reporter(host: &str) -> Reporter {
    Reporter {
        controller: "kcpshard".into(),
        instance: Some(host.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_step_is_retried_less_often_the_longer_it_fails_but_at_least_every_10s() {
        assert_eq!(backoff(Duration::ZERO), WHEN_IDLE);
        assert_eq!(backoff(Duration::from_secs(3)), WHEN_IDLE);
        assert_eq!(backoff(Duration::from_secs(12)), Duration::from_secs(6));
        assert_eq!(backoff(Duration::from_secs(3600)), MAX_BACKOFF);
    }
}
