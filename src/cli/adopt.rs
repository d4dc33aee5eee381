//! `kcpshard adopt ROOT_DIR --name NAME --dry-run`: what taking over the kcp that serves from
//! ROOT_DIR would take (its key material, tokens, store and flags), and whether it can be taken
//! over (docs/operations.md, "Adopt a running kcp"). It reads; it writes nothing and signals no
//! process. Exits non-zero when the kcp cannot be adopted, with each reason and what to do.
use std::path::PathBuf;

use anyhow::bail;

use crate::adopt;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The root directory the kcp to adopt serves from (its --root-directory).
    root_dir: PathBuf,
    /// The name of the KcpShard that would run it.
    #[arg(long)]
    name: String,
    /// The kcp release the shard runs (spec.version); it must be the one running. Default: the one
    /// running.
    #[arg(long)]
    version: Option<String>,
    /// Report what an adoption would take and whether it can, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if !args.dry_run {
        bail!("this kcpshard reports what an adoption would take (--dry-run) but cannot take over a running kcp yet");
    }
    let found = adopt::inspect(&args.root_dir).await?;
    let version = args.version.unwrap_or_else(|| found.process.version.clone());
    let refusals = found.refusals(&version);
    println!("KcpShard {} (dry run)", args.name);
    print!("{}", adopt::report::render(&found, &version, &refusals));
    if !refusals.is_empty() {
        bail!("{} cannot be adopted: {}", args.root_dir.display(), refusals[0]);
    }
    Ok(())
}
