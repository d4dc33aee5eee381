//! `metadata.managedFields`: which manager owns which fields, and how each write moves ownership
//! (structured-merge-diff's `merge.Updater`, as kube-apiserver's field manager drives it).
//!
//! - An Update (create, PUT, merge or JSON patch) gives its manager the fields it added or
//!   changed, and takes them from every other manager; fields it removed are nobody's any more.
//! - An Apply makes its manager's set exactly the fields of the configuration it sent. A field
//!   another manager owns whose value the apply would change is a conflict: 409 naming the field
//!   and the manager, unless `force` moves the field to the applier. Fields the applier owned and
//!   no longer sends are removed from the object, unless another manager still owns them (or
//!   anything below them).
//! - Entries are per (manager, operation, subresource); one whose set becomes empty is dropped.
use serde_json::{Value, json};

use super::fieldset::{Display, Element, FieldSet, Path};
use super::structure::{self, Shape};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Entry {
    /// How a conflict names the manager: `"kubectl-client-side-apply" using kcpshard.io/v1alpha1`
    /// for an Update, the name alone for an Apply (k8s.io/apiserver fieldmanager's printManager).
    fn display(&self) -> String {
        let mut name = format!("{:?}", self.manager);
        if let Some(subresource) = &self.subresource {
            name = format!("{name} with subresource {subresource:?}");
        }
        match self.operation {
            Operation::Update => format!("{name} using {}", self.api_version),
            Operation::Apply => name,
        }
    }

    fn to_json(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": self.operation.as_str(),
            "apiVersion": self.api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if let Some(time) = &self.time {
            entry["time"] = json!(time);
        }
        if let Some(subresource) = &self.subresource {
            entry["subresource"] = json!(subresource);
        }
        entry
    }

    fn from_json(entry: &Value) -> Option<Entry> {
        let operation = match entry["operation"].as_str()? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return None,
        };
        Some(Entry {
            manager: entry["manager"].as_str().unwrap_or_default().to_string(),
            operation,
            api_version: entry["apiVersion"].as_str().unwrap_or_default().to_string(),
            time: entry["time"].as_str().map(str::to_string),
            subresource: entry["subresource"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            fields: FieldSet::from_fields_v1(entry.get("fieldsV1").unwrap_or(&json!({})))?,
        })
    }
}

/// Who writes, and where: the entry a write goes to.
#[derive(Debug, Clone)]
pub struct Writer {
    pub manager: String,
    pub subresource: Option<&'static str>,
    pub api_version: String,
    /// The time written into the entry when it changes.
    pub now: String,
}

/// Which paths a write through one endpoint can own: the main resource owns everything but status
/// (when status is a subresource) and the server's own metadata; `/status` owns status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Main { status_subresource: bool },
    Status,
}

/// Fields no manager owns: set by the server, or naming the object.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

impl Scope {
    fn owns(self, path: &[Element]) -> bool {
        let field = |i: usize| match path.get(i) {
            Some(Element::Field(name)) => Some(name.as_str()),
            _ => None,
        };
        match (self, field(0)) {
            (Scope::Status, first) => first == Some("status"),
            (_, Some("apiVersion" | "kind")) => false,
            (_, Some("metadata")) => !field(1).is_some_and(|f| SERVER_METADATA.contains(&f)),
            (Scope::Main { status_subresource }, Some("status")) => !status_subresource,
            _ => true,
        }
    }

    fn fields(self, value: &Value, shape: Shape<'_>) -> FieldSet {
        let mut set = structure::fields_of(value, shape);
        set.retain(|p| self.owns(p));
        set
    }

    /// The fields `last_applied` (kubectl's last client-side configuration) sets that `live` still
    /// holds with the value it set: what an apply by kubectl may take over from client-side apply
    /// without a conflict (k8s.io/apimachinery pkg/util/managedfields/internal/lastappliedmanager.go,
    /// allowedConflictsFromLastApplied).
    pub fn still_as_applied(self, live: &Value, last_applied: &Value, shape: Shape<'_>) -> FieldSet {
        let mut set = self.fields(last_applied, shape);
        set.retain(|p| !is_leaf(p) || structure::get(live, p) == structure::get(last_applied, p));
        set
    }
}

/// An apply that would change fields other managers own.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts(pub Vec<(String, Path)>);

impl Conflicts {
    /// Every conflicting field is one of `fields`.
    pub fn within(&self, fields: &FieldSet) -> bool {
        self.0.iter().all(|(_, path)| fields.contains(path))
    }

