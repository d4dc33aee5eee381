//! Latency figures for the API that `kcpshard serve` serves, over HTTPS with kube-rs' own client
//! (hyper + rustls, HTTP/1.1, the kubeconfig's CA and token), as `hack/bench/api.sh` runs it:
//!
//!     cargo run --release --example api_bench -- --kubeconfig STATE/kubeconfig --pid PID
//!
//! It fills the API with `--objects` events (events.k8s.io/v1, which the controller ignores) and a
//! few KcpShards whose kcp binary does not exist (a controller, if one runs, reports BinaryMissing
//! and starts no kcp), then times, one request at a time on one kept-alive connection: GET of one
//! object and LIST of all, in both event views and for KcpShards, and a merge patch (a durable
//! write). Then `--watchers` concurrent watches of KcpShards and the time until all of them have
//! seen one update, `--rounds` times. With `--pid`, the server's VmRSS at each stage.
//!
//! Every request is timed from just before it is sent to the last byte of the body read; the body
//! is not decoded, so client-side parsing is not in the figures (the watchers parse each line).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Method, Request};
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use tokio::sync::mpsc;

struct Args {
    kubeconfig: String,
    pid: Option<u32>,
    objects: usize,
    samples: usize,
    list_samples: usize,
    watchers: usize,
    rounds: usize,
    shards: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        kubeconfig: String::new(),
        pid: None,
        objects: 1000,
        samples: 2000,
        list_samples: 200,
        watchers: 100,
        rounds: 20,
        shards: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => args.kubeconfig = value()?,
            "--pid" => args.pid = Some(value()?.parse()?),
            "--objects" => args.objects = value()?.parse()?,
            "--samples" => args.samples = value()?.parse()?,
            "--list-samples" => args.list_samples = value()?.parse()?,
            "--watchers" => args.watchers = value()?.parse()?,
            "--rounds" => args.rounds = value()?.parse()?,
            "--shards" => args.shards = value()?.parse()?,
            other => bail!("unknown flag {other}; see the top of examples/api_bench.rs"),
        }
    }
    if args.kubeconfig.is_empty() {
        bail!("--kubeconfig is required");
    }
    Ok(args)
}

const NAMESPACE: &str = "bench";
const EVENTS_V1: &str = "/apis/events.k8s.io/v1/namespaces/bench/events";
const CORE_EVENTS: &str = "/api/v1/namespaces/bench/events";
const SHARDS: &str = "/apis/kcpshard.io/v1alpha1/kcpshards";

/// Sends one request and reads the whole body; fails on a non-2xx answer.
async fn send(client: &Client, method: Method, path: &str, content_type: &str, body: Vec<u8>) -> anyhow::Result<Bytes> {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(body)?;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
    }
    Ok(bytes)
}

async fn get(client: &Client, path: &str) -> anyhow::Result<Bytes> {
    send(client, Method::GET, path, "application/json", Vec::new()).await
}

/// [`get`] with owned arguments, for the timing loops' closures.
async fn get_owned(client: Client, path: String) -> anyhow::Result<Bytes> {
    get(&client, &path).await
}

fn event(i: usize) -> Value {
    event_named(&format!("bench-{i:04}"), i)
}

fn event_named(name: &str, i: usize) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "eventTime": "2026-11-29T10:00:00.000000Z",
        "regarding": {"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "name": format!("bench-{}", i % 3)},
        "reason": "SlotStarting",
        "type": "Normal",
        "action": "Reconcile",
        "note": format!("Started slot a of bench-{} (event {i}), a note of ordinary length for an event", i % 3),
        "reportingController": "kcpshard.io/bench",
        "reportingInstance": "bench",
    })
}

