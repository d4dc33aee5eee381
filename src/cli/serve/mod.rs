//! `kcpshard serve`: the controller and, by default, the API it reads, in one process. The
//! processes it starts (slots, stores, fronts) are processes of their own, or systemd units
//! (`--runtime`), and outlive it.
//!
//! Two ways to hold the KcpShards:
//! - its own local API (the default): served over HTTPS from files in the state dir, its
//!   kubeconfig written there; `/readyz` and `/metrics` are the API's.
//! - a shared API (`--kubeconfig`, `--context`): a Kubernetes cluster or a kcp workspace that
//!   holds the CRD (`kcpshard crd`) and manifests/rbac.yaml. No API is served; the controller
//!   writes status and events there, and `/readyz`, `/healthz` and `/metrics` are answered over
//!   plain HTTP on `--probe-listen`. It takes only the shards whose `spec.host` is its
//!   `--host-name`, and acts only while it holds its host's Lease (controller/host_lease.rs);
//!   until then it waits, and says so.
//!
//! Either way the processes and state files stay on this host, under `--state-dir`.
//!
//! Under systemd (`Type=notify`, manifests/systemd/kcpshard.service) it speaks the notify
//! protocol: `READY=1` once the API (or the probe listener) listens; `STATUS=` with each shard's
//! phase, or that it waits for its host's Lease; `WATCHDOG=1` while the controller makes progress
//! (its heartbeat, controller/heartbeat.rs), or while it waits; `STOPPING=1`.
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::ResourceExt;
use sd_notify::NotifyState;
use tokio::sync::watch;

use crate::api::KcpShard;
use crate::apiserver::metrics::ApiMetrics;
use crate::apiserver::{self, ApiServer, ServeConfig, StateLock};
use crate::controller::assignment::{self, ApiKind, Assignment};
use crate::controller::heartbeat::Heartbeat;
use crate::controller::host_lease::{self, HostLease};
use crate::process::{Runtime, RuntimeKind};
use crate::readiness::{self, Readiness};
use crate::{controller, gitops};

mod api;
mod notify;
mod shutdown;

use api::Api;
use notify::notify_systemd;
use shutdown::{SHUTDOWN_GRACE, end_task, shutdown_signal, why_it_ended};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the objects, the PKI, the kubeconfig this command writes, and each shard's
    /// slots, store and front. With --kubeconfig: the shards' slots, stores and fronts only.
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
    /// objects (see --manifests-prune). See docs/how-to/gitops.md.
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
    /// Reconcile the KcpShards of a shared API (a Kubernetes cluster, a kcp workspace) instead of
    /// serving a local one: this kubeconfig's current context (or --context). The CRD and
    /// manifests/rbac.yaml must be applied there first (docs/how-to/shared-api.md).
    #[arg(long, value_name = "FILE", conflicts_with = "api_listen")]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the context to use instead of the kubeconfig's current one.
    #[arg(long, requires = "kubeconfig")]
    context: Option<String>,
    /// The host this serve is: it runs the KcpShards whose spec.host is this name (and, from its
    /// local API, those that name no host). Default: the machine's host name, lowercased.
    #[arg(long, env = "KCPSHARD_HOST_NAME")]
    host_name: Option<String>,
    /// With --kubeconfig: the namespace of the hosts' Leases (Lease kcpshard-host-<host-name>).
    #[arg(long, default_value = host_lease::DEFAULT_NAMESPACE, requires = "kubeconfig")]
    lease_namespace: String,
    /// With --kubeconfig: how long the host's Lease holds without a renewal (`15s`): a serve
    /// waiting for it takes over at most this long after the holder was killed.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_lease_duration, requires = "kubeconfig")]
    lease_duration: Duration,
    /// With --kubeconfig: where /readyz, /healthz and /metrics are answered, over plain HTTP.
    #[arg(long, default_value = "127.0.0.1:6441", requires = "kubeconfig")]
    probe_listen: SocketAddr,
}

fn parse_lease_duration(text: &str) -> Result<Duration, String> {
    let duration = crate::api::parse_duration(text).map_err(|e| e.to_string())?;
    if duration < Duration::from_secs(3) || duration.subsec_nanos() != 0 {
        return Err(format!(
            "{text}: a Lease lasts whole seconds, at least 3s (it is renewed a third of it before it expires)"
        ));
    }
    Ok(duration)
}

