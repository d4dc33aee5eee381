//! The rules of the real kube-apiserver that controllers depend on, checked through kube-rs against
//! the API in-process (the controller's own path). kubectl's view is in tests/kubectl.rs.
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Resource;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::{Value, json};

use kcpshard::apiserver::ApiServer;

fn shard_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kcpshard.io", "v1alpha1", "KcpShard"),
        "kcpshards",
    )
}

fn shard(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": {"name": name},
        // Each shard its own front address: the API refuses a second shard on one.
        "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"},
                 "front": {"listen": format!("127.0.0.1:{}", 20000 + name.bytes().map(u16::from).sum::<u16>())}},
        "status": {"phase": "Ready"},
    }))
    .unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    client: kube::Client,
    shards: Api<DynamicObject>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let client = ApiServer::open(dir.path()).unwrap().client();
    let shards = Api::all_with(client.clone(), &shard_resource());
    Fixture {
        _dir: dir,
        client,
        shards,
    }
}

fn rv(object: &DynamicObject) -> String {
    object.metadata.resource_version.clone().unwrap()
}

#[tokio::test]
async fn create_sets_system_metadata_and_drops_status() {
    let f = fixture();
    let created = f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(
        created.data.get("status").is_none(),
        "status is written through /status only"
    );
    let err = f
        .shards
        .create(&PostParams::default(), &shard("dev"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_write_that_changes_nothing_keeps_the_resource_version() {
    let f = fixture();
    let created = f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    let same = json!({"spec": {"version": "v0.31.2"}});
    let patched = f
        .shards
        .patch("dev", &PatchParams::default(), &Patch::Merge(&same))
        .await
        .unwrap();
    assert_eq!(rv(&patched), rv(&created));

    let status = json!({"status": {"phase": "Ready"}});
    let first = f
        .shards
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let second = f
        .shards
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_ne!(rv(&first), rv(&created));
    assert_eq!(rv(&second), rv(&first), "an identical status write persists nothing");
}

#[tokio::test]
async fn generation_follows_spec_changes_but_not_status_or_labels() {
    let f = fixture();
    f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    let labelled = f
        .shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let status = f
        .shards
        .patch_status(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Progressing"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.metadata.generation, Some(1));
    let bumped = f
        .shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "v0.31.0"}})),
        )
        .await
        .unwrap();
    assert_eq!(bumped.metadata.generation, Some(2));
    assert_eq!(
        bumped.data["status"]["phase"], "Progressing",
        "a spec write keeps the status"
    );

    let sneaky = f
        .shards
        .patch_status(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "v9.9.9"}})),
        )
        .await
        .unwrap();
    assert_eq!(sneaky.data["spec"]["version"], "v0.31.0", "/status writes only status");
}

#[tokio::test]
async fn a_stale_update_is_a_conflict() {
    let f = fixture();
    let created = f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    f.shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "v0.31.0"}})),
        )
        .await
        .unwrap();
    let mut stale = created.clone();
    stale.data["spec"]["version"] = json!("v0.31.1");
    let err = f
        .shards
        .replace("dev", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
}

#[tokio::test]
async fn delete_waits_for_finalizers() {
    let f = fixture();
    let mut with_finalizer = shard("dev");
    with_finalizer.metadata.finalizers = Some(vec!["kcpshard.io/cleanup".into()]);
    f.shards.create(&PostParams::default(), &with_finalizer).await.unwrap();
    f.shards.delete("dev", &DeleteParams::default()).await.unwrap();
    let marked = f.shards.get("dev").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.generation, Some(2));

    let remove = json!([{"op": "remove", "path": "/metadata/finalizers/0"}]);
    f.shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::<Value>::Json(serde_json::from_value(remove).unwrap()),
        )
        .await
        .unwrap();
    assert!(
        f.shards.get_opt("dev").await.unwrap().is_none(),
        "gone once the last finalizer is removed"
    );
}

#[tokio::test]
async fn kube_runtime_finalizer_patches_apply_to_objects_without_finalizers() {
    // kube-runtime's finalizer helper tests `/metadata/finalizers == null` before adding the first.
    let f = fixture();
    f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    let add = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["kcpshard.io/cleanup"]},
    ]);
    let patched = f
        .shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::<Value>::Json(serde_json::from_value(add).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.finalizers,
        Some(vec!["kcpshard.io/cleanup".to_string()])
    );
}

