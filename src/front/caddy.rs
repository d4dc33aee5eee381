//! Caddy as the front (`spec.front.type: Caddy`): a caddy the user runs, whose `reverse_proxy`
//! handler, marked `"@id": <upstreamId>`, spreads requests over the serving slots. kcpshard only talks to
//! caddy's admin API (docs/background.md section 9; its active health checks on `/readyz` take a dead slot out of rotation, mechanism B): [`CaddyAdmin::upstreams`] reads the
//! handler's upstreams (and so checks that caddy answers and that the @id names a reverse_proxy
//! handler), and [`CaddyAdmin::serve`] replaces them with the serving slots' addresses
//! (`PATCH /id/<id>/upstreams`) and reads them back. [`render_config`] is the caddy JSON config
//! kcpshard recommends (`kcpshard front caddy-config` prints it; docs/how-to/fronts.md (Fronts,
//! Caddy) says why each setting is there).
//!
//! What Debian's caddy (2.6.2) does, as `tests/caddy_front.rs` measures:
//! - Every change through the admin API reloads the whole config: every server, the admin
//!   endpoint included, is replaced; the listening sockets are kept, so no dial is refused. A
//!   PATCH that changes nothing does not reload, and [`CaddyAdmin::serve`] does not even send one
//!   when the upstream is already right: a reload cuts every upgraded stream (`kubectl exec`,
//!   `attach`, `port-forward`) on every site of that caddy.
//! - A reload closes the idle keep-alive connections of clients; requests already in flight
//!   finish on the old upstream, and watches (chunked responses) stay open until the old slot
//!   ends them. With `flush_interval: -1`, caddy 2.6 instead cancels every proxied request in
//!   flight at a reload (a 502, or a watch cut short), so the rendered config leaves it unset:
//!   caddy flushes a response of unknown length (a watch) at once anyway.
//! - Caddy accepts any `dial` string in a PATCH; a wrong one only fails the requests. Hence
//!   [`CaddyAdmin::serve`] takes `SocketAddr`s.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// Caddy's own default admin address, and kcpshard's default for `spec.front.caddy.adminAddress`.
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:2019";
/// The @id the rendered config gives the reverse_proxy handler; the docs' `upstreamId`.
pub const DEFAULT_UPSTREAM_ID: &str = "kcp-proxy";
/// The name caddy checks each slot's serving certificate against: slots listen on 127.0.0.1, and
/// kcp's certificate carries that address.
pub const SLOT_SERVER_NAME: &str = "127.0.0.1";
/// The tag that ties the server's TLS policy to kcp's certificate among the certificates caddy has.
/// The servers of caddy's http app in its config API.
const HTTP_SERVERS: &str = "/config/apps/http/servers";
const CERTIFICATE_TAG: &str = "kcpshard";
/// How often caddy asks each upstream's `/readyz`, and how long it waits for the answer. A check
/// that times out marks the upstream unhealthy like a failed one (caddy 2.6.2
/// reverseproxy/healthchecks.go:295-302), an unhealthy upstream gets no request
/// (reverseproxy.go:373-376), and a kcp on a busy machine (a new slot starting beside
/// it) can take over 1 s to answer while it serves: with one upstream, caddy then answers 503
/// (docs/reliability.md). 5 s still takes a hung slot out within seconds.
const HEALTH_INTERVAL: &str = "1s";
const HEALTH_TIMEOUT: &str = "5s";
/// Connecting to the admin API; it answers at once or not at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One admin request, including a reload (milliseconds when measured).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum CaddyError {
    #[error(
        "caddy's admin API at {admin} does not answer ({cause}): start caddy with the config from \
         docs/how-to/fronts.md (`kcpshard front caddy-config`), or fix spec.front.caddy.adminAddress"
    )]
    Unreachable { admin: String, cause: String },

    #[error("caddy's admin API at {admin} did not answer {what} within {seconds} s; see caddy's log")]
    Timeout { admin: String, what: String, seconds: u64 },

    #[error(
        "caddy has no object with @id {id} (admin API {admin}): add \"@id\": \"{id}\" to the reverse_proxy \
         handler that forwards to kcp, or fix spec.front.caddy.upstreamId"
    )]
    UnknownId { admin: String, id: String },

    #[error(
        "caddy's object with @id {id} (admin API {admin}) is {found}, not a reverse_proxy handler: move \
         \"@id\": \"{id}\" onto the reverse_proxy handler that forwards to kcp"
    )]
    NotReverseProxy { admin: String, id: String, found: String },

    #[error(
        "caddy's admin API refused the address {admin} ({message}): set spec.front.caddy.adminAddress to \
         the address in caddy's admin.listen, or add it to admin.origins"
    )]
    HostNotAllowed { admin: String, message: String },

    #[error("caddy's admin API at {admin} refused {what} with {status}: {message}")]
    Refused {
        admin: String,
        what: String,
        status: u16,
        message: String,
    },

    #[error(
        "caddy's admin API at {admin} accepted the upstreams {want} for @id {id}, but its upstreams \
         read back as {got:?}; is another program changing caddy's config?"
    )]
    NotApplied {
        admin: String,
        id: String,
        want: String,
        got: Vec<String>,
    },

    #[error("caddy's admin API at {admin} answered {what} with something kcpshard cannot read: {detail}")]
    Protocol {
        admin: String,
        what: String,
        detail: String,
    },

    #[error("invalid upstream id {id:?}: write the @id of the caddy handler alone, e.g. kcp-proxy")]
    InvalidId { id: String },

    #[error("{what} {path} is not valid UTF-8, which caddy's JSON config cannot hold; use another path")]
    NonUtf8Path { what: &'static str, path: PathBuf },
}

