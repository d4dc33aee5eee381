//! A stand-in for kcp, for the controller's fast tests (never where the end-to-end suite checks
//! kcp's behaviour, which it runs the real kcp for; tests/e2e_shared_api.rs runs it for a second
//! host's shard, where only which serve starts and reports what is checked). It takes a slot's command line (`start --root-directory=... --secure-port=...`)
//! and behaves, on the surface the controller uses, as kcp does:
//! - it writes the shared material into its root (or keeps what was seeded there) and an
//!   `admin.kubeconfig` whose `shard-base`, `base` and `root` contexts reach it;
//! - it accepts the shard admin's token and those of `--token-auth-file`, as kcp does;
//! - it serves HTTPS on its port: `/readyz` (500 for `STANDIN_READY_AFTER_MS`, default 300, after
//!   its start, and from SIGTERM on), the controllers Lease in `system:admin`, and workspaces in
//!   `root`, which are Ready while some stand-in holds the Lease;
//! - it runs a leader election over a file in the shard's directory (three levels above its root:
//!   `shards/<name>/stand-in-lease`, shared by every stand-in of a shard) with kcp's rules: a 60 s
//!   Lease, never released, and it logs `"(re-)starting leader election" identity="..."` as kcp;
//!   kcpshard may hand the Lease to another identity (a PUT, or a POST when there is none), and
//!   that stand-in leads at its next try, as client-go's elector does;
//! - on SIGTERM it fails `/readyz`, stops listening after `--shutdown-delay-duration`, stops leading
//!   (its election reaches the Lease through its own listener, as kcp's does) and exits;
//! - it serves kcp's system CRDs (one, `shards.core.kcp.io`) and empty lists of APIResourceSchemas
//!   and APIExports, which a preflight compares;
//! - a root under a shard's `preflight/` (a preflight on a copy of the data) has a Lease file of
//!   its own there: the copy's, not the slots';
//! - `--stand-in-ready-after-ms=N` (an extra argument) overrides `STANDIN_READY_AFTER_MS`;
//! - an extra argument containing `bogus` makes it exit 1 with `Error: unknown flag: <arg>`;
//! - `--stand-in-hang-posts-while=PATH`: a POST of a workspace waits while PATH exists (a kcp
//!   that hangs on a write), after creating PATH with the extension `seen`;
//! - `--stand-in-exit-if-exists=PATH` makes it exit 1 at start while PATH exists (a kcp that
//!   crashes on its data from some point on).
//!
//! Hangs and crashes are real: tests SIGSTOP and SIGKILL it.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const LEASE_SECONDS: u64 = 60;
const LEASE_PATH: &str =
    "/clusters/system:admin/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kcp-controllers";
const LEASES_PATH: &str = "/clusters/system:admin/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
const WORKSPACES_PATH: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
const SYSTEM_CRDS: &str = "/clusters/system:system-crds/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const CRDS: &str = r#"{"items":[{"metadata":{"name":"shards.core.kcp.io"},"spec":{"versions":[{"name":"v1alpha1","served":true,"storage":true}]},"status":{"storedVersions":["v1alpha1"]}}]}"#;

/// kcp's listener: with `--permit-port-sharing`, SO_REUSEPORT, so that it binds the port the
/// controller holds for it.
fn listen(port: u16, share_port: bool) -> tokio::net::TcpListener {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_reuse_port(share_port).unwrap();
    socket
        .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    socket.listen(1024).unwrap();
    socket.set_nonblocking(true).unwrap();
    tokio::net::TcpListener::from_std(socket.into()).unwrap()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    args.iter().find_map(|a| a.strip_prefix(&prefix)).map(str::to_string)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The Lease: `holder renew_seconds`, in a file every stand-in of a shard shares.
struct Lease {
    path: PathBuf,
}

impl Lease {
    fn read(&self) -> Option<(String, u64)> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let (holder, renewed) = text.trim().split_once(' ')?;
        Some((holder.to_string(), renewed.parse().ok()?))
    }

    fn holder(&self) -> Option<String> {
        self.read().map(|(h, _)| h)
    }

    /// One try of client-go's election: take a free or expired Lease, renew our own.
    fn try_lead(&self, me: &str) {
        let free = match self.read() {
            None => true,
            Some((holder, renewed)) => holder == me || now_secs() > renewed + LEASE_SECONDS,
        };
        if free {
            self.name(me);
        }
    }

    /// The Lease names `holder`, renewed now (a try that leads, or kcpshard's hand-over).
    fn name(&self, holder: &str) {
        let tmp = self.path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, format!("{holder} {}", now_secs())).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    fn leader_alive(&self) -> bool {
        self.read().is_some_and(|(_, renewed)| now_secs() <= renewed + 5)
    }
}

