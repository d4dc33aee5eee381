//! HTTPS serving: TLS with ALPN (h2 and http/1.1, as kubectl negotiates), the bearer-token check,
//! the body size limit, and graceful shutdown.
use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use http::Request;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::ApiServer;
use super::error::ApiError;
use super::handler::{self, ApiRequest, Body, MAX_BODY};
use super::pki::Pki;

pub async fn serve(
    listener: TcpListener,
    server: Arc<ApiServer>,
    pki: &Pki,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let acceptor = tls_acceptor(pki)?;
    let token: Arc<str> = Arc::from(pki.token.as_str());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, server, token) = (acceptor.clone(), server.clone(), token.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let (server, token) = (server.clone(), token.clone());
                async move { Ok::<_, std::convert::Infallible>(answer(&server, &token, request).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(tls), service).into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    // Watches never end by themselves; give requests in flight a moment, then stop.
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    }
    Ok(())
}

async fn answer(server: &Arc<ApiServer>, token: &str, request: Request<Incoming>) -> http::Response<Body> {
    if !authorized(&request, token) {
        return handler::error_response(&ApiError::Unauthorized);
    }
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return handler::error_response(&ApiError::TooLarge { limit: MAX_BODY });
        }
        Err(e) => return handler::error_response(&ApiError::BadRequest(format!("cannot read the request body: {e}"))),
    };
    let request = ApiRequest {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: super::parse_query(parts.uri.query()),
        headers: parts.headers,
        body,
    };
    handler::handle(server, request).await
}

/// `Authorization: Bearer <token>`, compared in constant time.
fn authorized(request: &Request<Incoming>, token: &str) -> bool {
    let Some(given) = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(given) = given.strip_prefix("Bearer ") else {
        return false;
    };
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn tls_acceptor(pki: &Pki) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(pki.serving_cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the serving certificate does not parse")?;
    let key =
        PrivateKeyDer::from_pem_slice(pki.serving_key_pem.as_bytes()).context("the serving key does not parse")?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the serving certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
