//! Load through a kcp shard's front while it rolls, for `hack/bench/roll.sh`: every
//! request a client of the shard could make during a roll, and every way one of them can fail.
//!
//! Clients, all through the front with the shard admin's token (persistent across slots):
//! - a `/readyz` poller every 20 ms on schedule (a poll starts at each tick, even while earlier ones
//!   wait), each poll on a new connection (as `curl` or a load balancer's health check does);
//! - 4 keep-alive clients, each on its own kept-alive connection, sending GETs in turn
//!   (the workspaces of root, `/readyz`);
//! - 4 new-connection clients sending the same GETs, each on a new TCP and TLS connection
//!   (`Connection: close`: the server ends the connection after the answer);
//! - 3 long watches on the workspaces of root that behave like client-go's reflector: list, watch
//!   from the list's resourceVersion with bookmarks, re-watch from the last resourceVersion seen when
//!   a stream ends, re-list on 410 Gone.
//!
//! A request fails when no answer comes (refused, reset, closed, timeout, TLS) or the answer is not
//! 2xx. A keep-alive client asks again, at once, when its kept-alive connection breaks before an
//! answer (closed or reset), as Go's net/http transport (client-go's, kubectl's) does for an
//! idempotent request on a reused connection (`shouldRetryRequest`, for as long as the connection
//! that failed was a reused one): a server that closes an idle connection races with the next
//! request on it, and the front closes a kept-alive connection to a slot that left its serving set
//! at its next request. A client's pool may hold more than one such connection, so it asks up to
//! [`POOL_RETRIES`] times. Such retries are counted and listed apart; a request whose last attempt
//! fails is a failure. A watch stream that ends, cleanly or cut, is not a failure
//! (client-go re-watches and loses nothing); it is counted apart. The token is never printed:
//! errors carry no headers, and non-2xx bodies are kcp's own status messages.
//!
//! Usage:
//!   roll_load --kubeconfig <state>/shards/<name>/admin.kubeconfig --front 127.0.0.1:6443 \
//!     [--duration 60] [--stop-file PATH] [--json PATH] [--timeline PATH]
//! Stops at the end of --duration, when the stop file appears, or at SIGTERM/SIGINT; then prints
//! the counts, and writes them (with every failure's time) as JSON to --json, and one CSV line per
//! request to --timeline (`hack/bench/plot.py` draws it): `at` (Unix seconds, when the answer or
//! the failure came), `took_ms`, the client class, the path, and `ok` or the failure's kind.
use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Parser;
use futures::StreamExt;
use http_body_util::BodyExt;
use kube::Client;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use kcpshard::slot::access::{SHARD_ADMIN_CONTEXT, config_for_context};

const WORKSPACES: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
/// A GET (headers and body) that takes longer than this failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(about = "Load through a kcp shard's front during rolls: a /readyz poller, GET clients, watches")]
struct Args {
    /// A kcp admin.kubeconfig with the shard admin's context (kcpshard writes the front's at
    /// <state>/shards/<name>/admin.kubeconfig).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The context with the shard admin's (persistent) token.
    #[arg(long, default_value = SHARD_ADMIN_CONTEXT)]
    context: String,
    /// The front's address, host:port.
    #[arg(long)]
    front: String,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Stop once this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Write the figures and every failure here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one CSV line per request here: at,took_ms,class,path,outcome.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// The /readyz poller's period in milliseconds.
    #[arg(long, default_value_t = 20)]
    poll_ms: u64,
    #[arg(long, default_value_t = 4)]
    keepalive_clients: usize,
    /// Pause between two GETs of one keep-alive client, in milliseconds.
    #[arg(long, default_value_t = 50)]
    keepalive_ms: u64,
    #[arg(long, default_value_t = 4)]
    new_connection_clients: usize,
    /// Pause between two GETs of one new-connection client, in milliseconds.
    #[arg(long, default_value_t = 100)]
    new_connection_ms: u64,
    #[arg(long, default_value_t = 3)]
    watches: usize,
    /// The paths the GET clients take turns with.
    #[arg(long = "get", default_values_t = [WORKSPACES.to_string(), "/readyz".to_string()])]
    paths: Vec<String>,
}

