//! Reading the manifests dir: which files count, and what one file holds once parsed and checked.
//!
//! A file counts when its name ends in `.yaml` or `.yml`, at any depth, unless a path component
//! starts with `.` (`.git`, `.github`, editors' swap files). A file may hold several documents
//! and `kind: List`s. It is checked here with the API's own checks (the structural schema in strict
//! mode, so a misspelt field is an error rather than silently pruned, then [`crate::api::validate`]),
//! so that a file the API would refuse halfway is refused whole before anything is sent.
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::apiserver::error::ApiError;
use crate::apiserver::objects::check_name;
use crate::apiserver::resources::{self, KCPSHARDS, Resource};
use crate::apiserver::schema::UnknownFields;

/// Files above this size are refused: the API refuses bodies above the same size.
pub const MAX_FILE_BYTES: u64 = crate::apiserver::handler::MAX_BODY as u64;

/// One object of a file, checked and ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub name: String,
    /// The document as written (the server defaults it again on apply).
    pub manifest: Value,
}

/// One manifest file as read in a pass.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    /// The path relative to the manifests dir, as messages name it.
    pub path: PathBuf,
    /// A hash of the file's bytes: an unchanged file is not applied again.
    pub hash: u64,
    /// The objects, or why nothing from the file may be applied.
    pub content: Result<Vec<Object>, String>,
    /// The KcpShard names the file's readable documents give, valid or not (for events).
    pub mentions: Vec<String>,
}

/// Every manifest file under `dir`, relative to it, sorted. Directories reached through a symlink
/// are not entered (a link to `..` would loop); files reached through one are read.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let path = rel.join(&name);
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                pending.push(path);
            } else if is_manifest_name(&path) && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

