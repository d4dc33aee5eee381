//! The front as a real process (`kcpshard front`) with real loopback sockets: backends are small
//! TCP servers in this test process that greet each connection with their name and echo lines.
//!
//! Every front a test starts is SIGKILLed when its [`Fixture`] drops, pass or fail (fronts run in
//! their own session by design, so nothing else would end them).
//!
//! Longer than 600 lines on purpose: the front's behaviours against one fixture of backends and
//! clients. Each tests/*.rs file is a test binary of its own (40-60 MB, linked again on every
//! change of the crate): one concern, one file.
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kcpshard::front::{self, Backend, FrontClient, FrontError, FrontLaunch, FrontStatus};
use kcpshard::process::Runtime;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixStream};

#[path = "support/ports.rs"]
mod ports;

const BIN: &str = env!("CARGO_BIN_EXE_kcpshard");
const ANY_PORT: &str = "127.0.0.1:0";
const IO_TIMEOUT: Duration = Duration::from_secs(5);

fn bin() -> &'static Path {
    Path::new(BIN)
}

/// The detached runtime (a test is no systemd service), and the shard its fronts serve.
static RUNTIME: std::sync::LazyLock<Runtime> = std::sync::LazyLock::new(Runtime::new);
const SHARD: &str = "test";

fn launch<'a>(binary: &'a Path, dir: &'a Path) -> FrontLaunch<'a> {
    FrontLaunch {
        runtime: &RUNTIME,
        shard: SHARD,
        binary,
        dir,
    }
}

fn any_port() -> SocketAddr {
    ANY_PORT.parse().unwrap()
}

// ------------------------------------------------------------------------------------------------
// Fixture: a front dir, and every process started for it killed at the end.

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pids: Mutex<BTreeSet<(u32, u64)>>,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("fronts").join("shard");
        Fixture {
            _tmp: tmp,
            dir,
            pids: Mutex::new(BTreeSet::new()),
        }
    }

    /// Remembers a process to kill at the end (with its start time, so a reused pid is spared).
    fn track(&self, pid: u32) {
        if let Some(start) = start_time(pid) {
            self.pids.lock().unwrap().insert((pid, start));
        }
    }

    async fn start(&self) -> (FrontClient, FrontStatus) {
        let client = front::ensure_running(launch(bin(), &self.dir), any_port())
            .await
            .unwrap();
        let status = client.status().await.unwrap();
        self.track(status.pid);
        (client, status)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(pid) = recorded_pid(&self.dir) {
            self.track(pid);
        }
        for (pid, start) in self.pids.lock().unwrap().iter() {
            if start_time(*pid) == Some(*start) {
                // SAFETY: plain kill(2), no memory involved.
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
        }
    }
}

fn recorded_pid(dir: &Path) -> Option<u32> {
    let bytes = std::fs::read(dir.join(front::PID_FILE)).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value["pid"].as_u64().map(|p| p as u32)
}

/// Fields of `/proc/<pid>/stat` after the command name: index 0 is field 3 (state).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(String::from).collect())
}

fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

fn running(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| !matches!(f[0].as_str(), "Z" | "X"))
}

fn session_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

async fn eventually(what: &str, bound: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {bound:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ------------------------------------------------------------------------------------------------
// Backends and clients

/// Greets each connection with `hello from NAME`, answers each line with `NAME: LINE`, and
/// answers the client's half-close with `NAME: eof` before closing.
struct EchoBackend {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl EchoBackend {
    async fn start(name: &str) -> EchoBackend {
        let listener = TcpListener::bind(ANY_PORT).await.unwrap();
        EchoBackend::on(listener, name)
    }

    fn on(listener: TcpListener, name: &str) -> EchoBackend {
        let address = listener.local_addr().unwrap();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let name = name.clone();
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let _ = stream
                        .get_mut()
                        .write_all(format!("hello from {name}\n").as_bytes())
                        .await;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match stream.read_line(&mut line).await {
                            Ok(0) => {
                                let _ = stream.get_mut().write_all(format!("{name}: eof\n").as_bytes()).await;
                                return;
                            }
                            Ok(_) => {
                                let answer = format!("{name}: {}\n", line.trim_end());
                                if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                            Err(_) => return,
                        }
                    }
                });
            }
        });
        EchoBackend { address, task }
    }

    fn backend(&self, slot: &str) -> Backend {
        Backend {
            slot: slot.into(),
            address: self.address,
        }
    }
}