fn shard(i: usize, port: u16) -> Value {
    json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": {"name": format!("bench-{i}")},
        "spec": {
            "version": "v0.31.2",
            // A controller, if one runs, reports BinaryMissing and starts no kcp.
            "kcp": {"binary": "/nonexistent/kcp-{version}"},
            "store": {"type": "KineSqlite"},
            "front": {"type": "Tcp", "listen": format!("127.0.0.1:{port}")},
        },
    })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Latencies of one kind of request.
struct Figures {
    name: String,
    samples: Vec<Duration>,
    bytes: usize,
}

impl Figures {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    fn mean(&self) -> Duration {
        self.samples.iter().sum::<Duration>() / self.samples.len() as u32
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn print_table(rows: &[Figures]) {
    println!(
        "| {:<44} | {:>7} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} |",
        "request", "samples", "p50 ms", "p99 ms", "mean ms", "max ms", "body B"
    );
    println!(
        "|{:-<46}|{:->9}|{:->11}|{:->11}|{:->11}|{:->11}|{:->11}|",
        "", "", "", "", "", "", ""
    );
    for f in rows {
        println!(
            "| {:<44} | {:>7} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} |",
            f.name,
            f.samples.len(),
            ms(f.percentile(50.0)),
            ms(f.percentile(99.0)),
            ms(f.mean()),
            ms(f.percentile(100.0)),
            f.bytes
        );
    }
}

/// One kind of request to time: its row name and how to make request `i`.
type Kind = (String, Box<dyn Fn(usize) -> BoxFuture<'static, anyhow::Result<Bytes>>>);

/// Times `samples` sequential requests of each kind, after `samples / 10` untimed ones. The kinds
/// take turns (A B C A B C ...), so load from elsewhere on the machine falls on all of them alike.
async fn time(kinds: Vec<Kind>, samples: usize) -> anyhow::Result<Vec<Figures>> {
    let mut rows: Vec<Figures> = kinds
        .iter()
        .map(|(name, _)| Figures {
            name: name.clone(),
            samples: Vec::with_capacity(samples),
            bytes: 0,
        })
        .collect();
    for i in 0..samples + samples / 10 {
        for (row, (_, request)) in rows.iter_mut().zip(&kinds) {
            let start = Instant::now();
            let body = request(i).await?;
            if i >= samples / 10 {
                row.samples.push(start.elapsed());
                row.bytes = body.len();
            }
        }
    }
    Ok(rows)
}

/// A GET of the path `path(i)` returns, as a [`Kind`].
fn get_kind(client: &Client, name: String, path: impl Fn(usize) -> String + 'static) -> Kind {
    let client = client.clone();
    (name, Box::new(move |i| get_owned(client.clone(), path(i)).boxed()))
}

fn rss(pid: Option<u32>) -> String {
    let Some(pid) = pid else { return "n/a (no --pid)".into() };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l[name.len()..].trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "VmRSS {}, VmHWM {} (peak), threads {}",
        field("VmRSS:"),
        field("VmHWM:"),
        field("Threads:")
    )
}

/// One watcher: reports the moment it reads the MODIFIED event of each round.
async fn watcher(
    client: Client,
    path: String,
    ready: mpsc::Sender<()>,
    seen: mpsc::UnboundedSender<(u64, Instant)>,
) -> anyhow::Result<()> {
    let request = Request::get(path).body(kube::client::Body::empty())?;
    let response = client.send(request).await?;
    if !response.status().is_success() {
        bail!("watch: {}", response.status());
    }
    // The server subscribes before it answers, so from here on no change can be missed.
    ready.send(()).await?;
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let now = Instant::now();
            let event: Value = serde_json::from_slice(&line)?;
            if event["type"] == "MODIFIED"
                && let Some(round) = event["object"]["metadata"]["annotations"]["bench.kcpshard.io/round"].as_str()
            {
                let _ = seen.send((round.parse()?, now));
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.default_retry = false;
    let client = Client::try_from(config)?;
    println!(
        "server: {}",
        String::from_utf8_lossy(&get(&client, "/version").await?).replace('\n', "")
    );
    println!("RSS of serve, idle after start: {}", rss(args.pid));

    // Fill: events from 8 writers at once (each create is a durable write), then the shards.
    let fill_start = Instant::now();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (client, objects) = (client.clone(), args.objects);
        writers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            for i in (w..objects).step_by(8) {
                let start = Instant::now();
                send(
                    &client,
                    Method::POST,
                    EVENTS_V1,
                    "application/json",
                    serde_json::to_vec(&event(i))?,
                )
                .await?;
                samples.push(start.elapsed());
            }
            anyhow::Ok(samples)
        }));
    }
    let mut creates = Figures {
        name: "POST event (create), 8 writers at once".into(),
        samples: Vec::new(),
        bytes: 0,
    };
    for w in writers {
        creates.samples.extend(w.await??);
    }
    let fill = fill_start.elapsed();
    for i in 0..args.shards {
        send(
            &client,
            Method::POST,
            SHARDS,
            "application/json",
            serde_json::to_vec(&shard(i, free_port()?))?,
        )
        .await?;
    }
    println!(
        "filled {} events in {:.2} s ({:.0} creates/s with 8 writers) and {} KcpShards",
        args.objects,
        fill.as_secs_f64(),
        args.objects as f64 / fill.as_secs_f64(),
        args.shards
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "RSS of serve, idle with {} events and {} KcpShards: {}",
        args.objects,
        args.shards,
        rss(args.pid)
    );

    let n = args.objects;
    let mut rows = vec![creates];
    let shards = args.shards.max(1);
    let event = move |i: usize| format!("bench-{:04}", (i * 7919) % n);
    rows.extend(
        time(
            vec![
                get_kind(&client, "GET one event (events.k8s.io/v1)".into(), move |i| {
                    format!("{EVENTS_V1}/{}", event(i))
                }),
                get_kind(&client, "GET one event (core/v1 view)".into(), move |i| {
                    format!("{CORE_EVENTS}/{}", event(i))
                }),
                get_kind(&client, "GET one KcpShard".into(), move |i| {
                    format!("{SHARDS}/bench-{}", i % shards)
                }),
                get_kind(&client, format!("LIST {} KcpShards", args.shards), |_| {
                    SHARDS.to_string()
                }),
            ],
            args.samples,
        )
        .await?,
    );
    // The selector matches nothing: the server still copies and converts every event, but sends
    // an empty list. The difference to the full LIST is encoding and transfer.
    let none = "labelSelector=bench.kcpshard.io%2Fnone%3Dx";
    rows.extend(
        time(
            vec![
                get_kind(&client, format!("LIST {n} events (events.k8s.io/v1)"), |_| {
                    EVENTS_V1.to_string()
                }),
                get_kind(&client, format!("LIST {n} events (core/v1 view)"), |_| {
                    CORE_EVENTS.to_string()
                }),
                get_kind(
                    &client,
                    format!("LIST {n} events, selector matches none (v1)"),
                    move |_| format!("{EVENTS_V1}?{none}"),
                ),
                get_kind(
                    &client,
                    format!("LIST {n} events, selector matches none (core)"),
                    move |_| format!("{CORE_EVENTS}?{none}"),
                ),
            ],
            args.list_samples,
        )
        .await?,
    );
    let patcher = client.clone();
    let patch: Kind = (
        "PATCH one event (merge; a durable write)".into(),
        Box::new(move |i| {
            let client = patcher.clone();
            async move {
                let body = serde_json::to_vec(&json!({"note": format!("patched {i}")}))?;
                send(
                    &client,
                    Method::PATCH,
                    &format!("{EVENTS_V1}/{}", event(i)),
                    "application/merge-patch+json",
                    body,
                )
                .await
            }
            .boxed()
        }),
    );
    rows.extend(time(vec![patch], args.list_samples).await?);

    // Reads while one client writes without pause: how long a read waits behind a write.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let body = serde_json::to_vec(&json!({"note": format!("busy {i}")}))?;
                send(
                    &client,
                    Method::PATCH,
                    &format!("{EVENTS_V1}/{}", event(i)),
                    "application/merge-patch+json",
                    body,
                )
                .await?;
                i += 1;
            }
            anyhow::Ok(i)
        })
    };
    let mut busy = time(
        vec![
            get_kind(&client, "GET one event, while 1 client patches".into(), move |i| {
                format!("{EVENTS_V1}/{}", event(i))
            }),
            get_kind(&client, "GET one KcpShard, while 1 client patches".into(), move |i| {
                format!("{SHARDS}/bench-{}", i % shards)
            }),
        ],
        args.samples / 2,
    )
    .await?;
    stop.store(true, Ordering::Relaxed);
    let patches = writer.await??;
    rows.append(&mut busy);
    println!("the busy writer made {patches} patches meanwhile");

    // Watchers: all subscribed, then one update per round; the round's figure is the time from
    // just before the PATCH is sent until the last watcher has read the MODIFIED event.
    let list: Value = serde_json::from_slice(&get(&client, SHARDS).await?)?;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string();
    let (ready_tx, mut ready_rx) = mpsc::channel(args.watchers);
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let connect_start = Instant::now();
    for _ in 0..args.watchers {
        let path = format!("{SHARDS}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true");
        tasks.push(tokio::spawn(watcher(
            client.clone(),
            path,
            ready_tx.clone(),
            seen_tx.clone(),
        )));
    }
    for _ in 0..args.watchers {
        ready_rx.recv().await.context("a watcher failed to start")?;
    }
    let connect = connect_start.elapsed();
    println!("RSS of serve with {} open watches: {}", args.watchers, rss(args.pid));
    let mut all_saw = Figures {
        name: format!("{} watchers all see one update", args.watchers),
        samples: Vec::new(),
        bytes: 0,
    };
    let mut each_saw = Figures {
        name: format!("{} watchers: each one sees the update", args.watchers),
        samples: Vec::new(),
        bytes: 0,
    };
    for round in 0..args.rounds as u64 {
        let patch = json!({"metadata": {"annotations": {"bench.kcpshard.io/round": round.to_string()}}});
        let start = Instant::now();
        send(
            &client,
            Method::PATCH,
            &format!("{SHARDS}/bench-0"),
            "application/merge-patch+json",
            serde_json::to_vec(&patch)?,
        )
        .await?;
        let mut last = start;
        for _ in 0..args.watchers {
            let (seen_round, at) = tokio::time::timeout(Duration::from_secs(30), seen_rx.recv())
                .await?
                .context("watchers ended")?;
            if seen_round != round {
                bail!("a watcher saw round {seen_round} during round {round}");
            }
            each_saw.samples.push(at - start);
            last = last.max(at);
        }
        all_saw.samples.push(last - start);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for task in &tasks {
        task.abort();
    }
    rows.push(all_saw);
    rows.push(each_saw);

    // Last, as it trims the oldest of the events the rows above read: each create beyond the
    // retention limit also deletes the oldest event.
    let creator = client.clone();
    let create: Kind = (
        format!("POST event at the {n}-event retention limit"),
        Box::new(move |i| {
            let client = creator.clone();
            async move {
                send(
                    &client,
                    Method::POST,
                    EVENTS_V1,
                    "application/json",
                    serde_json::to_vec(&event_named(&format!("extra-{i:04}"), i))?,
                )
                .await
            }
            .boxed()
        }),
    );
    rows.extend(time(vec![create], args.list_samples).await?);

    println!();
    print_table(&rows);
    println!();
    println!(
        "{} watches opened and subscribed in {:.1} ms; {} rounds",
        args.watchers,
        connect.as_secs_f64() * 1000.0,
        args.rounds
    );
    drop(tasks);
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("RSS of serve, idle after the runs: {}", rss(args.pid));
    Ok(())
}