    /// The real server's message (k8s.io/apiserver .../fieldmanager/internal/conflict.go).
    pub fn message(&self) -> String {
        if let [(manager, path)] = self.0.as_slice() {
            return format!(
                "Apply failed with 1 conflict: conflict with {manager}: {}",
                Display(path)
            );
        }
        let mut managers: Vec<&String> = self.0.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for manager in managers {
            lines.push(format!("conflicts with {manager}:"));
            for (_, path) in self.0.iter().filter(|(m, _)| m == manager) {
                lines.push(format!("- {}", Display(path)));
            }
        }
        format!("Apply failed with {} conflicts: {}", self.0.len(), lines.join("\n"))
    }

    /// `details.causes`: one `FieldManagerConflict` per field.
    pub fn causes(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|(manager, path)| (format!("conflict with {manager}"), Display(path).to_string()))
            .collect()
    }
}

/// The managed fields of an object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Managed(pub Vec<Entry>);

impl Managed {
    /// The entries of `object`'s `metadata.managedFields`; entries that do not decode are dropped
    /// (the real server falls back to the stored ones too).
    pub fn read(object: &Value) -> Managed {
        Managed(
            object["metadata"]["managedFields"]
                .as_array()
                .map(|entries| entries.iter().filter_map(Entry::from_json).collect())
                .unwrap_or_default(),
        )
    }

