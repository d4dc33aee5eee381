//! `kcpshard front caddy-config`: prints the caddy JSON config kcpshard recommends for a shard whose
//! front is a caddy you run (`spec.front.type: Caddy`; see docs/how-to/fronts.md).
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::front::caddy::{self, CaddyConfig};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address clients dial, the same as spec.front.listen.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// caddy's admin endpoint (host:port), the same as spec.front.caddy.adminAddress.
    #[arg(long, default_value = caddy::DEFAULT_ADMIN_ADDRESS)]
    admin: String,
    /// The @id of the reverse_proxy handler, the same as spec.front.caddy.upstreamId.
    #[arg(long, default_value = caddy::DEFAULT_UPSTREAM_ID)]
    upstream_id: String,
    /// kcp's serving certificate: the shard's <state>/shards/<name>/shared/apiserver.crt.
    #[arg(long)]
    cert: PathBuf,
    /// kcp's serving key: the shard's <state>/shards/<name>/shared/apiserver.key.
    #[arg(long)]
    key: PathBuf,
    /// The CA that verifies the slots (default: --cert, which holds kcp's CA).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// A serving slot's address, if known (repeat for each); kcpshard sets the upstreams itself
    /// either way.
    #[arg(long)]
    upstream: Vec<SocketAddr>,
    /// caddy's storage directory (locks, and a local CA that is never installed).
    #[arg(long)]
    storage: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ca = args.ca.as_deref().unwrap_or(&args.cert);
    let config = CaddyConfig {
        listen: args.listen,
        admin_address: args.admin.clone(),
        upstream_id: args.upstream_id.clone(),
        cert_file: absolute(&args.cert)?,
        key_file: absolute(&args.key)?,
        ca_file: absolute(ca)?,
        upstreams: args.upstream,
        storage_dir: absolute(&args.storage)?,
    };
    let rendered = caddy::render_config(&config)?;
    println!("{}", serde_json::to_string_pretty(&rendered)?);
    Ok(())
}

/// caddy runs from another working directory (`/` under systemd): write absolute paths.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot make {} absolute", path.display()))
}