// ------------------------------------------------------------------------------------------------
// What failed, and how

/// How a request failed. The transport kinds come from the error chain (io::ErrorKind, rustls,
/// hyper), so "refused" means ECONNREFUSED, not a message that says so.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// ECONNREFUSED: nothing listened.
    Refused,
    /// ECONNRESET, EPIPE, ECONNABORTED.
    Reset,
    /// The peer closed the connection before a whole answer (EOF mid-handshake or mid-response).
    Closed,
    /// No answer within the connect timeout (2 s) or [`REQUEST_TIMEOUT`].
    Timeout,
    /// A TLS error other than the peer closing (a bad certificate, a protocol error).
    Tls,
    /// An answer that is not 2xx.
    Status(u16),
    Other,
}

impl Kind {
    fn label(&self) -> String {
        match self {
            Kind::Refused => "refused".into(),
            Kind::Reset => "reset".into(),
            Kind::Closed => "closed".into(),
            Kind::Timeout => "timeout".into(),
            Kind::Tls => "tls".into(),
            Kind::Status(code) => format!("http-{code}"),
            Kind::Other => "other".into(),
        }
    }
}

fn io_kind(e: &std::io::Error) -> Option<Kind> {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => Some(Kind::Refused),
        ConnectionReset | ConnectionAborted | BrokenPipe => Some(Kind::Reset),
        TimedOut => Some(Kind::Timeout),
        UnexpectedEof => Some(Kind::Closed),
        _ => None,
    }
}

/// Walks the error chain. `io::Error::source` skips the error it wraps, so that one is looked at
/// through `get_ref` (tokio-rustls wraps `rustls::Error` in an io::Error).
fn classify(error: &(dyn StdError + 'static)) -> Kind {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return Kind::Tls;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return Kind::Tls;
            }
            if let Some(kind) = io_kind(io) {
                return kind;
            }
            if let Some(inner) = io.get_ref() {
                let kind = classify(inner);
                if kind != Kind::Other {
                    return kind;
                }
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return Kind::Timeout;
            }
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                // Keep looking for an io error underneath (a reset is more precise).
                let below = e.source().map(classify).unwrap_or(Kind::Other);
                return if below == Kind::Other { Kind::Closed } else { below };
            }
        }
        next = e.source();
    }
    // Errors that carry their cause only as text.
    let text = chain_text(error).to_lowercase();
    if text.contains("connection refused") {
        Kind::Refused
    } else if text.contains("connection reset") || text.contains("broken pipe") {
        Kind::Reset
    } else if text.contains("timed out") || text.contains("timeout") {
        Kind::Timeout
    } else if text.contains("eof") || text.contains("closed") {
        Kind::Closed
    } else if text.contains("tls") || text.contains("certificate") || text.contains("handshake") {
        Kind::Tls
    } else {
        Kind::Other
    }
}

/// What a non-2xx answer says, short: the failed checks of a health endpoint (`[-]shutdown
/// failed: reason withheld`), else the beginning of the body.
fn short_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("[-]")).collect();
    if failed.is_empty() {
        text.chars().take(200).collect::<String>().replace('\n', " | ")
    } else {
        failed.join(" | ")
    }
}

fn chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut next = error.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

// ------------------------------------------------------------------------------------------------
// Counting

#[derive(Debug, Clone)]
struct Failure {
    at: DateTime<Utc>,
    class: &'static str,
    path: String,
    kind: Kind,
    detail: String,
}

#[derive(Default)]
struct ClassStats {
    requests: u64,
    latencies_ms: Vec<f32>,
}

