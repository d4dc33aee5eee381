//! The API serve reads: its own from the state dir, or a shared one (`--kubeconfig`) with a
//! listener of its own for the probes.
use super::*;

/// The API serve reads: a future that serves it (or the probes) until shutdown, and what the
/// rest of serve needs of it.
pub(super) struct Api {
    pub(super) client: kube::Client,
    pub(super) readiness: Readiness,
    pub(super) metrics: Arc<ApiMetrics>,
    pub(super) serving: Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>,
    /// Sent once the API (or the probe listener) listens.
    pub(super) listening: tokio::sync::oneshot::Receiver<SocketAddr>,
    pub(super) kind: ApiKind,
}

impl Api {
    /// The local API from the state dir.
    pub(super) fn local(args: &Args, until: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<Api> {
        let config = ServeConfig {
            state_dir: args.state_dir.clone(),
            api_listen: args.api_listen,
        };
        let server = ApiServer::open(&config.state_dir)?;
        let (tx, listening) = tokio::sync::oneshot::channel();
        Ok(Api {
            client: server.client(),
            readiness: server.readiness.clone(),
            metrics: server.metrics.clone(),
            kind: ApiKind::Local,
            listening,
            serving: Box::pin(async move { apiserver::serve(&config, server, until, tx).await }),
        })
    }

    /// The shared API of `kubeconfig`, and the probe listener.
    pub(super) async fn shared(
        args: &Args,
        kubeconfig: &Path,
        until: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<Api> {
        let file = kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("cannot read the kubeconfig {}", kubeconfig.display()))?;
        let options = kube::config::KubeConfigOptions {
            context: args.context.clone(),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(file, &options)
            .await
            .with_context(|| format!("cannot use the kubeconfig {}", kubeconfig.display()))?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).context("cannot build a client of the shared API")?;
        let shards: kube::Api<KcpShard> = kube::Api::all(client.clone());
        match shards.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => anyhow::bail!(
                "the API at {server} does not serve kcpshards.kcpshard.io: apply the CRD there first (kcpshard crd | kubectl apply -f -)"
            ),
            Err(e) => return Err(e).with_context(|| format!("cannot list the KcpShards of the API at {server}")),
        }
        let listener = tokio::net::TcpListener::bind(args.probe_listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} for /readyz: is another program using it? pass --probe-listen with a free address",
                    args.probe_listen
                )
            })?;
        let address = listener.local_addr()?;
        tracing::info!(%server, probes = %address, "reconciling the KcpShards of a shared API; /readyz, /healthz and /metrics over HTTP");
        let (tx, listening) = tokio::sync::oneshot::channel();
        let _ = tx.send(address);
        let readiness = Readiness::default();
        let metrics = Arc::new(ApiMetrics::default());
        let serving = readiness::serve_probes(listener, readiness.clone(), metrics.clone(), until);
        Ok(Api {
            client,
            readiness,
            metrics,
            kind: ApiKind::Shared,
            listening,
            serving: Box::pin(async move {
                serving.await;
                Ok(())
            }),
        })
    }
}
