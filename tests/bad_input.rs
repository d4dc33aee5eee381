//! Bad input to `kcpshard serve`, sent as raw HTTPS requests (many of them kubectl refuses to send):
//! each gets a Status error that says what is wrong, and nothing is stored (checked with a get).
mod common;

use common::{Serve, dev_manifest};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use serde_json::{Value, json};

const COLLECTION: &str = "/apis/kcpshard.io/v1alpha1/kcpshards";

struct Reply {
    code: StatusCode,
    body: Value,
    text: String,
}

async fn send(client: &Client, method: Method, path: &str, content_type: &str, body: Vec<u8>) -> Reply {
    let request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body))
        .unwrap();
    let response = client
        .send(request)
        .await
        .unwrap_or_else(|err| panic!("{method} {path}: no HTTP response: {err}"));
    let code = response.status();
    let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { code, body, text }
}

async fn post_json(client: &Client, path: &str, object: &Value) -> Reply {
    send(
        client,
        Method::POST,
        path,
        "application/json",
        object.to_string().into_bytes(),
    )
    .await
}

/// The reply is a Status failure with this code, and says something (returned for more checks).
fn assert_status(reply: &Reply, code: u16, what: &str) {
    assert_eq!(
        reply.code.as_u16(),
        code,
        "{what}: expected HTTP {code}, got {} with {}",
        reply.code,
        reply.text
    );
    assert_eq!(
        reply.body["kind"], "Status",
        "{what}: the body is a Status: {}",
        reply.text
    );
    assert_eq!(reply.body["status"], "Failure", "{what}: {}", reply.text);
    assert_eq!(reply.body["code"], code, "{what}: Status.code matches: {}", reply.text);
    assert!(
        reply.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: the Status has a message: {}",
        reply.text
    );
}

/// A 422 Invalid whose causes name `field`.
fn assert_invalid(reply: &Reply, field: &str, what: &str) {
    assert_status(reply, 422, what);
    assert_eq!(reply.body["reason"], "Invalid", "{what}: {}", reply.text);
    let causes = reply.body["details"]["causes"].as_array().cloned().unwrap_or_default();
    assert!(
        causes
            .iter()
            .any(|c| c["field"].as_str().is_some_and(|f| f.contains(field))),
        "{what}: a cause names {field}: {}",
        reply.text
    );
}

async fn assert_nothing_stored(serve: &Serve, client: &Client) {
    let list = send(client, Method::GET, COLLECTION, "application/json", Vec::new()).await;
    assert_eq!(list.code, StatusCode::OK, "{}", list.text);
    let items = list.body["items"].as_array().cloned().unwrap_or_default();
    if !items.is_empty() {
        serve.fail(&format!("bad input was stored: {}", list.text));
    }
}