#[derive(Default)]
struct WatchStats {
    lists: u64,
    watches: u64,
    relists_410: u64,
    streams_ended_clean: u64,
    streams_cut: BTreeMap<String, u64>,
    events: BTreeMap<String, u64>,
}

/// One request as the timeline file has it.
struct Outcome {
    at: DateTime<Utc>,
    took: Duration,
    class: &'static str,
    path: String,
    /// None when it succeeded.
    failed: Option<Kind>,
}

#[derive(Default)]
struct Stats {
    classes: BTreeMap<&'static str, ClassStats>,
    /// Every request (final attempts only), in the order they ended.
    timeline: Vec<Outcome>,
    failures: Vec<Failure>,
    /// First attempts of keep-alive GETs that broke and were retried (the retry's outcome counts).
    retried: Vec<Failure>,
    /// Poller ticks that found [`POLLS_IN_FLIGHT`] polls still waiting.
    polls_skipped: u64,
    watch: WatchStats,
}

#[derive(Clone)]
struct Recorder {
    stats: Arc<Mutex<Stats>>,
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn retried(&self, class: &'static str, path: &str, (kind, detail): (Kind, String)) {
        let failure = Failure {
            at: Utc::now(),
            class,
            path: path.to_string(),
            kind,
            detail,
        };
        eprintln!(
            "roll_load: retried {} {class} GET {path}: {}: {}",
            failure.at.to_rfc3339_opts(SecondsFormat::Millis, true),
            failure.kind.label(),
            failure.detail
        );
        self.lock().retried.push(failure);
    }

    fn outcome(&self, class: &'static str, path: &str, took: Duration, result: Result<(), (Kind, String)>) {
        let mut stats = self.lock();
        let entry = stats.classes.entry(class).or_default();
        entry.requests += 1;
        entry.latencies_ms.push(took.as_secs_f32() * 1000.0);
        stats.timeline.push(Outcome {
            at: Utc::now(),
            took,
            class,
            path: path.to_string(),
            failed: result.as_ref().err().map(|(kind, _)| kind.clone()),
        });
        if let Err((kind, detail)) = result {
            let failure = Failure {
                at: Utc::now(),
                class,
                path: path.to_string(),
                kind,
                detail,
            };
            eprintln!(
                "roll_load: FAILED {} {class} GET {path}: {}: {}",
                failure.at.to_rfc3339_opts(SecondsFormat::Millis, true),
                failure.kind.label(),
                failure.detail
            );
            stats.failures.push(failure);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Requests

/// A client of the kubeconfig's server, CA and token, built as kube's own is but with two
/// differences that matter for counting: TCP_NODELAY on its connections (kube's connector leaves
/// Nagle on, which with the server's delayed ACK stalls each new TLS connection by about 40 ms; Go's
/// clients set TCP_NODELAY), and no retry layer (kube retries 429, 503 and 504 answers up to 15 times
/// by default, which would hide them). No read timeout: a watch may be idle for minutes; each GET
/// is bounded by [`REQUEST_TIMEOUT`] instead.
fn nodelay_client(config: &kube::Config) -> anyhow::Result<Client> {
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
}

fn get(path: &str, close: bool) -> http::Request<kube::client::Body> {
    let mut builder = http::Request::get(path).header(http::header::ACCEPT, "application/json");
    if close {
        builder = builder.header(http::header::CONNECTION, "close");
    }
    builder.body(kube::client::Body::empty()).expect("a valid request")
}

/// One GET, headers and body, within [`REQUEST_TIMEOUT`]: Ok for 2xx.
async fn get_once(client: &Client, path: &str, close: bool) -> Result<(), (Kind, String)> {
    let work = async {
        let response = client
            .send(get(path, close))
            .await
            .map_err(|e| (classify(&e), chain_text(&e)))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| (classify(&e), chain_text(&e)))?
            .to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err((Kind::Status(status.as_u16()), short_body(&body)))
        }
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err((Kind::Timeout, format!("no whole answer within {REQUEST_TIMEOUT:?}"))),
    }
}

/// How often a keep-alive GET is asked again after its kept-alive connection closed before an answer.
const POOL_RETRIES: usize = 4;

/// One kind of GET loop: its label in the report, how often it asks, and whether each GET asks for
/// a new connection.
#[derive(Clone, Copy)]
struct Cadence {
    class: &'static str,
    period: Duration,
    close: bool,
}

/// GETs `paths` in turn, starting at `offset`, at `cadence` until `stop`.
async fn getter(
    client: Client,
    cadence: Cadence,
    paths: Vec<String>,
    offset: usize,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
) {
    let Cadence { class, period, close } = cadence;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = offset;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let path = &paths[n % paths.len()];
        n += 1;
        let began = Instant::now();
        let mut result = get_once(&client, path, close).await;
        // As Go's transport does for an idempotent request: ask again while a kept-alive
        // connection from the pool turns out closed before any byte of the answer (each idle one
        // to a slot that left the front's serving set is, at its next request), up to the pool's
        // size; each such attempt is counted as retried, only the last outcome as the request's.
        let mut attempts = 1;
        while let Err((Kind::Closed | Kind::Reset, _)) = &result
            && !close
            && attempts <= POOL_RETRIES
        {
            recorder.retried(class, path, result.unwrap_err());
            result = get_once(&client, path, close).await;
            attempts += 1;
        }
        recorder.outcome(class, path, began.elapsed(), result);
    }
}

