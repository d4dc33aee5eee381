//! One pass over the manifests dir: [`decide`] (pure) says what each file calls for, given what
//! the earlier passes did; [`Syncer::pass`] reads the files, applies, and reports.
//!
//! A file is applied when its bytes differ from those of its last successful apply, so an
//! unchanged dir sends nothing. A refused file is reported once per content (a log line, and a
//! Warning event on each KcpShard it names that exists); the same bytes are not reported again.
//! An object defined by two files is refused in the file that brought the second definition.
//!
//! After the applies, [`Syncer::sweep`] looks for KcpShards kcpshard-gitops applied that no file
//! holds any more: each gets a Warning event once, and with prune the ones it created are deleted
//! (never in a pass that found an invalid file, whose objects cannot be told).
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use kube::Resource as _;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::manifests::{Checker, ManifestFile, Object, list_files};
use super::{CREATED_BY, FIELD_MANAGER};
use crate::api::KcpShard;

/// Kubernetes refuses event notes above 1 kB.
const MAX_NOTE: usize = 1000;

/// What the last pass that acted on a file did with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub hash: u64,
    /// True when these bytes were applied; false when they were refused (and reported).
    pub applied: bool,
    /// The KcpShards the file defined when it was last applied.
    pub names: Vec<String>,
}

/// What one file calls for in this pass.
#[derive(Debug, PartialEq)]
pub enum Decision<'a> {
    /// The same bytes were applied or reported before: nothing to send.
    Unchanged,
    Apply(&'a [Object]),
    /// Apply nothing from the file; report `error`, with an event on each of `names` that exists.
    Refuse {
        error: String,
        names: Vec<String>,
    },
}

/// One decision per file, in the files' order.
pub fn decide<'a>(files: &'a [ManifestFile], records: &HashMap<PathBuf, Record>) -> Vec<Decision<'a>> {
    let unchanged = |file: &ManifestFile| records.get(&file.path).is_some_and(|r| r.hash == file.hash);
    // Unchanged applied files keep the objects they define; a changed file may not take them.
    let mut owner: BTreeMap<&str, &Path> = BTreeMap::new();
    for file in files.iter().filter(|f| unchanged(f)) {
        if let Some(record) = records.get(&file.path).filter(|r| r.applied) {
            for name in &record.names {
                owner.entry(name.as_str()).or_insert(&file.path);
            }
        }
    }
    files
        .iter()
        .map(|file| {
            if unchanged(file) {
                return Decision::Unchanged;
            }
            let mut names = file.mentions.clone();
            for name in records.get(&file.path).map(|r| r.names.as_slice()).unwrap_or_default() {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            let objects = match &file.content {
                Err(error) => {
                    return Decision::Refuse {
                        error: error.clone(),
                        names,
                    };
                }
                Ok(objects) => objects,
            };
            for object in objects {
                if let Some(other) = owner.get(object.name.as_str()).filter(|p| **p != file.path) {
                    return Decision::Refuse {
                        error: format!(
                            "KcpShard {} is also defined in {}: define each object in one file",
                            object.name,
                            other.display()
                        ),
                        names,
                    };
                }
            }
            for object in objects {
                owner.insert(object.name.as_str(), &file.path);
            }
            Decision::Apply(objects)
        })
        .collect()
}

/// How applying one object ended.
enum Applied {
    Done,
    /// The API refused the object (a 4xx): the file is refused as if invalid.
    Refused(String),
    /// The API could not be reached or failed (a 5xx): try again next pass.
    Failed(String),
}

/// The manifests dir and what earlier passes did with each file.
pub struct Syncer {
    client: kube::Client,
    dir: PathBuf,
    checker: Checker,
    records: HashMap<PathBuf, Record>,
    reporter: Reporter,
    /// The last error listing the dir, so a dir that stays unreadable is reported once.
    list_error: Option<String>,
    /// Delete the objects kcpshard-gitops created once no file holds them.
    prune: bool,
    /// Objects no file holds that were reported, and why: each is reported once.
    reported: HashMap<String, &'static str>,
}

