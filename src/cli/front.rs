//! `kcpshard front`: the TCP front as a process of its own (see `crate::front`). `serve` starts it
//! detached; people run it by hand only to debug. `kcpshard front caddy-config` prints the config
//! for the other front type, a caddy you run (see `cli::caddy_config`).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::duration::parse_duration;
use crate::front::{self, FrontConfig};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address clients dial; port 0 picks a free port (`status` names the real one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// The front's private directory (made 0700): control.sock, backend.json, front.pid.json.
    #[arg(long, required = true)]
    dir: Option<PathBuf>,
    /// Also serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// How long open connections may run on after SIGTERM or a handover, e.g. 30s or 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Take the listening socket over from the front answering on this control socket (upgrade).
    #[arg(long)]
    inherit_from: Option<PathBuf>,
    /// Take over the socket this process listens on at --listen, instead of binding it: the
    /// process keeps serving what it accepts, and once it closes the socket (it stops), every
    /// connection is the front's, none refused in between. Needs the right to ptrace it.
    #[arg(long, value_name = "PID", conflicts_with = "inherit_from")]
    take_listener_of: Option<u32>,
    /// Threads forwarding connections; 1 runs everything on one thread (no cross-thread wake-ups).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the caddy JSON config for a shard whose front is a caddy you run (spec.front.type Caddy).
    CaddyConfig(super::caddy_config::Args),
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let dir = match (args.command, args.dir) {
        (Some(Command::CaddyConfig(args)), _) => return super::caddy_config::run(args),
        (None, Some(dir)) => dir,
        (None, None) => anyhow::bail!("kcpshard front needs --dir"),
    };
    let config = FrontConfig {
        listen: args.listen,
        dir,
        metrics_listen: args.metrics_listen,
        drain_timeout: args.drain_timeout,
        inherit_from: args.inherit_from,
        take_listener_of: args.take_listener_of,
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
