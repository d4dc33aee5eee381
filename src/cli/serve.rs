//! `kcpshard serve`: runs the API server (and, in later issues, the controller and the fronts).
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::apiserver::{self, ServeConfig};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the objects, the PKI and the kubeconfig this command writes.
    #[arg(long, env = "KCPSHARD_STATE_DIR", default_value = ".kcpshard")]
    state_dir: PathBuf,
    /// Address of the HTTPS API; port 0 picks a free port (the kubeconfig names the real one).
    #[arg(long, default_value = "127.0.0.1:6440")]
    api_listen: SocketAddr,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    apiserver::run(ServeConfig {
        state_dir: args.state_dir,
        api_listen: args.api_listen,
    })
    .await
}
