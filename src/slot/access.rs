//! Talking to one slot directly: readiness, the controllers lease, the workspace probe (whether it
//! serves kcp's own APIs is [`super::serving`]).
//!
//! - The client always dials the slot's OWN port, never the front and never the server URL in the
//!   kubeconfig (which names the front, or an older slot): checking readiness through a copied
//!   kubeconfig reaches the old slot and switches too early (docs/background.md section 5).
//! - Readiness and the Lease: as the shard admin (`shard-admin` user of the `shard-base` context):
//!   that token is persistent through `.admin-token-store`, so it works on every slot of the shard.
//!   The `root`/`base` contexts of a slot's own `admin.kubeconfig` carry a kcp-admin token that is
//!   new in every process (docs/background.md section 2).
//! - The workspace probe: as kcpshard's admin identity ([`super::identity`]), from the `base`
//!   context of the shard's kubeconfig through the front, which every slot accepts.
//! - TLS is verified with the CA data in the kubeconfig (the shard's shared `apiserver.crt`).
use std::path::Path;
use std::time::{Duration, Instant};

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::SlotError;

/// The context of `admin.kubeconfig` whose user is the shard admin and whose cluster is the base
/// URL (no `/clusters/...` suffix). kcp writes `system:admin` (same user, cluster
/// `<base>/clusters/system:admin`) and `shard-base`.
pub const SHARD_ADMIN_CONTEXT: &str = "shard-base";
/// The user kcp names the shard admin in `admin.kubeconfig`.
pub const SHARD_ADMIN_USER: &str = "shard-admin";
/// The context on the base URL whose user is the kcp admin: in a slot's own `admin.kubeconfig`
/// kcp's per-process kcp-admin (valid only on the process that wrote it); in the shard's
/// kubeconfig through the front kcpshard's admin identity (valid on every slot).
pub const KCP_ADMIN_CONTEXT: &str = "base";

/// The Lease that kcp's controllers elect a leader with, in the `system:admin` logical cluster.
pub const CONTROLLERS_LEASE_PATH: &str =
    "/clusters/system:admin/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kcp-controllers";
const WORKSPACES_PATH: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
/// Label on probe workspaces, so that leftovers of an interrupted probe can be found.
pub const PROBE_LABEL: &str = "kcpshard.io/probe";

/// `https://127.0.0.1:<port>`: a slot's own URL.
pub fn slot_url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}

/// A client for the shard admin of the slot whose `admin.kubeconfig` is given, dialing `server`
/// (a slot's own URL, see [`slot_url`]).
pub async fn shard_admin_client(kubeconfig: &Path, server: &str) -> Result<kube::Client, SlotError> {
    client_for_context(kubeconfig, SHARD_ADMIN_CONTEXT, server).await
}

/// A client for the kcp admin (`base` context) of `kubeconfig`, dialing `server`: with the shard's
/// kubeconfig through the front, kcpshard's admin identity, which every slot accepts. The
/// workspace probe needs a real user: a workspace created by the shard admin never leaves
/// Initializing (kcp records no owner for `system:masters`; docs/background.md section 10).
pub async fn admin_client(kubeconfig: &Path, server: &str) -> Result<kube::Client, SlotError> {
    client_for_context(kubeconfig, KCP_ADMIN_CONTEXT, server).await
}

/// A client for `context` of an `admin.kubeconfig`, with its server replaced by `server`. Short
/// connect and read timeouts: a slot that does not answer within seconds is not ready.
pub async fn client_for_context(kubeconfig: &Path, context: &str, server: &str) -> Result<kube::Client, SlotError> {
    let config = config_for_context(kubeconfig, context, server).await?;
    kube::Client::try_from(config).map_err(|e| SlotError::Client(e.to_string()))
}

/// The configuration [`client_for_context`] builds its client from, for callers that build their
/// own client from it (other timeouts or connector settings, e.g. examples/roll_load.rs).
pub async fn config_for_context(kubeconfig: &Path, context: &str, server: &str) -> Result<kube::Config, SlotError> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| SlotError::Kubeconfig {
        path: kubeconfig.to_path_buf(),
        message: e.to_string(),
    })?;
    if !kc.contexts.iter().any(|c| c.name == context) {
        return Err(SlotError::Kubeconfig {
            path: kubeconfig.to_path_buf(),
            message: format!(
                "no context {context:?} (a kcp admin.kubeconfig has root, base, system:admin, shard-base)"
            ),
        });
    }
    let options = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|e| SlotError::Kubeconfig {
            path: kubeconfig.to_path_buf(),
            message: e.to_string(),
        })?;
    config.cluster_url = server.parse().map_err(|e| SlotError::Kubeconfig {
        path: kubeconfig.to_path_buf(),
        message: format!("server {server:?}: {e}"),
    })?;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(10));
    config.write_timeout = Some(Duration::from_secs(10));
    Ok(config)
}

