//! Watches: one JSON event per line on a chunked response, as client-go and kube-rs read them.
//!
//! - `resourceVersion` unset or "0": ADDED for every current object, then changes.
//! - `resourceVersion=N`: the changes after N. Too old for the in-memory history: a single ERROR
//!   event carrying a 410 Expired Status, on a 200 response (what kube-rs and client-go expect).
//! - `sendInitialEvents=true` (with `resourceVersionMatch=NotOlderThan`, client-go's streaming
//!   list, used by `kubectl wait`): ADDED for every object, then a BOOKMARK annotated
//!   `k8s.io/initial-events-end: "true"`.
//! - `allowWatchBookmarks=true`: a BOOKMARK (apiVersion, kind, resourceVersion) every
//!   [`BOOKMARK_EVERY`], so a client can resume from a recent version.
//! - A change that moves an object out of the selection is a DELETED, into it an ADDED.
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::ApiServer;
use super::error::ApiError;
use super::negotiation::Rendering;
use super::selectors::Selector;
use super::store::{Change, ChangeType};

const BOOKMARK_EVERY: Duration = Duration::from_secs(15);

/// What the client asked of the watch.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: usize,
    pub namespace: Option<String>,
    pub selector: Selector,
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    /// How each object is rendered: itself, a one-row Table (`kubectl get -w`), or its metadata.
    pub rendering: Rendering,
}

pub type WatchBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// Starts the watch and returns the response body that streams it.
pub fn start(server: Arc<ApiServer>, request: WatchRequest) -> Result<WatchBody, ApiError> {
    let (tx, rx) = mpsc::channel(64);
    let resource = &server.resources[request.resource];
    let storage = resource.storage;
    let namespace = request.namespace.clone();
    let (initial, from, live) = match request.resource_version {
        Some(rv) if rv > 0 && !request.send_initial_events => match server.objects.store.subscribe(rv) {
            Ok(sub) => {
                let backlog: Vec<Change> = sub
                    .backlog
                    .into_iter()
                    .filter(|c| in_scope(c, storage, namespace.as_deref()))
                    .collect();
                (Initial::Changes(backlog), rv, sub.live)
            }
            Err(oldest) => {
                let status = ApiError::Expired { requested: rv, oldest }.to_status();
                let line = event_line("ERROR", &status);
                let _ = tx.try_send(Ok(Frame::data(line)));
                return Ok(StreamBody::new(ReceiverStream::new(rx)));
            }
        },
        _ => {
            let (items, rv, live) = server
                .objects
                .store
                .snapshot_and_subscribe(storage, namespace.as_deref());
            (Initial::Objects(items, request.send_initial_events), rv, live)
        }
    };
    server.metrics.watchers.inc();
    tokio::spawn(async move {
        let watcher = Watcher {
            server: server.clone(),
            request,
            tx,
        };
        watcher.run(initial, from, live).await;
        server.metrics.watchers.dec();
    });
    Ok(StreamBody::new(ReceiverStream::new(rx)))
}

enum Initial {
    /// Current objects as ADDED; with a closing bookmark when the client asked for initial events.
    Objects(Vec<Value>, bool),
    /// Changes after the requested version.
    Changes(Vec<Change>),
}

struct Watcher {
    server: Arc<ApiServer>,
    request: WatchRequest,
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
}

/// The client went away.
struct Gone;

impl Watcher {
    async fn run(&self, initial: Initial, mut last_rv: u64, mut live: broadcast::Receiver<Change>) {
        let result: Result<(), Gone> = async {
            match initial {
                Initial::Objects(items, end_bookmark) => {
                    for object in items {
                        let served = self.resource().to_view(&object);
                        if self.request.selector.matches(&served) {
                            self.send("ADDED", &served).await?;
                        }
                    }
                    if end_bookmark {
                        self.bookmark(last_rv, true).await?;
                    }
                }
                Initial::Changes(changes) => {
                    for change in changes {
                        last_rv = change.resource_version;
                        self.forward(&change).await?;
                    }
                }
            }
            let mut bookmarks = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
            let deadline = tokio::time::sleep(self.request.timeout.unwrap_or(Duration::from_secs(365 * 24 * 3600)));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    change = live.recv() => match change {
                        Ok(change) if change.resource_version > last_rv => {
                            last_rv = change.resource_version;
                            if in_scope(&change, self.resource().storage, self.request.namespace.as_deref()) {
                                self.forward(&change).await?;
                            }
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            // This watcher fell too far behind to replay what it missed: end it the
                            // way the real server does, so the client re-lists.
                            let status = ApiError::Expired { requested: last_rv, oldest: self.server.objects.store.current_resource_version() }.to_status();
                            self.send_line("ERROR", &status).await?;
                            return Ok(());
                        }
                        Err(broadcast::error::RecvError::Closed) => return Ok(()),
                    },
                    _ = bookmarks.tick(), if self.request.bookmarks => self.bookmark(last_rv, false).await?,
                    _ = &mut deadline => return Ok(()),
                    _ = self.tx.closed() => return Err(Gone),
                }
            }
        }
        .await;
        let _ = result;
    }

    fn resource(&self) -> &super::resources::Resource {
        &self.server.resources[self.request.resource]
    }

    async fn forward(&self, change: &Change) -> Result<(), Gone> {
        let resource = self.resource();
        let now = resource.to_view(&change.object);
        let selected_now = self.request.selector.matches(&now);
        let selected_before = change
            .previous
            .as_ref()
            .is_some_and(|p| self.request.selector.matches(&resource.to_view(p)));
        let event_type = match (change.change_type, selected_before, selected_now) {
            (ChangeType::Deleted, true, _) => ChangeType::Deleted,
            (ChangeType::Deleted, false, _) => return Ok(()),
            (_, false, true) => ChangeType::Added,
            (_, true, true) => ChangeType::Modified,
            (_, true, false) => ChangeType::Deleted,
            (_, false, false) => return Ok(()),
        };
        self.send(event_type.as_str(), &now).await
    }

    async fn send(&self, event_type: &str, object: &Value) -> Result<(), Gone> {
        let rendered = self.request.rendering.one(self.resource(), object.clone());
        self.send_line(event_type, &rendered).await
    }

    async fn bookmark(&self, resource_version: u64, initial_events_end: bool) -> Result<(), Gone> {
        let resource = self.resource();
        let mut metadata = json!({"resourceVersion": resource_version.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({"apiVersion": resource.api_version(), "kind": resource.kind, "metadata": metadata});
        self.send_line("BOOKMARK", &object).await
    }

    async fn send_line(&self, event_type: &str, object: &Value) -> Result<(), Gone> {
        self.tx
            .send(Ok(Frame::data(event_line(event_type, object))))
            .await
            .map_err(|_| Gone)
    }
}

fn in_scope(change: &Change, storage: &str, namespace: Option<&str>) -> bool {
    change.key.resource == storage && namespace.is_none_or(|ns| change.key.namespace.as_deref() == Some(ns))
}

fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": event_type, "object": object})).expect("events serialise");
    line.push(b'\n');
    Bytes::from(line)
}
