//! The `KcpShard` resource (`kcpshard.io/v1alpha1`, cluster-scoped): the spec a user writes (which kcp
//! release, where its data lives, where clients dial it, how a roll may proceed) and the status the
//! controller reports (the slots it runs, the front's backend, the last roll's timings, conditions).
//!
//! Every field carries a doc comment: it becomes the field's `description` in the CRD, which is what
//! `kubectl explain ks.spec.store` prints. Defaults live here too (`#[serde(default)]`), so the
//! schema carries them and the API server fills them in as a real kube-apiserver would.
//!
//! Longer than 600 lines on purpose: these types are the CRD's schema and their doc comments its
//! field descriptions; split across files, one resource's schema would be read in pieces.
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::duration::{DURATION_PATTERN, DurationError, parse_duration};
use super::status::KcpShardStatus;

/// API group of the KcpShard resource.
pub const GROUP: &str = "kcpshard.io";
/// API version of the KcpShard resource.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in objects.
pub const API_VERSION: &str = "kcpshard.io/v1alpha1";
/// Kind of the KcpShard resource.
pub const KIND: &str = "KcpShard";
/// Plural resource name (the URL segment).
pub const PLURAL: &str = "kcpshards";
/// Singular resource name.
pub const SINGULAR: &str = "kcpshard";
/// Short name, as in `kubectl get ks`.
pub const SHORT_NAME: &str = "ks";
/// Setting this annotation to a new value (a timestamp, by convention) asks for a roll to a fresh
/// slot with the same version, like `kubectl rollout restart`.
pub const RESTARTED_AT_ANNOTATION: &str = "kcpshard.io/restartedAt";
/// Setting this annotation to a new value (a timestamp, by convention; `kcpshard credentials
/// rotate` sets it) asks for a new admin identity: the shard rolls so that every slot accepts the
/// new one beside the old, then again so that they refuse the old one.
pub const ROTATE_CREDENTIALS_ANNOTATION: &str = "kcpshard.io/rotateCredentialsAt";
/// Setting this annotation to a new value (a timestamp, by convention; `kcpshard snapshot create`
/// sets it) asks for a snapshot of the store now, taken while it serves (KinePostgres,
/// KineSqlite). status.lastSnapshot names the request it was taken for.
pub const SNAPSHOT_REQUEST_ANNOTATION: &str = "kcpshard.io/snapshotRequestedAt";
/// Setting this annotation asks for a restore of a store snapshot (KinePostgres, KineSqlite): its value is a
/// snapshot's file name in the shard's snapshots directory, or a path. A planned outage: every
/// slot stops, the snapshot is restored, and slots of the version that served the data in it
/// start. The controller removes the annotation once it has taken the request up (or refused it),
/// and reports in status.lastRestore; `kcpshard snapshot restore` sets it and follows.
pub const RESTORE_SNAPSHOT_ANNOTATION: &str = "kcpshard.io/restoreSnapshot";
/// The finalizer the controller puts on every KcpShard so it can stop slots and fronts on delete.
pub const FINALIZER: &str = "kcpshard.io/cleanup";

/// The pattern `spec.version` must match: a kcp release tag.
pub const VERSION_PATTERN: &str = r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$";
/// The pattern `spec.host` must match: a lowercase DNS name (it names a Lease, `kcpshard-host-<host>`).
pub const HOST_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";
/// The longest `spec.host`: a Lease's name is at most 253 characters, with its prefix.
pub const HOST_MAX_LENGTH: u32 = 200;
/// The pattern `spec.front.listen` must match: `host:port`, an IPv6 host in brackets.
pub const LISTEN_PATTERN: &str = r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.-]+):\d{1,5}$";