/// One request; the status and body, whatever the status. Err only when no answer came.
pub(super) async fn call(
    client: &kube::Client,
    method: Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(StatusCode, Vec<u8>), SlotError> {
    let mut req = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(http::header::ACCEPT, "application/json");
    let bytes = match body {
        Some(v) => {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
            serde_json::to_vec(v).expect("JSON serialises")
        }
        None => Vec::new(),
    };
    let req = req
        .body(kube::client::Body::from(bytes))
        .map_err(|e| SlotError::Client(e.to_string()))?;
    let unreachable = |e: String| SlotError::Unreachable {
        method: method.to_string(),
        path: path.to_string(),
        message: e,
    };
    let res = client.send(req).await.map_err(|e| unreachable(e.to_string()))?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    Ok((status, body.to_vec()))
}

pub(super) fn unexpected(method: &str, path: &str, status: StatusCode, body: &[u8]) -> SlotError {
    let text = String::from_utf8_lossy(body);
    SlotError::Unexpected {
        method: method.to_string(),
        path: path.to_string(),
        status: status.as_u16(),
        body: text.chars().take(500).collect(),
    }
}

/// `GET /readyz` answers `ok`. Ok(false) when the slot answers anything else (starting, or
/// shutting down); Err when it does not answer at all.
pub async fn readyz(client: &kube::Client) -> Result<bool, SlotError> {
    let (status, body) = call(client, Method::GET, "/readyz", None).await?;
    Ok(status == StatusCode::OK && String::from_utf8_lossy(&body).trim() == "ok")
}

/// Whether kcp answers `GET /livez/ping` (200) within `timeout`: that check touches no store, so a
/// kcp whose store is away still answers it, and one that is wedged (stopped, deadlocked) does not.
pub async fn answers_ping(client: &kube::Client, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, call(client, Method::GET, "/livez/ping", None)).await,
        Ok(Ok((StatusCode::OK, _)))
    )
}

