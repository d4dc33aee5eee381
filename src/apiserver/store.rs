//! The object store: one JSON file per object under `<state>/objects/`, a resourceVersion counter,
//! and the change feed that watches read.
//!
//! Invariants:
//! - A write is acknowledged only after its file is durable: temp file, fsync, rename, fsync of the
//!   directory. A store killed mid-write leaves at most a `*.tmp` file, which `open` removes. A
//!   write that fails (a full disk) changes nothing, on disk or in memory, and says so
//!   ([`StoreError::NoSpace`]).
//! - Nothing on disk is dropped silently: an object file (or the counter) that does not parse stops
//!   `open` with an error naming it ([`StoreError::Corrupt`]). Serving without it would make the
//!   object vanish from the API, and whoever watches (the controller, GitOps) act on its absence.
//! - resourceVersions never go backwards, across restarts too: on open the counter is the largest of
//!   every object's resourceVersion and `objects/resource-version`, which is written before any
//!   delete (a delete removes the only file that carried the largest version).
//! - Every change gets exactly one resourceVersion and reaches watchers in that order: writes are
//!   serialised under one lock, and a watcher subscribes under the same lock.
use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::fsutil;

/// How many past changes a watch can resume from. Older resourceVersions get 410 Expired.
const HISTORY: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode an object for {path}: {source}")]
    Encode { path: PathBuf, source: serde_json::Error },
    #[error(
        "cannot {action} {path}: no space left on the device that holds the state directory; nothing was written. Free space there (or grow the filesystem), then retry"
    )]
    NoSpace { action: &'static str, path: PathBuf },
    #[error(
        "{path} does not parse ({reason}); serve does not start without it, because the object would vanish from the API. Repair it (it is JSON), or move it out of the state directory to drop that object (a KcpShard can then be applied again: the controller adopts its running processes)"
    )]
    Corrupt { path: PathBuf, reason: String },
}

impl StoreError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> StoreError {
        if fsutil::is_no_space(&source) {
            StoreError::NoSpace {
                action,
                path: path.to_path_buf(),
            }
        } else {
            StoreError::Io {
                action,
                path: path.to_path_buf(),
                source,
            }
        }
    }

    /// The disk is full: the client may retry once space is freed (HTTP 507).
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. })
    }
}

/// Where an object lives: its resource's storage name, its namespace (None when cluster-scoped),
/// and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub resource: &'static str,
    pub namespace: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One write, as watchers see it. `previous` lets a filtered watch turn a change that moves an
/// object out of (or into) its selection into DELETED (or ADDED), as the real server does.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub change_type: ChangeType,
    pub key: Key,
    pub object: Value,
    pub previous: Option<Value>,
}

/// What a new watch starts from: the changes after its resourceVersion, then the live feed.
pub struct Subscription {
    pub backlog: Vec<Change>,
    pub live: broadcast::Receiver<Change>,
}

pub struct Store {
    dir: PathBuf,
    inner: Mutex<Inner>,
    feed: broadcast::Sender<Change>,
}

struct Inner {
    objects: BTreeMap<Key, Value>,
    resource_version: u64,
    history: VecDeque<Change>,
}

