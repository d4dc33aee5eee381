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
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    front::run(FrontConfig {
        listen: args.listen,
        dir: args.dir,
        metrics_listen: args.metrics_listen,
        drain_timeout: args.drain_timeout,
        inherit_from: args.inherit_from,
    })
    .await?;
    Ok(())
}