/// Is the slot with root `root_dir` ready on its own `port`? Uses the shard-admin token of the
/// root's `admin.kubeconfig` (the seeded copy works before the slot rewrites it: the token and CA
/// are the shard's). Ok(false) while there is no kubeconfig yet or the slot does not answer;
/// Err only for a kubeconfig that cannot be used.
pub async fn slot_ready(root_dir: &Path, port: u16) -> Result<bool, SlotError> {
    let kubeconfig = root_dir.join(super::material::ADMIN_KUBECONFIG);
    if !kubeconfig.exists() {
        return Ok(false);
    }
    let client = shard_admin_client(&kubeconfig, &slot_url(port)).await?;
    match readyz(&client).await {
        Ok(ready) => Ok(ready),
        Err(SlotError::Unreachable { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes Lease `kube-system/kcp-controllers` in `system:admin`, so that a waiting slot leads
/// the controllers within its retry period instead of after the 60 s lease (kcp sets no
/// ReleaseOnCancel; docs/background.md section 3). Call it only after the old leader has exited: a live
/// leader just renews it. Ok(true): a lease was deleted; Ok(false): there was none (also released).
pub async fn release_controllers_lease(client: &kube::Client) -> Result<bool, SlotError> {
    let (status, body) = call(client, Method::DELETE, CONTROLLERS_LEASE_PATH, None).await?;
    match status {
        s if s.is_success() => Ok(true),
        StatusCode::NOT_FOUND => Ok(false),
        s => Err(unexpected("DELETE", CONTROLLERS_LEASE_PATH, s, &body)),
    }
}

/// Creates Lease `kube-system/kcp-controllers` in `system:admin`, held by `holder` for `seconds`
/// from now, unless there is one. A kcp started with `--enable-leader-election` that finds it
/// valid follows (client-go's elector waits `leaseDurationSeconds` of the record it observed).
/// Ok(true): created; Ok(false): a Lease was there (a kcp leads with it).
pub async fn hold_controllers_lease(client: &kube::Client, holder: &str, seconds: u32) -> Result<bool, SlotError> {
    let (leases, name) = CONTROLLERS_LEASE_PATH
        .rsplit_once('/')
        .expect("the Lease's path ends in its name");
    let now = micro_time_now();
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": name, "namespace": "kube-system" },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "acquireTime": now,
            "renewTime": now,
        },
    });
    let (status, body) = call(client, Method::POST, leases, Some(&lease)).await?;
    match status {
        s if s.is_success() => Ok(true),
        StatusCode::CONFLICT => Ok(false),
        s => Err(unexpected("POST", leases, s, &body)),
    }
}

/// kcp's LeaseDuration (kcp v0.31 pkg/server/server.go:771-773): how long a Lease it did not
/// renew keeps the other candidates waiting.
const KCP_LEASE_SECONDS: u32 = 60;

/// Names the kcp whose election identity is `to` the holder of Lease `kube-system/kcp-controllers`
/// in `system:admin` (created if there is none), as of now. That kcp's elector, at its next try
/// (every 2-4.4 s: RetryPeriod 2 s with client-go's jitter 1.2), reads itself as the holder and
/// renews: it leads. Any other candidate, a slot just starting among them, reads a valid Lease of
/// someone else and waits; after a plain DELETE the first to try would win, and a starting slot's
/// first try can come before the serving slot's next one. (client-go as kcp v0.31.2 pins it,
/// kcp-dev/kubernetes ba4f7d493d5b, tools/leaderelection/leaderelection.go: `acquire` tries every
/// RetryPeriod with jitter 1.2, :259-274; `tryAcquireOrRenew` creates a missing Lease, :449-463,
/// waits on one held by another, :471-474, and renews one that names itself, :478-493.)
/// Ok(true): handed; Ok(false): the Lease changed between the read and the write (a kcp took or
/// renewed it).
pub async fn hand_controllers_lease(client: &kube::Client, to: &str) -> Result<bool, SlotError> {
    let (status, body) = call(client, Method::GET, CONTROLLERS_LEASE_PATH, None).await?;
    let mut lease: serde_json::Value = match status {
        StatusCode::OK => serde_json::from_slice(&body)
            .map_err(|e| SlotError::Client(format!("GET {CONTROLLERS_LEASE_PATH}: not a Lease: {e}")))?,
        StatusCode::NOT_FOUND => return hold_controllers_lease(client, to, KCP_LEASE_SECONDS).await,
        s => return Err(unexpected("GET", CONTROLLERS_LEASE_PATH, s, &body)),
    };
    let now = micro_time_now();
    let spec = &mut lease["spec"];
    let transitions = spec["leaseTransitions"].as_i64().unwrap_or(0) + 1;
    spec["holderIdentity"] = to.into();
    spec["acquireTime"] = now.clone().into();
    spec["renewTime"] = now.into();
    spec["leaseTransitions"] = transitions.into();
    // The read's metadata.resourceVersion goes back with it: a change meanwhile is a conflict.
    let (status, body) = call(client, Method::PUT, CONTROLLERS_LEASE_PATH, Some(&lease)).await?;
    match status {
        s if s.is_success() => Ok(true),
        StatusCode::CONFLICT => Ok(false),
        s => Err(unexpected("PUT", CONTROLLERS_LEASE_PATH, s, &body)),
    }
}

/// Now as a Lease's MicroTime.
fn micro_time_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The controllers' Lease as the election reads it: who holds it and when they last renewed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllersLease {
    /// `hostname_<uuid>` of the leading kcp, if any.
    pub holder: Option<String>,
    /// `spec.renewTime`: a leader renews every 2 s (kcp's RetryPeriod).
    pub renewed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The controllers' Lease (no holder when there is none).
pub async fn controllers_lease(client: &kube::Client) -> Result<ControllersLease, SlotError> {
    let (status, body) = call(client, Method::GET, CONTROLLERS_LEASE_PATH, None).await?;
    match status {
        StatusCode::OK => {
            let lease: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let spec = &lease["spec"];
            Ok(ControllersLease {
                holder: spec["holderIdentity"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(String::from),
                renewed_at: spec["renewTime"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.to_utc()),
            })
        }
        StatusCode::NOT_FOUND => Ok(ControllersLease::default()),
        s => Err(unexpected("GET", CONTROLLERS_LEASE_PATH, s, &body)),
    }
}

/// The holder of the controllers lease (`hostname_<uuid>` of the leading kcp), if any.
pub async fn controllers_lease_holder(client: &kube::Client) -> Result<Option<String>, SlotError> {
    Ok(controllers_lease(client).await?.holder)
}

/// Creates a throwaway workspace `kcpshard-probe-<random>` in `root` and returns its name. Only the
/// leader's controllers get it to phase `Ready`, so it proves that some slot leads them.
///
/// `client` must be a real identity, i.e. [`admin_client`], not the shard admin, whose workspaces
/// stay in Initializing (docs/background.md section 10).
pub async fn create_probe_workspace(client: &kube::Client) -> Result<String, SlotError> {
    let mut random = [0u8; 4];
    getrandom::fill(&mut random).map_err(|e| SlotError::Client(format!("random name: {e}")))?;
    let name = format!(
        "kcpshard-probe-{}",
        random.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let body = serde_json::json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1",
        "kind": "Workspace",
        "metadata": { "name": name, "labels": { PROBE_LABEL: "true" } },
    });
    let (status, resp) = call(client, Method::POST, WORKSPACES_PATH, Some(&body)).await?;
    if !status.is_success() {
        return Err(unexpected("POST", WORKSPACES_PATH, status, &resp));
    }
    Ok(name)
}

/// The phase of workspace `name` in `root`; None when it has none yet or is gone.
pub async fn workspace_phase(client: &kube::Client, name: &str) -> Result<Option<String>, SlotError> {
    let path = format!("{WORKSPACES_PATH}/{name}");
    let (status, body) = call(client, Method::GET, &path, None).await?;
    match status {
        StatusCode::OK => {
            let ws: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            Ok(ws["status"]["phase"].as_str().map(str::to_string))
        }
        StatusCode::NOT_FOUND => Ok(None),
        s => Err(unexpected("GET", &path, s, &body)),
    }
}

/// Deletes workspace `name` in `root` (gone already is fine).
pub async fn delete_workspace(client: &kube::Client, name: &str) -> Result<(), SlotError> {
    let path = format!("{WORKSPACES_PATH}/{name}");
    let (status, body) = call(client, Method::DELETE, &path, None).await?;
    match status {
        s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
        s => Err(unexpected("DELETE", &path, s, &body)),
    }
}

/// Creates a probe workspace, waits (at most `timeout`) for it to be Ready, deletes it, and
/// returns the time from the create to Ready (for tests and benchmarks that wait in line; the
/// controller creates and looks at it in separate steps).
pub async fn probe_workspace(client: &kube::Client, timeout: Duration) -> Result<Duration, SlotError> {
    let started = Instant::now();
    let name = create_probe_workspace(client).await?;
    let mut phase = None;
    let outcome = loop {
        match workspace_phase(client, &name).await {
            Ok(p) if p.as_deref() == Some("Ready") => break Ok(started.elapsed()),
            Ok(p) => phase = p,
            // A slot under a roll may briefly not answer; the deadline bounds the wait.
            Err(SlotError::Unreachable { .. }) | Err(SlotError::Unexpected { .. }) => {}
            Err(e) => break Err(e),
        }
        if started.elapsed() >= timeout {
            break Err(SlotError::ProbeTimeout {
                workspace: name.clone(),
                phase: phase.clone().unwrap_or_default(),
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if let Err(e) = delete_workspace(client, &name).await {
        tracing::warn!(workspace = %name, error = %e, "could not delete the probe workspace");
    }
    outcome
}

/// Deletes probe workspaces left by interrupted probes (a crash between create and delete).
/// Returns how many it deleted.
pub async fn delete_stale_probes(client: &kube::Client) -> Result<usize, SlotError> {
    let list_path = format!("{WORKSPACES_PATH}?labelSelector={PROBE_LABEL}%3Dtrue");
    let (status, body) = call(client, Method::GET, &list_path, None).await?;
    if status != StatusCode::OK {
        return Err(unexpected("GET", &list_path, status, &body));
    }
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut deleted = 0;
    for item in list["items"].as_array().into_iter().flatten() {
        let Some(name) = item["metadata"]["name"].as_str() else {
            continue;
        };
        let path = format!("{WORKSPACES_PATH}/{name}");
        let (status, body) = call(client, Method::DELETE, &path, None).await?;
        match status {
            s if s.is_success() => deleted += 1,
            StatusCode::NOT_FOUND => {}
            s => return Err(unexpected("DELETE", &path, s, &body)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The Lease as kcp's apiserver keeps it: a write must carry the resourceVersion it read.
    #[derive(Default)]
    struct LeaseStore {
        lease: Option<serde_json::Value>,
        version: u64,
        /// A kcp that renews right after each GET, as a leader that is still alive would.
        renewing: Option<&'static str>,
        /// Every request answers 500 (an apiserver whose store is away).
        failing: bool,
    }

    impl LeaseStore {
        fn held_by(holder: &str, transitions: i64) -> Self {
            let mut store = LeaseStore::default();
            store.store(serde_json::json!({
                "metadata": { "name": "kcp-controllers", "namespace": "kube-system" },
                "spec": { "holderIdentity": holder, "leaseDurationSeconds": 60, "leaseTransitions": transitions },
            }));
            store
        }

        fn store(&mut self, mut lease: serde_json::Value) {
            self.version += 1;
            lease["metadata"]["resourceVersion"] = self.version.to_string().into();
            self.lease = Some(lease);
        }

        fn spec(&self) -> &serde_json::Value {
            &self.lease.as_ref().expect("a Lease")["spec"]
        }

        fn answer(&mut self, method: &Method, path: &str, body: &[u8]) -> (StatusCode, Vec<u8>) {
            let (leases, _) = CONTROLLERS_LEASE_PATH.rsplit_once('/').unwrap();
            let status = match (method, path) {
                _ if self.failing => StatusCode::INTERNAL_SERVER_ERROR,
                (&Method::GET, CONTROLLERS_LEASE_PATH) => {
                    let Some(lease) = self.lease.clone() else {
                        return (StatusCode::NOT_FOUND, Vec::new());
                    };
                    if let Some(holder) = self.renewing {
                        let mut renewed = lease.clone();
                        renewed["spec"]["holderIdentity"] = holder.into();
                        self.store(renewed);
                    }
                    return (StatusCode::OK, serde_json::to_vec(&lease).unwrap());
                }
                (&Method::PUT, CONTROLLERS_LEASE_PATH) => {
                    let lease: serde_json::Value = serde_json::from_slice(body).unwrap();
                    if lease["metadata"]["resourceVersion"] != self.version.to_string().as_str() {
                        StatusCode::CONFLICT
                    } else {
                        self.store(lease);
                        StatusCode::OK
                    }
                }
                (&Method::POST, p) if p == leases && self.lease.is_some() => StatusCode::CONFLICT,
                (&Method::POST, p) if p == leases => {
                    self.store(serde_json::from_slice(body).unwrap());
                    StatusCode::CREATED
                }
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, Vec::new())
        }
    }

    fn client(store: &Arc<Mutex<LeaseStore>>) -> kube::Client {
        let store = store.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let store = store.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                let (status, answer) = store.lock().unwrap().answer(&parts.method, parts.uri.path(), &body);
                let response = http::Response::builder()
                    .status(status)
                    .body(kube::client::Body::from(answer))
                    .unwrap();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_held_lease_is_handed_to_the_successor_as_a_new_term() {
        let store = Arc::new(Mutex::new(LeaseStore::held_by("slot-a", 2)));
        assert!(hand_controllers_lease(&client(&store), "slot-b").await.unwrap());
        let store = store.lock().unwrap();
        let spec = store.spec();
        assert_eq!(spec["holderIdentity"], "slot-b");
        assert_eq!(spec["leaseTransitions"], 3);
        assert_eq!(spec["leaseDurationSeconds"], 60, "the rest of the Lease is kept");
        assert_eq!(spec["acquireTime"], spec["renewTime"]);
    }

    #[tokio::test]
    async fn a_missing_lease_is_created_for_the_successor() {
        let store = Arc::new(Mutex::new(LeaseStore::default()));
        assert!(hand_controllers_lease(&client(&store), "slot-b").await.unwrap());
        let store = store.lock().unwrap();
        assert_eq!(store.spec()["holderIdentity"], "slot-b");
        assert_eq!(store.spec()["leaseDurationSeconds"], KCP_LEASE_SECONDS);
    }

    #[tokio::test]
    async fn a_lease_renewed_between_the_read_and_the_write_stays_with_its_renewer() {
        let mut lease = LeaseStore::held_by("slot-a", 2);
        lease.renewing = Some("slot-a");
        let store = Arc::new(Mutex::new(lease));
        assert!(!hand_controllers_lease(&client(&store), "slot-b").await.unwrap());
        assert_eq!(store.lock().unwrap().spec()["holderIdentity"], "slot-a");
    }

    #[tokio::test]
    async fn an_apiserver_error_is_an_error_naming_the_request() {
        let store = Arc::new(Mutex::new(LeaseStore::held_by("slot-a", 2)));
        store.lock().unwrap().failing = true;
        let err = hand_controllers_lease(&client(&store), "slot-b").await.unwrap_err();
        assert!(
            matches!(&err, SlotError::Unexpected { method, status: 500, .. } if method == "GET"),
            "{err}"
        );
        assert_eq!(store.lock().unwrap().spec()["holderIdentity"], "slot-a");
    }
}