/// What [`CaddyAdmin::serve`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// The handler already sent everything to that address; caddy was not touched (no reload).
    Unchanged,
    /// The upstreams were replaced (caddy reloaded its config); `from` is what they were.
    Switched { from: Vec<String> },
}

/// A client of caddy's admin API over plain HTTP on `host:port` (caddy's `admin.listen`). Each
/// request opens its own connection: every config change restarts caddy's admin endpoint.
#[derive(Debug, Clone)]
pub struct CaddyAdmin {
    address: String,
}

impl CaddyAdmin {
    /// `address` is `host:port`, as in `spec.front.caddy.adminAddress`.
    pub fn new(address: impl Into<String>) -> CaddyAdmin {
        CaddyAdmin {
            address: address.into(),
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// The `dial` addresses of the upstreams of the reverse_proxy handler with @id `id`, in order.
    /// This is also the check that caddy's admin API answers and that `id` names a reverse_proxy
    /// handler: each failure comes as an error that says what to fix.
    pub async fn upstreams(&self, id: &str) -> Result<Vec<String>, CaddyError> {
        check_id(id)?;
        let what = format!("GET /id/{id}");
        let (status, body) = self.call(Method::GET, &format!("/id/{id}"), None).await?;
        if !status.is_success() {
            return Err(self.refusal(id, &what, status, &body));
        }
        let object: Value = serde_json::from_slice(&body).map_err(|e| self.protocol(&what, e.to_string()))?;
        let handler = object.get("handler").and_then(Value::as_str);
        if handler != Some("reverse_proxy") {
            let found = match handler {
                Some(other) => format!("a {other} handler"),
                None => "an object with no \"handler\"".to_string(),
            };
            return Err(CaddyError::NotReverseProxy {
                admin: self.address.clone(),
                id: id.to_string(),
                found,
            });
        }
        match object.get("upstreams") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(upstreams)) => upstreams
                .iter()
                .map(|upstream| {
                    upstream
                        .get("dial")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| self.protocol(&what, format!("an upstream without a dial address: {upstream}")))
                })
                .collect(),
            Some(other) => Err(self.protocol(&what, format!("upstreams is not a list: {other}"))),
        }
    }

    /// Makes the handler with @id `id` spread requests over `to` (its serving set; caddy's
    /// active health checks take a slot that fails `/readyz` out of rotation, see
    /// [`render_config`]), and reads it back. Does nothing when that is already so: each change
    /// reloads caddy, which cuts upgraded streams (`exec`). Callers check each new slot's `/readyz`
    /// on its own port first (docs/background.md section 5).
    pub async fn serve(&self, id: &str, to: &[SocketAddr]) -> Result<Switch, CaddyError> {
        let want: Vec<String> = to.iter().map(SocketAddr::to_string).collect();
        let before = self.upstreams(id).await?;
        if before == want {
            return Ok(Switch::Unchanged);
        }
        let what = format!("PATCH /id/{id}/upstreams");
        let body = Value::Array(want.iter().map(|dial| json!({ "dial": dial })).collect()).to_string();
        let (status, answer) = self
            .call(Method::PATCH, &format!("/id/{id}/upstreams"), Some(body))
            .await?;
        if !status.is_success() {
            return Err(self.refusal(id, &what, status, &answer));
        }
        let after = self.upstreams(id).await?;
        if after != want {
            return Err(CaddyError::NotApplied {
                admin: self.address.clone(),
                id: id.to_string(),
                want: want.join(", "),
                got: after,
            });
        }
        Ok(Switch::Switched { from: before })
    }

    /// How many upstreams of caddy's reverse_proxy handlers, in every server of its http app,
    /// dial `address`.
    pub async fn dialling(&self, address: &str) -> Result<usize, CaddyError> {
        let mut servers = self.http_servers().await?;
        Ok(redirect_upstreams(&mut servers, address, address))
    }

    /// Sends to `to` what caddy's reverse_proxy handlers, in every server of its http app, send to
    /// `from` (each upstream whose `dial` is `from`), in one change: one reload. Returns how many
    /// upstreams dialled `from`.
    pub async fn redirect(&self, from: &str, to: &str) -> Result<usize, CaddyError> {
        let mut servers = self.http_servers().await?;
        let moved = redirect_upstreams(&mut servers, from, to);
        if moved == 0 {
            return Ok(moved);
        }
        let (status, answer) = self
            .call(Method::PATCH, HTTP_SERVERS, Some(servers.to_string()))
            .await?;
        if !status.is_success() {
            return Err(self.refusal("", &format!("PATCH {HTTP_SERVERS}"), status, &answer));
        }
        Ok(moved)
    }

    /// The servers of caddy's http app, as its config API gives them.
    async fn http_servers(&self) -> Result<Value, CaddyError> {
        let (status, body) = self.call(Method::GET, HTTP_SERVERS, None).await?;
        if !status.is_success() {
            return Err(self.refusal("", &format!("GET {HTTP_SERVERS}"), status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| self.protocol(&format!("GET {HTTP_SERVERS}"), e.to_string()))
    }

    async fn call(&self, method: Method, path: &str, body: Option<String>) -> Result<(StatusCode, Bytes), CaddyError> {
        let what = format!("{method} {path}");
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(CaddyError::Timeout {
                admin: self.address.clone(),
                what,
                seconds: REQUEST_TIMEOUT.as_secs(),
            }),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(StatusCode, Bytes), CaddyError> {
        let what = format!("{method} {path}");
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.address.as_str())).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(self.unreachable(e.to_string())),
            Err(_) => return Err(self.unreachable(format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()))),
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        // Caddy checks Host against the addresses its admin endpoint listens on (DNS rebinding),
        // and wants a JSON content type on every request that carries a body.
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.address)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.protocol(&what, format!("cannot build the request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| self.protocol(&what, e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.protocol(&what, e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// The error for a non-2xx answer; caddy's own message is `{"error": "..."}`.
    fn refusal(&self, id: &str, what: &str, status: StatusCode, body: &[u8]) -> CaddyError {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
        if status == StatusCode::NOT_FOUND && message.starts_with("unknown object ID") {
            return CaddyError::UnknownId {
                admin: self.address.clone(),
                id: id.to_string(),
            };
        }
        if status == StatusCode::FORBIDDEN && message.starts_with("host not allowed") {
            return CaddyError::HostNotAllowed {
                admin: self.address.clone(),
                message,
            };
        }
        CaddyError::Refused {
            admin: self.address.clone(),
            what: what.to_string(),
            status: status.as_u16(),
            message,
        }
    }

    fn unreachable(&self, cause: String) -> CaddyError {
        CaddyError::Unreachable {
            admin: self.address.clone(),
            cause,
        }
    }

    fn protocol(&self, what: &str, detail: String) -> CaddyError {
        CaddyError::Protocol {
            admin: self.address.clone(),
            what: what.to_string(),
            detail,
        }
    }
}

/// Sets `dial` to `to` in every reverse_proxy upstream under `config` that dials `from`; how many.
fn redirect_upstreams(config: &mut Value, from: &str, to: &str) -> usize {
    match config {
        Value::Object(object) => {
            let mut moved = 0;
            if object.get("handler").and_then(Value::as_str) == Some("reverse_proxy")
                && let Some(Value::Array(upstreams)) = object.get_mut("upstreams")
            {
                for upstream in upstreams.iter_mut() {
                    if upstream.get("dial").and_then(Value::as_str) == Some(from) {
                        upstream["dial"] = json!(to);
                        moved += 1;
                    }
                }
            }
            moved
                + object
                    .iter_mut()
                    .filter(|(key, _)| key.as_str() != "upstreams")
                    .map(|(_, value)| redirect_upstreams(value, from, to))
                    .sum::<usize>()
        }
        Value::Array(items) => items.iter_mut().map(|v| redirect_upstreams(v, from, to)).sum(),
        _ => 0,
    }
}

/// The id goes into a URL path as one segment.
fn check_id(id: &str) -> Result<(), CaddyError> {
    if id.is_empty() || id.contains(['/', '?', '#', '%', ' ']) || id.chars().any(char::is_control) {
        return Err(CaddyError::InvalidId { id: id.to_string() });
    }
    Ok(())
}

/// What [`render_config`] needs: the shard's front address and serving material, and where caddy
/// keeps its admin endpoint and its storage.
#[derive(Debug, Clone)]
pub struct CaddyConfig {
    /// The address clients dial (`spec.front.listen`); caddy serves HTTPS there.
    pub listen: SocketAddr,
    /// caddy's admin endpoint, `host:port` (`spec.front.caddy.adminAddress`).
    pub admin_address: String,
    /// The @id of the reverse_proxy handler (`spec.front.caddy.upstreamId`).
    pub upstream_id: String,
    /// kcp's serving certificate and key (the shard's shared `apiserver.crt`/`apiserver.key`),
    /// which caddy serves to clients so that kcp's kubeconfigs verify it unchanged.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA caddy verifies the slots with (kcp's `apiserver.crt` holds its CA).
    pub ca_file: PathBuf,
    /// The serving slots, if known; without them the upstreams start empty until the controller's
    /// first change (caddy answers 503 "no upstreams available" once its try_duration has passed).
    pub upstreams: Vec<SocketAddr>,
    /// caddy's storage root (locks, and the local CA its pki app makes, never installed).
    pub storage_dir: PathBuf,
}

/// The caddy JSON config kcpshard recommends for one shard (docs/how-to/fronts.md (Fronts, Caddy)
/// explains each setting). Paths are written as given: pass absolute ones, caddy resolves relative
/// paths against its own working directory.
pub fn render_config(config: &CaddyConfig) -> Result<Value, CaddyError> {
    check_id(&config.upstream_id)?;
    let path = |what: &'static str, path: &Path| {
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| CaddyError::NonUtf8Path {
                what,
                path: path.to_path_buf(),
            })
    };
    let cert = path("the certificate file", &config.cert_file)?;
    let key = path("the key file", &config.key_file)?;
    let ca = path("the CA file", &config.ca_file)?;
    let storage = path("the storage directory", &config.storage_dir)?;
    let upstreams: Vec<Value> = config
        .upstreams
        .iter()
        .map(|address| json!({ "dial": address.to_string() }))
        .collect();
    Ok(json!({
        "admin": { "listen": config.admin_address },
        "storage": { "module": "file_system", "root": storage },
        "apps": {
            // Never let caddy put its local CA into the system trust store (docs/background.md
            // section 9: a tls.automation policy with the internal issuer did exactly that).
            "pki": { "certificate_authorities": { "local": { "install_trust": false } } },
            // kcp's own certificate, loaded as is; no automation block, so caddy never issues or
            // renews a certificate for this server.
            "tls": {
                "certificates": {
                    "load_files": [{ "certificate": cert, "key": key, "tags": [CERTIFICATE_TAG] }]
                }
            },
            "http": {
                "servers": {
                    "kcpshard": {
                        "listen": [config.listen.to_string()],
                        // h1 and h2 over TCP only: no HTTP/3 UDP listener on the front address.
                        "protocols": ["h1", "h2"],
                        "automatic_https": { "disable": true },
                        "tls_connection_policies": [
                            { "certificate_selection": { "any_tag": [CERTIFICATE_TAG] } }
                        ],
                        "routes": [{
                            "handle": [{
                                "handler": "reverse_proxy",
                                "@id": config.upstream_id,
                                "transport": {
                                    "protocol": "http",
                                    // Upgrades (exec, attach, port-forward) need HTTP/1.1 to kcp.
                                    "versions": ["1.1"],
                                    "tls": {
                                        "root_ca_pem_files": [ca],
                                        "server_name": SLOT_SERVER_NAME
                                    }
                                },
                                // A slot restarting its listener costs latency, not an error (the
                                // same window as kcpshard's TCP front); least_conn, as that front.
                                "load_balancing": {
                                    "selection_policy": { "policy": "least_conn" },
                                    "try_duration": "2s",
                                    "try_interval": "50ms"
                                },
                                // Every serving slot's /readyz, through the transport above: a slot
                                // that fails it (stopping, hung, dead) leaves the rotation at the
                                // next check, without a config change, and rejoins once it passes.
                                // kcp answers /readyz without credentials (AlwaysAllowPaths).
                                "health_checks": {
                                    "active": {
                                        "uri": "/readyz",
                                        "interval": HEALTH_INTERVAL,
                                        "timeout": HEALTH_TIMEOUT,
                                        "expect_status": 200
                                    }
                                },
                                "upstreams": upstreams
                            }]
                        }]
                    }
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests;