impl Store {
    /// Loads every object under `dir`, removing the temp files of writes that never finished.
    /// `resources` names the storage directories to load.
    pub fn open(dir: &Path, resources: &[&'static str]) -> Result<Store, StoreError> {
        create_private_dir(dir)?;
        let mut objects = BTreeMap::new();
        let mut resource_version = read_counter(&dir.join("resource-version"))?;
        for &resource in resources {
            let resource_dir = dir.join(resource);
            create_private_dir(&resource_dir)?;
            for scope in read_dir(&resource_dir)? {
                if !scope.is_dir() {
                    continue;
                }
                let namespace = match scope.file_name().and_then(|n| n.to_str()) {
                    Some(CLUSTER_SCOPE) => None,
                    Some(ns) => Some(ns.to_string()),
                    None => continue,
                };
                for file in read_dir(&scope)? {
                    if let Some(object) = load_object(&file)? {
                        // The object names itself: a long name's file name is shortened.
                        let name = match object["metadata"]["name"].as_str() {
                            Some(name) => name.to_string(),
                            None => file
                                .file_stem()
                                .and_then(|n| n.to_str())
                                .unwrap_or_default()
                                .to_string(),
                        };
                        resource_version = resource_version.max(resource_version_of(&object));
                        objects.insert(
                            Key {
                                resource,
                                namespace: namespace.clone(),
                                name,
                            },
                            object,
                        );
                    }
                }
            }
        }
        let (feed, _) = broadcast::channel(HISTORY);
        Ok(Store {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                objects,
                resource_version,
                history: VecDeque::new(),
            }),
            feed,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied write: memory is updated only
        // after the file is durable. So a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn get(&self, key: &Key) -> Option<Value> {
        self.lock().objects.get(key).cloned()
    }

    /// Every object of `resource` (in `namespace` when given), with the resourceVersion of the list.
    pub fn list(&self, resource: &'static str, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let inner = self.lock();
        (inner.items(resource, namespace), inner.resource_version)
    }

    pub fn current_resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    /// Changes the object under `key` in one atomic step: `decide` sees the current object (if any)
    /// under the store's lock and says what to do. A written object gets the next resourceVersion;
    /// a deleted one is announced with one.
    pub fn modify<E>(&self, key: &Key, decide: impl FnOnce(Option<&Value>) -> Result<Action, E>) -> Result<Outcome, E>
    where
        E: From<StoreError>,
    {
        let mut inner = self.lock();
        let previous = inner.objects.get(key).cloned();
        let resource_version = inner.resource_version + 1;
        let (change_type, object) = match decide(previous.as_ref())? {
            Action::Nothing => return Ok(Outcome::Unchanged(previous)),
            Action::Put(mut object) => {
                object["metadata"]["resourceVersion"] = Value::String(resource_version.to_string());
                write_object(&self.object_path(key), &object)?;
                inner.objects.insert(key.clone(), object.clone());
                (
                    if previous.is_some() {
                        ChangeType::Modified
                    } else {
                        ChangeType::Added
                    },
                    object,
                )
            }
            Action::Delete => {
                let Some(mut object) = previous.clone() else {
                    return Ok(Outcome::Unchanged(None));
                };
                // The counter is made durable first: once the file is gone, nothing else carries it.
                write_object(&self.dir.join("resource-version"), &Value::from(resource_version))?;
                let path = self.object_path(key);
                fs::remove_file(&path).map_err(|e| StoreError::io("remove", &path, e))?;
                fsutil::sync_dir(path.parent().unwrap_or(&self.dir))
                    .map_err(|e| StoreError::io("fsync the directory of", &path, e))?;
                inner.objects.remove(key);
                object["metadata"]["resourceVersion"] = Value::String(resource_version.to_string());
                (ChangeType::Deleted, object)
            }
        };
        inner.resource_version = resource_version;
        self.publish(
            &mut inner,
            Change {
                resource_version,
                change_type,
                key: key.clone(),
                object: object.clone(),
                previous,
            },
        );
        Ok(match change_type {
            ChangeType::Deleted => Outcome::Deleted(object),
            _ => Outcome::Written(object),
        })
    }

    /// What [`Store::modify`] would do, without doing it (a dry run): nothing is written, no
    /// resourceVersion is used, nobody is notified. A would-be written object keeps the
    /// resourceVersion it has (none, for a create).
    pub fn preview<E>(
        &self,
        key: &Key,
        decide: impl FnOnce(Option<&Value>) -> Result<Action, E>,
    ) -> Result<Outcome, E> {
        let previous = self.lock().objects.get(key).cloned();
        Ok(match decide(previous.as_ref())? {
            Action::Nothing => Outcome::Unchanged(previous),
            Action::Put(mut object) => {
                match previous.as_ref().map(|p| p["metadata"]["resourceVersion"].clone()) {
                    Some(rv) => object["metadata"]["resourceVersion"] = rv,
                    None => {
                        if let Some(metadata) = object["metadata"].as_object_mut() {
                            metadata.remove("resourceVersion");
                        }
                    }
                }
                Outcome::Written(object)
            }
            Action::Delete => match previous {
                Some(object) => Outcome::Deleted(object),
                None => Outcome::Unchanged(None),
            },
        })
    }

    /// The changes after `resource_version` and a receiver for the ones to come, taken together
    /// so that nothing falls between them. `Err(oldest)` when the history no longer reaches back
    /// that far (the caller answers 410 Expired).
    pub fn subscribe(&self, resource_version: u64) -> Result<Subscription, u64> {
        let inner = self.lock();
        // History starts empty at open and drops its oldest entry when full, so its first entry
        // (or, when empty, the current version) marks how far back a watch can resume.
        let floor = inner
            .history
            .front()
            .map_or(inner.resource_version, |c| c.resource_version - 1);
        if resource_version < floor {
            return Err(floor);
        }
        let backlog = inner
            .history
            .iter()
            .filter(|c| c.resource_version > resource_version)
            .cloned()
            .collect();
        Ok(Subscription {
            backlog,
            live: self.feed.subscribe(),
        })
    }

    /// A snapshot of `resource` and a live receiver taken together: for watches that start with the
    /// current state (resourceVersion unset or 0, or sendInitialEvents).
    pub fn snapshot_and_subscribe(
        &self,
        resource: &'static str,
        namespace: Option<&str>,
    ) -> (Vec<Value>, u64, broadcast::Receiver<Change>) {
        let inner = self.lock();
        (
            inner.items(resource, namespace),
            inner.resource_version,
            self.feed.subscribe(),
        )
    }

    fn publish(&self, inner: &mut Inner, change: Change) {
        if inner.history.len() == HISTORY {
            inner.history.pop_front();
        }
        inner.history.push_back(change.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.feed.send(change);
    }

    fn object_path(&self, key: &Key) -> PathBuf {
        let scope = key.namespace.as_deref().unwrap_or(CLUSTER_SCOPE);
        self.dir.join(key.resource).join(scope).join(file_name(&key.name))
    }
}

impl Inner {
    fn items(&self, resource: &'static str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.resource == resource && namespace.is_none_or(|ns| k.namespace.as_deref() == Some(ns)))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// What [`Store::modify`] should do.
#[derive(Debug)]
pub enum Action {
    Put(Value),
    Delete,
    /// A no-op: nothing persisted, no resourceVersion used, no watch event.
    Nothing,
}

/// What [`Store::modify`] did, with the object as written (or as deleted).
#[derive(Debug)]
pub enum Outcome {
    Written(Value),
    Deleted(Value),
    /// Nothing changed; the current object, if any.
    Unchanged(Option<Value>),
}

/// Names up to this length are their own file names (with `.json`, within Linux's 255 bytes).
const LONGEST_PLAIN_NAME: usize = 200;

/// The file an object is stored in: `<name>.json`, or for a long name (a DNS subdomain may have
/// 253 characters) its first [`LONGEST_PLAIN_NAME`] characters, `~` (which no name holds) and a
/// 64-bit FNV-1a hash of the whole name. The file's object carries its real name.
fn file_name(name: &str) -> String {
    if name.len() <= LONGEST_PLAIN_NAME {
        return format!("{name}.json");
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let head: String = name.chars().take(LONGEST_PLAIN_NAME).collect();
    format!("{head}~{hash:016x}.json")
}

/// The directory name for cluster-scoped objects (not a valid namespace name, so no clash).
const CLUSTER_SCOPE: &str = "_cluster";

pub fn resource_version_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

fn read_counter(path: &Path) -> Result<u64, StoreError> {
    let bytes = fsutil::read_optional(path).map_err(|e| StoreError::io("read", path, e))?;
    let Some(bytes) = bytes else {
        return Ok(0);
    };
    // A counter that does not parse could let resourceVersions go backwards after a delete.
    String::from_utf8(bytes)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: "not a resourceVersion number".into(),
        })
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = fs::read_dir(dir).map_err(|source| StoreError::Io {
        action: "list",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    Ok(paths)
}

/// Reads one object file. A leftover temp file (a write killed before its rename) is removed. A file
/// that does not parse is an error naming it: see [`StoreError::Corrupt`].
fn load_object(path: &Path) -> Result<Option<Value>, StoreError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("tmp") => {
            fs::remove_file(path).map_err(|e| StoreError::io("remove", path, e))?;
            Ok(None)
        }
        Some("json") => {
            let bytes = fs::read(path).map_err(|e| StoreError::io("read", path, e))?;
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(object) if object.is_object() => Ok(Some(object)),
                Ok(_) => Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    reason: "not a JSON object".into(),
                }),
                Err(e) => Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                }),
            }
        }
        _ => Ok(None),
    }
}

/// Writes `value` to `path` durably (see [`crate::fsutil::write_atomically`]).
fn write_object(path: &Path, value: &Value) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    fsutil::write_atomically(path, &bytes).map_err(|e| StoreError::io("write", path, e))
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    fsutil::create_private_dir(dir).map_err(|e| StoreError::io("create directory", dir, e))
}

#[cfg(test)]
mod tests;
