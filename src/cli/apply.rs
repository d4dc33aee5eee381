//! `kcpshard apply -f FILE|DIR|-`: what `kubectl apply` does for KcpShard objects.
//!
//! Client-side (the default) works like kubectl: the applied manifest is kept in the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation, and a three-way JSON merge patch
//! (last applied, this manifest, the live object) removes what was dropped from the manifest and
//! sets what changed, leaving fields written by others (status, the controller) alone. Because the
//! annotation is the same one kubectl writes, `kcpshard apply` and `kubectl apply` can take turns.
//! `--server-side` sends the manifest as a server-side apply under the field manager `kcpshard`.
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Map, Value};

use super::connect::{self, Cluster, Conn, QUALIFIED};

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const FIELD_MANAGER: &str = "kcpshard";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A YAML or JSON file (several documents allowed), a directory of them, or `-` for stdin.
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// Send a server-side apply (field manager `kcpshard`) instead of a client-side merge patch.
    #[arg(long)]
    server_side: bool,
    /// With --server-side: take over fields owned by another field manager.
    #[arg(long, requires = "server_side")]
    force_conflicts: bool,
    #[command(flatten)]
    conn: Conn,
}

/// One manifest to apply, with where it came from for messages.
struct Manifest {
    source: String,
    object: Value,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // Read and check every document before changing anything, so a typo in the third file does
    // not leave the first two applied.
    let mut manifests = Vec::new();
    for path in &args.files {
        manifests.extend(read_manifests(path)?);
    }
    if manifests.is_empty() {
        bail!("no objects found in {}", show(&args.files));
    }
    let cluster = args.conn.connect().await?;
    let mut failed = 0;
    for manifest in &manifests {
        let name = manifest.object["metadata"]["name"].as_str().unwrap_or_default();
        let result = if args.server_side {
            server_side(&cluster, manifest, args.force_conflicts).await
        } else {
            client_side(&cluster, manifest).await
        };
        match result {
            Ok(outcome) => println!("{QUALIFIED}/{name} {outcome}"),
            Err(err) => {
                failed += 1;
                eprintln!("error: applying {QUALIFIED}/{name} from {}: {err:#}", manifest.source);
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} objects were not applied", manifests.len());
    }
    Ok(())
}

async fn client_side(cluster: &Cluster, manifest: &Manifest) -> anyhow::Result<&'static str> {
    let api = cluster.kcpshards();
    let name = manifest.object["metadata"]["name"].as_str().unwrap_or_default();
    let modified = with_last_applied(&manifest.object)?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let current = api.get_opt(name).await.map_err(|e| cluster.explain(e))?;
    let Some(current) = current else {
        let object: DynamicObject =
            serde_json::from_value(modified).context("the manifest is not a Kubernetes object")?;
        let post = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        api.create(&post, &object).await.map_err(|e| cluster.explain(e))?;
        return Ok("created");
    };
    let current = serde_json::to_value(&current)?;
    let original = current["metadata"]["annotations"][LAST_APPLIED]
        .as_str()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .unwrap_or(Value::Object(Map::new()));
    let patch = three_way_merge_patch(&original, &modified, &current);
    if patch.as_object().is_some_and(Map::is_empty) {
        return Ok("unchanged");
    }
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| cluster.explain(e))?;
    Ok("configured")
}

async fn server_side(cluster: &Cluster, manifest: &Manifest, force: bool) -> anyhow::Result<&'static str> {
    let name = manifest.object["metadata"]["name"].as_str().unwrap_or_default();
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.force = force;
    cluster
        .kcpshards()
        .patch(name, &params, &Patch::Apply(&manifest.object))
        .await
        .map_err(|e| cluster.explain(e))?;
    Ok("serverside-applied")
}

/// The manifest as kubectl sends it: itself, plus an annotation holding itself without that
/// annotation, byte for byte as kubectl writes it (sorted keys, `"annotations":{}` kept, a trailing
/// newline), so that kubectl sees no change after `kcpshard apply` of the same file and vice versa.
fn with_last_applied(object: &Value) -> anyhow::Result<Value> {
    let mut modified = sorted(object);
    let metadata = modified
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("metadata is not an object"))?;
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    let annotations = annotations
        .as_object_mut()
        .ok_or_else(|| anyhow!("metadata.annotations is not an object"))?;
    annotations.remove(LAST_APPLIED);
    let recorded = serde_json::to_string(&sorted(&modified))? + "\n";
    if let Some(annotations) = modified["metadata"]["annotations"].as_object_mut() {
        annotations.insert(LAST_APPLIED.into(), Value::String(recorded));
    }
    Ok(modified)
}

/// A copy with every object's keys in order (Go's encoding/json order), whatever serde_json's
/// map type is.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// kubectl's `CreateThreeWayJSONMergePatch`: deletions come from (original -> modified), additions
/// and changes from (current -> modified).
pub fn three_way_merge_patch(original: &Value, modified: &Value, current: &Value) -> Value {
    let deletions = filter_nulls(&merge_diff(original, modified), true);
    let changes = filter_nulls(&merge_diff(current, modified), false);
    let mut patch = deletions;
    deep_merge(&mut patch, changes);
    patch
}

