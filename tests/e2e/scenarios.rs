//! What several end-to-end tests do alike: an APIExport bound in a workspace, the preflight
//! checked before a roll, and objects made before a change and found kept after it.
use super::*;

/// An APIResourceSchema and an APIExport of it in root, and an APIBinding to it in workspace
/// `workspace` (which must exist), as a user makes them: `Ok` once the binding is Bound and its
/// resource is served in the workspace.
pub async fn bind_an_export(config: &Config, workspace: &str, timeout: Duration) -> Result<(), String> {
    let schema = json!({
        "apiVersion": "apis.kcp.io/v1alpha1",
        "kind": "APIResourceSchema",
        "metadata": { "name": "v1.widgets.e2e.kcpshard.io" },
        "spec": {
            "group": "e2e.kcpshard.io",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "scope": "Cluster",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            }],
        },
    });
    let export = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": { "name": "e2e-widgets" },
        "spec": { "resources": [{
            "group": "e2e.kcpshard.io", "name": "widgets",
            "schema": "v1.widgets.e2e.kcpshard.io", "storage": { "crd": {} },
        }] },
    });
    let binding = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBinding",
        "metadata": { "name": "e2e-widgets" },
        "spec": { "reference": { "export": { "path": "root", "name": "e2e-widgets" } } },
    });
    for (path, body) in [
        (
            "/clusters/root/apis/apis.kcp.io/v1alpha1/apiresourceschemas".to_string(),
            schema,
        ),
        (
            "/clusters/root/apis/apis.kcp.io/v1alpha2/apiexports".to_string(),
            export,
        ),
        (
            format!("/clusters/root:{workspace}/apis/apis.kcp.io/v1alpha2/apibindings"),
            binding,
        ),
    ] {
        match once(config, http::Method::POST, &path, Some(&body)).await {
            Ok((200 | 201, _)) => {}
            Ok((status, body)) => return Err(format!("POST {path}: {status} {body}")),
            Err(e) => return Err(format!("POST {path}: {e}")),
        }
    }
    export_served(config, workspace, timeout).await
}

/// The binding [`bind_an_export`] made is Bound and its resource is served in `workspace`.
pub async fn export_served(config: &Config, workspace: &str, timeout: Duration) -> Result<(), String> {
    let binding = format!("/clusters/root:{workspace}/apis/apis.kcp.io/v1alpha2/apibindings/e2e-widgets");
    let widgets = format!("/clusters/root:{workspace}/apis/e2e.kcpshard.io/v1/widgets");
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        match once(config, http::Method::GET, &binding, None).await {
            Ok((200, body)) => {
                let b: Value = serde_json::from_str(&body).unwrap_or_default();
                let phase = b["status"]["phase"].as_str().unwrap_or_default().to_string();
                match once(config, http::Method::GET, &widgets, None).await {
                    Ok((200, _)) if phase == "Bound" => return Ok(()),
                    Ok((status, _)) => last = format!("binding phase {phase:?}, GET widgets: {status}"),
                    Err(e) => last = e,
                }
            }
            Ok((status, body)) => last = format!("GET {binding}: {status} {body}"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "the APIBinding in {workspace} is not served within {timeout:?}: {last}"
    ))
}

/// A preflight's status once it has a result for `version` (started after `after`, RFC 3339).
pub fn preflight_done<'a>(object: &'a Value, version: &str, after: &str) -> Option<&'a Value> {
    let p = &object["status"]["preflight"];
    (p["version"] == version && p["result"].is_string() && p["startedAt"].as_str().is_some_and(|t| t > after))
        .then_some(p)
}

/// What a preflight may leave: processes whose argv names the shard's preflight directory, and
/// the directory of its copy.
pub fn preflight_leftovers(env: &Env, shard: &str) -> Vec<String> {
    let dir = env.shard_dir(shard).join("preflight");
    let mut left: Vec<String> = processes_with(&dir.display().to_string())
        .into_iter()
        .chain(processes_with(&format!("kcpshard-{shard}-preflight")))
        .map(|(pid, argv)| format!("pid {pid}: {argv}"))
        .collect();
    if dir.join("copy").exists() {
        left.push(format!("{} exists", dir.join("copy").display()));
    }
    left
}

