//! The front as observed: through kcpshard's front's control socket (or caddy's admin API), and,
//! when that does not answer, by its recorded process: starting, asked to stop, exited at its
//! start (it said why in its dir), or running without answering.
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use kube::runtime::reflector::ObjectRef;

use super::ObservedSlot;
use crate::controller::front::Front;
use crate::controller::plan::{FrontCheck, FrontCheckObservation, FrontObservation, ProcessStop, Stopping};
use crate::controller::state::ShardDirs;
use crate::controller::{Context, Wake};
use crate::front::Backend;
use crate::slot::access;

/// How long the front's control socket may take to answer a status request.
const FRONT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `/readyz` through a caddy front may take to answer a check of a change.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// What one look saw of the front.
pub(super) struct FrontLook {
    pub observation: FrontObservation,
    /// Where it forwards new connections, as it says.
    pub backends: Vec<Backend>,
    /// Why it is not up, for status.
    pub problem: Option<String>,
    /// kcpshard's front runs another binary than serve's.
    pub outdated: bool,
    /// A successor of serve's binary was started to take over from it and still may.
    pub upgrading: bool,
    /// It listens on another address than the spec's.
    pub elsewhere: bool,
    /// Per slot name: when the front last replayed a new connection the slot left unanswered.
    pub last_silent: Vec<(String, DateTime<Utc>)>,
}

impl FrontLook {
    fn not_up(observation: FrontObservation, problem: String) -> FrontLook {
        FrontLook {
            observation,
            backends: vec![],
            problem: Some(problem),
            outdated: false,
            upgrading: false,
            elsewhere: false,
            last_silent: vec![],
        }
    }
}

/// Looks at `front`; `slots` name the addresses it forwards to, `stopping` says whether it was
/// asked to stop. Its process's exit wakes the controller.
pub(super) async fn look(
    ctx: &Context,
    shard_ref: &ObjectRef<crate::api::KcpShard>,
    front: &Front,
    slots: &[ObservedSlot],
    stopping: &[ProcessStop],
) -> FrontLook {
    let watch = |pid: u32| ctx.exits.watch(pid, (shard_ref.clone(), Wake::Exit));
    let answer = tokio::time::timeout(FRONT_TIMEOUT, front.observe()).await;
    let silent = !matches!(answer, Ok(Ok(_)));
    // Between a crash and the restart its unit makes (and until the new front records its pid),
    // nothing answers and no recorded front runs: starting, not down.
    if silent
        && front.starting().is_none()
        && !front.recorded_pid_alive()
        && !stopping.iter().any(|s| s.what == Stopping::Front)
        && front.restarted_by_unit().await
    {
        return FrontLook::not_up(
            FrontObservation::Starting,
            "systemd restarts the front (its unit is active); it serves once it answers on its control socket".into(),
        );
    }
    match answer {
        Ok(Ok(seen)) => {
            // The front's exit, and a successor's (which failed its upgrade), wake the controller.
            for pid in seen.pid.iter().chain(&seen.upgrading) {
                watch(*pid);
            }
            ctx.metrics
                .fronts
                .seen(&shard_ref.name, &seen.connections, &seen.backends);
            // A slot is what the front forwards to only if it, as recorded now, listens where the
            // front sends: a slot replaced under the same name (after a crash) is on another port.
            let name_of = |address: SocketAddr| {
                slots
                    .iter()
                    .find(|s| s.address() == address)
                    .map(|s| s.name().to_string())
            };
            let counts = |count: fn(&crate::front::SlotConnections) -> u64| {
                seen.connections
                    .iter()
                    .map(|(slot, c)| (slot.clone(), count(c)))
                    .filter(|(_, n)| *n > 0)
                    .collect::<Vec<_>>()
            };
            FrontLook {
                observation: FrontObservation::Up {
                    backends: seen.backends.iter().filter_map(|b| name_of(b.address)).collect(),
                    open: counts(|c| c.open),
                    retiring: counts(|c| c.retired_pending),
                },
                elsewhere: seen.listen != front.listen(),
                last_silent: seen
                    .connections
                    .iter()
                    .filter_map(|(slot, c)| Some((slot.clone(), c.last_silent?)))
                    .collect(),
                backends: seen.backends,
                problem: None,
                outdated: seen.outdated,
                upgrading: seen.upgrading.is_some(),
            }
        }
        Ok(Err(_)) if let Some(pid) = front.starting() => {
            // An exit at its start wakes the controller.
            watch(pid);
            FrontLook::not_up(
                FrontObservation::Starting,
                "the front was started a moment ago and does not answer on its control socket yet".into(),
            )
        }
        Ok(Err(problem)) if front.recorded_pid_alive() => {
            // A front asked to stop closes its control socket at once and drains.
            if stopping.iter().any(|s| s.what == Stopping::Front) {
                FrontLook::not_up(FrontObservation::Down, problem)
            } else {
                FrontLook::not_up(
                    FrontObservation::Unresponsive,
                    format!("the front's process runs but does not answer on its control socket ({problem})"),
                )
            }
        }
        Ok(Err(problem)) => match front.start_error() {
            Some(error) => FrontLook::not_up(
                FrontObservation::Down,
                format!("the front exited at its start: {error}"),
            ),
            None => FrontLook::not_up(FrontObservation::Down, problem),
        },
        Err(_) if front.recorded_pid_alive() => FrontLook::not_up(
            FrontObservation::Unresponsive,
            format!("the front's process runs but its control socket did not answer within {FRONT_TIMEOUT:?}"),
        ),
        Err(_) => FrontLook::not_up(
            FrontObservation::Down,
            format!("the front did not answer within {FRONT_TIMEOUT:?}"),
        ),
    }
}

/// A due check of a caddy front's change: one `/readyz` through the front at `listen`, as a client
/// would, with the admin credentials of `slot` (one the front serves).
pub(super) async fn check(
    dirs: &ShardDirs,
    listen: SocketAddr,
    slot: Option<&String>,
    check: &FrontCheck,
) -> FrontCheckObservation {
    let Some(slot) = slot else {
        return FrontCheckObservation {
            check: check.clone(),
            outcome: Err("caddy serves no slot of the shard".into()),
        };
    };
    let kubeconfig = dirs.slot(slot).admin_kubeconfig();
    let outcome = match access::shard_admin_client(&kubeconfig, &format!("https://{listen}")).await {
        Err(e) => Err(e.to_string()),
        Ok(client) => match tokio::time::timeout(CHECK_TIMEOUT, access::readyz(&client)).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(format!("/readyz through {listen} does not answer ok")),
            Ok(Err(e)) => Err(format!("/readyz through {listen} failed: {e}")),
            Err(_) => Err(format!(
                "/readyz through {listen} did not answer within {CHECK_TIMEOUT:?}"
            )),
        },
    };
    FrontCheckObservation {
        check: check.clone(),
        outcome,
    }
}
