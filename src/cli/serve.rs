//! `kcpshard serve`: the API server and the controller in one process. The processes it starts
//! (slots, stores, fronts) are processes of their own, or systemd units (`--runtime`), and
//! outlive it.
//!
//! Under systemd (`Type=notify`, manifests/systemd/kcpshard.service) it speaks the notify
//! protocol: `READY=1` once the API listens and the controller runs; `STATUS=` with each shard's
//! phase; `WATCHDOG=1` while the controller makes progress (its heartbeat,
//! controller/heartbeat.rs), so a wedged or dead controller is restarted; `STOPPING=1`.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::ResourceExt;
use sd_notify::NotifyState;
use tokio::sync::watch;

use crate::api::KcpShard;
use crate::apiserver::{self, ApiServer, ServeConfig, StateLock};
use crate::controller::heartbeat::Heartbeat;
use crate::process::{Runtime, RuntimeKind};
use crate::{controller, gitops};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the objects, the PKI, the kubeconfig this command writes, and each shard's
    /// slots, store and front.
    #[arg(long, env = "KCPSHARD_STATE_DIR", default_value = ".kcpshard")]
    state_dir: PathBuf,
    /// Address of the HTTPS API; port 0 picks a free port (the kubeconfig names the real one).
    #[arg(long, default_value = "127.0.0.1:6440")]
    api_listen: SocketAddr,
    /// The kine binary the KineSqlite store runs.
    #[arg(long, env = "KCPSHARD_KINE", default_value = "bin/kine")]
    kine_binary: PathBuf,
    /// Run the controller (slots, stores, fronts). `--controller=false` serves the API alone: for
    /// tests of the API itself, or to inspect a state dir without touching its processes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    controller: bool,
    /// GitOps: apply every KcpShard in the YAML files under DIR (a git checkout, say) at start and
    /// whenever they change, with server-side apply under the field manager `kcpshard-gitops`.
    /// A field removed from a file is removed from the object. Deleting a file does not delete its
    /// objects (see --manifests-prune). See docs/operations.md.
    #[arg(long, value_name = "DIR")]
    manifests: Option<PathBuf>,
    /// With --manifests: delete the KcpShards that kcpshard-gitops created and that no file in DIR
    /// holds any more (like Flux's prune). Nothing is pruned in a pass that finds an invalid file.
    #[arg(long, requires = "manifests")]
    manifests_prune: bool,
    /// With --manifests: how often DIR is read again in case a change was not seen (`30s`, `2m`).
    /// Only files whose bytes changed are applied.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::api::parse_duration, requires = "manifests")]
    manifests_interval: std::time::Duration,
    /// How the processes serve starts run: `systemd`, a transient unit each (of this user's
    /// manager; root's is the system manager); `process`, detached processes with log files.
    /// Default: systemd when serve itself runs as a systemd service, else process.
    #[arg(long, value_enum, env = "KCPSHARD_RUNTIME")]
    runtime: Option<RuntimeKind>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // What serve and the processes it starts (kine, fronts, kcp) create is private to this user,
    // not only the files kcpshard writes itself: kine's sqlite database holds kcp's Secrets.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let config = ServeConfig {
        state_dir: args.state_dir.clone(),
        api_listen: args.api_listen,
    };
    let working_dir = std::env::current_dir().context("cannot read the working directory")?;
    let manifests = args.manifests.as_ref().map(|dir| working_dir.join(dir));
    if let Some(dir) = &manifests {
        gitops::check_dir(dir)?;
    }
    let _lock = StateLock::acquire(&config.state_dir)?;
    let server = ApiServer::open(&config.state_dir)?;
    let gitops_client = server.client();
    let controller_metrics = controller::metrics::ControllerMetrics::default();
    server
        .metrics
        .register("controller", |registry| controller_metrics.register(registry));
    let (exits, woken) = crate::process::exits::ExitNotices::new();
    let kind = args.runtime.unwrap_or_else(RuntimeKind::from_environment);
    let runtime = Runtime::of_kind(kind).await?;
    tracing::info!(runtime = ?runtime.kind(), "the processes serve starts run as {}", match runtime.kind() {
        RuntimeKind::Systemd => "systemd units",
        RuntimeKind::Process => "detached processes",
    });
    let heartbeat = Heartbeat::default();
    let status_client = server.client();
    let ctx = controller::Context::new(
        server.client(),
        controller::reporter(),
        runtime,
        working_dir.join(&config.state_dir),
        working_dir.join(&args.kine_binary),
        std::env::current_exe().context("cannot find this binary to run the front")?,
        controller_metrics,
        exits,
        heartbeat.clone(),
    );
    let readiness = server.clone();
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let (listening, api_listens) = tokio::sync::oneshot::channel();
    let api = apiserver::serve(&config, server, until_stopped(stopped.clone()), listening);
    let gitops = manifests.map(|dir| {
        tokio::spawn(gitops::run(
            gitops_client,
            dir,
            args.manifests_interval,
            args.manifests_prune,
            until_stopped(stopped.clone()),
        ))
    });
    let mut controller = args
        .controller
        .then(|| tokio::spawn(controller::run(ctx, woken, until_stopped(stopped))));
    let watched = controller.as_ref().map(|c| c.abort_handle());
    let controller_ended = async {
        match controller.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(api);
    tokio::select! {
        result = &mut api => return result,
        _ = api_listens => {}
    }
    let notifier = tokio::spawn(notify_systemd(status_client, heartbeat, watched));
    let failure = tokio::select! {
        result = &mut api => return result,
        _ = shutdown_signal() => None,
        ended = controller_ended => {
            // Nothing acts on spec changes any more: say so where a supervisor looks, and exit
            // non-zero so that it restarts serve.
            let reason = why_it_ended(ended);
            tracing::error!(%reason, "serve cannot go on; exiting");
            readiness.set_not_ready(reason.clone());
            controller = None;
            Some(reason)
        }
    };
    notifier.abort();
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    let _ = stop.send(true);
    api.await?;
    if let Some(controller) = controller {
        // Steps are short, so the controller ends within a second; a slow one (a snapshot) is cut
        // off so that serve honours SIGTERM within 5 s. The processes it runs are not touched.
        if tokio::time::timeout(SHUTDOWN_GRACE, controller).await.is_err() {
            tracing::warn!("the controller's last step did not finish within {SHUTDOWN_GRACE:?}; leaving it");
        }
    }
    if let Some(gitops) = gitops {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, gitops).await;
    }
    match failure {
        Some(reason) => anyhow::bail!("{reason}"),
        None => Ok(()),
    }
}

