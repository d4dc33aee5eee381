//! The `kcpshard` command: `serve` runs the API, `crd` prints the CRD, and the rest are thin
//! kubectl-like clients of that API (for machines without kubectl) that follow kubectl's output
//! conventions, so that what a user learns from one carries over to the other.
//!
//! Each subcommand lives in its own file; [`connect`] finds the API from a kubeconfig and turns
//! transport and server errors into messages that say what to do.
mod adopt;
mod apply;
mod caddy_config;
mod connect;
mod crd;
mod credentials;
mod delete;
mod describe;
mod events;
mod follow;
mod front;
mod get;
mod job;
mod rollout;
mod serve;
mod snapshot;
mod table;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Runs kcp shards as blue/green slots behind a front, driven by KcpShard objects.
#[derive(Debug, Parser)]
#[command(name = "kcpshard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the KcpShard API over HTTPS from files in the state dir, and write its kubeconfig;
    /// or reconcile the KcpShards of a shared API (--kubeconfig). Runs the controller either way.
    Serve(Box<serve::Args>),
    /// Print the KcpShard CustomResourceDefinition (the same bytes as crds/kcpshards.kcpshard.io.yaml),
    /// or with --reference its field reference (docs/reference.md).
    Crd(crd::Args),
    /// Create or update KcpShard objects from YAML or JSON files, like `kubectl apply -f`.
    Apply(apply::Args),
    /// List KcpShards, or show one, like `kubectl get kcpshards`.
    Get(get::Args),
    /// Show a KcpShard in detail, with its conditions and events, like `kubectl describe`.
    Describe(describe::Args),
    /// Delete a KcpShard and wait until it is gone, like `kubectl delete`.
    Delete(delete::Args),
    /// List events, like `kubectl events`.
    Events(events::Args),
    /// Follow a roll to its end, like `kubectl rollout status`.
    Rollout(rollout::Args),
    /// List a shard's store snapshots, or restore one (a planned outage), following it to its end.
    Snapshot(snapshot::Args),
    /// Rotate a shard's admin identity (the kubeconfig through the front), and follow it to its end.
    Credentials(credentials::Args),
    /// Run the TCP front (started and adopted by `serve`; see docs/front.md), or print a caddy front's config.
    Front(Box<front::Args>),
    /// Report what taking over a kcp that runs now, from its root directory, would take (--dry-run).
    Adopt(adopt::Args),
    /// Run one of serve's jobs (serve starts them; not for use by hand).
    #[command(hide = true)]
    Job(job::Args),
}

/// The command line as clap describes it: its flags, their defaults and help (docs/cli-reference.md
/// is generated from it).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(matches!(cli.command, Command::Serve(_) | Command::Front(_)));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", crate::errors::chain(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve::run(*args).await,
        Command::Crd(args) => crd::run(args),
        Command::Apply(args) => apply::run(args).await,
        Command::Get(args) => get::run(args).await,
        Command::Describe(args) => describe::run(args).await,
        Command::Delete(args) => delete::run(args).await,
        Command::Events(args) => events::run(args).await,
        Command::Rollout(args) => rollout::run(args).await,
        Command::Credentials(args) => credentials::run(args).await,
        Command::Snapshot(args) => snapshot::run(args).await,
        Command::Front(args) => front::run(*args).await,
        Command::Adopt(args) => adopt::run(args).await,
        Command::Job(args) => job::run(args).await,
    }
}

/// Logs go to stderr so that stdout stays parseable (`get -o json`, `crd > file`). `serve` logs at
/// info by default; the clients stay quiet unless something is wrong. `RUST_LOG` overrides both.
fn init_tracing(serving: bool) {
    // kube-client logs every 5xx of the clients built from a kubeconfig as an error; kcp answers
    // /readyz with 500 while a slot starts, which the controller polls on purpose.
    let default = if serving {
        "info,kube_client::client::builder=off"
    } else {
        "warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: serve's log is mostly a file or the journal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}
