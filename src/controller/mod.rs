//! The controller: a kube-runtime `Controller` over the local API (in-process client). Each
//! reconcile of a `KcpShard` observes what runs ([`observe`]), asks the pure [`plan`] for the one
//! next step, performs it ([`act`]), then writes status (conditions, phase, slots, front, lastRoll)
//! and an event per thing that happened. It requeues at once after a step, shortly while a slot
//! starts, and every few seconds when idle; a process of the shard that exits wakes it at once.
//!
//! A finalizer makes deletion a step of its own: the slots, the store's processes and the front
//! stop; the data stays under the state dir.
pub mod act;
pub mod clients;
pub mod conditions;
pub mod front;
pub mod heartbeat;
pub mod metrics;
pub mod observe;
pub mod plan;
pub mod state;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::api::{FINALIZER, KcpShard, RESTARTED_AT_ANNOTATION};
use crate::process::Runtime;
use crate::process::exits::ExitNotices;
use crate::store::{StoreBackend, StoreError, StorePaths};
use plan::{Desired, SlotTemplate, Step};
use state::ShardDirs;

/// Requeue after a step that changed something: take the next one at once.
const NEXT_STEP: Duration = Duration::from_millis(10);
/// Requeue while a slot starts.
const WHILE_STARTING: Duration = Duration::from_millis(200);
/// Requeue when converged or blocked: how soon a crashed slot is noticed.
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
    pub slot_clients: clients::SlotClients,
    pub metrics: metrics::ControllerMetrics,
    /// Wakes the controller for a shard when one of its processes exits.
    pub exits: ExitNotices<ObjectRef<KcpShard>>,
    /// Beaten at the end of every reconcile: serve's watchdog pings systemd only while it beats.
    pub heartbeat: heartbeat::Heartbeat,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:#}")]
    Step(#[from] anyhow::Error),
    #[error("cannot write the status of KcpShard {name}: {source}")]
    Status { name: String, source: kube::Error },
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl Context {
    /// The front the spec asks for.
    pub fn front(&self, shard: &KcpShard, dirs: &ShardDirs) -> anyhow::Result<front::Front> {
        front::Front::from_spec(
            &shard.spec.front,
            self.front_binary.clone(),
            dirs.front(),
            &shard.name_any(),
            &self.runtime,
        )
    }

    /// The store the spec asks for (a password is read now).
    pub fn store(&self, shard: &KcpShard, dirs: &ShardDirs) -> Result<StoreBackend, StoreError> {
        let paths = StorePaths {
            state_dir: std::path::absolute(&self.state_dir).unwrap_or_else(|_| self.state_dir.clone()),
            store_dir: std::path::absolute(dirs.store()).unwrap_or_else(|_| dirs.store()),
        };
        StoreBackend::from_spec(&shard.spec.store, &self.kine_binary, &paths, &shard.name_any())
    }
}

/// The desired state from the spec: the template every current slot must have.
pub fn desired(shard: &KcpShard, working_dir: &Path) -> anyhow::Result<Desired> {
    let spec = &shard.spec;
    let binary = working_dir.join(spec.kcp.binary_for(&spec.version));
    let template = SlotTemplate {
        version: spec.version.clone(),
        binary: binary.display().to_string(),
        extra_args: spec.kcp.extra_args.clone(),
        shutdown_delay: spec.kcp.shutdown_delay.clone(),
        front_url: format!("https://{}", spec.front.listen),
        restarted_at: shard.annotations().get(RESTARTED_AT_ANNOTATION).cloned(),
    };
    Ok(Desired {
        binary_present: binary.is_file(),
        template,
        readiness_timeout: spec.rollout.readiness_timeout().map_err(anyhow::Error::msg)?,
        deleting: shard.meta().deletion_timestamp.is_some(),
        version_refused: None,
        snapshot_before_version_change: spec.rollout.snapshot_before_version_change
            && spec.store.type_ == crate::api::StoreType::KinePostgres,
    })
}

async fn reconcile(shard: Arc<KcpShard>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let name = shard.name_any();
    let result = finalizer(&api, FINALIZER, shard, |event| async {
        match event {
            Finalizer::Apply(shard) => step(&shard, &ctx).await,
            Finalizer::Cleanup(shard) => {
                // Deleting: take cleanup steps until nothing runs, then let the finalizer go.
                loop {
                    let action = step(&shard, &ctx).await?;
                    if action == Action::await_change() {
                        return Ok(action);
                    }
                }
            }
        }
    })
    .await;
    ctx.heartbeat.beat(&name);
    result.map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

/// One observe-plan-act-report round.
async fn step(shard: &KcpShard, ctx: &Context) -> Result<Action, Error> {
    let name = shard.name_any();
    let dirs = ShardDirs::new(&ctx.state_dir, &name);
    let working_dir = std::env::current_dir().map_err(anyhow::Error::from)?;
    let desired = desired(shard, &working_dir)?;
    let world = match observe::observe(ctx, shard, &dirs).await {
        Ok(world) => world,
        Err(e) => match state::corrupt_file(&e) {
            Some(path) => return report_unreadable(ctx, shard, &path, &e).await,
            None => return Err(e.into()),
        },
    };
    let mut desired = desired;
    if let Some(serving) = world.serving_version() {
        desired.version_refused = shard.spec.rollout.version_change(&serving, &shard.spec.version).err();
    }
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
    ctx.metrics.step_taken(&name, &next, outcome.is_err());
    let (notes, failure) = match outcome {
        Ok(notes) => (notes, None),
        Err(e) => {
            // A record the step needed does not parse (a kine's, a slot's process record): as above.
            if let Some(path) = state::corrupt_file(&e) {
                return report_unreadable(ctx, shard, &path, &e).await;
            }
            tracing::warn!(shard = %name, step = ?next, error = %format!("{e:#}"), "step failed");
            (
                vec![Note::warning("StepFailed", format!("{e:#}"))],
                Some(format!("{e:#}")),
            )
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
    for note in notes {
        // A blocked roll or a failing step is reported when it starts, not on every look.
        let repeat = match (&next, note.reason) {
            (Step::Blocked { cause }, "RollBlocked") => degraded.is_some_and(|c| c.reason == cause.reason()),
            (_, "StepFailed") => degraded.is_some_and(|c| c.reason == "StepFailed" && c.message == note.message),
            _ => false,
        };
        if !repeat {
            publish(ctx, shard, note).await;
        }
    }
    let world = if matches!(
        next,
        Step::Idle | Step::Blocked { .. } | Step::AwaitReady { .. } | Step::AwaitSettle { .. }
    ) {
        world
    } else {
        observe::observe(ctx, shard, &dirs).await?
    };
    let upcoming = plan::plan(&desired, &world.observed);
    let status = status::build(shard, stored.as_ref(), &desired, &world, &upcoming, failure.as_deref());
    write_status(&api, &name, stored.as_ref(), &status).await?;
    // This status already says Degraded for a block the next look will find (a new shard with no
    // binary): that look takes the block as reported, so the event goes out now.
    if let Step::Blocked { cause } = &upcoming
        && !matches!(next, Step::Blocked { .. })
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
    Ok(match (&next, failure) {
        (_, Some(_)) => Action::requeue(backoff(failing_for)),
        (Step::Idle, _) if desired.deleting => Action::await_change(),
        (Step::Idle | Step::Blocked { .. }, _) => Action::requeue(WHEN_IDLE),
        (Step::AwaitSettle { remaining, .. }, _) => Action::requeue(*remaining),
        (Step::AwaitReady { .. }, _) => Action::requeue(WHILE_STARTING),
        _ => Action::requeue(NEXT_STEP),
    })
}

/// One of the controller's own files does not parse: no step is taken (the processes run on as
/// they are), and the user reads in Degraded which file it is and what to do. Moving it aside is
/// safe: what it held is observed again (running slots, the front's backend), and a slot whose
/// record had to be rebuilt is replaced by a roll.
async fn report_unreadable(
    ctx: &Context,
    shard: &KcpShard,
    path: &Path,
    error: &anyhow::Error,
) -> Result<Action, Error> {
    let name = shard.name_any();
    let message = format!(
        "{error:#}. The controller takes no step for this shard while it cannot read that file; the slots, store and front keep running as they are. Move it aside (mv {path} {path}.bad): the controller then rebuilds what it can observe (running slots, the front's backend) and replaces by a roll a slot whose record it had to rebuild",
        path = path.display()
    );
    tracing::warn!(shard = %name, file = %path.display(), error = %format!("{error:#}"), "a state file does not parse");
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
    if shard.meta().deletion_timestamp.is_some() {
        // The cleanup loop takes steps until one says "done": an error ends it and retries later.
        return Err(Error::Step(anyhow::anyhow!("{message}")));
    }
    Ok(Action::requeue(WHEN_IDLE))
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

fn error_policy(shard: Arc<KcpShard>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(shard = %shard.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(WHEN_IDLE)
}

/// Runs the controller until `shutdown` resolves. `exited` carries the shards whose processes
/// exited (from `ctx.exits`): each is reconciled at once.
pub async fn run(
    ctx: Context,
    exited: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<KcpShard>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let metrics = ctx.metrics.clone();
    let exited = tokio_stream::wrappers::UnboundedReceiverStream::new(exited)
        .inspect(move |shard| metrics.process_exited(&shard.name));
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

/// The recorder's identity: controller `kcpshard`, instance the host name.
pub fn reporter() -> Reporter {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok();
    Reporter {
        controller: "kcpshard".into(),
        instance: host,
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
