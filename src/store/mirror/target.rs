//! The store a mirror writes into ([`MirrorTarget`]), readied by the job before it copies
//! ([`prepare`]): kine's table made, refused when it already holds kcp's keys, its revisions raised
//! above every revision the old store hands out during the move ([`raised_above`]); and the kines
//! of the job's own it writes and reads through ([`PrivateKine`]).
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::Client;

use crate::api::{StoreSpec, StoreType};
use crate::store::etcd::EtcdCluster;
use crate::store::etcd_keys::{self, KCP_PREFIX};
use crate::store::{PostgresServer, StoreError, kine, private};

/// How far above the old store's revision the new store's revisions start: room for the old
/// store's writes during the move (checked when the mirror ends), as many as it makes in
/// [`MOVE_ROOM`] at the rate it writes when the move begins (sampled over [`RATE_SAMPLE`]), and at
/// least [`MIN_RAISE_MARGIN`]. Not more: a kine store is raised in one write, but an etcd cluster
/// one write per revision, and a later move into one starts from this store's revision.
async fn raised_above(source: &Client) -> Result<i64, StoreError> {
    let before = etcd_keys::revision(source).await?;
    tokio::time::sleep(RATE_SAMPLE).await;
    let now = etcd_keys::revision(source).await?;
    let room = (now - before) * (MOVE_ROOM.as_millis() / RATE_SAMPLE.as_millis()) as i64;
    Ok(now + room.max(MIN_RAISE_MARGIN))
}

const MOVE_ROOM: Duration = Duration::from_secs(600);
const RATE_SAMPLE: Duration = Duration::from_secs(1);
const MIN_RAISE_MARGIN: i64 = 10_000;

/// How long a kine of the job's own may take to accept.
const PRIVATE_KINE_START: Duration = Duration::from_secs(60);

/// The store a mirror goes into.
#[derive(Debug)]
pub enum MirrorTarget {
    Kine(KineTarget),
    /// An etcd cluster kcpshard does not run.
    Etcd(EtcdCluster),
}

/// A kine store a mirror goes into, written through a kine of the job's own.
#[derive(Debug)]
pub enum KineTarget {
    /// A database on a PostgreSQL server (made if missing).
    Postgres(PostgresServer),
    /// The directory of the shard's store, where a KineSqlite `state.db` is (or is made).
    Sqlite(PathBuf),
}

impl MirrorTarget {
    /// The target `spec` names: a KinePostgres or Etcd store, or a KineSqlite one in `store_dir`.
    pub fn from_spec(spec: &StoreSpec, store_dir: Option<&Path>) -> Result<MirrorTarget, StoreError> {
        match (spec.type_, &spec.kine_postgres, &spec.etcd, store_dir) {
            (StoreType::KinePostgres, Some(settings), _, _) => Ok(MirrorTarget::Kine(KineTarget::Postgres(
                PostgresServer::from_spec(settings)?,
            ))),
            (StoreType::KineSqlite, _, _, Some(dir)) => Ok(MirrorTarget::Kine(KineTarget::Sqlite(dir.to_path_buf()))),
            (StoreType::Etcd, _, Some(etcd), _) => Ok(MirrorTarget::Etcd(EtcdCluster::from_spec(etcd))),
            _ => Err(StoreError::Invalid(format!(
                "a mirror goes into a KinePostgres or Etcd store, or a KineSqlite store given its directory; not {}",
                spec.describe()
            ))),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            MirrorTarget::Kine(KineTarget::Postgres(server)) => server.describe(),
            MirrorTarget::Kine(KineTarget::Sqlite(dir)) => dir.join(kine::DB_FILE).display().to_string(),
            MirrorTarget::Etcd(cluster) => format!("the etcd cluster at {}", cluster.endpoints.join(", ")),
        }
    }

    /// What to do with a target that holds keys.
    fn how_to_clear(&self) -> String {
        match self {
            MirrorTarget::Kine(KineTarget::Postgres(_)) => {
                "drop it (DROP DATABASE) or name another in spec.store".to_string()
            }
            MirrorTarget::Kine(KineTarget::Sqlite(dir)) => format!(
                "move {} (with its -wal and -shm files) aside",
                dir.join(kine::DB_FILE).display()
            ),
            MirrorTarget::Etcd(_) => {
                format!("delete them (etcdctl del --prefix {KCP_PREFIX}) or name another cluster in spec.store")
            }
        }
    }

    /// Refuses a target that holds kcp's keys, saying how to clear it.
    async fn refuse_held_keys(&self, client: &Client) -> Result<(), StoreError> {
        if !etcd_keys::holds_keys(client, KCP_PREFIX).await? {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "{} already holds keys under {KCP_PREFIX} (another shard's, an earlier store's, or an earlier move's copy that did not finish): {}",
            self.describe(),
            self.how_to_clear()
        )))
    }
}

