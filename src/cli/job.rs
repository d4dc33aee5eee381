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
    /// Mirror the keys kcp keeps from one store into a kine store it readies (kine's table made,
    /// the revisions raised above the first store's): a copy at one revision, then every later
    /// change, until the file `--until` exists and every change up to the first store's revision
    /// at that moment is applied.
    StoreMirror {
        /// Where how far the mirror is gets written (JSON, replaced as it goes).
        #[arg(long)]
        progress: PathBuf,
        /// The file `serve` makes once the first store takes no more writes.
        #[arg(long)]
        until: PathBuf,
        /// The store mirrored into: its spec.store (JSON), of type KinePostgres or KineSqlite. A
        /// password is read as that spec says (a file, or a variable `serve` passes on).
        #[arg(long)]
        to_store: String,
        /// The shard's store directory, where a KineSqlite store mirrored into keeps state.db.
        #[arg(long)]
        to_store_dir: Option<PathBuf>,
        /// The kine the job runs on the store mirrored into (and on a KinePostgres one mirrored
        /// from).
        #[arg(long)]
        kine_binary: PathBuf,
        #[command(flatten)]
        from: MirrorSource,
    },
}

/// The store mirrored from: an etcd cluster's client URLs (with its TLS files), a kine's address,
/// or a KinePostgres store (its spec.store as JSON), which the job runs a kine of its own on.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = true)]
struct MirrorSource {
    /// Once per member.
    #[arg(long = "from-endpoint", conflicts_with = "from_store")]
    from: Vec<String>,
    #[arg(long)]
    from_store: Option<String>,
    #[arg(long)]
    from_cacert: Option<PathBuf>,
    #[arg(long)]
    from_cert: Option<PathBuf>,
    #[arg(long)]
    from_key: Option<PathBuf>,
    /// The source is a kcp's embedded etcd, whose data is in this directory: once the until file
    /// exists (kcp has exited, its etcd with it), the last changes are read from a copy of it.
    #[arg(long, requires = "etcd_binary", conflicts_with = "from_store")]
    from_data_dir: Option<PathBuf>,
    /// The etcd that opens that copy.
    #[arg(long)]
    etcd_binary: Option<PathBuf>,
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
        Job::StoreMirror {
            progress,
            until,
            to_store,
            to_store_dir,
            kine_binary,
            from,
        } => {
            let MirrorSource {
                from,
                from_store,
                from_cacert,
                from_cert,
                from_key,
                from_data_dir,
                etcd_binary,
            } = from;
            // Kept until the job ends: the source's kine, when the job runs one.
            let (source, _source_kine) = match from_store {
                Some(spec) => {
                    let spec: crate::api::StoreSpec = serde_json::from_str(&spec)?;
                    let Some(settings) = spec.kine_postgres.as_ref() else {
                        anyhow::bail!("--from-store names a KinePostgres store, not {}", spec.describe());
                    };
                    let server = crate::store::PostgresServer::from_spec(settings)?;
                    let kine = mirror::source_kine(&server, &kine_binary).await?;
                    (kine.client.clone(), Some(kine))
                }
                None => {
                    let from = cluster(from, from_cacert, from_cert, from_key);
                    (etcd_keys::connect(&from.endpoints, Some(&from)).await?, None)
                }
            };
            let to: crate::api::StoreSpec = serde_json::from_str(&to_store)?;
            let target = mirror::MirrorTarget::from_spec(&to, to_store_dir.as_deref())?;
            let readied = mirror::prepare(&target, &kine_binary, &source).await?;
            let raised = readied.raised_above;
            let after_exit = from_data_dir
                .zip(etcd_binary)
                .map(|(data_dir, etcd)| mirror::AfterExit {
                    data_dir,
                    etcd,
                    scratch: PathBuf::from(mirror::COPY_SCRATCH),
                });
            let done = mirror::run(
                &source,
                &readied.client,
                &progress,
                &until,
                Some(raised),
                after_exit.as_ref(),
            )
            .await?;
            println!(
                "mirrored {} keys at revision {} and {} changes after it, up to revision {}, into {} (revisions above {raised})",
                done.copied_keys,
                done.copy_revision.unwrap_or_default(),
                done.applied_changes,
                done.applied_revision,
                target.describe()
            );
            Ok(())
        }
    }
}