/// The desired state of one kcp shard: which kcp release serves it, where its data lives, where
/// clients dial it, and how a roll from one slot to the next may proceed.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kcpshard.io",
    version = "v1alpha1",
    kind = "KcpShard",
    plural = "kcpshards",
    singular = "kcpshard",
    shortname = "ks",
    status = "KcpShardStatus",
    derive = "PartialEq",
    doc = "A kcp shard run as blue/green slots behind a front, on a shared store. Changing spec.version (or the kcpshard.io/restartedAt annotation) rolls the shard to a new slot without a failed request.",
    printcolumn = r#"{"name": "Role", "type": "string", "jsonPath": ".spec.shard.name", "description": "In a sharded kcp: root, or the shard's name (spec.shard.name). Empty for a kcp of one shard."}"#,
    printcolumn = r#"{"name": "Version", "type": "string", "jsonPath": ".status.version", "description": "The kcp release the slots behind the front run."}"#,
    printcolumn = r#"{"name": "Desired", "type": "string", "priority": 1, "jsonPath": ".spec.version", "description": "The kcp release the shard should run (spec.version)."}"#,
    printcolumn = r#"{"name": "Active", "type": "string", "jsonPath": ".status.activeSlot", "description": "The slot the front forwards to."}"#,
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the shard is in its life cycle."}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Whether the shard serves through its front."}"#,
    printcolumn = r#"{"name": "Host", "type": "string", "jsonPath": ".spec.host", "description": "The host whose kcpshard serve runs the shard (spec.host); empty: the host of the local API."}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KcpShardSpec {
    /// The kcp release tag the shard runs, e.g. v0.31.2. Changing it rolls the shard to a new slot
    /// running that release (see rollout for which changes are allowed).
    #[schemars(pattern(VERSION_PATTERN))]
    pub version: String,
    /// How each slot's kcp process is started.
    #[serde(default)]
    pub kcp: KcpSettings,
    /// Where the shard's data lives. Every slot of the shard uses the same store.
    pub store: StoreSpec,
    /// The address clients dial; it forwards each connection to one of the serving slots.
    #[serde(default)]
    pub front: FrontSpec,
    /// How a roll to a new slot proceeds and which version changes it may make.
    #[serde(default)]
    pub rollout: RolloutSpec,
    /// How many slots serve behind the front at once (1 to 3). Every slot runs with leader
    /// election, so one leads kcp's controllers and every one serves requests; the front spreads
    /// new connections over them. With 2 or more, a slot that crashes or hangs leaves the front
    /// while the others serve on. A roll runs one slot more while it replaces them one by one.
    #[serde(default = "default_slots")]
    #[schemars(range(min = 1, max = 3))]
    pub slots: u32,
    /// The host that runs the shard: the `kcpshard serve` whose --host-name (default: the
    /// machine's host name) is this value starts its slots, store and front. Unset: the host whose
    /// own local API holds the object; a serve against a shared API (--kubeconfig) takes only the
    /// shards that name its host. Changing it does not move a running shard: delete the shard and
    /// create it again with the new host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(HOST_PATTERN), length(min = 1, max = HOST_MAX_LENGTH))]
    pub host: Option<String>,
    /// This shard's place in a sharded kcp: a root shard and more shards behind kcp-front-proxy.
    /// Unset: a kcp of one shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardSpec>,
    /// Snapshots of the store taken while it serves, on a schedule (besides those taken before
    /// each version change, spec.rollout, and on request, `kcpshard snapshot create`).
    #[serde(default)]
    pub backup: BackupSpec,
    /// A kcp that runs now on this host, outside kcpshard, for the shard to take over
    /// (docs/how-to/adopt.md, "Adopt a running kcp"): its key material and tokens become the
    /// shard's, its data moves into spec.store while it serves, and at the switch it is stopped and
    /// the shard's slots serve in its place. Its root directory is only read. Only on a new shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptSpec>,
}

/// The kcp a new shard takes over.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptSpec {
    /// The root directory the kcp runs with (its --root-directory), absolute.
    #[schemars(length(min = 1))]
    pub root_directory: String,
    /// The admin API (host:port) of a caddy in front of the kcp. Before the switch, kcpshard sends
    /// to the front what caddy sent to the kcp (every reverse_proxy upstream that dials the kcp's
    /// address), in one config change. Unset: clients dial the kcp or the front themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caddy_admin_address: Option<String>,
}

