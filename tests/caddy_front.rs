//! The Caddy front type against Debian's real caddy (`bin/caddy`, linked by hack/install-deps.sh):
//! caddy runs the config `kcpshard front caddy-config` prints, in front of two HTTPS backends in
//! this test process that stand in for kcp slots (kcp's shape of serving material: a certificate
//! file holding the leaf and its CA, shared by both), and kcpshard switches its upstream through
//! the admin API while clients poll `/readyz` through caddy.
//!
//! caddy runs with HOME, XDG_CONFIG_HOME and XDG_DATA_HOME in a temp dir and its storage there too,
//! so nothing reaches the user's home or the system trust store (docs/background.md section 9).
//!
//! Longer than 600 lines on purpose: one caddy and its stand-in backends, and every switch of its
//! upstreams kcpshard makes. Each tests/*.rs file is a test binary of its own (40-60 MB, linked
//! again on every change of the crate): one concern, one file.
mod support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kcpshard::front::caddy::{CaddyAdmin, CaddyError, Switch};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;

const BIN: &str = env!("CARGO_BIN_EXE_kcpshard");
const ID: &str = "kcp-proxy";
const POLL_EVERY: Duration = Duration::from_millis(50);
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// /slow answers after this long; /watch sends WATCH_EVENTS lines, one every WATCH_EVERY.
const SLOW_FOR: Duration = Duration::from_millis(1500);
const WATCH_EVENTS: usize = 15;
const WATCH_EVERY: Duration = Duration::from_millis(100);

// ------------------------------------------------------------------------------------------------
// Serving material in kcp's shape: apiserver.crt = leaf + CA, apiserver.key.

struct Material {
    cert_file: PathBuf,
    key_file: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
    ca: CertificateDer<'static>,
}