fn dev() -> Value {
    dev_manifest()
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_json_is_a_bad_request() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let body = br#"{"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"#.to_vec();
    let reply = send(&client, Method::POST, COLLECTION, "application/json", body).await;
    assert_status(&reply, 400, "truncated JSON");
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_yaml_is_a_bad_request() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let body = b"apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata:\n  name: dev\n spec: [\n".to_vec();
    let path = format!("{COLLECTION}/dev?fieldManager=test");
    let reply = send(
        &client,
        Method::PATCH,
        &path,
        "application/apply-patch+yaml",
        body.clone(),
    )
    .await;
    assert_status(&reply, 400, "malformed YAML in a server-side apply");
    let reply = send(&client, Method::POST, COLLECTION, "application/yaml", body).await;
    assert_status(&reply, 400, "malformed YAML in a create");
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_api_version_is_a_bad_request() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["apiVersion"] = json!("kcpshard.io/v1");
    assert_status(
        &post_json(&client, COLLECTION, &object).await,
        400,
        "apiVersion kcpshard.io/v1",
    );
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_kind_is_a_bad_request() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["kind"] = json!("Deployment");
    assert_status(&post_json(&client, COLLECTION, &object).await, 400, "kind Deployment");
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_enum_value_is_invalid() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["spec"]["store"]["type"] = json!("Floppy");
    assert_invalid(
        &post_json(&client, COLLECTION, &object).await,
        "spec.store.type",
        "store type Floppy",
    );
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_version_string_is_invalid() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["spec"]["version"] = json!("latest");
    assert_invalid(
        &post_json(&client, COLLECTION, &object).await,
        "spec.version",
        "version latest",
    );
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_required_field_is_invalid() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["spec"].as_object_mut().unwrap().remove("store");
    assert_invalid(
        &post_json(&client, COLLECTION, &object).await,
        "spec.store",
        "no spec.store",
    );
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_field_with_strict_field_validation_is_refused() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["spec"]["replicas"] = json!(3);
    let path = format!("{COLLECTION}?fieldValidation=Strict");
    let reply = post_json(&client, &path, &object).await;
    assert_status(&reply, 400, "unknown field spec.replicas with fieldValidation=Strict");
    assert!(
        reply.text.contains("replicas"),
        "the error names the field: {}",
        reply.text
    );
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn body_over_3_mib_is_too_large() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["metadata"]["annotations"] = json!({"padding": "x".repeat(3 * 1024 * 1024)});
    let reply = post_json(&client, COLLECTION, &object).await;
    assert_status(&reply, 413, "a body over 3 MiB");
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn name_that_is_not_a_dns_subdomain_is_invalid() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    for name in ["Dev_1", "-dev", &"a".repeat(254)] {
        let mut object = dev();
        object["metadata"]["name"] = json!(name);
        let reply = post_json(&client, COLLECTION, &object).await;
        assert_invalid(&reply, "metadata.name", &format!("name {name:?}"));
    }
    assert_nothing_stored(&serve, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn name_that_tries_a_path_is_refused_and_writes_no_file() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let mut object = dev();
    object["metadata"]["name"] = json!("../x");
    let reply = post_json(&client, COLLECTION, &object).await;
    assert_invalid(&reply, "metadata.name", "name ../x in a create");
    for path in [format!("{COLLECTION}/..%2Fx"), format!("{COLLECTION}/%2E%2E%2Fx")] {
        let reply = send(
            &client,
            Method::PUT,
            &path,
            "application/json",
            object.to_string().into_bytes(),
        )
        .await;
        assert!(
            reply.code.is_client_error() && reply.body["kind"] == "Status",
            "PUT {path}: expected a 4xx Status, got {} {}",
            reply.code,
            reply.text
        );
    }
    assert_nothing_stored(&serve, &client).await;
    let root = serve.state_dir().parent().unwrap().to_path_buf();
    let strays = files_named_x(&root);
    assert!(strays.is_empty(), "files written for name ../x: {strays:?}");
}

fn files_named_x(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_named_x(&path));
        } else if path.file_stem().is_some_and(|s| s == "x") {
            found.push(path);
        }
    }
    found
}

async fn create_dev(client: &Client) -> Value {
    let reply = post_json(client, COLLECTION, &dev()).await;
    assert_eq!(reply.code, StatusCode::CREATED, "create dev: {}", reply.text);
    reply.body
}