/// RFC 7386 merge patch that turns `from` into `to`.
fn merge_diff(from: &Value, to: &Value) -> Value {
    let (Some(from), Some(to)) = (from.as_object(), to.as_object()) else {
        return to.clone();
    };
    let mut patch = Map::new();
    for (key, new) in to {
        match from.get(key) {
            None => {
                patch.insert(key.clone(), new.clone());
            }
            Some(old) if old == new => {}
            Some(old) if old.is_object() && new.is_object() => {
                let sub = merge_diff(old, new);
                if sub.as_object().is_some_and(|m| !m.is_empty()) {
                    patch.insert(key.clone(), sub);
                }
            }
            Some(_) => {
                patch.insert(key.clone(), new.clone());
            }
        }
    }
    for key in from.keys() {
        if !to.contains_key(key) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    Value::Object(patch)
}

/// kubectl's `keepOrDeleteNullInObj`: keep only deletions (`keep_null`), or only the rest.
fn filter_nulls(patch: &Value, keep_null: bool) -> Value {
    let mut out = Map::new();
    if let Some(map) = patch.as_object() {
        for (key, value) in map {
            match value {
                Value::Null if keep_null => {
                    out.insert(key.clone(), Value::Null);
                }
                Value::Null => {}
                // An explicitly empty map is a value, not an empty patch.
                Value::Object(sub) if sub.is_empty() && !keep_null => {
                    out.insert(key.clone(), value.clone());
                }
                Value::Object(sub) if sub.is_empty() => {}
                Value::Object(_) => {
                    let sub = filter_nulls(value, keep_null);
                    if sub.as_object().is_some_and(|m| !m.is_empty()) {
                        out.insert(key.clone(), sub);
                    }
                }
                _ if !keep_null => {
                    out.insert(key.clone(), value.clone());
                }
                _ => {}
            }
        }
    }
    Value::Object(out)
}

fn deep_merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                match into.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => deep_merge(existing, value),
                    _ => {
                        into.insert(key, value);
                    }
                }
            }
        }
        (into, from) => *into = from,
    }
}

fn read_manifests(path: &Path) -> anyhow::Result<Vec<Manifest>> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        return parse_manifests("stdin", &text);
    }
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}: does it exist?", path.display()))?;
    let files = if meta.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("cannot list {}", path.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut manifests = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        manifests.extend(parse_manifests(&file.display().to_string(), &text)?);
    }
    Ok(manifests)
}

/// Splits YAML (or JSON, which is YAML) into documents, unpacks `kind: List`, and refuses anything
/// that is not a named KcpShard.
fn parse_manifests(source: &str, text: &str) -> anyhow::Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for (index, items) in crate::api::manifest::documents(text) {
        let at = format!("{source} (document {index})");
        let items = items.map_err(|e| anyhow::anyhow!("{at} {e}"))?;
        for object in items {
            check_manifest(&at, &object)?;
            out.push(Manifest {
                source: at.clone(),
                object,
            });
        }
    }
    Ok(out)
}

fn check_manifest(at: &str, object: &Value) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or("<none>");
    let kind = object["kind"].as_str().unwrap_or("<none>");
    let want = format!("{}/{}", connect::GROUP, connect::VERSION);
    if api_version != want || kind != connect::KIND {
        bail!(
            "{at} is apiVersion {api_version}, kind {kind}; kcpshard apply only handles \
             apiVersion {want}, kind {} (use kubectl for other objects)",
            connect::KIND
        );
    }
    if object["metadata"]["name"].as_str().is_none_or(str::is_empty) {
        bail!("{at} has no metadata.name: every KcpShard needs a name");
    }
    Ok(())
}

fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unchanged_manifest_gives_an_empty_patch() {
        let manifest = json!({"metadata": {"name": "dev"}, "spec": {"version": "v1"}});
        let modified = with_last_applied(&manifest).unwrap();
        let mut current = modified.clone();
        current["status"] = json!({"phase": "Ready"});
        current["metadata"]["resourceVersion"] = json!("7");
        let original = serde_json::to_value(&manifest).unwrap();
        assert_eq!(three_way_merge_patch(&original, &modified, &current), json!({}));
    }

    #[test]
    fn last_applied_is_written_as_kubectl_writes_it() {
        let manifest = json!({"kind": "KcpShard", "apiVersion": "kcpshard.io/v1alpha1",
            "metadata": {"name": "dev"}, "spec": {"version": "v1"}});
        let modified = with_last_applied(&manifest).unwrap();
        assert_eq!(
            modified["metadata"]["annotations"][LAST_APPLIED],
            "{\"apiVersion\":\"kcpshard.io/v1alpha1\",\"kind\":\"KcpShard\",\"metadata\":{\"annotations\":{},\"name\":\"dev\"},\"spec\":{\"version\":\"v1\"}}\n"
        );
    }

    #[test]
    fn dropped_fields_are_deleted_and_changes_set_but_others_fields_kept() {
        let original = json!({"spec": {"version": "v1", "kcp": {"extraArgs": ["-v=2"]}}});
        let modified = json!({"spec": {"version": "v2"}});
        let current = json!({"spec": {"version": "v1", "kcp": {"extraArgs": ["-v=2"]}, "x": 1}});
        assert_eq!(
            three_way_merge_patch(&original, &modified, &current),
            json!({"spec": {"version": "v2", "kcp": null}})
        );
    }

    #[test]
    fn other_kinds_are_refused() {
        let err = parse_manifests("f.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
            .err()
            .unwrap();
        assert!(err.to_string().contains("only handles"), "{err}");
    }

    #[test]
    fn several_documents_and_lists_are_read() {
        let text = "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: a}\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- apiVersion: kcpshard.io/v1alpha1\n  kind: KcpShard\n  metadata: {name: b}\n";
        let names: Vec<String> = parse_manifests("f", text)
            .unwrap()
            .into_iter()
            .map(|m| m.object["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }
}