/// The serving certificate and key (kept when seeded: the shard's), its CA, and the shard admin's
/// token.
fn material(root: &Path) -> (String, String, String, String) {
    let cert = root.join("apiserver.crt");
    let key = root.join("apiserver.key");
    let kubeconfig = root.join("admin.kubeconfig");
    if let (Ok(c), Ok(k), Ok(kc)) = (
        std::fs::read_to_string(&cert),
        std::fs::read_to_string(&key),
        std::fs::read_to_string(&kubeconfig),
    ) {
        let token = kc
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .unwrap_or_default()
            .to_string();
        let ca = c
            .split_inclusive("-----END CERTIFICATE-----\n")
            .last()
            .unwrap_or(&c)
            .to_string();
        return (c, k, ca, token);
    }
    let pki = kcpshard::apiserver::pki::load_or_create(&root.join(".stand-in"), "127.0.0.1".parse().unwrap())
        .expect("stand-in key material");
    let chain = format!("{}{}", pki.serving_cert_pem, pki.ca_pem);
    std::fs::write(&cert, &chain).unwrap();
    std::fs::write(&key, &pki.serving_key_pem).unwrap();
    std::fs::write(root.join("sa.key"), &pki.serving_key_pem).unwrap();
    std::fs::write(root.join(".admin-token-store"), b"stand-in").unwrap();
    (chain, pki.serving_key_pem, pki.ca_pem, pki.token)
}

