//! On a shared API, one serve per host acts: the holder of the host's Lease
//! (`coordination.k8s.io/v1`, [`lease_name`] in `--lease-namespace`, default
//! [`DEFAULT_NAMESPACE`]). A second serve with the same `--host-name` (a standby, or one started
//! by mistake) waits, and says so in its log and its `/readyz`, naming the holder; it takes over
//! once the holder stops renewing (it released the Lease on SIGTERM, or was killed and the Lease
//! expired), within the Lease's duration.
//!
//! The Lease is kept by kube-lease-manager (server-side apply, so two serves cannot both take a
//! free Lease; the holder renews it `duration / 3` before it expires). A serve that loses it
//! (it could not renew in time, and another took it) stops acting at once: serve exits non-zero
//! so that its supervisor starts it again, as a waiting one. The processes it runs are not
//! touched either way: the next holder finds them through the state dir, as a restarted serve does.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerError, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::readiness::Readiness;

/// Where the hosts' Leases live unless `--lease-namespace` says otherwise (manifests/rbac.yaml
/// creates it).
pub const DEFAULT_NAMESPACE: &str = "kcpshard-system";
/// The `/readyz` check that fails while this serve waits for its host's Lease.
pub const READINESS_CHECK: &str = "host-lease";
/// How often a waiting serve looks who holds the Lease, for its log and `/readyz`.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How long a stopping serve waits for its release of the Lease to be written.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// The Lease of host `host`.
pub fn lease_name(host: &str) -> String {
    format!("kcpshard-host-{host}")
}

#[derive(Debug, thiserror::Error)]
pub enum HostLeaseError {
    #[error(
        "cannot use the Lease {namespace}/{name} on the shared API: {source}. Check that the namespace {namespace} exists and that this identity may get, create and patch leases in it (kubectl apply -f manifests/rbac.yaml)"
    )]
    Unusable {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error(
        "lost the Lease {namespace}/{name} (another serve of host {host} holds it now, or it could not be renewed in time): stopping, so that no two serves act on the same shards"
    )]
    Lost {
        namespace: String,
        name: String,
        host: String,
    },
}

/// This serve's claim on its host's Lease.
pub struct HostLease {
    api: Api<Lease>,
    namespace: String,
    name: String,
    host: String,
    pub identity: String,
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
}

impl HostLease {
    /// Creates the Lease when it is missing and starts trying to hold it, renewing it every
    /// `duration` less its grace (`duration / 3`) while held.
    pub async fn start(
        client: kube::Client,
        namespace: &str,
        host: &str,
        duration: Duration,
    ) -> Result<HostLease, HostLeaseError> {
        let name = lease_name(host);
        let mut random = [0u8; 4];
        getrandom::fill(&mut random).expect("the OS has random bytes");
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let identity = format!("{host}_{}_{hex}", std::process::id());
        let seconds = duration.as_secs().max(3);
        let params =
            LeaseParams::new(identity.clone(), seconds, seconds / 3).with_field_manager(format!("kcpshard-{identity}"));
        let manager = LeaseManager::new(client.clone(), &name, namespace, params, LeaseCreateMode::AutoCreate)
            .await
            .map_err(|source| HostLeaseError::Unusable {
                namespace: namespace.to_string(),
                name: name.clone(),
                source,
            })?;
        let (leading, task) = manager.watch().await;
        Ok(HostLease {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name,
            host: host.to_string(),
            identity,
            leading,
            task,
        })
    }

    /// `namespace/name` of the Lease.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Returns once this serve holds the Lease. While it waits, `/readyz` fails naming the
    /// holder, and the log says so whenever the holder changes.
    pub async fn acquired(&mut self, readiness: &Readiness) -> Result<(), HostLeaseError> {
        let mut told: Option<Option<String>> = None;
        loop {
            if *self.leading.borrow_and_update() {
                readiness.pass(READINESS_CHECK);
                tracing::info!(lease = %self.lease(), identity = %self.identity, "holding the host's Lease: this serve acts for host {}", self.host);
                return Ok(());
            }
            if self.task.is_finished() {
                return Err(self.lost());
            }
            let holder = self.holder().await;
            if told.as_ref() != Some(&holder) {
                let message = match &holder {
                    Some(holder) => format!(
                        "waiting for the Lease {}: another serve of host {} holds it ({holder}); this one acts once it is released or expires",
                        self.lease(),
                        self.host,
                    ),
                    None => format!("taking the Lease {} (nobody holds it)", self.lease()),
                };
                tracing::info!(identity = %self.identity, "{message}");
                readiness.fail(READINESS_CHECK, message);
                told = Some(holder);
            }
            let _ = tokio::time::timeout(LOOK_EVERY, self.leading.changed()).await;
        }
    }

    /// Whether this serve holds the Lease now.
    pub fn holds(&self) -> bool {
        *self.leading.borrow()
    }

    /// Resolves when this serve, holding the Lease, no longer does: it must stop acting.
    pub async fn lost_it(&mut self) -> HostLeaseError {
        let _ = self.leading.wait_for(|leading| !leading).await;
        self.lost()
    }

    fn lost(&self) -> HostLeaseError {
        HostLeaseError::Lost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            host: self.host.clone(),
        }
    }

    /// Gives the Lease up (if held), so that a waiting serve takes over as soon as it next looks.
    pub async fn release(self) {
        let HostLease { leading, task, .. } = self;
        // The manager releases the Lease when the last receiver goes.
        drop(leading);
        match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the host's Lease"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "cannot release the host's Lease; it expires by itself"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the Lease's task ended badly; the Lease expires by itself"),
            Err(_) => {
                tracing::warn!("the release of the host's Lease took over {RELEASE_TIMEOUT:?}; it expires by itself")
            }
        }
    }

    /// Who holds the Lease now, as the API says (None: nobody, or it cannot be read).
    async fn holder(&self) -> Option<String> {
        match self.api.get(&self.name).await {
            Ok(lease) => lease.spec.and_then(|s| s.holder_identity),
            Err(e) => {
                tracing::warn!(lease = %self.lease(), error = %e, "cannot read the host's Lease");
                None
            }
        }
    }
}