fn is_manifest_name(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// Checks manifests as the API would, with the resources it serves.
pub struct Checker {
    resources: Vec<Resource>,
}

impl Default for Checker {
    fn default() -> Self {
        Checker {
            resources: resources::all(),
        }
    }
}

impl Checker {
    /// Reads `dir/rel` and checks it. A file that cannot be read is refused like an invalid one.
    pub fn read(&self, dir: &Path, rel: &Path) -> ManifestFile {
        let bytes = read_limited(&dir.join(rel));
        let hash = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            match &bytes {
                Ok(bytes) => bytes.hash(&mut hasher),
                Err(e) => e.hash(&mut hasher),
            }
            hasher.finish()
        };
        let (content, mentions) = match bytes {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => self.parse(&text),
                Err(_) => (Err("is not UTF-8 text".to_string()), Vec::new()),
            },
            Err(e) => (Err(e), Vec::new()),
        };
        ManifestFile {
            path: rel.to_path_buf(),
            hash,
            content,
            mentions,
        }
    }

    /// The objects of a file's text, or the first reason to refuse it; and the names it mentions.
    pub fn parse(&self, text: &str) -> (Result<Vec<Object>, String>, Vec<String>) {
        let mut objects = Vec::new();
        let mut mentions = Vec::new();
        let mut first_error = None;
        let mut defined: BTreeMap<String, usize> = BTreeMap::new();
        for (at, items) in crate::api::manifest::documents(text) {
            let items = match items {
                Ok(items) => items,
                Err(e) => {
                    first_error.get_or_insert(format!("document {at} {e}"));
                    continue;
                }
            };
            for item in items {
                if let Some(name) = item["metadata"]["name"].as_str().filter(|n| !n.is_empty())
                    && item["kind"] == "KcpShard"
                    && !mentions.iter().any(|m| m == name)
                {
                    mentions.push(name.to_string());
                }
                match self.check(&item) {
                    Ok(object) => {
                        if let Some(earlier) = defined.insert(object.name.clone(), at) {
                            first_error.get_or_insert(format!(
                                "documents {earlier} and {at} both define KcpShard {}: define each object once",
                                object.name
                            ));
                        }
                        objects.push(object);
                    }
                    Err(e) => {
                        first_error.get_or_insert(format!("document {at}: {e}"));
                    }
                }
            }
        }
        // A file of comments only (a placeholder) holds nothing to apply, and is not an error.
        let content = match first_error {
            Some(error) => Err(error),
            None => Ok(objects),
        };
        (content, mentions)
    }

    /// One object: a kind the API serves and `--manifests` applies, a valid name, no namespace or
    /// pinned resourceVersion, and a spec the API accepts.
    fn check(&self, object: &Value) -> Result<Object, String> {
        if !object.is_object() {
            return Err("is not an object (a mapping with apiVersion, kind, metadata and spec)".into());
        }
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let shards = self
            .resources
            .iter()
            .find(|r| r.storage == KCPSHARDS)
            .expect("the API serves KcpShards");
        let applies = format!("--manifests applies {} {} objects", shards.api_version(), shards.kind);
        match self
            .resources
            .iter()
            .find(|r| r.api_version() == api_version && r.kind == kind)
        {
            None if api_version.is_empty() || kind.is_empty() => {
                return Err(format!("has no apiVersion or kind: {applies}"));
            }
            None => {
                return Err(format!(
                    "is apiVersion {api_version}, kind {kind}, which this API does not serve: {applies}"
                ));
            }
            Some(r) if r.storage != KCPSHARDS => {
                return Err(format!("is a {kind} ({api_version}): {applies} only"));
            }
            Some(_) => {}
        }
        if !object["metadata"].is_object() {
            return Err("has no metadata: every KcpShard needs metadata.name".into());
        }
        let name = object["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or("has no metadata.name: every KcpShard needs a name")?;
        check_name(shards, name).map_err(|e| e.to_string())?;
        if object["metadata"].get("namespace").is_some_and(|ns| !ns.is_null()) {
            return Err(format!(
                "KcpShard {name} has metadata.namespace, but KcpShards are cluster-scoped: remove it"
            ));
        }
        if object["metadata"]
            .get("resourceVersion")
            .is_some_and(|rv| !rv.is_null())
        {
            return Err(format!(
                "KcpShard {name} has metadata.resourceVersion, which pins one version of the object and \
                 is stale after the next write: remove it"
            ));
        }
        let mut checked = object.clone();
        let invalid = |causes| ApiError::Invalid {
            kind: shards.kind.clone(),
            group: shards.group.to_string(),
            name: name.to_string(),
            causes,
        };
        if let Some(schema) = &shards.schema {
            schema
                .check(&mut checked, UnknownFields::Strict)
                .map_err(|causes| invalid(causes).to_string())?;
        }
        let causes = shards.semantic_check(&checked);
        if !causes.is_empty() {
            return Err(invalid(causes).to_string());
        }
        Ok(Object {
            name: name.to_string(),
            manifest: object.clone(),
        })
    }
}