/// After a roll to `version` that began at `after` (RFC 3339): the preflight ran first, passed,
/// was told as events (PreflightStarted, PreflightLaunched, PreflightPassed), finished before the roll's first new
/// slot started and left nothing behind. Returns its status.
pub async fn check_preflight_before_roll(env: &Env, shard: &str, version: &str, after: &str) -> Value {
    let object = env.get(shard).await.unwrap();
    let Some(preflight) = preflight_done(&object, version, after).cloned() else {
        env.fail(&format!("no status.preflight of {version}: {:#}", object["status"]));
    };
    env.log(&format!("preflight of {version}: {preflight:#}"));
    let result = preflight["result"].as_str().unwrap_or_default();
    assert!(
        result == "Compatible" || result == "SchemaChanged",
        "the preflight passed: {preflight:#}"
    );
    let completed = parse_time(&preflight["completedAt"]).expect("completedAt");
    let new_slot = parse_time(&object["status"]["lastRoll"]["newSlotStartedAt"]).expect("newSlotStartedAt");
    let started = parse_time(&preflight["startedAt"]).expect("startedAt");
    env.log(&format!(
        "preflight of {version}: {result} {:.1}s after its start, removed and the new slot started {:.1}s after it",
        (completed - started).num_milliseconds() as f64 / 1000.0,
        (new_slot - started).num_milliseconds() as f64 / 1000.0
    ));
    assert!(
        completed < new_slot,
        "the preflight ended ({completed}) before the new slot started ({new_slot})"
    );
    let events = env.events(shard).await;
    for e in events
        .iter()
        .filter(|e| matches!(e.reason.as_deref(), Some("PreflightStarted" | "PreflightLaunched")))
    {
        env.log(&format!(
            "{}: {}",
            e.reason.as_deref().unwrap_or_default(),
            e.message.as_deref().unwrap_or_default()
        ));
    }
    for reason in ["PreflightStarted", "PreflightLaunched", "PreflightPassed"] {
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(version))),
            "no {reason} event for {version}:\n{}",
            summarize_events(&events)
        );
    }
    let left = preflight_leftovers(env, shard);
    assert!(left.is_empty(), "the preflight left: {left:?}");
    preflight
}

/// The workspace with an APIBinding, a ConfigMap and a Secret that [`make_objects`] makes.
pub const KEPT: &str = "before-move";
/// The workspace [`make_objects`] makes inside [`KEPT`].
pub const NESTED: &str = "inner";

/// What a test made before a move or an adoption, as read then, by path.
pub type Kept = BTreeMap<String, Value>;

/// Workspace [`KEPT`] with a workspace [`NESTED`] in it, an APIBinding to an APIExport in root, a
/// ConfigMap and a Secret.
pub async fn make_objects(env: &Env, admin: &Config) -> Kept {
    create_workspace_ready(admin, KEPT, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    create_workspace_ready_in(admin, &format!("root:{KEPT}"), NESTED, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    bind_an_export(admin, KEPT, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| env.fail(&e));
    let namespace = format!("/clusters/root:{KEPT}/api/v1/namespaces/default");
    let objects = [
        (
            format!("{namespace}/configmaps"),
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "kept", "labels": { "e2e": "kept" } },
                    "data": { "settings.yaml": "replicas: 3\nregion: eu\n" } }),
        ),
        (
            format!("{namespace}/secrets"),
            json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "kept" },
                    "type": "Opaque", "stringData": { "token": "s3cr3t-before-the-move" } }),
        ),
    ];
    for (path, body) in &objects {
        let (status, answer) = once(admin, http::Method::POST, path, Some(body)).await.unwrap();
        assert_eq!(status, 201, "POST {path}: {answer}");
    }
    let mut kept = Kept::new();
    for path in [
        format!("{namespace}/configmaps/kept"),
        format!("{namespace}/secrets/kept"),
        "/clusters/root/apis/apis.kcp.io/v1alpha2/apiexports/e2e-widgets".to_string(),
        format!("/clusters/root:{KEPT}/apis/apis.kcp.io/v1alpha2/apibindings/e2e-widgets"),
        format!("{WORKSPACES}/{KEPT}"),
        format!("/clusters/root:{KEPT}/apis/tenancy.kcp.io/v1alpha1/workspaces/{NESTED}"),
    ] {
        kept.insert(path.clone(), read(admin, &path).await);
    }
    kept
}

/// `path` as the API serves it now, without what a move may change: its resourceVersion, and the
/// status controllers keep writing (a binding's and a workspace's conditions carry times).
pub async fn read(admin: &Config, path: &str) -> Value {
    let (status, body) = once(admin, http::Method::GET, path, None).await.unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    let mut object: Value = serde_json::from_str(&body).unwrap();
    let meta = object["metadata"].as_object_mut().unwrap();
    meta.remove("resourceVersion");
    meta.remove("managedFields");
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("conditions");
    }
    object
}

/// Every object made before is there, with the same uid, content and (where it has one) phase.
pub async fn assert_objects_kept(env: &Env, admin: &Config, kept: &Kept) {
    for (path, before) in kept {
        let now = read(admin, path).await;
        if &now != before {
            env.fail(&format!("{path} changed:\nbefore {before:#}\nafter  {now:#}"));
        }
    }
    export_served(admin, KEPT, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| env.fail(&e));
}

/// Clients with client-go's patience: its TLS handshake may take 10 s (a new connection in the
/// switch waits in the front until the new store's slot takes it).
pub fn patient(mut config: Config) -> Config {
    config.connect_timeout = Some(Duration::from_secs(10));
    config
}
