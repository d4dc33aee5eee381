//! Durability of the file-backed API : `kcpshard serve` is
//! SIGKILLed at random moments while several clients write, and restarted on the same state dir.
//! Afterwards every acknowledged write is there, resourceVersions never went backwards, and the
//! store loads.
//!
//! The writes are events (events.k8s.io/v1), which the controller ignores, to a fixed set of
//! [`CLIENTS`] x [`EVENTS_PER_CLIENT`] objects: well under the event retention limit, so no write
//! is trimmed away; `serve` runs without the controller (`Serve::start`), as in every API test.
//! Each client owns its objects, so the writes to one object are sequential and
//! "the last acknowledged write, or a later one" is well defined.
//!
//! A write counts as acknowledged only when the server answered 2xx. A write whose answer was lost
//! (the connection died with the server) is unknown: it may or may not have happened, and the
//! client sends it again, as a controller would, to the new server. Reproduce a failure with the
//! seed it prints: `KCPSHARD_DURABILITY_SEED=<seed> cargo test --test durability`.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::watch;

use common::Serve;

/// Concurrent writers.
const CLIENTS: usize = 4;
/// The events each writer owns: one create, then merge patches in turn.
const EVENTS_PER_CLIENT: usize = 50;
/// Writes per client: 1,000 in all.
const WRITES_PER_CLIENT: usize = 250;
/// SIGKILLs of `serve` during the writes (one more follows them, before the final check).
const KILLS: usize = 4;
/// One request's limit; a SIGKILLed server resets its connections at once, so this only bounds a
/// hang.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const NAMESPACE: &str = "default";
/// The annotation that carries a write's marker (the `note` carries it too).
const MARKER: &str = "durability.kcpshard.io/marker";

fn events_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events")
}

fn event_name(client: usize, object: usize) -> String {
    format!("durability-c{client}-e{object:02}")
}

/// The content of write `seq` (0 is the create) to `object` of `client`.
fn marker(client: usize, object: usize, seq: usize) -> String {
    format!("c{client}-e{object}-w{seq}")
}

fn marker_seq(marker: &str) -> Option<usize> {
    marker.rsplit_once("-w").and_then(|(_, seq)| seq.parse().ok())
}

/// What became of one write.
#[derive(Debug, Clone)]
struct Record {
    client: usize,
    object: usize,
    seq: usize,
    /// The server answered 2xx with this resourceVersion.
    rv: Option<u64>,
    /// The serve instance that answered, when the request was sent and answered while that instance
    /// was the only one running (see [`Shared::epoch`]); None when a restart fell in between.
    epoch: Option<u64>,
    /// Earlier attempts of this write lost their answer: a 2xx now may be a no-op that returns the
    /// resourceVersion the lost attempt got from an earlier instance.
    retried: bool,
}

struct Shared {
    kubeconfig: PathBuf,
    /// Which `serve` instance is running: bumped after a kill and before the next start. A request
    /// that reads the same epoch before it is sent and after its answer came was answered by that
    /// instance: the one before it was dead when it was sent, the next did not exist yet.
    epoch: AtomicU64,
    /// Writes settled so far (acknowledged, or found to exist), for the killer's schedule.
    settled: watch::Sender<usize>,
}

/// A tiny, seedable generator (splitmix64): the test needs reproducible randomness, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    match std::env::var("KCPSHARD_DURABILITY_SEED") {
        Ok(s) => s.parse().expect("KCPSHARD_DURABILITY_SEED is a number"),
        Err(_) => {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes).expect("random bytes");
            u64::from_le_bytes(bytes)
        }
    }
}

/// A client for the serve instance the kubeconfig names now, and that instance's epoch. Waits while
/// the kubeconfig is missing (between a kill and the next start).
async fn connect(shared: &Shared) -> (u64, Api<DynamicObject>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = shared.epoch.load(Ordering::SeqCst);
        if let Ok(client) = client_from(&shared.kubeconfig).await
            && shared.epoch.load(Ordering::SeqCst) == before
        {
            return (before, Api::namespaced_with(client, NAMESPACE, &events_resource()));
        }
        assert!(
            Instant::now() < deadline,
            "no usable kubeconfig at {} for 60s",
            shared.kubeconfig.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn client_from(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    // One attempt per request: this test decides what to resend, and records each attempt.
    config.default_retry = false;
    config.read_timeout = Some(REQUEST_TIMEOUT);
    Ok(Client::try_from(config)?)
}

/// Why an attempt did not settle the write.
enum Failed {
    /// The answer was lost: connection refused or reset, or no answer in time.
    Lost(String),
    /// The server said no.
    Refused(Box<kube::core::Status>),
}

async fn attempt(api: &Api<DynamicObject>, client: usize, object: usize, seq: usize) -> Result<DynamicObject, Failed> {
    let name = event_name(client, object);
    let mark = marker(client, object, seq);
    let request = async {
        if seq == 0 {
            let event: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {MARKER: mark}},
                "eventTime": "2026-11-29T10:00:00.000000Z",
                "regarding": {"kind": "Pod", "namespace": NAMESPACE, "name": format!("writer-{client}")},
                "reason": "DurabilityWrite",
                "type": "Normal",
                "action": "Write",
                "note": mark,
                "reportingController": "kcpshard.io/durability-test",
                "reportingInstance": format!("writer-{client}"),
            }))
            .expect("an event");
            api.create(&PostParams::default(), &event).await
        } else {
            let patch = json!({"metadata": {"annotations": {MARKER: mark}}, "note": mark});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
        }
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(object)) => Ok(object),
        Ok(Err(kube::Error::Api(status))) => Err(Failed::Refused(status)),
        Ok(Err(other)) => Err(Failed::Lost(other.to_string())),
        Err(_) => Err(Failed::Lost(format!("no answer within {REQUEST_TIMEOUT:?}"))),
    }
}

