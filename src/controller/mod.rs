//! The controller: a kube-runtime `Controller` over the local API (in-process client). Each
//! reconcile of a `KcpShard` observes what runs ([`observe`]), asks the pure [`plan`] for the one
//! next step, performs it ([`act`]), then writes status (conditions, phase, slots, front, lastRoll)
//! and an event per thing that happened. It requeues at once after a step, shortly while a slot
//! starts, and every few seconds when idle; a process of the shard that exits wakes it at once.
//!
//! A finalizer makes deletion a step of its own: the slots, the store's processes and the front
//! stop; the data stays under the state dir.
pub mod act;
pub mod assignment;
pub mod clients;
pub mod conditions;
pub mod credentials;
pub mod error;
pub mod front;
pub mod health;
pub mod heartbeat;
pub mod host_lease;
pub mod jobs;
pub mod lease;
pub mod metrics;
pub mod observe;
pub mod plan;
pub mod preflight;
pub mod restore;
pub mod sharding;
pub mod state;
pub mod status;

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

use crate::api::{FINALIZER, KcpShard, RESTARTED_AT_ANNOTATION, StoreSpec};
use crate::process::exits::ExitNotices;
use crate::process::{ProcessRecord, Runtime};
use crate::store::{StoreBackend, StoreError, StorePaths};
pub use error::Error;
use plan::{Desired, SlotTemplate, Step, Wait};
use state::ShardDirs;

/// Requeue after a step that changed something: take the next one at once.
const NEXT_STEP: Duration = Duration::from_millis(10);
/// Requeue while the probe workspace gets Ready: how late the roll learns that a leader runs.
const WHILE_PROBING: Duration = Duration::from_millis(100);
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
}

/// What every reconcile shares.
pub struct Context {
    pub client: kube::Client,
    pub reporter: Reporter,
    pub runtime: Runtime,
    pub state_dir: PathBuf,
    /// The kine binary the store runs (KineSqlite, KinePostgres).
    pub kine_binary: PathBuf,
    /// This binary, which runs `kcpshard front`.
    pub front_binary: PathBuf,
    pub slot_clients: Arc<clients::SlotClients>,
    pub metrics: metrics::ControllerMetrics,
    /// Wakes the controller for a shard when one of its processes exits, or a health check saw
    /// a change.
    pub exits: Arc<ExitNotices<(ObjectRef<KcpShard>, Wake)>>,
    pub health: health::HealthChecks,
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
        front_binary: PathBuf,
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
            front_binary,
            slot_clients: Default::default(),
            metrics,
            health: health::HealthChecks::new(exits.clone()),
            exits,
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
            self.front_binary.clone(),
            dirs.front(),
            &shard.name_any(),
            &self.runtime,
        )
        .map_err(Error::Front)
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

/// The desired state from the spec: the template every current slot must have (but for the admin
/// identities it accepts, which `step` adds from [`credentials::reconcile`]).
pub fn desired(shard: &KcpShard, working_dir: &Path) -> Result<Desired, Error> {
    let spec = &shard.spec;
    let binary = working_dir.join(spec.kcp.binary_for(&spec.version));
    let template = SlotTemplate {
        version: spec.version.clone(),
        binary: binary.display().to_string(),
        extra_args: spec.kcp.extra_args.clone(),
        shutdown_delay: spec.kcp.shutdown_delay.clone(),
        front_url: format!("https://{}", spec.front.listen),
        restarted_at: shard.annotations().get(RESTARTED_AT_ANNOTATION).cloned(),
        // From the shard's identity record and what runs: `credentials::reconcile`, in `step`.
        accepted_identities: vec![],
        // From the root shard: `sharding::resolve`, in `step`.
        sharded: None,
    };
    Ok(Desired {
        binary_present: binary.is_file(),
        template,
        slots: spec.slots as usize,
        readiness_timeout: spec.rollout.readiness_timeout().map_err(Error::Spec)?,
        liveness_timeout: spec.rollout.liveness_timeout().map_err(Error::Spec)?,
        drain_timeout: spec.rollout.drain_timeout().map_err(Error::Spec)?,
        deleting: shard.meta().deletion_timestamp.is_some(),
        version_refused: None,
        root_not_ready: None,
        // And a store that takes snapshots: the one in use, in `step`.
        snapshot_before_version_change: spec.rollout.snapshot_before_version_change,
        preflight: spec.rollout.preflight,
        allow_schema_change: spec.rollout.allow_minor_version_change,
        // Judged with the shard's files: `restore::request`, in `step`.
        restore: None,
        // From the data's record, once the template is whole: `interim`, in `step`.
        interim: None,
    })
}