/// Scheduled snapshots of the store (docs/how-to/snapshots.md, "Snapshots").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// How often to take a snapshot of the store while it serves, e.g. "24h" or "30m" (at least
    /// 10s): a pg_dump of a KinePostgres database, a copy of a KineSqlite database (sqlite's VACUUM
    /// INTO), an etcd snapshot of an Etcd store. Unset: only on request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub interval: Option<String>,
    /// How many scheduled and requested snapshots to keep; older ones are removed after each new
    /// one. Those taken before version changes are kept apart (spec.rollout.snapshotsToKeep).
    #[serde(default = "default_backups_to_keep")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep: u32,
}

fn default_backups_to_keep() -> u32 {
    7
}

impl Default for BackupSpec {
    fn default() -> Self {
        Self {
            interval: None,
            keep: default_backups_to_keep(),
        }
    }
}

impl BackupSpec {
    /// `interval` as a [`Duration`], if set.
    pub fn interval(&self) -> Option<Result<Duration, DurationError>> {
        self.interval.as_deref().map(parse_duration)
    }
}

/// kcp's own name of the root shard (`--shard-name` defaults to it).
pub const ROOT_SHARD_NAME: &str = "root";

/// A shard of a sharded kcp (docs/how-to/sharded-kcp.md, "A sharded kcp with kcpshard").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardSpec {
    /// kcp's --shard-name: "root" for the root shard, else this shard's name in kcp (its Shard
    /// object in the root workspace), e.g. "shard-2".
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The name of the KcpShard that is the root shard (its spec.shard.name is "root"), managed by
    /// the same kcpshard serve. Required unless this is the root; its slots start once the root
    /// is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_shard: Option<String>,
    /// The root shard only: the URL of the kcp-front-proxy in front of the sharded kcp, e.g.
    /// "https://127.0.0.1:6443". Every shard advertises it as kcp's --shard-external-url (the
    /// workspace URLs clients get), and kcp reaches workspaces on other shards through it.
    #[serde(default, rename = "externalURL", skip_serializing_if = "Option::is_none")]
    pub external_url: Option<String>,
    /// A non-root shard only: a kubeconfig (path on this host) of the cache server kcp's
    /// --cache-kubeconfig is to use. Default: the cache server embedded in the root shard,
    /// through the root's front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_kubeconfig: Option<String>,
}

impl ShardSpec {
    /// Whether this is the root shard of its sharded kcp.
    pub fn is_root(&self) -> bool {
        self.name == ROOT_SHARD_NAME
    }
}

fn default_slots() -> u32 {
    1
}

/// How each slot's kcp process is started.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct KcpSettings {
    /// Path of the kcp binary. "{version}" is replaced by spec.version; a relative path is resolved
    /// against the directory kcpshard serve runs in. hack/install-deps.sh installs bin/kcp-<version>.
    #[schemars(length(min = 1))]
    pub binary: String,
    /// Extra command-line flags passed to every slot's kcp, after the ones kcpshard sets, e.g.
    /// ["--v=2"]. Flags kcpshard owns (--root-directory, --secure-port, --etcd-servers, ...) are refused.
    /// kcpshard also sets --etcd-healthcheck-timeout and --etcd-readycheck-timeout to 8s (kcp's
    /// default 2s: a busy kcp's /readyz then fails on its own slow store read); these may set them again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub extra_args: Vec<String>,
    /// How long a slot keeps serving after SIGTERM before closing its listener
    /// (kcp's --shutdown-delay-duration), e.g. "2s". Default 0s: the front moves new connections to
    /// the new slot before the old one gets SIGTERM, so a delay only keeps kept-alive connections
    /// on a slot whose /readyz fails. Set one if another load balancer also sends to the slots.
    #[schemars(pattern(DURATION_PATTERN))]
    pub shutdown_delay: String,
}

impl Default for KcpSettings {
    fn default() -> Self {
        Self {
            binary: "bin/kcp-{version}".into(),
            extra_args: Vec::new(),
            shutdown_delay: "0s".into(),
        }
    }
}