impl Syncer {
    pub fn new(client: kube::Client, host: String, dir: PathBuf, prune: bool) -> Syncer {
        Syncer {
            client,
            dir,
            checker: Checker::default(),
            records: HashMap::new(),
            reporter: Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(host),
            },
            list_error: None,
            prune,
            reported: HashMap::new(),
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &ApiResource::erase::<KcpShard>(&()))
    }

    /// Reads every manifest file, applies the changed ones and reports the refused ones.
    pub async fn pass(&mut self) {
        let paths = match list_files(&self.dir) {
            Ok(paths) => {
                self.list_error = None;
                paths
            }
            Err(e) => {
                let error = e.to_string();
                if self.list_error.as_ref() != Some(&error) {
                    tracing::warn!(dir = %self.dir.display(), "cannot read the manifests dir, nothing applied: {error}");
                }
                self.list_error = Some(error);
                return;
            }
        };
        let files: Vec<ManifestFile> = paths.iter().map(|p| self.checker.read(&self.dir, p)).collect();
        // A file that is gone holds nothing any more: the sweep below reports its objects.
        self.records.retain(|path, _| paths.contains(path));
        let decisions = decide(&files, &self.records);
        let unchanged = decisions.iter().filter(|d| **d == Decision::Unchanged).count();
        tracing::debug!(files = files.len(), unchanged, "manifests pass");
        for (file, decision) in files.iter().zip(decisions) {
            let previous = self
                .records
                .get(&file.path)
                .map(|r| r.names.clone())
                .unwrap_or_default();
            match decision {
                Decision::Unchanged => {}
                Decision::Refuse { error, names } => {
                    self.refuse(&file.path, &error, &names).await;
                    self.records.insert(
                        file.path.clone(),
                        Record {
                            hash: file.hash,
                            applied: false,
                            names: previous,
                        },
                    );
                }
                Decision::Apply(objects) => {
                    let mut record = Some(Record {
                        hash: file.hash,
                        applied: true,
                        names: objects.iter().map(|o| o.name.clone()).collect(),
                    });
                    for object in objects {
                        match self.apply(&file.path, object).await {
                            Applied::Done => {}
                            Applied::Refused(error) => {
                                let names = objects.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
                                self.refuse(&file.path, &error, &names).await;
                                record = Some(Record {
                                    hash: file.hash,
                                    applied: false,
                                    names: previous.clone(),
                                });
                                break;
                            }
                            Applied::Failed(error) => {
                                tracing::warn!(
                                    file = %file.path.display(),
                                    "cannot apply KcpShard {} from {}, trying again: {error}",
                                    object.name,
                                    file.path.display()
                                );
                                record = None;
                                break;
                            }
                        }
                    }
                    match record {
                        Some(record) => self.records.insert(file.path.clone(), record),
                        None => self.records.remove(&file.path),
                    };
                }
            }
        }
        self.sweep(&files).await;
    }

    /// Reports (and with prune, deletes) the KcpShards kcpshard-gitops applied that no file in DIR
    /// holds any more.
    async fn sweep(&mut self, files: &[ManifestFile]) {
        let mut held = BTreeSet::new();
        // A file that does not parse may hold anything: its objects cannot be told from orphans.
        let mut unsure = self.records.values().any(|r| !r.applied);
        for file in files {
            match &file.content {
                Ok(objects) => held.extend(objects.iter().map(|o| o.name.clone())),
                Err(_) => {
                    unsure = true;
                    held.extend(file.mentions.iter().cloned());
                }
            }
        }
        self.reported.retain(|name, _| !held.contains(name));
        let objects = match self.api().list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!("cannot list the KcpShards to find those no manifest holds: {e}");
                return;
            }
        };
        let dir = self.dir.display().to_string();
        for object in objects {
            let name = object.metadata.name.clone().unwrap_or_default();
            let created = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CREATED_BY))
                .is_some_and(|v| v == FIELD_MANAGER);
            let applied = created
                || object
                    .metadata
                    .managed_fields
                    .iter()
                    .flatten()
                    .any(|e| e.manager.as_deref() == Some(FIELD_MANAGER));
            if held.contains(&name) || !applied || object.metadata.deletion_timestamp.is_some() {
                continue;
            }
            // Why it stays (a key of `reported`), and the note that says so.
            let (why, note) = match (self.prune, created, unsure) {
                (true, true, false) => {
                    let note =
                        format!("No file in {dir} holds KcpShard {name} any more: deleting it (--manifests-prune)");
                    tracing::warn!("{note}");
                    self.publish(&object, EventType::Warning, "ManifestPruned", note).await;
                    if let Err(e) = self.api().delete(&name, &DeleteParams::default()).await {
                        tracing::warn!("cannot prune KcpShard {name}: {e}");
                    }
                    continue;
                }
                (true, true, true) => (
                    "unsure",
                    format!(
                        "No file in {dir} holds KcpShard {name} any more; it is not pruned while a file in {dir} is invalid"
                    ),
                ),
                (true, false, _) => (
                    "not-created",
                    format!(
                        "No file in {dir} holds KcpShard {name} any more; it is left as it is, because kcpshard-gitops did not create it"
                    ),
                ),
                (false, _, _) => (
                    "kept",
                    format!(
                        "No file in {dir} holds KcpShard {name} any more; it is left as it is: delete it with kubectl delete, or serve with --manifests-prune"
                    ),
                ),
            };
            if self.reported.get(&name) == Some(&why) {
                continue;
            }
            tracing::warn!("{note}");
            self.publish(&object, EventType::Warning, "ManifestRemoved", note).await;
            self.reported.insert(name, why);
        }
    }

    /// Server-side apply of one object under [`FIELD_MANAGER`], logging the resourceVersion change.
    async fn apply(&self, path: &Path, object: &Object) -> Applied {
        let api = self.api();
        let before = match api.get_opt(&object.name).await {
            Ok(before) => before,
            Err(e) => return classify(e),
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // What kcpshard-gitops creates it marks as its own, and keeps marked in every apply (the
        // apply owns the annotation, so leaving it out would remove it).
        let ours = match &before {
            None => true,
            Some(before) => before
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CREATED_BY))
                .is_some_and(|v| v == FIELD_MANAGER),
        };
        let mut manifest = object.manifest.clone();
        if ours {
            manifest["metadata"]["annotations"][CREATED_BY] = serde_json::json!(FIELD_MANAGER);
        }
        let after = match api.patch(&object.name, &params, &Patch::Apply(&manifest)).await {
            Ok(after) => after,
            Err(e) => return classify(e),
        };
        let version = |o: &DynamicObject| o.metadata.resource_version.clone().unwrap_or_default();
        let generation = |o: &DynamicObject| o.metadata.generation.unwrap_or_default();
        let file = path.display();
        let name = &object.name;
        match &before {
            None => {
                tracing::info!(%file, "applied KcpShard {name} from {file}: created, resourceVersion {}", version(&after));
                self.publish(
                    &after,
                    EventType::Normal,
                    "ManifestApplied",
                    format!("Created from {file}"),
                )
                .await;
            }
            Some(before) if version(before) == version(&after) => {
                tracing::info!(%file, "applied KcpShard {name} from {file}: unchanged, resourceVersion {}", version(&after));
            }
            Some(before) => {
                tracing::info!(
                    %file,
                    "applied KcpShard {name} from {file}: resourceVersion {} -> {}, generation {} -> {}",
                    version(before),
                    version(&after),
                    generation(before),
                    generation(&after)
                );
                let spec_version = |o: &DynamicObject| o.data["spec"]["version"].as_str().unwrap_or("none").to_string();
                let note = match (spec_version(before), spec_version(&after)) {
                    (old, new) if old != new => format!("Applied {file}: spec.version {old} -> {new}"),
                    _ => format!("Applied {file}"),
                };
                self.publish(&after, EventType::Normal, "ManifestApplied", note).await;
            }
        }
        Applied::Done
    }

    /// Logs why nothing from `path` was applied, and puts a Warning event on each of `names` that
    /// exists.
    async fn refuse(&self, path: &Path, error: &str, names: &[String]) {
        let file = path.display();
        tracing::warn!(%file, "manifest {file} is invalid, nothing from it is applied: {error}");
        for name in names {
            match self.api().get_opt(name).await {
                Ok(Some(object)) => {
                    let note = format!("{file}: {error}");
                    self.publish(&object, EventType::Warning, "ManifestInvalid", note).await;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(%file, "cannot read KcpShard {name} to report on it: {e}"),
            }
        }
    }

    async fn publish(&self, object: &DynamicObject, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "Apply".into(),
            secondary: None,
        };
        // A recorder per event, as the controller does: a shared one folds events of one reason
        // into a series that keeps the first message.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        let reference = object.object_ref(&ApiResource::erase::<KcpShard>(&()));
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::warn!(error = %e, "cannot record an event");
        }
    }
}