    /// Sets `object`'s `metadata.managedFields` (removes it when empty).
    pub fn write(&self, object: &mut Value) {
        let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
            return;
        };
        // In the real server's order: Apply before Update, then by time, manager, subresource.
        let mut entries: Vec<&Entry> = self.0.iter().collect();
        entries.sort_by(|a, b| {
            (a.operation == Operation::Update, &a.time, &a.manager, &a.subresource).cmp(&(
                b.operation == Operation::Update,
                &b.time,
                &b.manager,
                &b.subresource,
            ))
        });
        if entries.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert(
                "managedFields".into(),
                Value::Array(entries.into_iter().map(Entry::to_json).collect()),
            );
        }
    }

    fn position(&self, writer: &Writer, operation: Operation) -> Option<usize> {
        self.0.iter().position(|e| {
            e.manager == writer.manager && e.operation == operation && e.subresource.as_deref() == writer.subresource
        })
    }

    /// Sets the writer's entry for `operation` to `fields`; its time moves when `changed`.
    fn set(&mut self, writer: &Writer, operation: Operation, fields: FieldSet, changed: bool) {
        match self.position(writer, operation) {
            Some(at) => {
                let entry = &mut self.0[at];
                if changed || entry.fields != fields {
                    entry.time = Some(writer.now.clone());
                }
                entry.fields = fields;
            }
            None => self.0.push(Entry {
                manager: writer.manager.clone(),
                operation,
                api_version: writer.api_version.clone(),
                time: Some(writer.now.clone()),
                subresource: writer.subresource.map(str::to_string),
                fields,
            }),
        }
        self.0.retain(|e| !e.fields.is_empty());
    }

    /// Records an Update from `old` to `new` by `writer`.
    pub fn update(&mut self, old: &Value, new: &Value, shape: Shape<'_>, scope: Scope, writer: &Writer) {
        let old_fields = scope.fields(old, shape);
        let new_fields = scope.fields(new, shape);
        let removed = old_fields.difference(&new_fields);
        let mut changed = new_fields.difference(&old_fields);
        // A map an update brings into being is owned as well (`.` in fieldsV1), as on the real
        // server; an apply owns only what it set.
        for path in structure::objects_added(old, new).iter() {
            if scope.owns(path) {
                changed.insert(path.clone());
            }
        }
        for path in new_fields.intersection(&old_fields).iter() {
            if is_leaf(path) && structure::get(old, path) != structure::get(new, path) {
                changed.insert(path.clone());
            }
        }
        let gone = changed.union(&removed);
        for entry in &mut self.0 {
            entry.fields = entry.fields.difference(&gone);
        }
        let own = self
            .position(writer, Operation::Update)
            .map(|at| self.0[at].fields.clone())
            .unwrap_or_default();
        let touched = !changed.is_empty() || !removed.is_empty();
        if touched || self.position(writer, Operation::Update).is_some() {
            self.set(writer, Operation::Update, own.union(&changed), touched);
        } else {
            self.0.retain(|e| !e.fields.is_empty());
        }
    }

    /// Applies `config` to `live` for `writer`: the object to store, or the conflicts.
    pub fn apply(
        &mut self,
        live: &Value,
        config: &Value,
        shape: Shape<'_>,
        scope: Scope,
        writer: &Writer,
        force: bool,
    ) -> Result<Value, Conflicts> {
        let config_fields = scope.fields(config, shape);
        let mut merged = structure::merge(live, config, shape);
        let own = self.position(writer, Operation::Apply);
        let mut conflicts = Vec::new();
        for (at, entry) in self.0.iter().enumerate() {
            if Some(at) == own {
                continue;
            }
            for path in entry.fields.intersection(&config_fields).iter() {
                if is_leaf(path) && structure::get(live, path) != structure::get(&merged, path) {
                    conflicts.push((at, path.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(Conflicts(
                conflicts
                    .into_iter()
                    .map(|(at, path)| (self.0[at].display(), path))
                    .collect(),
            ));
        }
        for (at, path) in &conflicts {
            let taken: FieldSet = [path.clone()].into_iter().collect();
            self.0[*at].fields = self.0[*at].fields.difference(&taken);
        }
        let previous = own.map(|at| self.0[at].fields.clone()).unwrap_or_default();
        for path in previous.difference(&config_fields).iter() {
            // A map the applier no longer owns itself stays while anything in it is still set, by
            // this configuration or by another manager.
            let kept = config_fields.has_at_or_below(path)
                || self
                    .0
                    .iter()
                    .enumerate()
                    .any(|(at, e)| Some(at) != own && e.fields.has_at_or_below(path));
            if !kept {
                structure::remove(&mut merged, path);
            }
        }
        let changed = &merged != live;
        self.set(writer, Operation::Apply, config_fields, changed);
        Ok(merged)
    }
}

/// Values are compared at leaves; a list item's path names the item, whose fields have paths of
/// their own.
fn is_leaf(path: &[Element]) -> bool {
    matches!(path.last(), Some(Element::Field(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources;

    const MAIN: Scope = Scope::Main {
        status_subresource: true,
    };

    fn writer(manager: &str) -> Writer {
        Writer {
            manager: manager.into(),
            subresource: None,
            api_version: "kcpshard.io/v1alpha1".into(),
            now: "2026-12-01T10:00:00Z".into(),
        }
    }

    fn shard(spec: Value) -> Value {
        json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "dev"}, "spec": spec})
    }

    fn with_shape<T>(f: impl FnOnce(Shape<'_>) -> T) -> T {
        let resource = resources::all().remove(0);
        f(Shape::root(resource.schema.as_ref().map(|s| s.root())))
    }

    #[test]
    fn an_apply_owns_what_it_sent_and_removes_what_it_stopped_sending() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let first = shard(json!({"version": "v1", "kcp": {"extraArgs": ["--v=2"]}}));
            let live = managed
                .apply(&json!({}), &first, shape, MAIN, &writer("gitops"), false)
                .unwrap();
            assert_eq!(managed.0.len(), 1);
            assert!(managed.0[0].fields.contains(&[
                Element::Field("spec".into()),
                Element::Field("kcp".into()),
                Element::Field("extraArgs".into())
            ]));
            let second = shard(json!({"version": "v1"}));
            let live = managed
                .apply(&live, &second, shape, MAIN, &writer("gitops"), false)
                .unwrap();
            assert_eq!(live["spec"], json!({"version": "v1", "kcp": {}}));
        })
    }

    /// kubectl's server-side apply after its client-side one: what the last-applied annotation set
    /// and the object still holds is taken over; a field someone else changed since is not.
    #[test]
    fn an_apply_may_take_over_only_what_client_side_apply_set_and_still_holds() {
        with_shape(|shape| {
            let version = [Element::Field("spec".into()), Element::Field("version".into())];
            let listen = [
                Element::Field("spec".into()),
                Element::Field("front".into()),
                Element::Field("listen".into()),
            ];
            let last = shard(json!({"version": "v1", "front": {"type": "Tcp", "listen": "127.0.0.1:6443"}}));
            let live = shard(json!({"version": "v1", "front": {"type": "Tcp", "listen": "127.0.0.1:7443"}}));
            let mut managed = Managed::default();
            managed.update(&json!({}), &live, shape, MAIN, &writer("kubectl-client-side-apply"));
            let edited = shard(json!({"version": "v2", "front": {"type": "Tcp", "listen": "127.0.0.1:8443"}}));
            let conflicts = managed
                .apply(&live, &edited, shape, MAIN, &writer("kubectl"), false)
                .unwrap_err();
            let allowed = MAIN.still_as_applied(&live, &last, shape);
            assert!(allowed.contains(&version));
            assert!(!allowed.contains(&listen), "changed since the client-side apply");
            assert!(!conflicts.within(&allowed));
            let only_version = Conflicts(conflicts.0.into_iter().filter(|(_, p)| p[..] == version).collect());
            assert!(only_version.within(&allowed));
        })
    }

    #[test]
    fn a_field_another_manager_changed_conflicts_unless_forced() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let live = managed
                .apply(
                    &json!({}),
                    &shard(json!({"version": "v1"})),
                    shape,
                    MAIN,
                    &writer("a"),
                    false,
                )
                .unwrap();
            // The same value is shared, not a conflict.
            let mut shared = managed.clone();
            shared
                .apply(
                    &live,
                    &shard(json!({"version": "v1"})),
                    shape,
                    MAIN,
                    &writer("b"),
                    false,
                )
                .unwrap();
            assert_eq!(shared.0.len(), 2);
            let conflicts = managed
                .clone()
                .apply(
                    &live,
                    &shard(json!({"version": "v2"})),
                    shape,
                    MAIN,
                    &writer("b"),
                    false,
                )
                .unwrap_err();
            assert_eq!(
                conflicts.message(),
                r#"Apply failed with 1 conflict: conflict with "a": .spec.version"#
            );
            let forced = managed
                .apply(&live, &shard(json!({"version": "v2"})), shape, MAIN, &writer("b"), true)
                .unwrap();
            assert_eq!(forced["spec"]["version"], "v2");
            assert_eq!(managed.0.len(), 1, "a lost its only field: {managed:?}");
            assert_eq!(managed.0[0].manager, "b");
        })
    }

    /// kubectl's upgrade from client-side apply gives its apply the maps an update owned (`.`).
    #[test]
    fn a_map_the_applier_owned_stays_while_its_configuration_sets_fields_in_it() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let old = shard(json!({"version": "v1", "rollout": {"allowMinorVersionChange": true}}));
            managed.update(&json!({}), &old, shape, MAIN, &writer("kubectl"));
            managed.0[0].operation = Operation::Apply;
            let live = managed
                .apply(
                    &old,
                    &shard(json!({"version": "v1"})),
                    shape,
                    MAIN,
                    &writer("kubectl"),
                    false,
                )
                .unwrap();
            assert_eq!(live["spec"], json!({"version": "v1"}));
        })
    }

    #[test]
    fn a_field_dropped_by_one_of_two_owners_stays() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let config = shard(json!({"version": "v1", "kcp": {"extraArgs": ["--x"]}}));
            let live = managed
                .apply(&json!({}), &config, shape, MAIN, &writer("a"), false)
                .unwrap();
            let live = managed.apply(&live, &config, shape, MAIN, &writer("b"), false).unwrap();
            let live = managed
                .apply(
                    &live,
                    &shard(json!({"version": "v1"})),
                    shape,
                    MAIN,
                    &writer("a"),
                    false,
                )
                .unwrap();
            assert_eq!(live["spec"]["kcp"]["extraArgs"], json!(["--x"]), "b still owns it");
        })
    }

    #[test]
    fn conditions_applied_by_two_managers_merge_by_type() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let status = |conditions: Value| json!({"status": {"conditions": conditions}});
            let mut w = writer("controller");
            w.subresource = Some("status");
            let live = managed
                .apply(
                    &shard(json!({})),
                    &status(json!([{"type": "Ready", "status": "True"}])),
                    shape,
                    Scope::Status,
                    &w,
                    false,
                )
                .unwrap();
            let mut other = writer("other");
            other.subresource = Some("status");
            let live = managed
                .apply(
                    &live,
                    &status(json!([{"type": "Custom", "status": "False"}])),
                    shape,
                    Scope::Status,
                    &other,
                    false,
                )
                .unwrap();
            let types: Vec<&str> = live["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap())
                .collect();
            assert_eq!(types, ["Ready", "Custom"]);
        })
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_from_the_others() {
        with_shape(|shape| {
            let mut managed = Managed::default();
            let old = shard(json!({"version": "v1", "kcp": {"extraArgs": ["--x"]}}));
            managed.update(&json!({}), &old, shape, MAIN, &writer("create"));
            let new = shard(json!({"version": "v2", "kcp": {"extraArgs": ["--x"]}}));
            managed.update(&old, &new, shape, MAIN, &writer("edit"));
            let owners = |path: &[&str]| -> Vec<String> {
                let path: Path = path.iter().map(|f| Element::Field(f.to_string())).collect();
                managed
                    .0
                    .iter()
                    .filter(|e| e.fields.contains(&path))
                    .map(|e| e.manager.clone())
                    .collect()
            };
            assert_eq!(owners(&["spec", "version"]), ["edit"]);
            assert_eq!(owners(&["spec", "kcp", "extraArgs"]), ["create"]);
            // metadata.name and status are nobody's through the main resource.
            assert!(owners(&["metadata", "name"]).is_empty());
            // Round trip through the object.
            let mut object = new.clone();
            managed.write(&mut object);
            assert_eq!(Managed::read(&object), managed);
        })
    }
}
