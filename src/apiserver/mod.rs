//! A small, real Kubernetes API served from files, for `KcpShard` objects and their events.
//!
//! On a single host there is no cluster, yet the controller (kube-runtime), the user (kubectl) and
//! GitOps tools all speak the Kubernetes API. So `kcpshard serve` serves one: HTTPS on loopback
//! (hyper + rustls), a bearer token, discovery and OpenAPI v3 as kubectl reads them, and the verbs
//! and rules of the real kube-apiserver for custom resources (docs/api.md).
//!
//! - [`store`]: one file per object, atomic writes, the resourceVersion counter, the change feed.
//! - [`objects`]: what create, update, patch and delete mean (generation, no-op writes, conflicts,
//!   finalizers, dry runs); [`apply`]: server-side apply and `managedFields`.
//! - [`handler`]: routing and Status errors; [`negotiation`] (JSON, YAML, Table,
//!   PartialObjectMetadata; 406), [`paging`] (limit/continue), [`watch`] streams changes.
//! - [`metadata`]: ObjectMeta validation; [`reviews`]: `kubectl auth can-i` and `whoami`.
//! - [`discovery`], [`openapi`], [`table`]: the documents kubectl needs to work unmodified.
//! - [`pki`], [`kubeconfig`], [`listener`]: key material, the kubeconfig it writes, TLS serving.
pub mod apply;
pub mod discovery;
pub mod error;
pub mod events;
pub mod handler;
pub mod kubeconfig;
pub mod listener;
pub mod metadata;
pub mod metrics;
pub mod negotiation;
pub mod objects;
pub mod openapi;
pub mod paging;
pub mod pki;
pub mod resources;
pub mod reviews;
pub mod schema;
pub mod selectors;
pub mod store;
pub mod table;
pub mod watch;

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use http::Request;
use http_body_util::BodyExt;

use handler::ApiRequest;
use objects::Objects;
use resources::Resource;
use store::Store;

/// What `kcpshard serve` needs to serve the API.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Holds the objects, the PKI, the token and the kubeconfig.
    pub state_dir: PathBuf,
    /// Where the HTTPS API listens; port 0 picks a free port (the kubeconfig names the real one).
    pub api_listen: SocketAddr,
}

/// The API's state, shared by the HTTPS listener and in-process clients.
pub struct ApiServer {
    pub resources: Vec<Resource>,
    pub objects: Objects,
    pub metrics: Arc<metrics::ApiMetrics>,
    /// Whether serve is ready (its controller runs), answered by `/readyz`.
    pub readiness: crate::readiness::Readiness,
}

impl ApiServer {
    /// Opens the objects under `state_dir/objects`.
    pub fn open(state_dir: &Path) -> anyhow::Result<Arc<ApiServer>> {
        let store = Store::open(&state_dir.join("objects"), resources::STORAGE)
            .with_context(|| format!("cannot load the objects under {}", state_dir.join("objects").display()))?;
        Ok(Arc::new(ApiServer {
            resources: resources::all(),
            objects: Objects {
                store,
                admission: Default::default(),
            },
            metrics: Default::default(),
            readiness: Default::default(),
        }))
    }

    /// A kube client that calls this API in-process, with no TLS and no token (the controller's).
    pub fn client(self: &Arc<Self>) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let server = server.clone();
            async move {
                let (mut parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                // Writes without a fieldManager are recorded under the User-Agent's product: the
                // in-process clients (controller, GitOps) are `kcpshard`.
                parts
                    .headers
                    .entry(http::header::USER_AGENT)
                    .or_insert(http::HeaderValue::from_static(concat!(
                        "kcpshard/",
                        env!("CARGO_PKG_VERSION")
                    )));
                let request = ApiRequest {
                    method: parts.method,
                    path: parts.uri.path().to_string(),
                    query: parse_query(parts.uri.query()),
                    headers: parts.headers,
                    body,
                };
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(handler::handle(&server, request).await)
            }
        });
        kube::Client::new(service, "default")
    }
}

pub fn parse_query(query: Option<&str>) -> std::collections::HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// Another serve holds the state dir's lock.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Busy(String);

/// Holds `state_dir/serve.lock` for as long as it lives: one `serve` per state dir.
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock, waiting while another serve holds it (one that is stopping: serve
    /// --kubeconfig takes it once it holds its host's Lease, and the serve that held the Lease
    /// before may not have exited yet).
    pub async fn wait(state_dir: &Path) -> anyhow::Result<StateLock> {
        let mut told = false;
        loop {
            match StateLock::acquire(state_dir) {
                Ok(lock) => return Ok(lock),
                Err(e) if e.downcast_ref::<Busy>().is_some() => {
                    if !told {
                        tracing::info!("{e}; waiting for it to exit");
                        told = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn acquire(state_dir: &Path) -> anyhow::Result<StateLock> {
        crate::fsutil::create_private_dir(state_dir)
            .with_context(|| format!("cannot create the state dir {}", state_dir.display()))?;
        let path = state_dir.join("serve.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(StateLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Busy(format!(
                "another `kcpshard serve` is already running on the state dir {} (it holds {}); stop it first, or pass a different --state-dir",
                state_dir.display(),
                path.display()
            ))
            .into()),
            Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
        }
    }
}

/// Serves `server` over HTTPS on `config.api_listen` until `shutdown` resolves, after writing
/// `<state>/kubeconfig` for the address it got. The caller holds the [`StateLock`].
pub async fn serve(
    config: &ServeConfig,
    server: Arc<ApiServer>,
    shutdown: impl std::future::Future<Output = ()>,
    listening: tokio::sync::oneshot::Sender<SocketAddr>,
) -> anyhow::Result<()> {
    let pki = pki::load_or_create(&config.state_dir, config.api_listen.ip())
        .context("cannot prepare the API's certificates and token")?;
    let listener = tokio::net::TcpListener::bind(config.api_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} for the API: is another program using it? pass --api-listen with a free address",
                config.api_listen
            )
        })?;
    let address = listener.local_addr()?;
    let kubeconfig = kubeconfig::write(&config.state_dir, address, &pki)?;
    tracing::info!(%address, kubeconfig = %kubeconfig.display(), "serving the kcpshard API");
    let _ = listening.send(address);
    listener::serve(listener, server, &pki, shutdown).await
}