#[tokio::test]
async fn server_side_apply_creates_then_updates() {
    let f = fixture();
    let params = PatchParams::apply("kcpshard-test");
    let created = f
        .shards
        .patch("dev", &params, &Patch::Apply(shard("dev")))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let mut newer = shard("dev");
    newer.data["spec"]["version"] = json!("v0.31.0");
    let updated = f.shards.patch("dev", &params, &Patch::Apply(newer)).await.unwrap();
    assert_eq!(updated.data["spec"]["version"], "v0.31.0");
    assert_eq!(updated.metadata.generation, Some(2));
}

#[tokio::test]
async fn a_watch_resumes_from_a_version_and_an_expired_one_gets_410() {
    let f = fixture();
    let created = f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    f.shards
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "v0.31.0"}})),
        )
        .await
        .unwrap();
    let mut stream = f
        .shards
        .watch(&WatchParams::default(), &rv(&created))
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.data["spec"]["version"], "v0.31.0"),
        other => panic!("expected the missed change, got {other:?}"),
    }

    // The history is in memory: a version from before a restart has expired.
    let dir = f._dir.path().to_path_buf();
    let restarted: Api<DynamicObject> = Api::all_with(ApiServer::open(&dir).unwrap().client(), &shard_resource());
    let mut stream = restarted
        .watch(&WatchParams::default(), &rv(&created))
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn a_streaming_list_ends_with_the_initial_events_bookmark() {
    let f = fixture();
    f.shards.create(&PostParams::default(), &shard("a")).await.unwrap();
    f.shards.create(&PostParams::default(), &shard("b")).await.unwrap();
    let params = WatchParams::streaming_lists();
    let mut stream = f.shards.watch(&params, "0").await.unwrap().boxed();
    let mut added = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(o)) => added.push(o.metadata.name.unwrap()),
            Some(WatchEvent::Bookmark(b)) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, ["a", "b"]);
}

#[tokio::test]
async fn recorder_events_are_readable_as_core_events_of_the_object() {
    let f = fixture();
    let created = f.shards.create(&PostParams::default(), &shard("dev")).await.unwrap();
    let recorder = Recorder::new(
        f.client.clone(),
        Reporter {
            controller: "kcpshard".into(),
            instance: None,
        },
    );
    let reference = created.object_ref(&shard_resource());
    let event = Event {
        type_: EventType::Warning,
        reason: "SlotNotReady".into(),
        note: Some("slot b did not answer /readyz within 120s".into()),
        action: "Roll".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();

    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(f.client.clone(), "default");
    let selector = format!(
        "involvedObject.kind=KcpShard,involvedObject.name=dev,involvedObject.uid={}",
        created.metadata.uid.unwrap()
    );
    let list = core
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "a repeated event is one event with a count");
    let seen = &list.items[0];
    assert_eq!(seen.reason.as_deref(), Some("SlotNotReady"));
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(seen.count, Some(2));
    let other = core
        .list(&kube::api::ListParams::default().fields("involvedObject.name=other"))
        .await
        .unwrap();
    assert!(other.items.is_empty());
}

/// Metadata informers (client-go, controller-runtime) ask for PartialObjectMetadata; big answers
/// are gzipped for a client that accepts it, as the real server does from 128 KiB.
#[tokio::test]
async fn metadata_only_lists_and_gzipped_big_answers() {
    use http_body_util::BodyExt;
    let f = fixture();
    for name in ["a", "b", "c"] {
        let mut shard = shard(name);
        shard.metadata.annotations = Some([("bulk".to_string(), "x".repeat(60 * 1024))].into());
        f.shards.create(&PostParams::default(), &shard).await.unwrap();
    }
    let get = |accept: &str, encoding: &str| {
        http::Request::get("/apis/kcpshard.io/v1alpha1/kcpshards")
            .header(http::header::ACCEPT, accept)
            .header(http::header::ACCEPT_ENCODING, encoding)
            .body(kube::client::Body::empty())
            .unwrap()
    };
    let response = f
        .client
        .send(get(
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            "identity",
        ))
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let list: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(list["items"][0]["kind"], "PartialObjectMetadata");
    assert!(list["items"][0]["spec"].is_null() && list["items"][0]["metadata"]["name"] == "a");

    let response = f.client.send(get("application/json", "gzip")).await.unwrap();
    assert_eq!(response.headers()[http::header::CONTENT_ENCODING], "gzip");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text).unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3));

    let response = f.client.send(get("text/html", "identity")).await.unwrap();
    assert_eq!(response.status(), 406);
}