/// What an interim slot runs (see [`Desired::interim`]): the template last started on the data,
/// when it is of another version than the spec's and its binary is still there, with the
/// identities and sharding every slot takes now (a rotation or a root's move since it ran does
/// not make the interim slot a stranger).
fn interim(desired: &Desired, data: Option<&state::DataVersion>) -> Option<SlotTemplate> {
    let recorded = data?.template.as_ref()?;
    if recorded.version == desired.template.version || !Path::new(&recorded.binary).is_file() {
        return None;
    }
    Some(SlotTemplate {
        front_url: desired.template.front_url.clone(),
        accepted_identities: desired.template.accepted_identities.clone(),
        sharded: desired.template.sharded.clone(),
        ..recorded.clone()
    })
}

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
        .map_err(|e| Error::Finalizer(format!("cannot update the finalizers of KcpShard {name}: {e}")))?;
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
    desired.snapshot_before_version_change &= world.store.store.type_ == crate::api::StoreType::KinePostgres;
    // A roll is judged from the version that served when it began, not from a half-rolled front;
    // a first slot from the version that last served the data (a re-created shard, a copied state
    // dir), so that no kcp starts on data a newer one has rewritten.
    let from = world
        .state
        .roll
        .as_ref()
        .and_then(|r| r.from_version.clone())
        .or_else(|| world.serving_version());
    if let Some(from) = &from {
        desired.version_refused = shard
            .spec
            .rollout
            .version_change(from, &shard.spec.version)
            .err()
            .map(|refused| format!("{refused}; the running slots keep serving"));
    } else if let Some(data) = &world.data_version {
        desired.version_refused = shard
            .spec
            .rollout
            .version_change(&data.version, &shard.spec.version)
            .err()
            .map(|refused| {
                format!(
                    "no slot runs, and kcp {} last served this shard's data (since {}, {}): {refused}",
                    data.version,
                    data.since.format("%Y-%m-%dT%H:%M:%SZ"),
                    dirs.data_version_file().display()
                )
            });
    }
    // The admin identities every slot must accept are part of the template: a rotation rolls.
    let credentials = if desired.deleting {
        None
    } else {
        let credentials = credentials::reconcile(
            &dirs,
            shard,
            &world.observed,
            &desired.template.front_url,
            chrono::Utc::now(),
        );
        match credentials {
            Ok(credentials) => Some(credentials),
            Err(e) => match state::corrupt_file(&e) {
                Some(path) => return report_unreadable(ctx, shard, &path, &e).await,
                None => return Err(e),
            },
        }
    };
    if let Some(credentials) = &credentials {
        desired.template.accepted_identities = credentials.accepted.clone();
    }
    // A shard of a sharded kcp: its flags come from its root. While the root cannot take it,
    // slots that run keep what they started with, and none starts.
    if !desired.deleting {
        match sharding::resolve(&ctx.client, &ctx.state_dir, shard, &desired.template.front_url).await? {
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
    tracing::debug!(shard = %name, step = ?next, "planned");
    let actor = act::Actor {
        ctx,
        shard,
        dirs: &dirs,
        desired: &desired,
        world: &world,
    };
    let outcome = actor.act(&next).await;
    ctx.metrics
        .step_taken(&name, &next, outcome.as_ref().err().map(Error::metric_label));
    let (notes, failure) = match outcome {
        Ok(notes) => (notes, None),
        Err(e) => {
            // A record the step needed does not parse (a kine's, a slot's process record): as above.
            if let Some(path) = state::corrupt_file(&e) {
                return report_unreadable(ctx, shard, &path, &e).await;
            }
            tracing::warn!(shard = %name, step = ?next, error = %e, "step failed");
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
            tracing::warn!(shard = %name, reason = problem.reason(), "{}", problem.message);
            Note::warning(problem.reason(), problem.message.clone())
        })
    });
    let credential_notes = credentials
        .iter()
        .flat_map(|c| c.notes.iter().cloned())
        .chain(disk_note);
    for note in credential_notes.chain(notes) {
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
    if let Some(credentials) = &credentials {
        let previous = stored.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        status.conditions.extend(conditions::merge(
            previous,
            std::slice::from_ref(&credentials.verdict),
            shard.metadata.generation,
            world.observed.now,
        ));
    }
    write_status(&api, &name, stored.as_ref(), &status).await?;
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
    let action = match (&next, failure) {
        (_, Some(_)) => Action::requeue(backoff(failing_for)),
        (Step::Idle | Step::Blocked { .. }, _) => Action::requeue(WHEN_IDLE),
        (Step::Wait(Wait::Settle { remaining, .. }), _) => Action::requeue(*remaining),
        (Step::Wait(Wait::Probe | Wait::Preflight), _) => Action::requeue(WHILE_PROBING),
        (Step::Wait(_), _) => Action::requeue(WHILE_WAITING),
        _ => Action::requeue(NEXT_STEP),
    };
    Ok((action, desired.deleting && next == Step::Idle))
}