/// Polls at most this many times at once; a tick that finds them all busy is counted as skipped.
const POLLS_IN_FLIGHT: usize = 50;

/// `/readyz` every `period` on schedule, each poll on a new connection: a poll starts at every
/// tick even while earlier ones still wait for their answer (a health checker's cadence does not
/// slow down when the backend does).
async fn poller_loop(client: Client, period: Duration, recorder: Recorder, stop: Arc<AtomicBool>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(POLLS_IN_FLIGHT));
    let mut polls = JoinSet::new();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            recorder.lock().polls_skipped += 1;
            continue;
        };
        let (client, recorder) = (client.clone(), recorder.clone());
        polls.spawn(async move {
            let began = Instant::now();
            let result = get_once(&client, "/readyz", true).await;
            recorder.outcome("readyz-poller", "/readyz", began.elapsed(), result);
            drop(permit);
        });
        while polls.try_join_next().is_some() {}
    }
    while polls.join_next().await.is_some() {}
}

// ------------------------------------------------------------------------------------------------
// Watches, as client-go's reflector does them

enum StreamEnd {
    /// The server ended the stream (timeoutSeconds, or the slot shutting down).
    Clean,
    /// The connection broke mid-stream.
    Cut(Kind),
    /// An ERROR event with code 410: the resourceVersion is too old, re-list.
    Gone,
    Stopped,
}