async fn get_dev(client: &Client) -> Value {
    let reply = send(
        client,
        Method::GET,
        &format!("{COLLECTION}/dev"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(reply.code, StatusCode::OK, "get dev: {}", reply.text);
    reply.body
}

#[tokio::test(flavor = "multi_thread")]
async fn put_without_resource_version_is_invalid() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let created = create_dev(&client).await;
    let mut update = created.clone();
    update["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    update["spec"]["kcp"]["extraArgs"] = json!(["--v=9"]);
    let path = format!("{COLLECTION}/dev");
    let reply = send(
        &client,
        Method::PUT,
        &path,
        "application/json",
        update.to_string().into_bytes(),
    )
    .await;
    assert_invalid(&reply, "metadata.resourceVersion", "PUT without resourceVersion");
    let stored = get_dev(&client).await;
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    assert_eq!(stored["spec"], created["spec"], "the refused PUT changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn put_with_a_stale_resource_version_is_a_conflict() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let created = create_dev(&client).await;
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    let path = format!("{COLLECTION}/dev");
    let reply = send(
        &client,
        Method::PATCH,
        &path,
        "application/merge-patch+json",
        patch.to_string().into_bytes(),
    )
    .await;
    assert_eq!(reply.code, StatusCode::OK, "merge patch: {}", reply.text);
    let current = reply.body;

    let mut stale = created.clone();
    stale["spec"]["kcp"]["extraArgs"] = json!(["--v=9"]);
    let reply = send(
        &client,
        Method::PUT,
        &path,
        "application/json",
        stale.to_string().into_bytes(),
    )
    .await;
    assert_status(&reply, 409, "PUT with the resourceVersion from before the patch");
    assert_eq!(reply.body["reason"], "Conflict", "{}", reply.text);
    let stored = get_dev(&client).await;
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        current["metadata"]["resourceVersion"]
    );
    assert_eq!(stored["spec"], current["spec"], "the refused PUT changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_shard_on_another_shards_front_address_is_refused_naming_it() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    create_dev(&client).await;
    let mut second = dev();
    second["metadata"]["name"] = json!("second");
    let reply = post_json(&client, COLLECTION, &second).await;
    assert_invalid(&reply, "spec.front.listen", "a second shard on dev's address");
    assert!(reply.text.contains("KcpShard dev already uses"), "{}", reply.text);
    // 0.0.0.0 on the same port takes it too; another port is fine.
    second["spec"]["front"]["listen"] = json!("0.0.0.0:6443");
    assert_invalid(
        &post_json(&client, COLLECTION, &second).await,
        "spec.front.listen",
        "0.0.0.0 on dev's port",
    );
    second["spec"]["front"]["listen"] = json!("127.0.0.1:6444");
    let reply = post_json(&client, COLLECTION, &second).await;
    assert_eq!(reply.code, StatusCode::CREATED, "{}", reply.text);
    // Moving it onto dev's address later is refused as well.
    let patch = json!({"spec": {"front": {"listen": "127.0.0.1:6443"}}});
    let reply = send(
        &client,
        Method::PATCH,
        &format!("{COLLECTION}/second"),
        "application/merge-patch+json",
        patch.to_string().into_bytes(),
    )
    .await;
    assert_invalid(&reply, "spec.front.listen", "a patch onto dev's address");
}

#[tokio::test(flavor = "multi_thread")]
async fn event_namespaces_must_be_labels() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    for (group, namespace) in [
        ("api/v1", "_cluster"),
        ("api/v1", "a.b"),
        ("apis/events.k8s.io/v1", "_cluster"),
    ] {
        let event = if group == "api/v1" {
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"},
                   "involvedObject": {"kind": "KcpShard", "name": "dev"}, "reason": "X", "message": "x", "type": "Normal"})
        } else {
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
                   "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "t", "reportingInstance": "t",
                   "action": "A", "reason": "X", "type": "Normal"})
        };
        let reply = post_json(&client, &format!("/{group}/namespaces/{namespace}/events"), &event).await;
        assert_invalid(
            &reply,
            "metadata.namespace",
            &format!("{group} events in {namespace:?}"),
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_253_character_name_works_and_survives_a_restart() {
    let mut serve = Serve::start().await;
    let client = serve.client().await;
    let name = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(name.len(), 253);
    let mut object = dev();
    object["metadata"]["name"] = json!(name);
    let reply = post_json(&client, COLLECTION, &object).await;
    assert_eq!(reply.code, StatusCode::CREATED, "{}", reply.text);
    serve.kill();
    serve.restart().await;
    let client = serve.client().await;
    let reply = send(
        &client,
        Method::GET,
        &format!("{COLLECTION}/{name}"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(reply.code, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.body["metadata"]["name"], name);
}