/// How long serve waits, after SIGTERM, for the controller's step in progress.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Why the controller's task ended, for `/readyz` and the exit status.
fn why_it_ended(ended: Result<(), tokio::task::JoinError>) -> String {
    match ended {
        Ok(()) => "the controller stopped".to_string(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            format!("the controller panicked: {message}")
        }
        Err(e) => format!("the controller ended: {e}"),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM can be handled");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down; slots, stores and fronts keep running");
}

/// How often serve tells systemd its status without a watchdog.
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// How long one look at the shards may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// `READY=1` (the API listens and the controller runs), then `STATUS=` when it changes and
/// `WATCHDOG=1` while the controller makes progress: every shard reconciled within the watchdog's
/// timeout, the controller task alive, the local API answering. Nothing without a notify socket.
async fn notify_systemd(client: kube::Client, heartbeat: Heartbeat, controller: Option<tokio::task::AbortHandle>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    let _ = sd_notify::notify(&[NotifyState::Ready]);
    let every = watchdog.map_or(STATUS_EVERY, |timeout| (timeout / 4).min(STATUS_EVERY));
    let api: kube::Api<KcpShard> = kube::Api::all(client);
    let mut last_status = String::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let listed = tokio::time::timeout(LIST_TIMEOUT, api.list(&Default::default())).await;
        let shards = match listed {
            Ok(Ok(list)) => list.items,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the shards for systemd's status");
                continue;
            }
            Err(_) => {
                tracing::warn!("the local API did not list the shards within {LIST_TIMEOUT:?}");
                continue;
            }
        };
        let status = status_line(&shards);
        if status != last_status {
            let _ = sd_notify::notify(&[NotifyState::Status(&status)]);
            last_status = status;
        }
        let Some(timeout) = watchdog else {
            continue;
        };
        let stale = match &controller {
            // --controller=false: the API answering is all there is to watch.
            None => Vec::new(),
            Some(task) if task.is_finished() => {
                tracing::error!("the controller has stopped; no longer pinging systemd's watchdog");
                continue;
            }
            Some(_) => {
                let names: Vec<String> = shards.iter().map(|s| s.name_any()).collect();
                heartbeat.stale(&names, timeout, Instant::now())
            }
        };
        if stale.is_empty() {
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        } else {
            tracing::error!(
                ?stale,
                ?timeout,
                "the controller has not reconciled these shards in time; no longer pinging systemd's watchdog"
            );
        }
    }
}

/// `dev: Ready, big: Progressing`, or that there is no shard.
fn status_line(shards: &[KcpShard]) -> String {
    if shards.is_empty() {
        return "no KcpShard".to_string();
    }
    shards
        .iter()
        .map(|s| {
            let phase = s
                .status
                .as_ref()
                .and_then(|st| st.phase)
                .map_or("Pending", |p| p.as_str());
            format!("{}: {phase}", s.name_any())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_controller_that_panics_makes_readyz_fail_with_the_panic() {
        let ended = tokio::spawn(async { panic!("index out of bounds") }).await;
        let reason = why_it_ended(ended);
        assert_eq!(reason, "the controller panicked: index out of bounds");
        let dir = tempfile::tempdir().unwrap();
        let server = ApiServer::open(dir.path()).unwrap();
        let readyz = || async {
            let request = crate::apiserver::handler::ApiRequest {
                method: http::Method::GET,
                path: "/readyz".into(),
                query: Default::default(),
                headers: Default::default(),
                body: Default::default(),
            };
            let response = crate::apiserver::handler::handle(&server, request).await;
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
        };
        assert_eq!(readyz().await, (200, "ok".to_string()));
        server.set_not_ready(reason);
        let (status, body) = readyz().await;
        assert_eq!(status, 503);
        assert!(
            body.contains("[-]controller failed: the controller panicked: index out of bounds"),
            "{body}"
        );
        assert_eq!(why_it_ended(tokio::spawn(async {}).await), "the controller stopped");
    }
}