/// One of the controller's own files does not parse: no step is taken (the processes run on as
/// they are), and the user reads in Degraded which file it is and what to do. Moving it aside is
/// safe: what it held is observed again (running slots, the front's backend), and a slot whose
/// record had to be rebuilt is replaced by a roll.
async fn report_unreadable(
    ctx: &Context,
    shard: &KcpShard,
    path: &Path,
    error: &Error,
) -> Result<(Action, bool), Error> {
    let name = shard.name_any();
    let message = format!(
        "{error}. The controller takes no step for this shard while it cannot read that file; the slots, store and front keep running as they are. Move it aside (mv {path} {path}.bad): the controller then rebuilds what it can observe (running slots, the front's backend) and replaces by a roll a slot whose record it had to rebuild",
        path = path.display()
    );
    tracing::warn!(shard = %name, file = %path.display(), %error, "a state file does not parse");
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let stored = stored_status(&api, &name).await?;
    let reported = stored.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.reason == status::UNREADABLE_REASON && c.message == message)
    });
    if !reported {
        publish(ctx, shard, Note::warning("StateFileUnreadable", message.clone())).await;
    }
    let status = status::unreadable(stored.as_ref(), shard.metadata.generation, &message, chrono::Utc::now());
    write_status(&api, &name, stored.as_ref(), &status).await?;
    Ok((Action::requeue(WHEN_IDLE), false))
}

/// The status as stored now (the watcher's copy may lag a write behind).
async fn stored_status(api: &Api<KcpShard>, name: &str) -> Result<Option<crate::api::KcpShardStatus>, Error> {
    api.get_status(name)
        .await
        .map(|shard| shard.status)
        .map_err(|source| Error::Status {
            name: name.to_string(),
            source,
        })
}

/// Writes `status` as one merge patch over `stored`: an unchanged status is a no-op on the server.
async fn write_status(
    api: &Api<KcpShard>,
    name: &str,
    stored: Option<&crate::api::KcpShardStatus>,
    status: &crate::api::KcpShardStatus,
) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status::as_patch(stored, status)),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Status {
        name: name.to_string(),
        source,
    })
}

async fn publish(ctx: &Context, shard: &KcpShard, note: Note) {
    let event = Event {
        type_: note.type_,
        reason: note.reason.into(),
        note: Some(note.message),
        action: "Reconcile".into(),
        secondary: None,
    };
    // A recorder per event: a shared one folds events of the same reason into one series and keeps
    // the first message ("started slot a" would hide "started slot b").
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    if let Err(e) = recorder.publish(&event, &shard.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot record an event");
    }
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
