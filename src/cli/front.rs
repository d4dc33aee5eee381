//! `kcpshard front`: the TCP front as a process of its own (see `crate::front`). `serve` starts it
//! detached; people run it by hand only to debug.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::duration::parse_duration;
use crate::front::{self, FrontConfig};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address clients dial; port 0 picks a free port (`status` names the real one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// The front's private directory (made 0700): control.sock, backend.json, front.pid.json.
    #[arg(long)]
    dir: PathBuf,
    /// Also serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// How long open connections may run on after SIGTERM or a handover, e.g. 30s or 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Take the listening socket over from the front answering on this control socket (upgrade).
    #[arg(long)]
    inherit_from: Option<PathBuf>,
    /// Threads forwarding connections; 1 runs everything on one thread (no cross-thread wake-ups).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = FrontConfig {
        listen: args.listen,
        dir: args.dir,
        metrics_listen: args.metrics_listen,
        drain_timeout: args.drain_timeout,
        inherit_from: args.inherit_from,
    };
    // The front gets a runtime of its own, sized by --threads; the command's runtime just waits.
    let threads = args.threads.max(1);
    let forwarding = std::thread::Builder::new()
        .name("front".into())
        .spawn(move || -> anyhow::Result<()> {
            let runtime = if threads == 1 {
                tokio::runtime::Builder::new_current_thread().enable_all().build()?
            } else {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .enable_all()
                    .build()?
            };
            runtime.block_on(front::run(config))?;
            Ok(())
        })?;
    tokio::task::spawn_blocking(move || forwarding.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the front's thread panicked"))?
}