fn material(dir: &Path) -> Material {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "test-kcp-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "test-kcp");
    let issuer = Issuer::new(ca_params, &ca_key);
    let leaf = params.signed_by(&key, &issuer).unwrap();
    let cert_file = dir.join("apiserver.crt");
    let key_file = dir.join("apiserver.key");
    std::fs::write(&cert_file, format!("{}{}", leaf.pem(), ca_cert.pem())).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    Material {
        cert_file,
        key_file,
        chain: vec![leaf.der().clone(), ca_cert.der().clone()],
        key_der: key.serialize_der(),
        ca: ca_cert.der().clone(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

// ------------------------------------------------------------------------------------------------
// Backends: HTTPS servers that stand in for two kcp slots.

/// The name of a backend whose `/readyz` fails.
const UNREADY: &str = "unready";
/// A backend that serves, but answers `/readyz` only after SLOW_FOR: a kcp on a busy machine
/// (another kcp starting beside it, its kine slow).
const SLOW_TO_ANSWER: &str = "slow-to-answer";

type Body = BoxBody<Bytes, Infallible>;

struct Backend {
    name: &'static str,
    addr: SocketAddr,
    /// The paths of the requests it received, in order.
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    async fn wait_for(&self, path: &str) {
        let deadline = Instant::now() + IO_TIMEOUT;
        while !self.seen.lock().unwrap().iter().any(|p| p == path) {
            assert!(Instant::now() < deadline, "{} never received {path}", self.name);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn backend(name: &'static str, material: &Material) -> Backend {
    backend_on(name, material, TcpListener::bind("127.0.0.1:0").await.unwrap())
}

/// `/readyz` and `/who` answer 200 with the backend's name (`/readyz` 500 for [`UNREADY`], after
/// SLOW_FOR for [`SLOW_TO_ANSWER`]); `/slow` the same after SLOW_FOR; `/watch` streams
/// WATCH_EVENTS lines "<name> <i>" (chunked, like a kcp watch).
fn backend_on(name: &'static str, material: &Material, listener: TcpListener) -> Backend {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            material.chain.clone(),
            PrivateKeyDer::Pkcs8(material.key_der.clone().into()),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, log) = (acceptor.clone(), log.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    log.lock().unwrap().push(request.uri().path().to_string());
                    async move { Ok::<_, Infallible>(answer(name, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Backend { name, addr, seen, task }
}

async fn answer(name: &'static str, request: Request<Incoming>) -> Response<Body> {
    let text = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap()
    };
    match request.uri().path() {
        // A slot that is stopping (kcp after SIGTERM) or not ready yet still serves, but fails this.
        "/readyz" if name == UNREADY => text(StatusCode::INTERNAL_SERVER_ERROR, "[-]shutdown failed".into()),
        "/readyz" | "/who" => {
            if name == SLOW_TO_ANSWER && request.uri().path() == "/readyz" {
                tokio::time::sleep(SLOW_FOR).await;
            }
            text(StatusCode::OK, name.to_string())
        }
        "/slow" => {
            tokio::time::sleep(SLOW_FOR).await;
            text(StatusCode::OK, name.to_string())
        }
        // Like kubectl exec: an HTTP/1.1 upgrade, then bytes both ways (echoed here).
        "/upgrade" => {
            tokio::spawn(async move {
                if let Ok(upgraded) = hyper::upgrade::on(request).await {
                    let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut reader, &mut writer).await;
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "Upgrade")
                .header("upgrade", "echo")
                .body(Empty::new().boxed())
                .unwrap()
        }
        "/watch" => {
            let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tokio::spawn(async move {
                for i in 0..WATCH_EVENTS {
                    if tx
                        .send(Ok(Frame::data(Bytes::from(format!("{name} {i}\n")))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    tokio::time::sleep(WATCH_EVERY).await;
                }
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(StreamBody::new(ReceiverStream::new(rx)).boxed())
                .unwrap()
        }
        _ => text(StatusCode::NOT_FOUND, "not found".into()),
    }
}

// ------------------------------------------------------------------------------------------------
// caddy with the rendered config

struct Caddy {
    proc: support::Proc,
    admin: CaddyAdmin,
    front: SocketAddr,
    storage: PathBuf,
    _dir: support::TempDir,
}

/// `kcpshard front caddy-config` for this shard, as a user would run it.
fn rendered_config(material: &Material, front: SocketAddr, admin: &str, upstream: SocketAddr, storage: &Path) -> Value {
    let output = Command::new(BIN)
        .args([
            "front",
            "caddy-config",
            "--listen",
            &front.to_string(),
            "--admin",
            admin,
        ])
        .args(["--upstream-id", ID, "--upstream", &upstream.to_string()])
        .arg("--cert")
        .arg(&material.cert_file)
        .arg("--key")
        .arg(&material.key_file)
        .arg("--storage")
        .arg(storage)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kcpshard front caddy-config failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("caddy-config prints JSON")
}

fn proxy_handler(config: &mut Value) -> &mut Value {
    &mut config["apps"]["http"]["servers"]["kcpshard"]["routes"][0]["handle"][0]
}

/// Starts caddy (from the test's own thread: see `support::Proc::spawn`) with the rendered config,
/// changed by `tweak`, and waits until its admin API answers and the front accepts.
async fn start_caddy(material: &Material, upstream: SocketAddr, tweak: impl FnOnce(&mut Value)) -> Caddy {
    let caddy = support::require("caddy");
    let dir = tempfile::Builder::new().prefix("kcpshard-caddy-").tempdir().unwrap();
    let admin_address = format!("127.0.0.1:{}", support::test_port());
    let front: SocketAddr = (Ipv4Addr::LOCALHOST, support::test_port()).into();
    let storage = dir.path().join("storage");
    let mut config = rendered_config(material, front, &admin_address, upstream, &storage);
    tweak(&mut config);
    let config_file = dir.path().join("caddy.json");
    std::fs::write(&config_file, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let mut cmd = Command::new(caddy);
    cmd.arg("run")
        .arg("--config")
        .arg(&config_file)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .current_dir(dir.path());
    let mut proc = support::Proc::spawn("caddy", cmd, &dir.path().join("caddy.log"));
    proc.grace = Duration::from_secs(3);
    let admin = CaddyAdmin::new(admin_address);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = proc.exited() {
            proc.fail(&format!("exited during startup: {status}"));
        }
        if admin.upstreams(ID).await.is_ok() && TcpStream::connect(front).await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            proc.fail("admin API or front not up within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Caddy {
        proc,
        admin,
        front,
        storage,
        _dir: dir,
    }
}

// ------------------------------------------------------------------------------------------------
// Clients through caddy

fn connector(material: &Material) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(material.ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to the front, verified with kcp's CA for 127.0.0.1 as kcp's kubeconfigs do.
async fn dial(front: SocketAddr, connector: &TlsConnector) -> Result<SendRequest<Empty<Bytes>>, String> {
    let work = async {
        let tcp = TcpStream::connect(front).await.map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::from(IpAddr::from(Ipv4Addr::LOCALHOST));
        let tls = connector.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    };
    tokio::time::timeout(IO_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err("dial timed out".into()))
}

/// GET `path`: Ok(body) for a 200, Err(what went wrong) otherwise.
async fn get(sender: &mut SendRequest<Empty<Bytes>>, path: &str) -> Result<String, String> {
    let work = async {
        sender.ready().await.map_err(|e| format!("connection: {e}"))?;
        let request = Request::get(path)
            .header("host", "127.0.0.1")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
        let body = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        if status == StatusCode::OK {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    };
    tokio::time::timeout(IO_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// An upgraded stream through the front (what kubectl exec, attach and port-forward open).
async fn upgrade(front: SocketAddr, connector: &TlsConnector) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(front).await.unwrap();
    let name = ServerName::from(IpAddr::from(Ipv4Addr::LOCALHOST));
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /upgrade HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            tls.read(&mut byte).await.unwrap(),
            1,
            "the front closed during the upgrade"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tls
}

/// Sends `text` on an upgraded stream and reads it back: Err when the stream was closed.
async fn echo(stream: &mut tokio_rustls::client::TlsStream<TcpStream>, text: &str) -> Result<String, String> {
    let work = async {
        stream.write_all(text.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; text.len()];
        stream.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(IO_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

async fn get_once(front: SocketAddr, connector: &TlsConnector, path: &str) -> Result<String, String> {
    get(&mut dial(front, connector).await?, path).await
}

#[derive(Debug, Clone)]
struct Poll {
    started: Instant,
    took: Duration,
    answer: Result<String, String>,
}

#[derive(Default)]
struct PollLog {
    polls: Mutex<Vec<Poll>>,
    /// Connections the client opened (keep-alive: one more each time caddy closed the last one).
    dials: AtomicUsize,
    /// GETs sent on a reused connection that caddy closed under them, sent again on a new one (as
    /// Go's http.Transport, hence every kcp client, does for an idempotent request).
    resent: AtomicUsize,
}

/// Polls `/readyz` every POLL_EVERY until `stop`: over one kept-alive connection (re-dialled when
/// caddy closes it), or over a new connection each time.
async fn poller(
    front: SocketAddr,
    connector: TlsConnector,
    keep_alive: bool,
    log: Arc<PollLog>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(POLL_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<SendRequest<Empty<Bytes>>> = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return,
        }
        let started = Instant::now();
        let mut resent = false;
        let answer = loop {
            let reused = keep_alive && conn.as_ref().is_some_and(|c| !c.is_closed());
            if !reused {
                log.dials.fetch_add(1, Ordering::Relaxed);
                conn = match dial(front, &connector).await {
                    Ok(c) => Some(c),
                    // Caddy's reload can reset a connection in its TLS handshake (seen once, in
                    // one CI run of this test): no request was sent, and a Go client sends a GET
                    // again after a connection reset (client-go, rest/request.go).
                    Err(e) if !resent && e.contains("reset by peer") => {
                        resent = true;
                        log.resent.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => break Err(e),
                };
            }
            let Some(sender) = conn.as_mut() else { unreachable!() };
            match get(sender, "/readyz").await {
                Err(e) if reused && !resent && (e.starts_with("connection") || e.starts_with("request")) => {
                    resent = true;
                    log.resent.fetch_add(1, Ordering::Relaxed);
                    conn = None;
                }
                answer => break answer,
            }
        };
        if !keep_alive {
            conn = None;
        }
        log.polls.lock().unwrap().push(Poll {
            started,
            took: started.elapsed(),
            answer,
        });
    }
}

struct Switched {
    started: Instant,
    ended: Instant,
    to: &'static str,
}

/// Which backend a poll must have reached: none (any) while a switch was under way.
fn expected(poll: &Poll, first: &'static str, switches: &[Switched]) -> Option<&'static str> {
    let mut current = first;
    for s in switches {
        if poll.started < s.started {
            return Some(current);
        }
        if poll.started < s.ended {
            return None;
        }
        current = s.to;
    }
    Some(current)
}

fn check_polls(client: &str, log: &PollLog, first: &'static str, switches: &[Switched]) -> Vec<String> {
    let polls = log.polls.lock().unwrap();
    let mut problems = Vec::new();
    for poll in polls.iter() {
        match (&poll.answer, expected(poll, first, switches)) {
            (Err(e), _) => problems.push(format!("{client}: poll at {:?} failed: {e}", poll.started)),
            (Ok(from), Some(want)) if from != want => problems.push(format!(
                "{client}: poll at {:?} answered by {from}, expected {want}",
                poll.started
            )),
            _ => {}
        }
    }
    let slowest = polls.iter().map(|p| p.took).max().unwrap_or_default();
    eprintln!(
        "{client}: {} polls, {} failed, {} connections, {} GETs resent after caddy closed or reset the connection, slowest {slowest:?}",
        polls.len(),
        polls.iter().filter(|p| p.answer.is_err()).count(),
        log.dials.load(Ordering::Relaxed),
        log.resent.load(Ordering::Relaxed),
    );
    problems
}

/// The files that make up the system trust store on Debian (and where update-ca-trust looks).
fn trust_store() -> BTreeSet<PathBuf> {
    let mut files = BTreeSet::new();
    for dir in [
        "/usr/local/share/ca-certificates",
        "/etc/ssl/certs",
        "/etc/pki/ca-trust/source/anchors",
    ] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            files.extend(entries.flatten().map(|e| e.path()));
        }
    }
    files
}

// ------------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switching_back_and_forth_through_caddy_fails_no_poll_and_answers_from_the_new_slot() {
    let trusted_before = trust_store();
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let green = backend("green", &material).await;
    let caddy = start_caddy(&material, blue.addr, |_| {}).await;
    assert_eq!(caddy.admin.upstreams(ID).await.unwrap(), [blue.addr.to_string()]);

    let (stop, stopped) = watch::channel(false);
    let keep_alive = Arc::new(PollLog::default());
    let fresh = Arc::new(PollLog::default());
    let pollers = [
        tokio::spawn(poller(
            caddy.front,
            connector(&material),
            true,
            keep_alive.clone(),
            stopped.clone(),
        )),
        tokio::spawn(poller(caddy.front, connector(&material), false, fresh.clone(), stopped)),
    ];
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut switches = Vec::new();
    let mut current = &blue;
    for i in 0..6 {
        let to = if i % 2 == 0 { &green } else { &blue };
        let started = Instant::now();
        let outcome = caddy.admin.serve(ID, &[to.addr]).await.unwrap();
        let ended = Instant::now();
        assert_eq!(
            outcome,
            Switch::Switched {
                from: vec![current.addr.to_string()]
            }
        );
        eprintln!("switch {} to {}: {:?}", i + 1, to.name, ended - started);
        switches.push(Switched {
            started,
            ended,
            to: to.name,
        });
        current = to;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.send(true).unwrap();
    for poller in pollers {
        poller.await.unwrap();
    }

    let mut problems = check_polls("keep-alive client", &keep_alive, blue.name, &switches);
    problems.extend(check_polls("new-connection client", &fresh, blue.name, &switches));
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\n--- caddy log ---\n{}",
        problems.len(),
        problems.join("\n"),
        caddy.proc.log_tail(30)
    );
    assert!(keep_alive.polls.lock().unwrap().len() >= 50);
    assert!(fresh.polls.lock().unwrap().len() >= 50);

    // caddy's local CA stays in its storage; the system trust store is untouched.
    assert!(caddy.storage.join("pki/authorities/local/root.crt").exists());
    assert_eq!(
        trust_store(),
        trusted_before,
        "the system trust store changed while caddy ran"
    );
}

/// What happens to a request waiting for its answer and a watch streaming events when the
/// upstream switches: (answer of /slow, lines of /watch, how /watch ended).
async fn in_flight_across_a_switch(
    tweak: impl FnOnce(&mut Value),
) -> (Result<String, String>, Vec<String>, Result<(), String>) {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let green = backend("green", &material).await;
    let caddy = start_caddy(&material, blue.addr, tweak).await;
    let connector = connector(&material);

    let slow = tokio::spawn({
        let connector = connector.clone();
        let front = caddy.front;
        async move { get_once(front, &connector, "/slow").await }
    });
    let mut watch_conn = dial(caddy.front, &connector).await.unwrap();
    let response = watch_conn
        .send_request(
            Request::get("/watch")
                .header("host", "127.0.0.1")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let mut lines = vec![String::from_utf8_lossy(&first).trim().to_string()];

    blue.wait_for("/slow").await;
    caddy.admin.serve(ID, &[green.addr]).await.unwrap();
    assert_eq!(
        get_once(caddy.front, &connector, "/readyz").await.as_deref(),
        Ok("green")
    );

    let ended = loop {
        match tokio::time::timeout(IO_TIMEOUT, body.frame()).await {
            Err(_) => break Err("no event within 5 s".to_string()),
            Ok(None) => break Ok(()),
            Ok(Some(Err(e))) => break Err(e.to_string()),
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    lines.extend(String::from_utf8_lossy(data).lines().map(str::to_string));
                }
            }
        }
    };
    (slow.await.unwrap(), lines, ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_and_an_open_watch_finish_on_the_old_slot_across_a_switch() {
    let (slow, lines, ended) = in_flight_across_a_switch(|_| {}).await;
    assert_eq!(slow.as_deref(), Ok("blue"), "the request in flight at the switch");
    let want: Vec<String> = (0..WATCH_EVENTS).map(|i| format!("blue {i}")).collect();
    assert_eq!(lines, want, "the watch open across the switch");
    assert_eq!(ended, Ok(()));
}

/// Why the rendered config has no `flush_interval: -1` (which an earlier caddy config used): with it, Debian's
/// caddy 2.6 cancels every proxied request at each reload, so each switch fails the requests in
/// flight and cuts the open watches short. If this starts failing, caddy no longer does that, and
/// docs/how-to/fronts.md (Fronts, Caddy)'s advice can be revisited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_flush_interval_minus_one_caddy_2_6_cuts_what_is_in_flight_at_a_switch() {
    let (slow, lines, _) = in_flight_across_a_switch(|config| {
        proxy_handler(config)["flush_interval"] = Value::from(-1);
    })
    .await;
    assert!(
        slow.is_err(),
        "the request in flight at the switch was answered: {slow:?}"
    );
    assert!(lines.len() < WATCH_EVENTS, "the watch got all its events: {lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_to_the_current_slot_does_not_reload_caddy() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let green = backend("green", &material).await;
    let caddy = start_caddy(&material, blue.addr, |_| {}).await;
    let mut conn = dial(caddy.front, &connector(&material)).await.unwrap();
    assert_eq!(get(&mut conn, "/readyz").await.as_deref(), Ok("blue"));

    assert_eq!(caddy.admin.serve(ID, &[blue.addr]).await.unwrap(), Switch::Unchanged);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A reload would have closed this idle connection (and every upgraded stream: exec, attach).
    assert_eq!(get(&mut conn, "/readyz").await.as_deref(), Ok("blue"));

    assert!(matches!(
        caddy.admin.serve(ID, &[green.addr]).await.unwrap(),
        Switch::Switched { .. }
    ));
    let deadline = Instant::now() + IO_TIMEOUT;
    while !conn.is_closed() {
        assert!(
            Instant::now() < deadline,
            "caddy kept an idle client connection across a reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// docs/background.md section 8's caveat, measured: every caddy reload cuts upgraded streams (exec, attach,
/// port-forward), which is why `serve` sends nothing when the upstream is already right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_stream_survives_a_no_op_switch_and_is_cut_by_a_real_one() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let green = backend("green", &material).await;
    let caddy = start_caddy(&material, blue.addr, |_| {}).await;
    let mut stream = upgrade(caddy.front, &connector(&material)).await;
    assert_eq!(echo(&mut stream, "before").await.as_deref(), Ok("before"));

    assert_eq!(caddy.admin.serve(ID, &[blue.addr]).await.unwrap(), Switch::Unchanged);
    assert_eq!(
        echo(&mut stream, "after a no-op switch").await.as_deref(),
        Ok("after a no-op switch")
    );

    assert!(matches!(
        caddy.admin.serve(ID, &[green.addr]).await.unwrap(),
        Switch::Switched { .. }
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = echo(&mut stream, "after a switch").await;
    assert!(after.is_err(), "the upgraded stream survived a caddy reload: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_starts_accepting_late_costs_latency_not_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let caddy = start_caddy(&material, blue.addr, |_| {}).await;
    let late: SocketAddr = (Ipv4Addr::LOCALHOST, support::test_port()).into();
    caddy.admin.serve(ID, &[late]).await.unwrap();

    let connector = connector(&material);
    let started = Instant::now();
    let request = tokio::spawn({
        let front = caddy.front;
        async move { get_once(front, &connector, "/readyz").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _green = backend_on("green", &material, TcpListener::bind(late).await.unwrap());
    assert_eq!(request.await.unwrap().as_deref(), Ok("green"));
    eprintln!("answered after {:?}", started.elapsed());
}

#[tokio::test]
async fn an_unreachable_admin_api_says_how_to_start_caddy() {
    let address = format!("127.0.0.1:{}", support::test_port());
    let admin = CaddyAdmin::new(address.clone());
    let err = admin.upstreams(ID).await.unwrap_err();
    assert!(matches!(err, CaddyError::Unreachable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("caddy's admin API at {address} does not answer (")),
        "{message}"
    );
    assert!(
        message.contains("start caddy with the config from docs/how-to/fronts.md"),
        "{message}"
    );
    assert!(message.contains("or fix spec.front.caddy.adminAddress"), "{message}");
    let err = admin.serve(ID, &["127.0.0.1:7001".parse().unwrap()]).await.unwrap_err();
    assert!(matches!(err, CaddyError::Unreachable { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_misplaced_id_says_where_to_put_it() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let caddy = start_caddy(&material, blue.addr, |config| {
        config["apps"]["http"]["servers"]["kcpshard"]["routes"][0]["@id"] = Value::from("kcp-route");
    })
    .await;

    let err = caddy.admin.upstreams("kcp-proxi").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "caddy has no object with @id kcp-proxi (admin API {}): add \"@id\": \"kcp-proxi\" to the \
             reverse_proxy handler that forwards to kcp, or fix spec.front.caddy.upstreamId",
            caddy.admin.address()
        )
    );
    let err = caddy.admin.serve("kcp-proxi", &[blue.addr]).await.unwrap_err();
    assert!(matches!(err, CaddyError::UnknownId { .. }), "{err:?}");

    let err = caddy.admin.upstreams("kcp-route").await.unwrap_err();
    assert!(matches!(err, CaddyError::NotReverseProxy { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("move \"@id\": \"kcp-route\" onto the reverse_proxy handler"),
        "{err}"
    );
    let err = caddy.admin.serve("kcp-route", &[blue.addr]).await.unwrap_err();
    assert!(matches!(err, CaddyError::NotReverseProxy { .. }), "{err:?}");

    // None of that touched the real handler.
    assert_eq!(caddy.admin.upstreams(ID).await.unwrap(), [blue.addr.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddys_own_health_checks_keep_a_serving_slot_that_fails_readyz_out_of_rotation() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let blue = backend("blue", &material).await;
    let unready = backend(UNREADY, &material).await;
    let (blue_addr, unready_addr) = (blue.addr, unready.addr);
    // Both serve; one of them fails /readyz, as a kcp does from its SIGTERM on.
    let caddy = start_caddy(&material, blue.addr, |config| {
        proxy_handler(config)["upstreams"] =
            serde_json::json!([{ "dial": blue_addr.to_string() }, { "dial": unready_addr.to_string() }]);
    })
    .await;
    assert_eq!(
        caddy.admin.upstreams(ID).await.unwrap(),
        [blue.addr.to_string(), unready.addr.to_string()]
    );
    unready.wait_for("/readyz").await;
    // One health interval: the failed check has taken the slot out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let connector = connector(&material);
    for _ in 0..20 {
        assert_eq!(get_once(caddy.front, &connector, "/who").await, Ok("blue".to_string()));
    }
    assert!(
        !unready.seen.lock().unwrap().iter().any(|p| p == "/who"),
        "no request reached the slot that fails /readyz: {:?}",
        unready.seen.lock().unwrap()
    );
    // Without a config change: the upstreams are the same two.
    assert_eq!(caddy.admin.upstreams(ID).await.unwrap().len(), 2);
}

/// A check that times out marks the upstream unhealthy just as a failed one does (caddy
/// reverseproxy/healthchecks.go:108-122), and with one upstream caddy then has none: it waits
/// try_duration and answers an empty 503. Worse, a reload (every switch) ends that wait at once
/// with the same 503 (reverseproxy.go:1068-1077: the retry wait ends with the old handler's
/// context). So the rendered timeout must exceed how long a busy kcp takes to answer `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_slow_to_answer_readyz_stays_in_caddys_rotation() {
    let tmp = tempfile::tempdir().unwrap();
    let material = material(tmp.path());
    let slow = backend(SLOW_TO_ANSWER, &material).await;
    let caddy = start_caddy(&material, slow.addr, |_| {}).await;
    slow.wait_for("/readyz").await;
    // Past the first check's answer, and two health intervals more.
    tokio::time::sleep(SLOW_FOR + Duration::from_secs(2)).await;
    let connector = connector(&material);
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(get_once(caddy.front, &connector, "/who").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed: Vec<_> = answers.iter().filter(|a| a.as_deref() != Ok(SLOW_TO_ANSWER)).collect();
    assert!(failed.is_empty(), "{} of 20 requests failed: {failed:?}", failed.len());
}
