//! Field paths and sets of them, and their wire form `fieldsV1` (structured-merge-diff's
//! `fieldpath` package: `f:<field>`, `k:<key object>`, `v:<value>`, `.` for a node that is owned
//! itself and has owned children).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// One step into a value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    /// A field of an object: `f:spec`.
    Field(String),
    /// An item of a map list, by its key fields, as canonical JSON with sorted keys:
    /// `k:{"type":"Ready"}`.
    Key(String),
    /// An item of a set list, by its value as JSON: `v:"kcpshard.io/cleanup"`.
    Value(String),
}

impl Element {
    /// The key element of a map-list `item` for `keys`, or None when a key field is missing.
    pub fn key_of(item: &Value, keys: &[String]) -> Option<Element> {
        let mut sorted: Vec<&String> = keys.iter().collect();
        sorted.sort();
        let mut parts = Vec::new();
        for key in sorted {
            let value = item.get(key)?;
            parts.push(format!("{}:{}", Value::String(key.clone()), value));
        }
        Some(Element::Key(format!("{{{}}}", parts.join(","))))
    }

    pub fn value_of(item: &Value) -> Element {
        Element::Value(item.to_string())
    }

    fn encode(&self) -> String {
        match self {
            Element::Field(name) => format!("f:{name}"),
            Element::Key(key) => format!("k:{key}"),
            Element::Value(value) => format!("v:{value}"),
        }
    }

    fn decode(text: &str) -> Option<Element> {
        let (kind, rest) = text.split_at_checked(2)?;
        match kind {
            "f:" => Some(Element::Field(rest.to_string())),
            // Re-encoded so that the same key always has the same form.
            "k:" => match serde_json::from_str::<Value>(rest).ok()? {
                Value::Object(fields) => {
                    let keys: Vec<String> = fields.keys().cloned().collect();
                    Element::key_of(&Value::Object(fields), &keys)
                }
                _ => None,
            },
            "v:" => serde_json::from_str::<Value>(rest).ok().map(|v| Element::value_of(&v)),
            _ => None,
        }
    }
}

/// A path from the object's root.
pub type Path = Vec<Element>;

/// `.spec.kcp.extraArgs`, `.status.conditions[type="Ready"]`, `.metadata.finalizers[="x"]`: how
/// the real server names a field in a conflict.
pub struct Display<'a>(pub &'a [Element]);

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for element in self.0 {
            match element {
                Element::Field(name) => write!(f, ".{name}")?,
                Element::Key(key) => {
                    let fields: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
                    let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    write!(f, "[{}]", parts.join(","))?
                }
                Element::Value(value) => write!(f, "[={value}]")?,
            }
        }
        Ok(())
    }
}

/// A set of owned paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    pub fn insert(&mut self, path: Path) {
        self.0.insert(path);
    }

    pub fn contains(&self, path: &[Element]) -> bool {
        self.0.contains(path)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    /// Whether `path` or anything below it is in the set.
    pub fn has_at_or_below(&self, path: &[Element]) -> bool {
        self.0
            .range(path.to_vec()..)
            .next()
            .is_some_and(|p| p.starts_with(path))
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }

    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }

    /// Keeps the paths `keep` says yes to.
    pub fn retain(&mut self, keep: impl FnMut(&Path) -> bool) {
        self.0.retain(keep);
    }

    /// The `fieldsV1` object.
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Tree {
            owned: bool,
            children: BTreeMap<Element, Tree>,
        }
        fn encode(tree: &Tree) -> Value {
            let mut out = Map::new();
            if tree.owned && !tree.children.is_empty() {
                out.insert(".".into(), Value::Object(Map::new()));
            }
            for (element, child) in &tree.children {
                out.insert(element.encode(), encode(child));
            }
            Value::Object(out)
        }
        let mut root = Tree::default();
        for path in &self.0 {
            let node = path.iter().fold(&mut root, |node, element| {
                node.children.entry(element.clone()).or_default()
            });
            node.owned = true;
        }
        encode(&root)
    }

    /// Reads a `fieldsV1` object; None when it is not one.
    pub fn from_fields_v1(fields: &Value) -> Option<FieldSet> {
        fn decode(node: &Map<String, Value>, path: &mut Path, out: &mut BTreeSet<Path>) -> Option<()> {
            if (node.is_empty() || node.contains_key(".")) && !path.is_empty() {
                out.insert(path.clone());
            }
            for (name, child) in node {
                if name == "." {
                    continue;
                }
                path.push(Element::decode(name)?);
                decode(child.as_object()?, path, out)?;
                path.pop();
            }
            Some(())
        }
        let mut out = BTreeSet::new();
        decode(fields.as_object()?, &mut Vec::new(), &mut out)?;
        Some(FieldSet(out))
    }
}

impl FromIterator<Path> for FieldSet {
    fn from_iter<I: IntoIterator<Item = Path>>(iter: I) -> Self {
        FieldSet(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(name: &str) -> Element {
        Element::Field(name.into())
    }

    #[test]
    fn fields_v1_round_trips_and_marks_owned_parents_with_a_dot() {
        let ready = Element::key_of(&json!({"type": "Ready", "status": "True"}), &["type".into()]).unwrap();
        let set: FieldSet = [
            vec![f("spec"), f("version")],
            vec![f("status"), f("conditions"), ready.clone()],
            vec![f("status"), f("conditions"), ready.clone(), f("status")],
            vec![f("metadata"), f("finalizers"), Element::value_of(&json!("x"))],
        ]
        .into_iter()
        .collect();
        let wire = set.to_fields_v1();
        assert_eq!(
            wire,
            json!({
                "f:metadata": {"f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {"f:version": {}},
                "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}},
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&wire), Some(set));
        assert_eq!(FieldSet::from_fields_v1(&json!({"x:bad": {}})), None);
    }

    #[test]
    fn keys_are_canonical_whatever_the_order_of_their_fields() {
        let a = Element::key_of(&json!({"b": 1, "a": "x"}), &["b".into(), "a".into()]).unwrap();
        let b = Element::decode(r#"k:{"b":1,"a":"x"}"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, Element::Key(r#"{"a":"x","b":1}"#.into()));
        assert_eq!(Element::key_of(&json!({"a": 1}), &["type".into()]), None);
    }

    #[test]
    fn paths_print_as_the_real_server_names_them() {
        let ready = Element::key_of(&json!({"type": "Ready"}), &["type".into()]).unwrap();
        let path = [f("status"), f("conditions"), ready, f("status")];
        assert_eq!(Display(&path).to_string(), r#".status.conditions[type="Ready"].status"#);
    }

    #[test]
    fn has_at_or_below_sees_descendants_only() {
        let set: FieldSet = [vec![f("spec"), f("kcp"), f("extraArgs")]].into_iter().collect();
        assert!(set.has_at_or_below(&[f("spec")]));
        assert!(set.has_at_or_below(&[f("spec"), f("kcp"), f("extraArgs")]));
        assert!(!set.has_at_or_below(&[f("spec"), f("version")]));
        assert!(!set.has_at_or_below(&[f("status")]));
    }
}