impl Drop for EchoBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Client(BufReader<TcpStream>);

impl Client {
    async fn dial(address: SocketAddr) -> Client {
        Client(BufReader::new(TcpStream::connect(address).await.unwrap()))
    }

    async fn line(&mut self) -> String {
        let mut line = String::new();
        let n = tokio::time::timeout(IO_TIMEOUT, self.0.read_line(&mut line))
            .await
            .expect("no answer within 5 s")
            .expect("read failed");
        assert!(n > 0, "the connection was closed");
        line.trim_end().to_string()
    }

    async fn ask(&mut self, message: &str) -> String {
        self.0
            .get_mut()
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        self.line().await
    }

    /// Waits for the end of the stream; returns how long it took.
    async fn closed_within(&mut self, bound: Duration) -> Duration {
        let started = Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(bound, self.0.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok(),
            "the front kept the connection open for more than {bound:?}"
        );
        assert!(rest.is_empty(), "unexpected bytes {rest:?}");
        started.elapsed()
    }
}

/// A loopback address for the front or a backend to bind later ([`ports`]).
/// Dials `address` over and over from a task of its own, keeping the first line each connection
/// is greeted with; a dial refused or not greeted within [`IO_TIMEOUT`] counts as failed.
struct Dialler {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<String>>>,
    failed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Dialler {
    fn start(address: SocketAddr) -> Dialler {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicUsize::new(0));
        let task = {
            let (stop, answers, failed) = (stop.clone(), answers.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let answered = async {
                        let mut c = BufReader::new(TcpStream::connect(address).await.ok()?);
                        let mut line = String::new();
                        c.read_line(&mut line).await.ok()?;
                        Some(line.trim_end().to_string())
                    };
                    match tokio::time::timeout(IO_TIMEOUT, answered).await {
                        Ok(Some(line)) => answers.lock().unwrap().push(line),
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        };
        Dialler {
            stop,
            answers,
            failed,
            task,
        }
    }

    /// How many dials were answered so far.
    fn answered(&self) -> usize {
        self.answers.lock().unwrap().len()
    }

    /// Stops dialling: every answer in order, and how many dials failed.
    async fn stop(self) -> (Vec<String>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let answers = std::mem::take(&mut *self.answers.lock().unwrap());
        (answers, self.failed.load(Ordering::Relaxed))
    }
}

fn test_address() -> SocketAddr {
    (std::net::Ipv4Addr::LOCALHOST, ports::test_port()).into()
}

// ------------------------------------------------------------------------------------------------
// Routing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_follow_a_switch_while_open_ones_stay_pinned() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let b = EchoBackend::start("b").await;
    let (client, status) = f.start().await;
    assert!(status.backends.is_empty());
    assert_ne!(status.listen.port(), 0);

    client.serve(&[a.backend("a")]).await.unwrap();
    let mut first = Client::dial(status.listen).await;
    assert_eq!(first.line().await, "hello from a");
    assert_eq!(first.ask("1").await, "a: 1");

    client.serve(&[b.backend("b")]).await.unwrap();
    let mut second = Client::dial(status.listen).await;
    assert_eq!(second.line().await, "hello from b");
    assert_eq!(
        first.ask("2").await,
        "a: 2",
        "an open connection stays on its slot after a switch"
    );
    assert_eq!(second.ask("3").await, "b: 3");

    let status = client.status().await.unwrap();
    assert_eq!(status.backends, vec![b.backend("b")]);
    assert_eq!((status.connections["a"].open, status.connections["a"].total), (1, 1));
    assert_eq!((status.connections["b"].open, status.connections["b"].total), (1, 1));

    drop(first);
    eventually("slot a has no open connection", Duration::from_secs(3), async || {
        client.status().await.unwrap().connections["a"].open == 0
    })
    .await;
    let status = client.status().await.unwrap();
    assert_eq!((status.connections["a"].open, status.connections["a"].total), (0, 1));
    assert_eq!(status.connections["b"].open, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_set_spreads_new_connections_and_a_slot_left_out_keeps_its_own() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let b = EchoBackend::start("b").await;
    let c = EchoBackend::start("c").await;
    let (client, status) = f.start().await;
    client
        .serve(&[a.backend("a"), b.backend("b"), c.backend("c")])
        .await
        .unwrap();
    // Held open, so that each new one goes to the slot with the fewest.
    let mut held = Vec::new();
    let mut given = BTreeMap::<String, u32>::new();
    for _ in 0..6 {
        let mut conn = Client::dial(status.listen).await;
        let slot = conn.line().await.trim_start_matches("hello from ").to_string();
        *given.entry(slot).or_default() += 1;
        held.push(conn);
    }
    assert_eq!(given.values().copied().collect::<Vec<_>>(), vec![2, 2, 2], "{given:?}");

    // c leaves the set: its connections stay (counted as retired, not judged: no TLS here).
    client.serve(&[a.backend("a"), b.backend("b")]).await.unwrap();
    let status_now = client.status().await.unwrap();
    assert_eq!(status_now.backends, vec![a.backend("a"), b.backend("b")]);
    assert_eq!(status_now.connections["c"].open, 2);
    assert_eq!(status_now.connections["c"].retired_unjudged, 2);
    assert_eq!(status_now.connections["a"].retired_unjudged, 0);
    for conn in held.iter_mut() {
        let answer = conn.ask("still").await;
        assert!(answer.ends_with(": still"), "{answer}");
    }
    for _ in 0..4 {
        let mut conn = Client::dial(status.listen).await;
        assert_ne!(
            conn.line().await,
            "hello from c",
            "no new connection goes to a slot out of the set"
        );
    }
    // The set persists: a restarted front serves the same two.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join(front::BACKEND_FILE)).unwrap()).unwrap();
    assert_eq!(file["backends"].as_array().unwrap().len(), 2);
    assert_eq!(
        file["backend"]["slot"], "a",
        "and its first, for a front of the single-backend protocol"
    );

    // An empty set: new connections are held for the hold window, then closed.
    client.serve(&[]).await.unwrap();
    let mut waiting = Client::dial(status.listen).await;
    let waited = waiting.closed_within(front::HOLD_WINDOW + Duration::from_secs(5)).await;
    assert!(
        waited >= front::HOLD_WINDOW - Duration::from_millis(500),
        "closed after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_is_dialled_before_the_client_sends_a_byte_and_half_closes_pass_through() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, status) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let mut c = Client::dial(status.listen).await;
    // A server-speaks-first greeting arrives although the client has sent nothing.
    assert_eq!(c.line().await, "hello from a");
    // The client's FIN reaches the backend, whose answer still comes back on the open half.
    c.0.get_mut().shutdown().await.unwrap();
    assert_eq!(c.line().await, "a: eof");
    c.closed_within(IO_TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_for_a_moment_still_gets_the_connection() {
    let f = Fixture::new();
    let (client, status) = f.start().await;
    let late = test_address();
    client
        .serve(&[Backend {
            slot: "late".into(),
            address: late,
        }])
        .await
        .unwrap();
    let started = Instant::now();
    let opener = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        EchoBackend::on(TcpListener::bind(late).await.unwrap(), "late")
    });
    let mut c = Client::dial(status.listen).await;
    assert_eq!(c.line().await, "hello from late");
    assert!(started.elapsed() >= Duration::from_millis(250));
    let _backend = opener.await.unwrap();
    let counts = client.status().await.unwrap().connections["late"];
    assert_eq!((counts.open, counts.total, counts.failed), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_accepts_gets_the_client_closed_after_the_retry_window() {
    let f = Fixture::new();
    let (client, status) = f.start().await;
    client
        .serve(&[Backend {
            slot: "gone".into(),
            address: test_address(),
        }])
        .await
        .unwrap();
    let mut c = Client::dial(status.listen).await;
    let waited = c.closed_within(Duration::from_secs(6)).await;
    assert!(
        waited >= front::RETRY_WINDOW - Duration::from_millis(200),
        "closed after {waited:?}"
    );
    let counts = client.status().await.unwrap().connections["gone"];
    assert_eq!((counts.open, counts.total, counts.failed), (0, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_backend_a_connection_waits_for_one_then_is_closed() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, status) = f.start().await;

    let mut unlucky = Client::dial(status.listen).await;
    let waited = unlucky.closed_within(front::HOLD_WINDOW + Duration::from_secs(5)).await;
    assert!(
        waited >= front::HOLD_WINDOW - Duration::from_millis(500),
        "closed after {waited:?}"
    );

    let mut lucky = Client::dial(status.listen).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.serve(&[a.backend("a")]).await.unwrap();
    assert_eq!(lucky.line().await, "hello from a");
}

// ------------------------------------------------------------------------------------------------
// Persistence, lifecycle and errors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_front_comes_back_on_the_persisted_backend() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, first) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let persisted: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join(front::BACKEND_FILE)).unwrap()).unwrap();
    assert_eq!(persisted["backend"]["slot"], "a");
    assert_eq!(persisted["backend"]["address"], a.address.to_string());

    front::stop(&RUNTIME, SHARD, &f.dir).await.unwrap();
    assert!(!running(first.pid), "stop leaves no front behind");
    assert!(FrontClient::connect(&f.dir).await.is_err());

    let (_client, second) = f.start().await;
    assert_ne!(second.pid, first.pid);
    assert_eq!(second.backends, vec![a.backend("a")]);
    let mut c = Client::dial(second.listen).await;
    assert_eq!(c.line().await, "hello from a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_front_is_adopted_not_duplicated() {
    let f = Fixture::new();
    let (_, first) = f.start().await;
    let again = front::ensure_running(launch(bin(), &f.dir), first.listen)
        .await
        .unwrap();
    assert_eq!(again.status().await.unwrap().pid, first.pid);
    let any = front::ensure_running(launch(bin(), &f.dir), any_port()).await.unwrap();
    assert_eq!(any.status().await.unwrap().pid, first.pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_asked_for_another_address_is_replaced() {
    let f = Fixture::new();
    let (_, first) = f.start().await;
    let wanted = test_address();
    let client = front::ensure_running(launch(bin(), &f.dir), wanted).await.unwrap();
    let second = client.status().await.unwrap();
    f.track(second.pid);
    assert_eq!(second.listen, wanted);
    assert_ne!(second.pid, first.pid);
    assert!(!running(first.pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_address_taken_by_another_program_gives_a_clear_error() {
    let f = Fixture::new();
    let squatter = std::net::TcpListener::bind(ANY_PORT).unwrap();
    let taken = squatter.local_addr().unwrap();
    let err = front::ensure_running(launch(bin(), &f.dir), taken).await.unwrap_err();
    assert!(
        matches!(err, FrontError::AddressInUse { address } if address == taken),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("front address {taken} is in use by another program; choose another spec.front.listen")
    );
    let pid = recorded_pid(&f.dir).expect("the attempt is recorded");
    assert!(!running(pid), "the failed front exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_and_state_files_are_private() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, _) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&f.dir), 0o700);
    assert_eq!(mode(&f.dir.join(front::CONTROL_SOCKET)), 0o600);
    assert_eq!(mode(&f.dir.join(front::BACKEND_FILE)), 0o600);
    assert_eq!(mode(&f.dir.join(front::PID_FILE)), 0o600);
    assert_eq!(mode(&f.dir.join(front::LOG_FILE)), 0o600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_protocol_is_one_json_object_per_line() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (_, status) = f.start().await;
    let stream = UnixStream::connect(f.dir.join(front::CONTROL_SOCKET)).await.unwrap();
    let mut conn = BufReader::new(stream);
    let mut ask = async |line: String| -> serde_json::Value {
        conn.get_mut().write_all(line.as_bytes()).await.unwrap();
        let mut answer = String::new();
        conn.read_line(&mut answer).await.unwrap();
        serde_json::from_str(&answer).unwrap()
    };
    let answer = ask(format!(
        "{{\"op\":\"switch\",\"slot\":\"a\",\"address\":\"{}\"}}\n",
        a.address
    ))
    .await;
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["status"]["backend"]["slot"], "a");
    let answer = ask("{\"op\":\"status\"}\n".into()).await;
    assert_eq!(answer["status"]["pid"], status.pid);
    assert_eq!(answer["status"]["listen"], status.listen.to_string());
    assert_eq!(answer["status"]["connections"]["a"]["open"], 0);
    let answer = ask("not json\n".into()).await;
    assert_eq!(answer["ok"], false);
    assert!(answer["error"].as_str().unwrap().contains("one JSON object per line"));
    let answer = ask("{\"op\":\"switch\",\"slot\":\"a b\",\"address\":\"127.0.0.1:1\"}\n".into()).await;
    assert_eq!(answer["ok"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_lets_open_connections_finish() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, status) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let mut open = Client::dial(status.listen).await;
    assert_eq!(open.line().await, "hello from a");

    let dir = f.dir.clone();
    let stopping = tokio::spawn(async move { front::stop(&RUNTIME, SHARD, &dir).await });
    eventually("the listening socket is closed", Duration::from_secs(5), async || {
        TcpStream::connect(status.listen).await.is_err()
    })
    .await;
    assert_eq!(open.ask("still there").await, "a: still there");
    assert!(!stopping.is_finished());
    assert!(running(status.pid));

    drop(open);
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!running(status.pid));
    assert!(!f.dir.join(front::CONTROL_SOCKET).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_connections_per_slot() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let metrics = test_address();
    let mut child = std::process::Command::new(BIN)
        .args([
            "front",
            "--listen",
            ANY_PORT,
            "--metrics-listen",
            &metrics.to_string(),
            "--dir",
        ])
        .arg(&f.dir)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    f.track(child.id());
    let mut client = None;
    eventually("the front answers", Duration::from_secs(5), async || {
        client = FrontClient::connect(&f.dir).await.ok();
        client.is_some()
    })
    .await;
    let client = client.unwrap();
    client.serve(&[a.backend("a")]).await.unwrap();
    let status = client.status().await.unwrap();
    let mut c = Client::dial(status.listen).await;
    assert_eq!(c.line().await, "hello from a");

    let mut http = TcpStream::connect(metrics).await.unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    http.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    for line in [
        "kcpshard_front_connections_open{slot=\"a\"} 1",
        "kcpshard_front_connections_total{slot=\"a\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

// ------------------------------------------------------------------------------------------------
// Surviving the starter, and handing over

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_survives_the_death_of_the_process_that_started_it() {
    use std::io::BufRead;
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    // A stand-in for serve (tests/support/front_starter.rs), SIGKILLed once the front serves.
    let mut helper = std::process::Command::new(env!("CARGO_BIN_EXE_front-starter"))
        .arg(BIN)
        .arg(&f.dir)
        .arg(a.address.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    f.track(helper.id());
    let stdout = helper.stdout.take().unwrap();
    let ready = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("READY ").map(str::to_string))
    });
    let ready = tokio::time::timeout(Duration::from_secs(20), ready)
        .await
        .unwrap()
        .unwrap();
    let ready = ready.expect("the helper started a front");
    let mut words = ready.split_whitespace();
    let pid: u32 = words.next().unwrap().parse().unwrap();
    let listen: SocketAddr = words.next().unwrap().parse().unwrap();
    f.track(pid);
    assert_eq!(session_of(pid), Some(pid), "the front leads its own session");

    let mut live = Client::dial(listen).await;
    assert_eq!(live.line().await, "hello from a");
    assert_eq!(live.ask("before").await, "a: before");

    // SAFETY: plain kill(2), no memory involved.
    unsafe { libc::kill(helper.id() as i32, libc::SIGKILL) };
    helper.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert!(running(pid), "the front outlives its starter");
    assert_eq!(live.ask("after").await, "a: after", "the open connection was not cut");
    let mut fresh = Client::dial(listen).await;
    assert_eq!(fresh.line().await, "hello from a");
    let adopted = front::ensure_running(launch(bin(), &f.dir), listen).await.unwrap();
    assert_eq!(
        adopted.status().await.unwrap().pid,
        pid,
        "a new starter adopts the front"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_listening_socket_over_without_refusing_a_connection() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, old) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let mut pinned = Client::dial(old.listen).await;
    assert_eq!(pinned.line().await, "hello from a");

    // Dial continuously through the upgrade; every dial must be answered by the backend.
    let dialler = Dialler::start(old.listen);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let upgraded = front::upgrade(launch(bin(), &f.dir)).await.unwrap();
    let new = upgraded.status().await.unwrap();
    f.track(new.pid);
    assert_ne!(new.pid, old.pid);
    assert_eq!(new.listen, old.listen);
    assert_eq!(new.backends, vec![a.backend("a")]);
    assert_eq!(recorded_pid(&f.dir), Some(new.pid));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (answers, failed) = dialler.stop().await;
    let unanswered = failed + answers.iter().filter(|a| *a != "hello from a").count();
    assert_eq!(unanswered, 0, "{} dials answered", answers.len());
    assert!(answers.len() > 10);

    // The old front drains: its open connection works until the client closes it, then it exits.
    assert!(running(old.pid));
    assert_eq!(pinned.ask("still old").await, "a: still old");
    drop(pinned);
    eventually("the old front exits once drained", Duration::from_secs(5), async || {
        !running(old.pid)
    })
    .await;

    // The successor is fully in charge: switches and connections work, the socket path is its own.
    let b = EchoBackend::start("b").await;
    upgraded.serve(&[b.backend("b")]).await.unwrap();
    let mut c = Client::dial(new.listen).await;
    assert_eq!(c.line().await, "hello from b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_running_with_another_binary_upgrades_the_front_in_place() {
    let f = Fixture::new();
    let a = EchoBackend::start("a").await;
    let (client, old) = f.start().await;
    client.serve(&[a.backend("a")]).await.unwrap();
    let mut pinned = Client::dial(old.listen).await;
    assert_eq!(pinned.line().await, "hello from a");

    // A new release: another file (another inode) at another path.
    let release = f._tmp.path().join("kcpshard-next");
    std::fs::copy(BIN, &release).unwrap();
    let upgraded = front::ensure_running(launch(&release, &f.dir), old.listen)
        .await
        .unwrap();
    let new = upgraded.status().await.unwrap();
    f.track(new.pid);
    // ensure_running logs an upgrade that failed and keeps the old front: say why here.
    assert_ne!(
        new.pid,
        old.pid,
        "the front was not replaced; upgrade.failed: {:?}; the end of front.log:\n{}",
        std::fs::read_to_string(f.dir.join("upgrade.failed")).ok(),
        std::fs::read_to_string(f.dir.join("front.log"))
            .unwrap_or_default()
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!((new.listen, new.backends.clone()), (old.listen, vec![a.backend("a")]));
    assert_eq!(std::fs::read_link(format!("/proc/{}/exe", new.pid)).unwrap(), release);
    assert_eq!(
        pinned.ask("across").await,
        "a: across",
        "the old front drains, it does not cut"
    );

    // Asked again with the same release, the successor is adopted as it is.
    let again = front::ensure_running(launch(&release, &f.dir), old.listen)
        .await
        .unwrap();
    assert_eq!(again.status().await.unwrap().pid, new.pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_leaves_the_old_front_serving() {
    let f = Fixture::new();
    let (_, old) = f.start().await;
    let broken = f._tmp.path().join("kcpshard-broken");
    std::fs::write(&broken, "#!/bin/sh\necho this release is broken >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let client = front::ensure_running(launch(&broken, &f.dir), old.listen)
        .await
        .unwrap();
    assert_eq!(client.status().await.unwrap().pid, old.pid);
    assert!(f.dir.join(front::UPGRADE_FAILED_FILE).exists());
    let err = front::upgrade(launch(&broken, &f.dir)).await.unwrap_err();
    assert!(err.to_string().contains("this release is broken"), "{err}");
    assert_eq!(
        FrontClient::connect(&f.dir).await.unwrap().status().await.unwrap().pid,
        old.pid
    );
}

/// A successor killed by a signal before it answered (a stop of serve's own unit takes what serve
/// just spawned with it) failed no upgrade of its own: the old front serves on, and the upgrade
/// to that binary is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_successor_is_killed_is_tried_again() {
    let f = Fixture::new();
    let (_, old) = f.start().await;
    let killed = f._tmp.path().join("kcpshard-killed");
    std::fs::write(
        &killed,
        "#!/bin/sh
kill -TERM $$
",
    )
    .unwrap();
    std::fs::set_permissions(&killed, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = front::upgrade(launch(&killed, &f.dir)).await.unwrap_err();
    assert!(matches!(err, FrontError::KilledWhileStarting { .. }), "{err:?}");
    let client = front::ensure_running(launch(&killed, &f.dir), old.listen)
        .await
        .unwrap();
    assert_eq!(client.status().await.unwrap().pid, old.pid);
    assert!(
        !f.dir.join(front::UPGRADE_FAILED_FILE).exists(),
        "a killed successor marked its binary as one that fails"
    );
    assert!(
        front::runs_other_binary(&killed, &f.dir, old.pid),
        "the upgrade is not tried again"
    );
}

/// `start_upgrade` spawns a successor and returns: the upgrade is `upgrading` until the successor
/// answers in the old front's place. A successor that fails is judged by the next call, once: its
/// error is returned and its binary not tried again; one killed by a signal is no verdict, and the
/// next call starts another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_started_without_waiting_is_seen_through_and_a_failed_one_is_told_once() {
    let f = Fixture::new();
    let (_, old) = f.start().await;
    // Ended as the runtime tells it: gone or a zombie. (Runtime::observe already says None while
    // the process exits, once its argv is gone, a moment before its state does.)
    let successor_ended = async |pid: u32| {
        eventually("the successor exited", IO_TIMEOUT, async || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next());
                matches!(state, Some('Z' | 'X'))
            })
        })
        .await
    };

    // A release that fails: the old front serves on; the failure is told by the next call.
    let broken = f._tmp.path().join("kcpshard-broken");
    std::fs::write(&broken, "#!/bin/sh\necho this release is broken >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let started = front::start_upgrade(launch(&broken, &f.dir)).await.unwrap();
    let front::UpgradeStart::Started { serving, successor } = started else {
        panic!("no successor started: {started:?}");
    };
    assert_eq!(serving, old.pid);
    successor_ended(successor).await;
    assert_eq!(
        front::upgrading(&RUNTIME, &f.dir, old.pid),
        None,
        "an exited successor upgrades nothing"
    );
    let told = front::start_upgrade(launch(&broken, &f.dir)).await.unwrap();
    assert!(
        matches!(&told, front::UpgradeStart::LastFailed { error, .. } if error.to_string().contains("this release is broken")),
        "{told:?}"
    );
    assert!(
        !front::runs_other_binary(&broken, &f.dir, old.pid),
        "a failed binary is tried again"
    );

    // Killed by a signal: tried again.
    let killed = f._tmp.path().join("kcpshard-killed");
    std::fs::write(&killed, "#!/bin/sh\nkill -TERM $$\n").unwrap();
    std::fs::set_permissions(&killed, std::fs::Permissions::from_mode(0o755)).unwrap();
    let started = front::start_upgrade(launch(&killed, &f.dir)).await.unwrap();
    let front::UpgradeStart::Started { successor, .. } = started else {
        panic!("no successor started: {started:?}");
    };
    successor_ended(successor).await;
    let again = front::start_upgrade(launch(&killed, &f.dir)).await.unwrap();
    let front::UpgradeStart::Started { successor, .. } = again else {
        panic!("a successor killed by a signal was taken for a failed upgrade: {again:?}");
    };
    successor_ended(successor).await;

    // A new release takes over: upgrading until it answers in the old front's place.
    let release = f._tmp.path().join("kcpshard-next");
    std::fs::copy(BIN, &release).unwrap();
    let started = front::start_upgrade(launch(&release, &f.dir)).await.unwrap();
    let front::UpgradeStart::Started { successor, .. } = started else {
        panic!("no successor started: {started:?}");
    };
    f.track(successor);
    eventually(
        "the successor answers in the old front's place",
        IO_TIMEOUT,
        async || match FrontClient::connect(&f.dir).await {
            Ok(client) => client.status().await.is_ok_and(|s| s.pid == successor),
            Err(_) => false,
        },
    )
    .await;
    assert_eq!(front::upgrading(&RUNTIME, &f.dir, successor), None);
    assert!(!front::runs_other_binary(&release, &f.dir, successor));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_is_not_stopped_for_an_address_it_cannot_get() {
    let f = Fixture::new();
    let (_, old) = f.start().await;
    let squatter = std::net::TcpListener::bind(ANY_PORT).unwrap();
    let taken = squatter.local_addr().unwrap();
    let err = front::ensure_running(launch(bin(), &f.dir), taken).await.unwrap_err();
    assert!(
        matches!(err, FrontError::AddressInUse { address } if address == taken),
        "{err:?}"
    );
    let still = FrontClient::connect(&f.dir).await.unwrap().status().await.unwrap();
    assert_eq!((still.pid, still.listen), (old.pid, old.listen));
}

/// `start_front` spawns and returns: the front is `starting` until it answers. One that cannot
/// listen exits and says why in its dir; the next `start_front` returns that error once, and the
/// one after starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_started_without_waiting_answers_later_and_one_that_cannot_listen_says_why_once() {
    let f = Fixture::new();
    let started = front::start_front(launch(bin(), &f.dir), any_port()).await.unwrap();
    f.track(started.pid);
    assert_eq!(
        front::starting(&f.dir).map(|p| p.pid),
        Some(started.pid),
        "just started and recorded"
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    let status = loop {
        if let Ok(client) = FrontClient::connect(&f.dir).await
            && let Ok(status) = client.status().await
        {
            break status;
        }
        assert!(Instant::now() < deadline, "the started front never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status.pid, started.pid);
    // SAFETY: plain kill(2), no memory involved.
    unsafe { libc::kill(started.pid as i32, libc::SIGKILL) };

    let squatter = std::net::TcpListener::bind(ANY_PORT).unwrap();
    let taken = squatter.local_addr().unwrap();
    let failing = front::start_front(launch(bin(), &f.dir), taken).await.unwrap();
    f.track(failing.pid);
    let deadline = Instant::now() + IO_TIMEOUT;
    while front::start_error(&f.dir).is_none() || front::recorded_process(&f.dir).is_some() {
        assert!(
            Instant::now() < deadline,
            "the front on a taken address neither exited nor said why"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        matches!(front::start_error(&f.dir), Some(FrontError::AddressInUse { address }) if address == taken),
        "{:?}",
        front::start_error(&f.dir)
    );
    let told = front::start_front(launch(bin(), &f.dir), taken).await.unwrap_err();
    assert!(
        matches!(told, FrontError::AddressInUse { address } if address == taken),
        "{told:?}"
    );
    drop(squatter);
    let again = front::start_front(launch(bin(), &f.dir), taken).await.unwrap();
    f.track(again.pid);
    assert_ne!(again.pid, failing.pid, "started again once the error was told");
}

/// `kcpshard front --take-listener-of PID` takes the socket another program listens on (here
/// another front, whose backend greets "old"): while that program runs both accept, and once it
/// stops every connection is the new front's, with no dial refused in between. This is how a
/// front can take the address clients dial from a kcp it replaces (process/listener.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_takes_over_the_socket_another_program_listens_on_without_refusing_a_connection() {
    let other = Fixture::new();
    let old_backend = EchoBackend::start("old").await;
    let (other_client, old) = other.start().await;
    other_client.serve(&[old_backend.backend("old")]).await.unwrap();

    // Dial continuously; every dial must be answered, by the old program or the new front.
    let dialler = Dialler::start(old.listen);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let f = Fixture::new();
    let new_backend = EchoBackend::start("new").await;
    std::fs::create_dir_all(f._tmp.path()).unwrap();
    let log = std::fs::File::create(f._tmp.path().join("front.log")).unwrap();
    let mut front = std::process::Command::new(bin())
        .args(["front", "--listen", &old.listen.to_string(), "--dir"])
        .arg(&f.dir)
        .args(["--take-listener-of", &old.pid.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    f.track(front.id());
    let mut client = None;
    eventually(
        "the new front answers on its control socket",
        Duration::from_secs(10),
        async || {
            client = FrontClient::connect(&f.dir).await.ok();
            client.is_some()
        },
    )
    .await;
    let client = client.unwrap();
    client.serve(&[new_backend.backend("new")]).await.unwrap();
    assert_eq!(client.status().await.unwrap().listen, old.listen);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The old program stops (SIGTERM: it closes its socket and drains); the socket lives on.
    // SAFETY: plain kill(2), no memory involved.
    unsafe { libc::kill(old.pid as i32, libc::SIGTERM) };
    eventually("the old front exits", Duration::from_secs(10), async || {
        !running(old.pid)
    })
    .await;
    let answered_before_exit = dialler.answered();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (answers, failed) = dialler.stop().await;
    let _ = front.kill();
    let _ = front.wait();

    assert_eq!(failed, 0, "{} dials answered", answers.len());
    assert!(
        answers.iter().any(|a| a == "hello from old"),
        "the old program answered before"
    );
    let after_exit = &answers[answered_before_exit..];
    assert!(!after_exit.is_empty(), "no dial after the old program exited");
    assert!(
        after_exit.iter().all(|a| a == "hello from new"),
        "after the old program exited: {after_exit:?}"
    );
}