impl KcpSettings {
    /// The binary path for a release: the template with `{version}` replaced.
    pub fn binary_for(&self, version: &str) -> String {
        self.binary.replace("{version}", version)
    }

    /// `shutdownDelay` as a [`Duration`] (validation has checked it parses).
    pub fn shutdown_delay(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.shutdown_delay)
    }
}

/// Where the shard's data lives. Set type, and the settings block of that type (kinePostgres or etcd;
/// kineSqlite needs none).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreSpec {
    /// The kind of store: KineSqlite (kine over a sqlite file in the state dir, one host, for
    /// development), KinePostgres (each slot runs its own kine over one PostgreSQL database), or Etcd
    /// (existing etcd endpoints).
    #[serde(rename = "type")]
    pub type_: StoreType,
    /// Settings for type KineSqlite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kine_sqlite: Option<KineSqliteStore>,
    /// Settings for type KinePostgres.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kine_postgres: Option<KinePostgresStore>,
    /// Settings for type Etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdStore>,
}

impl StoreSpec {
    /// Why kcpshard cannot move a shard's data from this store to `to` while it serves (None: it
    /// can; controller/plan/migration.rs). A managed PostgreSQL keeps one cluster in the shard's
    /// store directory, so a move between two managed ones stays on its server (another database).
    pub fn move_refused(&self, to: &StoreSpec) -> Option<String> {
        let why = match (self.type_, to.type_) {
            (StoreType::KinePostgres, StoreType::KinePostgres) => {
                let (a, b) = (self.kine_postgres.as_ref()?, to.kine_postgres.as_ref()?);
                let other_server = a.host != b.host || a.port != b.port;
                if !(a.managed && b.managed && other_server) {
                    return None;
                }
                "from one managed PostgreSQL to another: both would keep their cluster in the shard's store directory. Move into another database of the same managed PostgreSQL, or into a PostgreSQL you run"
            }
            _ => return None,
        };
        Some(format!("kcpshard cannot move a shard's data {why}"))
    }

    /// The first field by which `self` puts the data somewhere else than `other`: the type, the
    /// PostgreSQL server (host, port, or whether kcpshard runs it), its database, or the etcd
    /// endpoints. The other settings (user, password, TLS) say how to reach the same data, and
    /// None is answered when only they differ.
    pub fn moved_at(&self, other: &StoreSpec) -> Option<&'static str> {
        if self.type_ != other.type_ {
            return Some("spec.store.type");
        }
        match (
            self.type_,
            &self.kine_postgres,
            &other.kine_postgres,
            &self.etcd,
            &other.etcd,
        ) {
            (StoreType::KinePostgres, Some(a), Some(b), _, _) => [
                ("spec.store.kinePostgres.host", a.host != b.host),
                ("spec.store.kinePostgres.port", a.port != b.port),
                ("spec.store.kinePostgres.database", a.database != b.database),
                ("spec.store.kinePostgres.managed", a.managed != b.managed),
            ]
            .into_iter()
            .find_map(|(field, differs)| differs.then_some(field)),
            (StoreType::Etcd, _, _, Some(a), Some(b)) => {
                let members = |e: &EtcdStore| {
                    let mut m = e.endpoints.clone();
                    m.sort();
                    m
                };
                (members(a) != members(b)).then_some("spec.store.etcd.endpoints")
            }
            _ => None,
        }
    }

    /// Where the data is, in words: "KineSqlite", "KinePostgres (database kcp on 127.0.0.1:5432)".
    pub fn describe(&self) -> String {
        match (self.type_, &self.kine_postgres, &self.etcd) {
            (StoreType::KinePostgres, Some(pg), _) => format!(
                "KinePostgres (database {} on {}{}:{})",
                pg.database,
                if pg.managed { "the managed PostgreSQL at " } else { "" },
                pg.host,
                pg.port
            ),
            (StoreType::Etcd, _, Some(etcd)) => format!("Etcd ({})", etcd.endpoints.join(", ")),
            (type_, _, _) => type_.as_str().to_string(),
        }
    }
}

/// The kind of store.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum StoreType {
    KineSqlite,
    KinePostgres,
    Etcd,
}

