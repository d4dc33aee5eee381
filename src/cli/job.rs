//! `kcpshard job`: long work that `serve` runs as a process of its own (a tracked job,
//! docs/architecture.md "Jobs") when no other program does it. Not for use by hand.
use std::path::{Path, PathBuf};

use clap::Subcommand;

use crate::store::etcd_snapshot;
use crate::store::{EtcdCluster, EtcdTls};

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
    /// Take an etcd snapshot of one member of an etcd cluster (the first that answers).
    EtcdSnapshot {
        /// The snapshot file (replaced if it exists).
        #[arg(long)]
        into: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Put the keys kcp keeps in an etcd cluster back as an etcd snapshot holds them.
    EtcdRestore {
        /// The snapshot file.
        #[arg(long)]
        from: PathBuf,
        /// etcdutl, which opens the snapshot.
        #[arg(long)]
        etcdutl_binary: PathBuf,
        /// etcd, which serves the opened snapshot to the restore.
        #[arg(long)]
        etcd_binary: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
}

/// An etcd cluster, as spec.store.etcd says it.
#[derive(Debug, clap::Args)]
struct EtcdArgs {
    /// A member's client URL (once per member).
    #[arg(long = "endpoint", required = true)]
    endpoints: Vec<String>,
    /// The CA bundle that verifies the members' certificates.
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// The client certificate.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long)]
    key: Option<PathBuf>,
}

impl EtcdArgs {
    fn cluster(self) -> EtcdCluster {
        EtcdCluster {
            endpoints: self.endpoints,
            tls: EtcdTls {
                ca_file: self.cacert,
                cert_file: self.cert,
                key_file: self.key,
            },
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.job {
        Job::SqliteCopy { from, into } => Ok(crate::store::copy::vacuum_into(&from, &into).await?),
        Job::EtcdSnapshot { into, etcd } => {
            let bytes = etcd_snapshot::save(&etcd.cluster(), &into).await?;
            println!("wrote an etcd snapshot of {bytes} bytes into {}", into.display());
            Ok(())
        }
        Job::EtcdRestore {
            from,
            etcdutl_binary,
            etcd_binary,
            etcd,
        } => {
            let scratch = Path::new(etcd_snapshot::RESTORE_SCRATCH);
            let tools = etcd_snapshot::EtcdTools {
                etcdutl: etcdutl_binary,
                etcd: etcd_binary,
            };
            let keys = etcd_snapshot::restore(&from, &etcd.cluster(), scratch, &tools).await?;
            println!("restored {keys} keys from {}", from.display());
            Ok(())
        }
    }
}