/// One watcher: list, watch from the list's resourceVersion, re-watch from the last one seen,
/// re-list on 410. Like client-go, a watch asks for a server-side timeout of 5-10 minutes.
async fn watcher(client: Client, id: usize, recorder: Recorder, stop: Arc<AtomicBool>) {
    let mut resource_version: Option<String> = None;
    let mut rng_state = 0x9e37_79b9_u32.wrapping_mul(id as u32 + 1);
    while !stop.load(Ordering::SeqCst) {
        let Some(rv) = resource_version.clone() else {
            let began = Instant::now();
            let listed = list(&client).await;
            recorder.lock().watch.lists += 1;
            match listed {
                Ok(rv) => {
                    recorder.outcome("watch", WORKSPACES, began.elapsed(), Ok(()));
                    resource_version = Some(rv);
                }
                Err(failure) => {
                    recorder.outcome("watch", WORKSPACES, began.elapsed(), Err(failure));
                    // client-go's reflector backs off (800 ms at first) after a failed list.
                    tokio::time::sleep(Duration::from_millis(800)).await;
                }
            }
            continue;
        };
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 17;
        rng_state ^= rng_state << 5;
        let timeout_seconds = 300 + rng_state % 300;
        let path = format!(
            "{WORKSPACES}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={timeout_seconds}"
        );
        let began = Instant::now();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, client.send(get(&path, false))).await;
        recorder.lock().watch.watches += 1;
        let response = match answer {
            Err(_) => {
                let failure = (Kind::Timeout, format!("no answer within {REQUEST_TIMEOUT:?}"));
                recorder.outcome("watch", "watch workspaces", began.elapsed(), Err(failure));
                tokio::time::sleep(Duration::from_millis(800)).await;
                continue;
            }
            Ok(Err(e)) => {
                recorder.outcome(
                    "watch",
                    "watch workspaces",
                    began.elapsed(),
                    Err((classify(&e), chain_text(&e))),
                );
                tokio::time::sleep(Duration::from_millis(800)).await;
                continue;
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status == http::StatusCode::GONE {
            // An answer client-go expects: not a failure, a re-list.
            recorder.outcome("watch", "watch workspaces", began.elapsed(), Ok(()));
            recorder.lock().watch.relists_410 += 1;
            resource_version = None;
            continue;
        }
        if !status.is_success() {
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            recorder.outcome(
                "watch",
                "watch workspaces",
                began.elapsed(),
                Err((Kind::Status(status.as_u16()), short_body(&body))),
            );
            tokio::time::sleep(Duration::from_millis(800)).await;
            continue;
        }
        recorder.outcome("watch", "watch workspaces", began.elapsed(), Ok(()));
        match read_stream(response, &mut resource_version, &recorder, &stop).await {
            StreamEnd::Clean => recorder.lock().watch.streams_ended_clean += 1,
            StreamEnd::Cut(kind) => *recorder.lock().watch.streams_cut.entry(kind.label()).or_default() += 1,
            StreamEnd::Gone => {
                recorder.lock().watch.relists_410 += 1;
                resource_version = None;
            }
            StreamEnd::Stopped => break,
        }
    }
}

/// LIST the workspaces: the list's resourceVersion.
async fn list(client: &Client) -> Result<String, (Kind, String)> {
    let work = async {
        let response = client
            .send(get(WORKSPACES, false))
            .await
            .map_err(|e| (classify(&e), chain_text(&e)))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| (classify(&e), chain_text(&e)))?
            .to_bytes();
        if !status.is_success() {
            return Err((Kind::Status(status.as_u16()), short_body(&body)));
        }
        let list: Value = serde_json::from_slice(&body).map_err(|e| (Kind::Other, format!("list: {e}")))?;
        list["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| (Kind::Other, "list without metadata.resourceVersion".to_string()))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err((Kind::Timeout, format!("no whole answer within {REQUEST_TIMEOUT:?}"))),
    }
}

/// Reads watch events (one JSON object a line) until the stream ends, keeping the last
/// resourceVersion seen.
async fn read_stream(
    response: http::Response<kube::client::Body>,
    resource_version: &mut Option<String>,
    recorder: &Recorder,
    stop: &AtomicBool,
) -> StreamEnd {
    let mut body = response.into_body().into_data_stream();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            chunk = body.next() => chunk,
            _ = wait_for(stop) => return StreamEnd::Stopped,
        };
        match chunk {
            None => return StreamEnd::Clean,
            Some(Err(e)) => return StreamEnd::Cut(classify(&e)),
            Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
        }
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let type_ = event["type"].as_str().unwrap_or("?").to_string();
            *recorder.lock().watch.events.entry(type_.clone()).or_default() += 1;
            if type_ == "ERROR" {
                if event["object"]["code"] == 410 {
                    return StreamEnd::Gone;
                }
                continue;
            }
            if let Some(rv) = event["object"]["metadata"]["resourceVersion"].as_str() {
                *resource_version = Some(rv.to_string());
            }
        }
    }
}