/// The file's bytes, or why they cannot be read (a message for the report).
fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "is larger than {MAX_FILE_BYTES} bytes, the most the API accepts"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: dev}\n\
                        spec:\n  version: v0.31.2\n  store: {type: KineSqlite}\n  front: {type: Tcp, listen: 127.0.0.1:6443}\n";

    fn parse(text: &str) -> (Result<Vec<Object>, String>, Vec<String>) {
        Checker::default().parse(text)
    }

    fn error(text: &str) -> String {
        parse(text).0.expect_err("the file should be refused")
    }

    #[test]
    fn a_valid_kcpshard_is_read_as_written() {
        let (content, mentions) = parse(GOOD);
        let objects = content.unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].name, "dev");
        assert_eq!(objects[0].manifest["spec"]["version"], "v0.31.2");
        assert!(
            objects[0].manifest["spec"].get("rollout").is_none(),
            "defaults are the server's"
        );
        assert_eq!(mentions, ["dev"]);
    }

    #[test]
    fn several_documents_and_lists_are_read() {
        let text = format!(
            "{GOOD}---\n{}---\napiVersion: v1\nkind: List\nitems:\n- {}\n",
            GOOD.replace("name: dev", "name: b"),
            serde_json::to_string(&serde_yaml::from_str::<Value>(&GOOD.replace("name: dev", "name: c")).unwrap())
                .unwrap()
        );
        let names: Vec<String> = parse(&text).0.unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, ["dev", "b", "c"]);
    }

    #[test]
    fn a_version_the_schema_refuses_refuses_the_file_and_names_the_field() {
        let (content, mentions) = parse(&format!("{}---\n{GOOD}", GOOD.replace("v0.31.2", "latest")));
        let e = content.unwrap_err();
        assert!(e.starts_with("document 1: ") && e.contains("spec.version"), "{e}");
        assert_eq!(
            mentions,
            ["dev"],
            "the name is known even though the document is invalid"
        );
    }

    #[test]
    fn a_check_beyond_the_schema_refuses_the_file() {
        let e = error(&GOOD.replace("spec:\n", "spec:\n  kcp: {extraArgs: [\"--secure-port=1\"]}\n"));
        assert!(e.contains("spec.kcp.extraArgs[0]"), "{e}");
    }

    #[test]
    fn a_misspelt_field_is_an_error_not_silently_dropped() {
        let e = error(&GOOD.replace("version:", "verison: x\n  version:"));
        assert!(e.contains("spec.verison"), "{e}");
    }

    #[test]
    fn bad_yaml_is_refused_with_its_document() {
        let e = error(&format!("{GOOD}---\nspec: [unclosed\n"));
        assert!(e.starts_with("document 2 is not valid YAML"), "{e}");
    }

    #[test]
    fn kinds_the_api_does_not_serve_or_manifests_does_not_apply_are_refused() {
        let e = error("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n");
        assert!(
            e.contains("does not serve") && e.contains("kcpshard.io/v1alpha1 KcpShard"),
            "{e}"
        );
        let e = error("apiVersion: v1\nkind: Event\nmetadata: {name: a, namespace: default}\n");
        assert!(e.contains("is a Event") && e.contains("only"), "{e}");
        let e = error(&GOOD.replace("kcpshard.io/v1alpha1", "kcpshard.io/v1"));
        assert!(e.contains("does not serve"), "{e}");
    }

    #[test]
    fn names_namespaces_and_pinned_versions_are_checked() {
        assert!(error(&GOOD.replace("name: dev", "name: Dev_1")).contains("metadata.name"));
        assert!(error(&GOOD.replace("{name: dev}", "{name: dev, namespace: x}")).contains("cluster-scoped"));
        assert!(error(&GOOD.replace("{name: dev}", "{name: dev, resourceVersion: \"7\"}")).contains("resourceVersion"));
        assert!(error(&GOOD.replace("metadata: {name: dev}", "metadata: {}")).contains("metadata.name"));
    }

    #[test]
    fn one_object_twice_in_a_file_is_refused() {
        let e = error(&format!("{GOOD}---\n{GOOD}"));
        assert!(e.contains("documents 1 and 2 both define KcpShard dev"), "{e}");
    }

    #[test]
    fn an_empty_file_holds_nothing_to_apply_and_is_no_error() {
        assert_eq!(parse("# nothing yet\n").0, Ok(vec![]));
        assert_eq!(parse("").0, Ok(vec![]));
    }

    #[test]
    fn hidden_entries_and_other_extensions_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        for path in [
            "a.yaml",
            "sub/b.yml",
            ".git/c.yaml",
            ".hidden.yaml",
            "notes.txt",
            "d.json",
            "sub/.x/e.yaml",
        ] {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, GOOD).unwrap();
        }
        let listed = list_files(dir.path()).unwrap();
        assert_eq!(listed, [PathBuf::from("a.yaml"), PathBuf::from("sub/b.yml")]);
    }
}