fn classify(error: kube::Error) -> Applied {
    match &error {
        kube::Error::Api(status) if (400..500).contains(&status.code) && ![408, 429].contains(&status.code) => {
            Applied::Refused(format!("the API refused it: {}", status.message))
        }
        _ => Applied::Failed(error.to_string()),
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(path: &str, hash: u64, names: &[&str]) -> ManifestFile {
        ManifestFile {
            path: path.into(),
            hash,
            content: Ok(names
                .iter()
                .map(|n| Object {
                    name: n.to_string(),
                    manifest: json!({"metadata": {"name": n}}),
                })
                .collect()),
            mentions: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn invalid(path: &str, hash: u64, mentions: &[&str]) -> ManifestFile {
        ManifestFile {
            path: path.into(),
            hash,
            content: Err("document 1 is not valid YAML".into()),
            mentions: mentions.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn record(path: &str, hash: u64, applied: bool, names: &[&str]) -> (PathBuf, Record) {
        (
            path.into(),
            Record {
                hash,
                applied,
                names: names.iter().map(|n| n.to_string()).collect(),
            },
        )
    }

    fn applies(decision: &Decision) -> Vec<String> {
        match decision {
            Decision::Apply(objects) => objects.iter().map(|o| o.name.clone()).collect(),
            other => panic!("expected Apply, got {other:?}"),
        }
    }

    fn refusal(decision: &Decision) -> (String, Vec<String>) {
        match decision {
            Decision::Refuse { error, names } => (error.clone(), names.clone()),
            other => panic!("expected Refuse, got {other:?}"),
        }
    }

    #[test]
    fn every_file_applies_at_start() {
        let files = [file("a.yaml", 1, &["a"]), file("b.yaml", 2, &["b", "c"])];
        let decisions = decide(&files, &HashMap::new());
        assert_eq!(applies(&decisions[0]), ["a"]);
        assert_eq!(applies(&decisions[1]), ["b", "c"]);
    }

    #[test]
    fn unchanged_bytes_send_nothing_whether_applied_or_refused() {
        let files = [file("a.yaml", 1, &["a"]), invalid("b.yaml", 2, &["b"])];
        let records = HashMap::from([record("a.yaml", 1, true, &["a"]), record("b.yaml", 2, false, &[])]);
        assert_eq!(decide(&files, &records), [Decision::Unchanged, Decision::Unchanged]);
    }

    #[test]
    fn changed_bytes_apply_again() {
        let files = [file("a.yaml", 9, &["a"])];
        let records = HashMap::from([record("a.yaml", 1, true, &["a"])]);
        assert_eq!(applies(&decide(&files, &records)[0]), ["a"]);
    }

    #[test]
    fn an_invalid_file_is_reported_on_the_objects_it_named_and_the_ones_it_applied_before() {
        // The file applied `a` before; now it is broken YAML that still shows the name `x`.
        let files = [invalid("a.yaml", 9, &["x"])];
        let records = HashMap::from([record("a.yaml", 1, true, &["a"])]);
        let (error, names) = refusal(&decide(&files, &records)[0]);
        assert!(error.contains("not valid YAML"));
        assert_eq!(names, ["x", "a"]);
    }

    #[test]
    fn an_invalid_file_does_not_stop_the_others() {
        let files = [invalid("a.yaml", 1, &[]), file("b.yaml", 2, &["b"])];
        let decisions = decide(&files, &HashMap::new());
        refusal(&decisions[0]);
        assert_eq!(applies(&decisions[1]), ["b"]);
    }

    #[test]
    fn a_second_definition_is_refused_in_the_file_that_brings_it() {
        // b.yaml has defined `dev` all along; a.yaml (sorted first) now defines it too.
        let files = [file("a.yaml", 5, &["dev"]), file("b.yaml", 2, &["dev"])];
        let records = HashMap::from([record("b.yaml", 2, true, &["dev"])]);
        let decisions = decide(&files, &records);
        let (error, names) = refusal(&decisions[0]);
        assert!(error.contains("also defined in b.yaml"), "{error}");
        assert_eq!(names, ["dev"]);
        assert_eq!(decisions[1], Decision::Unchanged);
        // At start nothing is established: the first file in order wins.
        let decisions = decide(&files, &HashMap::new());
        assert_eq!(applies(&decisions[0]), ["dev"]);
        assert!(refusal(&decisions[1]).0.contains("also defined in a.yaml"));
    }

    #[test]
    fn an_object_moved_between_files_in_one_change_applies() {
        // a.yaml gave `dev` up (changed) while b.yaml took it (new): no conflict.
        let files = [file("a.yaml", 7, &[]), file("b.yaml", 3, &["dev"])];
        let records = HashMap::from([record("a.yaml", 1, true, &["dev"])]);
        let decisions = decide(&files, &records);
        assert_eq!(applies(&decisions[1]), ["dev"]);
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(text, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with("..."));
        assert_eq!(truncate("short".into(), MAX_NOTE), "short");
    }
}