/// One client: [`WRITES_PER_CLIENT`] writes to its own events, each resent until it settles.
async fn writer(shared: Arc<Shared>, client: usize) -> Vec<Record> {
    let (mut epoch, mut api) = connect(&shared).await;
    let mut records = Vec::new();
    for write in 0..WRITES_PER_CLIENT {
        let (object, seq) = (write % EVENTS_PER_CLIENT, write / EVENTS_PER_CLIENT);
        let mut lost = Vec::new();
        loop {
            let before = shared.epoch.load(Ordering::SeqCst);
            let result = attempt(&api, client, object, seq).await;
            let after = shared.epoch.load(Ordering::SeqCst);
            let answered_by = (before == after && after == epoch).then_some(after);
            match result {
                Ok(written) => {
                    let rv = written
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok());
                    assert!(rv.is_some(), "a 2xx answer without a resourceVersion: {written:?}");
                    let note = written.data["note"].as_str().unwrap_or_default();
                    assert_eq!(
                        note,
                        marker(client, object, seq),
                        "the answer to a write carries what was written"
                    );
                    records.push(Record {
                        client,
                        object,
                        seq,
                        rv,
                        epoch: answered_by,
                        retried: !lost.is_empty(),
                    });
                    break;
                }
                Err(Failed::Refused(status)) if seq == 0 && status.code == 409 && !lost.is_empty() => {
                    // A create whose answer was lost had happened: it is durable, but nobody
                    // acknowledged it, so it is not a record.
                    break;
                }
                Err(Failed::Refused(status)) if seq > 0 && status.code == 404 => {
                    panic!(
                        "writer {client}: {} is gone, though its create was settled earlier: {status:?}",
                        event_name(client, object)
                    )
                }
                Err(Failed::Refused(status)) => {
                    panic!(
                        "writer {client}: write {seq} to {} was refused after {} lost attempts: {status:?}",
                        event_name(client, object),
                        lost.len()
                    )
                }
                Err(Failed::Lost(why)) => {
                    lost.push(why);
                    assert!(
                        lost.len() < 50,
                        "writer {client}: write {seq} to {} never got an answer: {lost:?}",
                        event_name(client, object)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    (epoch, api) = connect(&shared).await;
                }
            }
        }
        shared.settled.send_modify(|n| *n += 1);
    }
    records
}

