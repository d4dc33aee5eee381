//! kube-runtime against our API, both ways the project uses it: over HTTPS with a client built
//! from the kubeconfig `kcpshard serve` writes, and in-process (`ApiServer::client`, as serve's own
//! controller does). A `Controller` over KcpShards, with the finalizer helper, sees creates,
//! updates and deletes, and a status write that changes nothing does not wake it.
mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use common::{Serve, dev_manifest};
use futures::StreamExt;
use kcpshard::api::KcpShard;
use kcpshard::apiserver::ApiServer;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

const FINALIZER: &str = "test.kcpshard.io/seen";

/// What a reconcile saw.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Applied {
        generation: i64,
        resource_version: String,
        phase: Option<String>,
    },
    Cleanup,
}

struct Context {
    api: Api<KcpShard>,
    seen: mpsc::UnboundedSender<Seen>,
}

async fn reconcile(shard: Arc<KcpShard>, ctx: Arc<Context>) -> Result<Action, finalizer::Error<Infallible>> {
    finalizer(&ctx.api, FINALIZER, shard, |event| async {
        let seen = match event {
            Finalizer::Apply(shard) => Seen::Applied {
                generation: shard.metadata.generation.unwrap_or_default(),
                resource_version: shard.resource_version().unwrap_or_default(),
                phase: shard
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| p.as_str().to_string()),
            },
            Finalizer::Cleanup(_) => Seen::Cleanup,
        };
        let _ = ctx.seen.send(seen);
        Ok::<_, Infallible>(Action::await_change())
    })
    .await
}

fn error_policy(_: Arc<KcpShard>, err: &finalizer::Error<Infallible>, _: Arc<Context>) -> Action {
    eprintln!("reconcile failed: {err}");
    Action::requeue(Duration::from_millis(500))
}

/// Receives the next thing the controller saw, failing the test after a while.
async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>, what: &str) -> Seen {
    match tokio::time::timeout(Duration::from_secs(15), seen.recv()).await {
        Ok(Some(seen)) => seen,
        _ => panic!("the controller did not reconcile {what}"),
    }
}

/// Waits until a reconcile matches, skipping others (the finalizer's own write wakes it too).
async fn until(seen: &mut mpsc::UnboundedReceiver<Seen>, what: &str, matches: impl Fn(&Seen) -> bool) -> Seen {
    loop {
        let next = next(seen, what).await;
        if matches(&next) {
            return next;
        }
    }
}

/// Drops what was seen until the controller has been quiet for a second.
async fn settle(seen: &mut mpsc::UnboundedReceiver<Seen>) {
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(1), seen.recv()).await {}
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_over_https_sees_creates_updates_and_deletes_and_not_no_op_status_writes() {
    let serve = Serve::start().await;
    let client = serve.client().await;
    let outcome = tokio::spawn(controller_sees_creates_updates_and_deletes(client)).await;
    if let Err(err) = outcome {
        serve.fail(&format!("{err}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_in_process_sees_creates_updates_and_deletes_and_not_no_op_status_writes() {
    let state = tempfile::tempdir().unwrap();
    let server = ApiServer::open(state.path()).expect("open the API in-process");
    controller_sees_creates_updates_and_deletes(server.client()).await;
}

async fn controller_sees_creates_updates_and_deletes(client: Client) {
    let api: Api<KcpShard> = Api::all(client.clone());
    let (tx, mut seen) = mpsc::unbounded_channel();
    let context = Arc::new(Context {
        api: api.clone(),
        seen: tx,
    });
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, error_policy, context)
            .for_each(|_| async {}),
    );

    // Create.
    let dev: KcpShard = serde_json::from_value(dev_manifest()).expect("dev.yaml is a KcpShard");
    api.create(&PostParams::default(), &dev).await.expect("create dev");
    until(&mut seen, "the create", |s| {
        matches!(s, Seen::Applied { generation: 1, .. })
    })
    .await;
    let with_finalizer = api.get("dev").await.unwrap();
    assert_eq!(
        with_finalizer.finalizers(),
        [FINALIZER],
        "the finalizer helper's JSON patch applied"
    );

    // Update of the spec: a new generation.
    let patch = json!({"spec": {"kcp": {"extraArgs": ["--v=4"]}}});
    api.patch("dev", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("spec patch");
    until(&mut seen, "the spec update", |s| {
        matches!(s, Seen::Applied { generation: 2, .. })
    })
    .await;

    // A status write that changes something wakes the controller once.
    let status = json!({"status": {"phase": "Ready"}});
    let written = api
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status patch");
    let rv = written.resource_version().unwrap();
    until(
        &mut seen,
        "the status change",
        |s| matches!(s, Seen::Applied { phase: Some(p), .. } if p == "Ready"),
    )
    .await;
    settle(&mut seen).await;

    // The same status again changes nothing: no new resourceVersion, no event, no reconcile.
    let again = api
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("no-op status patch");
    assert_eq!(
        again.resource_version().unwrap(),
        rv,
        "a no-op write must not persist a new resourceVersion"
    );
    if let Ok(Some(woke)) = tokio::time::timeout(Duration::from_secs(3), seen.recv()).await {
        panic!("a status patch that changed nothing caused a reconcile: {woke:?}");
    }

    // Delete: the controller runs its cleanup, removes its finalizer, and the object goes.
    api.delete("dev", &DeleteParams::default()).await.expect("delete");
    until(&mut seen, "the delete", |s| *s == Seen::Cleanup).await;
    common::eventually(Duration::from_secs(10), "dev to be gone after cleanup", || async {
        api.get_opt("dev").await.ok().flatten().is_none().then_some(())
    })
    .await;
    controller.abort();
}
