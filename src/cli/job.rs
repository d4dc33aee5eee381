//! `kcpshard job`: long work that `serve` runs as a process of its own (a tracked job,
//! docs/architecture.md "Jobs") when no other program does it. Not for use by hand.
use std::path::PathBuf;

use clap::Subcommand;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    job: Job,
}

#[derive(Debug, Subcommand)]
enum Job {
    /// Copy a sqlite database that kine may be writing to, consistently (`VACUUM INTO`).
    SqliteCopy {
        /// The database to copy.
        #[arg(long)]
        from: PathBuf,
        /// The copy (replaced if it exists).
        #[arg(long)]
        into: PathBuf,
    },
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.job {
        Job::SqliteCopy { from, into } => Ok(crate::store::copy::vacuum_into(&from, &into).await?),
    }
}