async fn wait_for(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ------------------------------------------------------------------------------------------------
// Report

fn percentile(sorted: &[f32], p: f64) -> f32 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

fn report(stats: &mut Stats, elapsed: Duration) -> Value {
    let total: u64 = stats.classes.values().map(|c| c.requests).sum();
    let failed = stats.failures.len() as u64;
    println!(
        "roll_load: {:.1} s, {total} requests, {failed} failed",
        elapsed.as_secs_f64()
    );
    println!(
        "  {:<16} {:>9} {:>7} {:>8} {:>8} {:>8}",
        "client", "requests", "failed", "p50 ms", "p99 ms", "max ms"
    );
    let mut classes = serde_json::Map::new();
    for (class, c) in stats.classes.iter_mut() {
        c.latencies_ms.sort_by(|a, b| a.total_cmp(b));
        let failed = stats.failures.iter().filter(|f| f.class == *class).count();
        let (p50, p99, max) = (
            percentile(&c.latencies_ms, 0.5),
            percentile(&c.latencies_ms, 0.99),
            c.latencies_ms.last().copied().unwrap_or(0.0),
        );
        println!(
            "  {class:<16} {:>9} {failed:>7} {p50:>8.1} {p99:>8.1} {max:>8.1}",
            c.requests
        );
        classes.insert(
            class.to_string(),
            json!({ "requests": c.requests, "failed": failed, "p50_ms": p50, "p99_ms": p99, "max_ms": max }),
        );
    }
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for kind in ["refused", "reset", "closed", "timeout", "tls", "other"] {
        by_kind.insert(kind.to_string(), 0);
    }
    for f in &stats.failures {
        *by_kind.entry(f.kind.label()).or_default() += 1;
    }
    let non_2xx: u64 = by_kind
        .iter()
        .filter(|(k, _)| k.starts_with("http-"))
        .map(|(_, v)| v)
        .sum();
    println!(
        "failed by kind: {} (non-2xx in all: {non_2xx})",
        by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let w = &stats.watch;
    println!(
        "watches: {} lists, {} watch requests, {} re-lists after 410; streams ended by the server {}, cut {}; events {}",
        w.lists,
        w.watches,
        w.relists_410,
        w.streams_ended_clean,
        if w.streams_cut.is_empty() {
            "0".to_string()
        } else {
            w.streams_cut
                .iter()
                .map(|(k, v)| format!("{v} ({k})"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        w.events
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "keep-alive GET attempts retried after a broken kept-alive connection: {}; poller ticks skipped ({POLLS_IN_FLIGHT} polls in flight): {}",
        stats.retried.len(),
        stats.polls_skipped
    );
    for (what, list) in [("failed", &stats.failures), ("retried", &stats.retried)] {
        for line in grouped(list) {
            println!("  {what} {line}");
        }
    }
    json!({
        "seconds": elapsed.as_secs_f64(),
        "requests": total,
        "failed": failed,
        "failedByKind": by_kind,
        "clients": classes,
        "watch": {
            "lists": w.lists,
            "watches": w.watches,
            "relists410": w.relists_410,
            "streamsEndedByServer": w.streams_ended_clean,
            "streamsCut": w.streams_cut,
            "events": w.events,
        },
        "pollsSkipped": stats.polls_skipped,
        "failures": stats.failures.iter().map(failure_json).collect::<Vec<_>>(),
        "retried": stats.retried.iter().map(failure_json).collect::<Vec<_>>(),
    })
}

fn failure_json(f: &Failure) -> Value {
    json!({
        "at": f.at.to_rfc3339_opts(SecondsFormat::Micros, true),
        "client": f.class,
        "path": f.path,
        "kind": f.kind.label(),
        "detail": f.detail,
    })
}

/// Failures alike (client, path, kind, detail) on one line: how many, the first and the last.
fn grouped(failures: &[Failure]) -> Vec<String> {
    // (client, path, kind, detail) -> (how many, first, last)
    type Group<'a> = (&'a str, &'a str, String, &'a str);
    let mut groups: BTreeMap<Group, (usize, DateTime<Utc>, DateTime<Utc>)> = BTreeMap::new();
    for f in failures {
        let key = (f.class, f.path.as_str(), f.kind.label(), f.detail.as_str());
        let entry = groups.entry(key).or_insert((0, f.at, f.at));
        entry.0 += 1;
        entry.1 = entry.1.min(f.at);
        entry.2 = entry.2.max(f.at);
    }
    groups
        .into_iter()
        .map(|((class, path, kind, detail), (n, first, last))| {
            format!(
                "{n} x {class} GET {path}: {kind}: {detail} ({} to {})",
                first.to_rfc3339_opts(SecondsFormat::Millis, true),
                last.to_rfc3339_opts(SecondsFormat::Millis, true)
            )
        })
        .collect()
}

/// The timeline file: a header, then one line per request (paths carry no commas).
fn timeline_csv(timeline: &[Outcome]) -> String {
    let mut out = String::from("at,took_ms,class,path,outcome\n");
    for o in timeline {
        let at = o.at.timestamp_micros() as f64 / 1e6;
        let outcome = o.failed.as_ref().map_or_else(|| "ok".to_string(), Kind::label);
        out.push_str(&format!(
            "{at:.6},{:.1},{},{},{outcome}\n",
            o.took.as_secs_f64() * 1000.0,
            o.class,
            o.path
        ));
    }
    out
}

// ------------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server = format!("https://{}", args.front);
    let config = config_for_context(&args.kubeconfig, &args.context, &server).await?;

    let recorder = Recorder {
        stats: Arc::new(Mutex::new(Stats::default())),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    let poller = nodelay_client(&config)?;
    tasks.spawn(poller_loop(
        poller,
        Duration::from_millis(args.poll_ms),
        recorder.clone(),
        stop.clone(),
    ));
    let cadences = [
        (
            args.keepalive_clients,
            Cadence {
                class: "keep-alive",
                period: Duration::from_millis(args.keepalive_ms),
                close: false,
            },
        ),
        (
            args.new_connection_clients,
            Cadence {
                class: "new-connection",
                period: Duration::from_millis(args.new_connection_ms),
                close: true,
            },
        ),
    ];
    for (clients, cadence) in cadences {
        for i in 0..clients {
            // One client each: its own pool, so its own kept-alive connection.
            let client = nodelay_client(&config)?;
            let (paths, recorder, stop) = (args.paths.clone(), recorder.clone(), stop.clone());
            tasks.spawn(getter(client, cadence, paths, i, recorder, stop));
        }
    }
    for id in 0..args.watches {
        let client = nodelay_client(&config)?;
        tasks.spawn(watcher(client, id, recorder.clone(), stop.clone()));
    }
    eprintln!(
        "roll_load: through {server}: /readyz every {} ms, {} keep-alive and {} new-connection clients ({}), {} watches",
        args.poll_ms,
        args.keepalive_clients,
        args.new_connection_clients,
        args.paths.join(", "),
        args.watches
    );

    let began = Instant::now();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let deadline = args.duration.map(|s| began + Duration::from_secs_f64(s));
    loop {
        let tick = tokio::time::sleep(Duration::from_millis(100));
        tokio::select! {
            _ = tick => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if args.stop_file.as_ref().is_some_and(|f| f.exists()) {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let elapsed = began.elapsed();
    // Requests in flight finish (each is bounded by REQUEST_TIMEOUT); watches stop at once.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(2), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();

    let mut stats = recorder.lock();
    let summary = report(&mut stats, elapsed);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?)?;
    }
    if let Some(path) = &args.timeline {
        std::fs::write(path, timeline_csv(&stats.timeline))?;
    }
    Ok(())
}