/// SIGKILLs `serve` once the writers have settled each of `thresholds` writes, a random few
/// milliseconds later (so the kill lands inside a write as often as between two), and starts it
/// again on the same state dir.
async fn killer(shared: Arc<Shared>, mut serve: Serve, thresholds: Vec<usize>, delays_ms: Vec<u64>) -> Serve {
    let mut settled = shared.settled.subscribe();
    for (threshold, delay) in thresholds.into_iter().zip(delays_ms) {
        settled
            .wait_for(|n| *n >= threshold)
            .await
            .expect("the writers' counter");
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let at = *settled.borrow();
        serve.kill();
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        serve.restart().await;
        eprintln!(
            "killed serve after {at} settled writes (+{delay} ms); restarted in {:?}",
            started.elapsed()
        );
    }
    serve
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_sigkill_and_resource_versions_never_go_backwards() {
    let started = Instant::now();
    let seed = seed();
    eprintln!("seed {seed} (KCPSHARD_DURABILITY_SEED={seed} repeats this run's kill schedule)");
    let mut rng = Rng(seed);
    let total = CLIENTS * WRITES_PER_CLIENT;
    // Kill points spread over the run: one in each of KILLS equal stretches of the writes.
    let stretch = (total - 100) / KILLS;
    let thresholds: Vec<usize> = (0..KILLS)
        .map(|i| 50 + i * stretch + rng.below(stretch as u64) as usize)
        .collect();
    let delays_ms: Vec<u64> = (0..KILLS).map(|_| rng.below(15)).collect();

    let serve = Serve::start().await;
    let shared = Arc::new(Shared {
        kubeconfig: serve.kubeconfig.clone(),
        epoch: AtomicU64::new(0),
        settled: watch::channel(0).0,
    });
    let killing = tokio::spawn(killer(shared.clone(), serve, thresholds, delays_ms));
    let writers: Vec<_> = (0..CLIENTS).map(|c| tokio::spawn(writer(shared.clone(), c))).collect();
    let mut records = Vec::new();
    for w in writers {
        records.extend(w.await.expect("a writer panicked"));
    }
    let mut serve = killing.await.expect("the killer panicked");
    eprintln!(
        "{} of {total} writes acknowledged ({} after a resend) in {:?}",
        records.len(),
        records.iter().filter(|r| r.retried).count(),
        started.elapsed()
    );

    // Resources versions: every version an instance handed out is above every version an earlier
    // instance acknowledged. Resent writes are left out of the "handed out" side: a resend that
    // finds its lost attempt applied is a no-op, answered with the lost attempt's older version.
    let mut acked_by_epoch: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // epoch -> (min fresh, max)
    for r in &records {
        if let (Some(epoch), Some(rv)) = (r.epoch, r.rv) {
            let entry = acked_by_epoch.entry(epoch).or_insert((u64::MAX, 0));
            if !r.retried {
                entry.0 = entry.0.min(rv);
            }
            entry.1 = entry.1.max(rv);
        }
    }
    let mut max_before = 0;
    for (epoch, (min_fresh, max)) in &acked_by_epoch {
        assert!(
            *min_fresh == u64::MAX || *min_fresh > max_before,
            "serve instance {epoch} handed out resourceVersion {min_fresh}, not above {max_before}, which an earlier instance acknowledged (seed {seed})"
        );
        max_before = max_before.max(*max);
    }
    assert!(
        acked_by_epoch.len() > KILLS / 2,
        "the writes should span the restarts: {acked_by_epoch:?}"
    );
    // Within one object (one writer, in order) versions only grow.
    let mut last_by_object: BTreeMap<(usize, usize), &Record> = BTreeMap::new();
    for r in &records {
        if let Some(previous) = last_by_object.insert((r.client, r.object), r) {
            assert!(
                r.rv >= previous.rv,
                "{} went from resourceVersion {:?} to {:?} (seed {seed})",
                event_name(r.client, r.object),
                previous.rv,
                r.rv
            );
        }
    }

    // One more kill, then the store must load and hold every acknowledged write.
    serve.kill();
    shared.epoch.fetch_add(1, Ordering::SeqCst);
    serve.restart().await;
    let (_, api) = connect(&shared).await;
    let list = api
        .list(&ListParams::default())
        .await
        .expect("list events after the last restart");
    let list_rv: u64 = list
        .metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("a list resourceVersion");
    let max_acked = records.iter().filter_map(|r| r.rv).max().unwrap_or(0);
    assert!(
        list_rv >= max_acked,
        "the list's resourceVersion {list_rv} is below the acknowledged {max_acked} (seed {seed})"
    );
    let stored: BTreeMap<String, &DynamicObject> = list
        .items
        .iter()
        .map(|o| (o.metadata.name.clone().unwrap_or_default(), o))
        .collect();
    assert_eq!(
        stored.len(),
        CLIENTS * EVENTS_PER_CLIENT,
        "one event per name, none lost, none extra: {:?}",
        stored.keys().collect::<Vec<_>>()
    );
    for ((client, object), last) in &last_by_object {
        let name = event_name(*client, *object);
        let event = stored
            .get(&name)
            .unwrap_or_else(|| panic!("{name} was acknowledged but is gone (seed {seed})"));
        let note = event.data["note"].as_str().unwrap_or_default();
        let annotation = event
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MARKER))
            .map(String::as_str)
            .unwrap_or_default();
        assert_eq!(note, annotation, "{name}: note and annotation were written together");
        let seq = marker_seq(note).unwrap_or_else(|| panic!("{name} carries no marker: {note:?}"));
        // A later write may have happened without being acknowledged (its answer was lost), but
        // never one later than the writer sent.
        assert!(
            seq >= last.seq
                && seq < WRITES_PER_CLIENT.div_ceil(EVENTS_PER_CLIENT)
                && note == marker(*client, *object, seq),
            "{name} shows {note:?}, but write {} ({:?}) was acknowledged (seed {seed})",
            last.seq,
            marker(*client, *object, last.seq)
        );
        let rv: u64 = event
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        assert!(
            rv >= last.rv.unwrap_or(0),
            "{name} is at resourceVersion {rv}, below its acknowledged {:?} (seed {seed})",
            last.rv
        );
    }
    // The core/v1 view of the same store reads too (what kubectl describe uses).
    let core: Api<DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Event")),
    );
    let core_list = core.list(&ListParams::default()).await.expect("list core/v1 events");
    assert_eq!(core_list.items.len(), stored.len());
    // A write killed before its rename leaves a temp file that the next start removes; a torn
    // object file would stop serve from starting (tests/faults_api.rs), and no older version moved
    // aside as *.corrupt may be lying around either.
    let leftovers = files_ending(&serve.state_dir().join("objects"), &[".tmp", ".corrupt"]);
    assert!(
        leftovers.is_empty(),
        "torn or leftover files after a restart: {leftovers:?}"
    );
    eprintln!("done in {:?}", started.elapsed());
}

fn files_ending(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_ending(&path, suffixes));
        } else if suffixes.iter().any(|s| path.to_string_lossy().ends_with(s)) {
            found.push(path);
        }
    }
    found
}
