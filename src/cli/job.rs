//! `kcpshard job`: long work that `serve` runs as a process of its own (a tracked job,
//! docs/architecture.md "Jobs") when no other program does it. Not for use by hand.
use std::path::{Path, PathBuf};

use clap::Subcommand;

use crate::store::{EtcdCluster, EtcdTls};
use crate::store::{etcd_keys, etcd_snapshot, mirror};

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
    /// Mirror the keys kcp keeps from one store into another (which must hold none), through
    /// etcd's API (a kine's too): a copy at one revision, then every later change, until every
    /// change up to the revision written into the file `--until` is applied.
    StoreMirror {
        /// Where how far the mirror is gets written (JSON, replaced as it goes).
        #[arg(long)]
        progress: PathBuf,
        /// The file `serve` writes the source's last revision into, once nothing writes to it.
        #[arg(long)]
        until: PathBuf,
        #[command(flatten)]
        ends: MirrorEnds,
    },
}

/// The two stores of a mirror, each an etcd cluster's client URLs (with its TLS files) or a
/// kine's address.
#[derive(Debug, clap::Args)]
struct MirrorEnds {
    /// The store mirrored from (once per member).
    #[arg(long = "from", required = true)]
    from: Vec<String>,
    #[arg(long)]
    from_cacert: Option<PathBuf>,
    #[arg(long)]
    from_cert: Option<PathBuf>,
    #[arg(long)]
    from_key: Option<PathBuf>,
    /// The store mirrored into (once per member).
    #[arg(long = "to", required = true)]
    to: Vec<String>,
    #[arg(long)]
    to_cacert: Option<PathBuf>,
    #[arg(long)]
    to_cert: Option<PathBuf>,
    #[arg(long)]
    to_key: Option<PathBuf>,
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
        cluster(self.endpoints, self.cacert, self.cert, self.key)
    }
}

fn cluster(
    endpoints: Vec<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> EtcdCluster {
    EtcdCluster {
        endpoints,
        tls: EtcdTls {
            ca_file,
            cert_file,
            key_file,
        },
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
        Job::StoreMirror { progress, until, ends } => {
            let from = cluster(ends.from, ends.from_cacert, ends.from_cert, ends.from_key);
            let to = cluster(ends.to, ends.to_cacert, ends.to_cert, ends.to_key);
            let source = etcd_keys::connect(&from.endpoints, Some(&from)).await?;
            let target = etcd_keys::connect(&to.endpoints, Some(&to)).await?;
            let done = mirror::run(&source, &target, &progress, &until).await?;
            println!(
                "mirrored {} keys at revision {} and {} changes after it, up to revision {}",
                done.copied_keys,
                done.copy_revision.unwrap_or_default(),
                done.applied_changes,
                done.applied_revision
            );
            Ok(())
        }
    }
}