impl StoreType {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreType::KineSqlite => "KineSqlite",
            StoreType::KinePostgres => "KinePostgres",
            StoreType::Etcd => "Etcd",
        }
    }

    /// The camelCase name of this type's settings block in spec.store.
    pub fn settings_field(self) -> &'static str {
        match self {
            StoreType::KineSqlite => "kineSqlite",
            StoreType::KinePostgres => "kinePostgres",
            StoreType::Etcd => "etcd",
        }
    }
}

/// Settings for kine over sqlite. The database file lives in the shard's directory under the state
/// dir; there is nothing to set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KineSqliteStore {}

/// Settings for kine over PostgreSQL. Each slot runs its own kine against this database.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KinePostgresStore {
    /// Host name or IP address of the PostgreSQL server.
    #[schemars(length(min = 1))]
    pub host: String,
    /// TCP port of the PostgreSQL server.
    #[serde(default = "default_postgres_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Database name; kine creates it when missing.
    #[serde(default = "default_postgres_database")]
    #[schemars(length(min = 1))]
    pub database: String,
    /// User name kine connects as.
    #[serde(default = "default_postgres_user")]
    #[schemars(length(min = 1))]
    pub user: String,
    /// Where the password comes from. A password is never written in the object itself. Omit it for
    /// trust or peer authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_from: Option<PasswordSource>,
    /// PostgreSQL sslmode, for kine's connections and kcpshard's own: disable, require (encrypted;
    /// the certificate is checked only against a caFile), verify-ca (the chain) or verify-full (the
    /// chain and the host name).
    #[serde(default)]
    pub ssl_mode: SslMode,
    /// Path of a PEM file with the CA certificates that verify the server's certificate (libpq's
    /// sslrootcert); without it, the system's roots. With sslMode require it makes kine and
    /// kcpshard verify the chain, as libpq does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// When true, kcpshard runs a PostgreSQL cluster for this shard itself (initdb, then postgres
    /// under the shard's directory) on host:port; when false it uses a server someone else runs.
    #[serde(default)]
    pub managed: bool,
}

fn default_postgres_port() -> u16 {
    5432
}
fn default_postgres_database() -> String {
    "kcp".into()
}
fn default_postgres_user() -> String {
    "kcp".into()
}

/// Where a secret comes from: exactly one of file or env.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSource {
    /// Path of a file holding the password (trailing newline ignored). Keep it mode 0600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Name of an environment variable of the kcpshard serve process holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

/// PostgreSQL sslmode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    #[default]
    Disable,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// The value as written in a PostgreSQL connection string.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Settings for an existing etcd cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdStore {
    /// Client URLs of the etcd members, e.g. ["https://127.0.0.1:2379"].
    #[schemars(length(min = 1))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub endpoints: Vec<String>,
    /// Path of the CA bundle that verifies the etcd members' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Path of the client certificate kcp presents to etcd (set together with keyFile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Path of the client certificate's private key (set together with certFile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
}

/// The address clients dial. It forwards each TCP connection (TLS passes through) to one of the serving slots.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct FrontSpec {
    /// The kind of front: Tcp (kcpshard's own TCP forwarder, listening on listen) or Caddy (a caddy
    /// you run; kcpshard changes its upstream through caddy's admin API).
    #[serde(rename = "type")]
    pub type_: FrontType,
    /// host:port clients dial, an IP address and a port, e.g. 127.0.0.1:6443 or [::1]:6443. Every
    /// slot is told this is the shard's URL.
    #[schemars(pattern(LISTEN_PATTERN))]
    pub listen: String,
    /// Settings for type Caddy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caddy: Option<CaddyFront>,
}

impl Default for FrontSpec {
    fn default() -> Self {
        Self {
            type_: FrontType::Tcp,
            listen: "127.0.0.1:6443".into(),
            caddy: None,
        }
    }
}

/// The kind of front.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum FrontType {
    #[default]
    Tcp,
    Caddy,
}

impl FrontType {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontType::Tcp => "Tcp",
            FrontType::Caddy => "Caddy",
        }
    }
}