impl KineTarget {
    /// The `--endpoint` of the job's own kine on it: never the one of the shard's kine on the
    /// same database, which kcpshard finds by that argument (store/kine.rs).
    fn endpoint(&self) -> String {
        match self {
            KineTarget::Postgres(server) => server.kine_endpoint("kcpshard-store-mirror"),
            // go-sqlite3 ignores a parameter it does not know.
            KineTarget::Sqlite(dir) => format!("{}&_kcpshard=store-mirror", kine::sqlite_endpoint(dir)),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            KineTarget::Postgres(server) => server.env(),
            KineTarget::Sqlite(_) => Vec::new(),
        }
    }

    async fn ready(&self) -> Result<(), StoreError> {
        match self {
            KineTarget::Postgres(server) => server.ensure_database().await.map(|_| ()),
            KineTarget::Sqlite(dir) => crate::fsutil::create_private_dir(dir).map_err(StoreError::io(dir)),
        }
    }

    async fn raise(&self, above: i64) -> Result<(), StoreError> {
        match self {
            KineTarget::Postgres(server) => server.raise_kine_revision(above).await,
            KineTarget::Sqlite(dir) => kine::raise_sqlite_revision(&dir.join(kine::DB_FILE), above).await,
        }
    }
}

/// The store a mirror writes into, readied by [`prepare`].
pub struct Readied {
    pub client: Client,
    /// Its revisions start above this one.
    pub raised_above: i64,
    /// The job's own kine the client writes through (a kine store), kept until the job ends.
    _kine: Option<PrivateKine>,
}

/// Readies the store `target` a move goes to, for a mirror from `source`: refused if it holds
/// kcp's keys, its revisions raised above the source's ([`raised_above`]). A kine store's table is
/// made by a kine of the job's own (a database is made if missing), then, with that kine stopped,
/// its revisions are raised, and the mirror writes through another kine of the job's own; an etcd
/// cluster is written directly, once its revision is raised ([`etcd_keys::raise_revision`]).
pub async fn prepare(target: &MirrorTarget, kine_binary: &Path, source: &Client) -> Result<Readied, StoreError> {
    let kine_target = match target {
        MirrorTarget::Etcd(cluster) => {
            let client = etcd_keys::connect(&cluster.endpoints, Some(cluster)).await?;
            target.refuse_held_keys(&client).await?;
            let raised_above = raised_above(source).await?;
            etcd_keys::raise_revision(&client, raised_above).await?;
            return Ok(Readied {
                client,
                raised_above,
                _kine: None,
            });
        }
        MirrorTarget::Kine(kine_target) => kine_target,
    };
    kine_target.ready().await?;
    let (endpoint, env) = (kine_target.endpoint(), kine_target.env());
    let schema_maker = PrivateKine::start(kine_binary, &endpoint, &env, TARGET_KINE).await?;
    target.refuse_held_keys(&schema_maker.client).await?;
    schema_maker.stop().await;
    let raised_above = raised_above(source).await?;
    kine_target.raise(raised_above).await?;
    let kine = PrivateKine::start(kine_binary, &endpoint, &env, TARGET_KINE).await?;
    Ok(Readied {
        client: kine.client.clone(),
        raised_above,
        _kine: Some(kine),
    })
}

/// A kine of the job's own on a KinePostgres store the data moves out of: the slots' own kines
/// stop with them during the switch, while the mirror reads on to the last change.
pub async fn source_kine(server: &PostgresServer, kine_binary: &Path) -> Result<PrivateKine, StoreError> {
    let endpoint = server.kine_endpoint("kcpshard-store-mirror-source");
    PrivateKine::start(kine_binary, &endpoint, &server.env(), SOURCE_KINE).await
}

/// The names of the job's kines' sockets and logs in its directory.
const TARGET_KINE: &str = "mirror-target-kine";
const SOURCE_KINE: &str = "mirror-source-kine";

/// A kine the job runs for itself, in the job's directory (its working directory: its socket and
/// log there): SIGKILLed with the job however the job ends (PR_SET_PDEATHSIG, and on drop). The
/// socket is named relative to that directory: a socket's path holds at most 107 bytes (unix(7)
/// `sun_path`), and a state dir's path can be longer.
pub struct PrivateKine {
    child: tokio::process::Child,
    pub client: Client,
}

impl PrivateKine {
    async fn start(
        binary: &Path,
        endpoint: &str,
        env: &[(String, String)],
        name: &str,
    ) -> Result<PrivateKine, StoreError> {
        let dir = Path::new(".");
        let socket = PathBuf::from(format!("{name}.sock"));
        crate::fsutil::remove_if_there(&socket).map_err(StoreError::io(&socket))?;
        let address = crate::store::kine_address::KineAddress::Unix(socket);
        let log = dir.join(format!("{name}.log"));
        let args = kine::kine_args(endpoint, &address);
        let mut child = private::spawn(binary, &args, env, dir, &log)?;
        let what = "the mirror's kine";
        let client = private::answering(what, &address.url(), &mut child, &log, PRIVATE_KINE_START).await?;
        Ok(PrivateKine { child, client })
    }

    /// SIGTERM, and SIGKILL if it has not exited within kine's stop grace.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(kine::STOP_GRACE, self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}