fn kubeconfig(ca: &str, token: &str, url: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (name, path) in [
        ("base", ""),
        ("root", "/clusters/root"),
        ("system:admin", "/clusters/system:admin"),
    ] {
        text += &format!("- name: {name}\n  cluster:\n    server: {url}{path}\n    certificate-authority-data: {ca}\n");
    }
    text += &format!(
        "users:\n- name: shard-admin\n  user:\n    token: {token}\n- name: kcp-admin\n  user:\n    token: {token}\n"
    );
    text += "contexts:\n";
    for (name, cluster, user) in [
        ("shard-base", "base", "shard-admin"),
        ("system:admin", "system:admin", "shard-admin"),
        ("base", "base", "kcp-admin"),
        ("root", "root", "kcp-admin"),
    ] {
        text += &format!("- name: {name}\n  context:\n    cluster: {cluster}\n    user: {user}\n");
    }
    text + "current-context: root\n"
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bogus) = args.iter().find(|a| a.contains("bogus")) {
        eprintln!("Error: unknown flag: {bogus}");
        std::process::exit(1);
    }
    if let Some(marker) = flag(&args, "stand-in-exit-if-exists")
        && Path::new(&marker).exists()
    {
        eprintln!("Error: told to fail by {marker}");
        std::process::exit(1);
    }
    let root = PathBuf::from(flag(&args, "root-directory").expect("--root-directory"));
    let port: u16 = flag(&args, "secure-port").expect("--secure-port").parse().unwrap();
    let delay = kcpshard::api::parse_duration(&flag(&args, "shutdown-delay-duration").unwrap_or("0s".into())).unwrap();
    let front = flag(&args, "shard-base-url").unwrap_or_else(|| format!("https://127.0.0.1:{port}"));
    // shards/<name>/slots/<slot>/root, or shards/<name>/preflight/copy/root.
    let shard_dir = root.ancestors().nth(3).expect("root is three levels below the shard");
    let lease_dir = if root
        .parent()
        .and_then(Path::parent)
        .is_some_and(|p| p.ends_with("preflight"))
    {
        root.parent().unwrap().to_path_buf()
    } else {
        shard_dir.to_path_buf()
    };
    let lease = Arc::new(Lease {
        path: lease_dir.join("stand-in-lease"),
    });
    let ready_after = Duration::from_millis(
        flag(&args, "stand-in-ready-after-ms")
            .or_else(|| std::env::var("STANDIN_READY_AFTER_MS").ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    std::fs::create_dir_all(&root).unwrap();
    let (chain, key, ca, token) = material(&root);
    // As kcp's --token-auth-file: `token,user,uid,groups` lines, read once at start.
    let mut tokens = vec![token.clone()];
    if let Some(file) = flag(&args, "token-auth-file") {
        let text = std::fs::read_to_string(&file).expect("the token file");
        tokens.extend(text.lines().filter_map(|l| l.split(',').next()).map(str::to_string));
    }
    let tokens = Arc::new(tokens);
    std::fs::write(root.join("admin.kubeconfig"), kubeconfig(&ca, &token, &front)).unwrap();

    let me = format!("stand-in_{}", std::process::id());
    println!(
        "I0000 00:00:00.000000 1 server.go:767] \"(re-)starting leader election\" identity=\"{me}\" namespace=\"kube-system\" name=\"kcp-controllers\""
    );
    let serving = Arc::new(AtomicBool::new(true));
    {
        let (lease, me, serving) = (lease.clone(), me.clone(), serving.clone());
        tokio::spawn(async move {
            while serving.load(Ordering::SeqCst) {
                lease.try_lead(&me);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(chain.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = listen(port, args.iter().any(|a| a.starts_with("--permit-port-sharing")));
    let hang_posts = flag(&args, "stand-in-hang-posts-while").map(|p| Arc::new(PathBuf::from(p)));
    let started = std::time::Instant::now();
    let terminating = Arc::new(AtomicBool::new(false));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let accept = async {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, lease, terminating, tokens, hang_posts) = (
                acceptor.clone(),
                lease.clone(),
                terminating.clone(),
                tokens.clone(),
                hang_posts.clone(),
            );
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let (lease, terminating, tokens, hang_posts) =
                        (lease.clone(), terminating.clone(), tokens.clone(), hang_posts.clone());
                    async move {
                        let authorized = request
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Bearer "))
                            .is_some_and(|t| tokens.iter().any(|known| known == t));
                        let path = request.uri().path().to_string();
                        let ready = !terminating.load(Ordering::SeqCst) && started.elapsed() >= ready_after;
                        if request.method() == Method::POST
                            && path == WORKSPACES_PATH
                            && let Some(hang) = hang_posts.as_deref()
                            && hang.exists()
                        {
                            std::fs::write(hang.with_extension("seen"), "").unwrap();
                            while hang.exists() {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                        let method = request.method().clone();
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let holder_in_body = || {
                            serde_json::from_slice::<serde_json::Value>(&body).ok()?["spec"]["holderIdentity"]
                                .as_str()
                                .map(str::to_string)
                        };
                        let answer = match (method, path.as_str()) {
                            _ if !authorized => reply(StatusCode::UNAUTHORIZED, "{}"),
                            (Method::GET, "/readyz") if ready => reply(StatusCode::OK, "ok"),
                            (Method::GET, "/readyz") => reply(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "[-]stand-in not ready\nreadyz check failed",
                            ),
                            (Method::GET, LEASE_PATH) => match lease.holder() {
                                Some(holder) => {
                                    reply(StatusCode::OK, format!(r#"{{"spec":{{"holderIdentity":"{holder}"}}}}"#))
                                }
                                None => reply(StatusCode::NOT_FOUND, "{}"),
                            },
                            (Method::DELETE, LEASE_PATH) => match std::fs::remove_file(&lease.path) {
                                Ok(()) => reply(StatusCode::OK, "{}"),
                                Err(_) => reply(StatusCode::NOT_FOUND, "{}"),
                            },
                            // kcpshard hands the Lease over: a PUT of the one read, or a create.
                            (Method::PUT, LEASE_PATH) => match holder_in_body() {
                                Some(holder) if lease.holder().is_some() => {
                                    lease.name(&holder);
                                    reply(StatusCode::OK, "{}")
                                }
                                Some(_) => reply(StatusCode::NOT_FOUND, "{}"),
                                None => reply(StatusCode::BAD_REQUEST, "{}"),
                            },
                            (Method::POST, LEASES_PATH) => match holder_in_body() {
                                Some(_) if lease.holder().is_some() => reply(StatusCode::CONFLICT, "{}"),
                                Some(holder) => {
                                    lease.name(&holder);
                                    reply(StatusCode::CREATED, "{}")
                                }
                                None => reply(StatusCode::BAD_REQUEST, "{}"),
                            },
                            (Method::GET, SYSTEM_CRDS) => reply(StatusCode::OK, CRDS),
                            (Method::GET, p) if p.starts_with("/clusters/*/apis/apis.kcp.io/") => {
                                reply(StatusCode::OK, r#"{"items":[]}"#)
                            }
                            (Method::POST, WORKSPACES_PATH) => reply(StatusCode::CREATED, "{}"),
                            (Method::GET, p) if p.starts_with(WORKSPACES_PATH) => {
                                let phase = if lease.leader_alive() { "Ready" } else { "Scheduling" };
                                reply(StatusCode::OK, format!(r#"{{"status":{{"phase":"{phase}"}}}}"#))
                            }
                            (Method::DELETE, p) if p.starts_with(WORKSPACES_PATH) => reply(StatusCode::OK, "{}"),
                            _ => reply(StatusCode::NOT_FOUND, "404 page not found"),
                        };
                        Ok::<_, std::convert::Infallible>(answer)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = sigterm.recv() => {}
    }
    // As kcp: /readyz fails at once, the listener closes after the shutdown delay, and with it the
    // election (which reaches the Lease through this process's own listener).
    terminating.store(true, Ordering::SeqCst);
    tokio::time::sleep(delay).await;
    drop(listener);
    serving.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
}
