//! Whether `kcpshard serve` is ready, as `/readyz` says: ready unless one of its checks fails
//! (the controller ended; on a shared API, the host's Lease is another serve's). The answer has
//! kube-apiserver's shape, `[-]<check> failed: <reason>` lines then `readyz check failed`, so a
//! supervisor or a person reads why.
//!
//! The local API answers `/readyz` itself (src/apiserver); a serve without one (`--kubeconfig`)
//! answers it, `/healthz`, `/livez` and `/metrics` on [`serve_probes`]: plain HTTP, meant for
//! loopback (`--probe-listen`).
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use http::{Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::apiserver::metrics::ApiMetrics;

/// The failing checks, by name. Cheap to clone; every clone is the same state.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<Mutex<BTreeMap<&'static str, String>>>);

impl Readiness {
    /// From now on `check` fails with `reason`.
    pub fn fail(&self, check: &'static str, reason: impl Into<String>) {
        self.lock().insert(check, reason.into());
    }

    /// `check` passes again.
    pub fn pass(&self, check: &'static str) {
        self.lock().remove(check);
    }

    /// Why `check` fails, if it does.
    pub fn reason(&self, check: &str) -> Option<String> {
        self.lock().get(check).cloned()
    }

    /// None when ready; else what `/readyz` answers with its 503.
    pub fn report(&self) -> Option<String> {
        let failing = self.lock();
        if failing.is_empty() {
            return None;
        }
        let mut body: String = failing
            .iter()
            .map(|(check, reason)| format!("[-]{check} failed: {reason}\n"))
            .collect();
        body.push_str("readyz check failed\n");
        Some(body)
    }

    /// The status and body of `/readyz`.
    pub fn answer(&self) -> (StatusCode, String) {
        match self.report() {
            Some(body) => (StatusCode::SERVICE_UNAVAILABLE, body),
            None => (StatusCode::OK, "ok".to_string()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Answers `/readyz`, `/healthz`, `/livez` and `/metrics` over plain HTTP on `listener` until
/// `shutdown` resolves.
pub async fn serve_probes(
    listener: TcpListener,
    readiness: Readiness,
    metrics: Arc<ApiMetrics>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed on the probe listener");
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let (readiness, metrics) = (readiness.clone(), metrics.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let (status, content_type, body) = match request.uri().path() {
                    "/readyz" => {
                        let (status, body) = readiness.answer();
                        (status, "text/plain", body)
                    }
                    "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok".to_string()),
                    "/metrics" => (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        metrics.encode(),
                    ),
                    _ => (
                        StatusCode::NOT_FOUND,
                        "text/plain",
                        "not found: /readyz, /healthz, /livez, /metrics\n".to_string(),
                    ),
                };
                let response = Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, content_type)
                    .body(Full::new(bytes::Bytes::from(body)))
                    .expect("responses are well formed");
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_names_every_failing_check_until_it_passes() {
        let readiness = Readiness::default();
        assert_eq!(readiness.answer(), (StatusCode::OK, "ok".to_string()));
        readiness.fail("host-lease", "waiting for the Lease");
        readiness.fail("controller", "the controller stopped");
        let (status, body) = readiness.answer();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "[-]controller failed: the controller stopped\n[-]host-lease failed: waiting for the Lease\nreadyz check failed\n"
        );
        readiness.pass("host-lease");
        readiness.pass("controller");
        assert_eq!(readiness.answer().0, StatusCode::OK);
    }
}