/// A caddy you run, whose reverse_proxy handler forwards to the serving slots (`kcpshard front caddy-config`
/// prints the config to use). kcpshard only changes that handler's upstreams, through caddy's admin API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaddyFront {
    /// host:port of caddy's admin API.
    #[serde(default = "default_caddy_admin")]
    #[schemars(pattern(LISTEN_PATTERN))]
    pub admin_address: String,
    /// The @id of the caddy handler whose upstreams kcpshard replaces
    /// (PATCH /id/<upstreamId>/upstreams), e.g. kcp-proxy.
    #[schemars(length(min = 1))]
    pub upstream_id: String,
}

fn default_caddy_admin() -> String {
    "127.0.0.1:2019".into()
}

/// How a roll to a new slot proceeds and which version changes it may make.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RolloutSpec {
    /// How long a new slot may take to answer /readyz on its own port, e.g. "120s". A slot that
    /// misses it is started once more (a kcp start-up sometimes never finishes); if it misses it
    /// again, the roll is abandoned (the new slot is stopped, the old one keeps serving). At most 1h.
    #[schemars(pattern(DURATION_PATTERN))]
    pub readiness_timeout: String,
    /// How long the old slot may take to exit after SIGTERM before it is killed, e.g. "30s". At most 1h.
    #[schemars(pattern(DURATION_PATTERN))]
    pub drain_timeout: String,
    /// How long a slot that served may go without answering anything on its own port (not even
    /// kcp's store-free /livez/ping) and without working (using CPU) before it is killed and
    /// replaced, e.g. "10s". It leaves the front while another slot serves after 2 looks that fail
    /// (a second each), or after 1 once the front saw it leave a new connection unanswered; this
    /// bounds how long a stopped or wedged kcp stays. A busy one is not killed. At most 1h.
    #[schemars(pattern(DURATION_PATTERN))]
    pub liveness_timeout: String,
    /// Snapshot the store before a roll that changes spec.version, while it serves: a pg_dump of
    /// the KinePostgres database, a copy of the KineSqlite database (sqlite's VACUUM INTO), or an
    /// etcd snapshot of an Etcd store, into the shard's snapshots directory (its path goes into
    /// status.lastRoll.snapshot).
    pub snapshot_before_version_change: bool,
    /// Before the first slot of a new spec.version starts, run that version alone against a copy
    /// of the data (a copy of the sqlite file, or the snapshot restored into a scratch database;
    /// Etcd stores are skipped): it must answer /readyz within readinessTimeout, its controllers
    /// must take their Lease within readinessTimeout again (whatever the shard's size: how fast
    /// they catch up is the roll's probe's question), and what it changed in kcp's own schemas is
    /// compared with the serving slots' (status.preflight). Failed blocks the roll; SchemaChanged
    /// rolls only with allowMinorVersionChange. The copy and its processes are removed after it.
    pub preflight: bool,
    /// How many snapshots to keep; older ones are removed after each new one.
    #[schemars(range(min = 1, max = 1000))]
    pub snapshots_to_keep: u32,
    /// Allow a roll that changes the minor version (v0.31.x to v0.32.y). Patch changes are always
    /// allowed; major changes never.
    pub allow_minor_version_change: bool,
    /// Allow a roll to an older version than the one running. kcp does not promise its storage
    /// can be read by an older release: restore the snapshot instead where you can.
    pub allow_downgrade: bool,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            readiness_timeout: "120s".into(),
            drain_timeout: "30s".into(),
            liveness_timeout: "10s".into(),
            snapshot_before_version_change: true,
            preflight: true,
            snapshots_to_keep: 5,
            allow_minor_version_change: false,
            allow_downgrade: false,
        }
    }
}

impl RolloutSpec {
    /// `readinessTimeout` as a [`Duration`].
    pub fn readiness_timeout(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.readiness_timeout)
    }

    /// `drainTimeout` as a [`Duration`].
    pub fn drain_timeout(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.drain_timeout)
    }

    /// `livenessTimeout` as a [`Duration`].
    pub fn liveness_timeout(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.liveness_timeout)
    }
}