/// Flags that parse but make no sense together: what to do instead.
fn refused(args: &Args) -> Option<&'static str> {
    args.kubeconfig.as_ref()?;
    if !args.controller {
        return Some(
            "--controller=false serves the local API alone, and with --kubeconfig there is none: drop one of them (read a shared API with kubectl)",
        );
    }
    if args.manifests_prune {
        return Some(
            "--manifests-prune cannot be used with --kubeconfig: on a shared API other hosts' serves apply KcpShards as kcpshard-gitops too, and this serve would delete theirs. Drop --manifests-prune (delete removed shards by hand), or prune with your GitOps tool",
        );
    }
    None
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // What serve and the processes it starts (kine, fronts, kcp) create is private to this user,
    // not only the files kcpshard writes itself: kine's sqlite database holds kcp's Secrets.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    if let Some(refusal) = refused(&args) {
        anyhow::bail!("{refusal}");
    }
    let host = match &args.host_name {
        Some(name) => name.clone(),
        None => assignment::machine_host_name().context("cannot read this machine's host name: pass --host-name")?,
    };
    if let Err(unfit) = assignment::check_host_name(&host) {
        // A local API's shards that name no host run whatever this machine is called.
        if args.host_name.is_some() || args.kubeconfig.is_some() {
            anyhow::bail!("{unfit}");
        }
        tracing::warn!("{unfit}; until then this serve runs only the shards that name no host");
    }
    let working_dir = std::env::current_dir().context("cannot read the working directory")?;
    let manifests = args.manifests.as_ref().map(|dir| working_dir.join(dir));
    if let Some(dir) = &manifests {
        gitops::check_dir(dir)?;
    }
    // One serve per state dir. On a shared API a serve of the same host may wait for the host's
    // Lease on the same dir (a standby): it takes the lock once it holds the Lease.
    let mut state_lock = match args.kubeconfig {
        None => Some(StateLock::acquire(&args.state_dir)?),
        Some(_) => None,
    };
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let api = match &args.kubeconfig {
        None => Api::local(&args, until_stopped(stopped.clone()))?,
        Some(kubeconfig) => Api::shared(&args, &working_dir.join(kubeconfig), until_stopped(stopped.clone())).await?,
    };
    let Api {
        client,
        readiness,
        metrics,
        serving: mut api,
        listening: api_listens,
        kind: api_kind,
    } = api;
    let assignment = Arc::new(Assignment::new(host.clone(), api_kind));
    tracing::info!(
        "this serve runs the KcpShards of host {host}{}",
        match api_kind {
            ApiKind::Local => " and those that name no host",
            ApiKind::Shared => " (spec.host)",
        }
    );
    let controller_metrics = controller::metrics::ControllerMetrics::default();
    controller_metrics.register_in(&metrics);
    let (exits, woken) = crate::process::exits::ExitNotices::new();
    let kind = args.runtime.unwrap_or_else(RuntimeKind::from_environment);
    let runtime = Runtime::of_kind(kind).await?;
    tracing::info!(runtime = ?runtime.kind(), "the processes serve starts run as {}", match runtime.kind() {
        RuntimeKind::Systemd => "systemd units",
        RuntimeKind::Process => "detached processes",
    });
    let heartbeat = Heartbeat::default();
    let ctx = controller::Context::new(
        client.clone(),
        controller::reporter(&host),
        runtime,
        working_dir.join(&args.state_dir),
        working_dir.join(&args.kine_binary),
        std::env::current_exe().context("cannot find this binary to run the front")?,
        controller_metrics,
        exits,
        heartbeat.clone(),
        assignment.clone(),
    );
    // On a shared API nothing acts before this serve holds its host's Lease.
    let mut lease = match api_kind {
        ApiKind::Local => None,
        ApiKind::Shared => {
            Some(HostLease::start(client.clone(), &args.lease_namespace, &host, args.lease_duration).await?)
        }
    };
    let (acting, may_act) = watch::channel(lease.is_none());
    let once_acting = |mut may_act: watch::Receiver<bool>, stopped: watch::Receiver<bool>| async move {
        tokio::select! {
            acting = may_act.wait_for(|acting| *acting) => acting.is_ok(),
            _ = until_stopped(stopped) => false,
        }
    };
    let gitops = manifests.map(|dir| {
        let gate = once_acting(may_act.clone(), stopped.clone());
        let (client, host, shutdown) = (client.clone(), host.clone(), until_stopped(stopped.clone()));
        let (interval, prune) = (args.manifests_interval, args.manifests_prune);
        tokio::spawn(async move {
            if gate.await {
                gitops::run(client, host, dir, interval, prune, shutdown).await;
            }
        })
    });
    let mut controller = args.controller.then(|| {
        let gate = once_acting(may_act.clone(), stopped.clone());
        let shutdown = until_stopped(stopped.clone());
        tokio::spawn(async move {
            if gate.await {
                controller::run(ctx, woken, shutdown).await;
            }
        })
    });
    let watched = controller.as_ref().map(|c| c.abort_handle());
    tokio::select! {
        result = &mut api => return result,
        _ = api_listens => {}
    }
    let notifier = tokio::spawn(notify_systemd(
        client,
        heartbeat,
        watched,
        assignment,
        readiness.clone(),
    ));
    let failure = {
        let controller_ended = async {
            match controller.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        // Resolves only when this serve cannot hold its host's Lease: then it must not act.
        let hold = async {
            let Some(lease) = lease.as_mut() else {
                return std::future::pending().await;
            };
            if let Err(e) = lease.acquired(&readiness).await {
                return e.to_string();
            }
            readiness.fail(
                "state-dir",
                format!(
                    "waiting for the lock of {}: the serve that held the Lease before may still run",
                    args.state_dir.display()
                ),
            );
            match StateLock::wait(&args.state_dir).await {
                Ok(lock) => state_lock = Some(lock),
                Err(e) => return format!("{e:#}"),
            }
            readiness.pass("state-dir");
            if !lease.holds() {
                return lease.lost_it().await.to_string();
            }
            let _ = acting.send(true);
            lease.lost_it().await.to_string()
        };
        tokio::select! {
            result = &mut api => return result,
            _ = shutdown_signal() => None,
            reason = hold => {
                tracing::error!(%reason, "serve cannot go on; exiting");
                readiness.fail(host_lease::READINESS_CHECK, reason.clone());
                Some((reason, false))
            }
            ended = controller_ended => {
                // Nothing acts on spec changes any more: say so where a supervisor looks, and exit
                // non-zero so that it restarts serve.
                let reason = why_it_ended(ended);
                tracing::error!(%reason, "serve cannot go on; exiting");
                readiness.fail("controller", reason.clone());
                Some((reason, true))
            }
        }
    };
    if matches!(failure, Some((_, true))) {
        controller = None;
    }
    notifier.abort();
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    let _ = stop.send(true);
    api.await?;
    if let Some(controller) = controller {
        // Steps are short, so the controller ends within a second; a slow one is cut off so that
        // serve honours SIGTERM within 5 s. The processes it runs are not touched.
        end_task(controller, SHUTDOWN_GRACE, "the controller's last step").await;
    }
    if let Some(gitops) = gitops {
        end_task(gitops, SHUTDOWN_GRACE, "the manifests' sync").await;
    }
    // Only now that nothing acts any more may another serve of this host take over.
    tracing::info!("nothing of the controller runs any more: letting go of the state dir");
    drop(state_lock);
    if let Some(lease) = lease {
        lease.release().await;
    }
    match failure {
        Some((reason, _)) => anyhow::bail!("{reason}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, String> {
        let argv = std::iter::once("serve").chain(flags.iter().copied());
        Command::try_parse_from(argv).map(|c| c.args).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_that_make_no_sense_with_a_shared_api_are_refused_with_what_to_do() {
        let shared = parse(&["--kubeconfig", "kc", "--host-name", "alpha"]).unwrap();
        assert_eq!(refused(&shared), None);
        assert_eq!(shared.lease_namespace, "kcpshard-system");
        assert_eq!(shared.lease_duration, Duration::from_secs(15));
        let no_controller = parse(&["--kubeconfig", "kc", "--controller=false"]).unwrap();
        assert!(refused(&no_controller).unwrap().contains("drop one of them"));
        let prune = parse(&["--kubeconfig", "kc", "--manifests", "m", "--manifests-prune"]).unwrap();
        assert!(refused(&prune).unwrap().contains("Drop --manifests-prune"));
        assert_eq!(
            refused(&parse(&["--manifests", "m", "--manifests-prune"]).unwrap()),
            None
        );
        for (flags, said) in [
            (
                &["--kubeconfig", "kc", "--api-listen", "127.0.0.1:0"][..],
                "cannot be used with",
            ),
            (&["--context", "c"][..], "--kubeconfig"),
            (&["--lease-namespace", "x"][..], "--kubeconfig"),
            (&["--probe-listen", "127.0.0.1:0"][..], "--kubeconfig"),
            (&["--kubeconfig", "kc", "--lease-duration", "2s"][..], "at least 3s"),
        ] {
            let error = parse(flags).map(|_| ()).unwrap_err();
            assert!(error.contains(said), "{flags:?}: {error}");
        }
    }

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
        server.readiness.fail("controller", reason);
        let (status, body) = readyz().await;
        assert_eq!(status, 503);
        assert!(
            body.contains("[-]controller failed: the controller panicked: index out of bounds"),
            "{body}"
        );
        assert_eq!(why_it_ended(tokio::spawn(async {}).await), "the controller stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_outlives_the_grace_is_gone_when_serve_lets_go_of_the_state_dir() {
        struct Step(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Step {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let step = Step(ended.clone());
        let started = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            let _step = step;
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        });
        end_task(task, SHUTDOWN_GRACE, "a long step").await;
        assert!(ended.load(std::sync::atomic::Ordering::SeqCst), "the step still runs");
        assert_eq!(started.elapsed(), SHUTDOWN_GRACE);
        // A task that ends within the grace is waited for, not cut off.
        let task = tokio::spawn(tokio::time::sleep(std::time::Duration::from_secs(1)));
        end_task(task, SHUTDOWN_GRACE, "a short step").await;
        assert_eq!(started.elapsed(), SHUTDOWN_GRACE + std::time::Duration::from_secs(1));
    }
}
