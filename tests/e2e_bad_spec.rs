//! Bad specs the API refuses before the controller sees them: a negative or absurd rollout timeout
//! is a 422 (kube-apiserver's Invalid), and nothing is stored. Against a real `kcpshard serve`
//! with its controller; no kcp starts, so this runs beside the real-kcp tests. (The bad specs the
//! controller must handle, a version with no binary and a front address in use, are walked on a
//! real shard in e2e_roll.rs.)
mod e2e;
mod support;

use std::process::Command;

use e2e::*;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;

fn shard_with_rollout(name: &str, field: &str, value: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": { "name": name },
        "spec": {
            "version": kcp_newer(),
            "store": { "type": "KineSqlite" },
            "front": { "type": "Tcp", "listen": format!("127.0.0.1:{}", test_port()) },
            "rollout": { field: value },
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_or_absurd_timeout_is_refused_with_422_and_nothing_is_stored() {
    let mut env = Env::start().await;
    let cases = [
        ("readinessTimeout", "-5s"),
        ("readinessTimeout", "100000h"),
        ("readinessTimeout", "soon"),
        ("drainTimeout", "-1s"),
        ("drainTimeout", "876000h"),
    ];
    for (i, (field, value)) in cases.iter().enumerate() {
        let name = format!("bad-timeout-{i}");
        match env
            .shards()
            .create(&PostParams::default(), &shard_with_rollout(&name, field, value))
            .await
        {
            Err(kube::Error::Api(status)) => {
                println!("spec.rollout.{field}={value}: {} {}", status.code, status.message);
                assert_eq!(status.code, 422, "spec.rollout.{field}={value}: {status:?}");
                assert!(
                    status.message.contains(field),
                    "the 422 does not name spec.rollout.{field}: {}",
                    status.message
                );
            }
            other => panic!("spec.rollout.{field}={value} was not refused: {other:?}"),
        }
        assert!(env.get(&name).await.is_none(), "the refused KcpShard {name} was stored");
    }

    // The same through the real kubectl, as a user would meet it.
    let kubectl = require("kubectl");
    let manifest = env.dir().join("bad.json");
    std::fs::write(
        &manifest,
        serde_json::to_vec(&shard_with_rollout("bad-kubectl", "readinessTimeout", "-30s")).unwrap(),
    )
    .unwrap();
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(env.state.join("kubeconfig"))
        .args(["apply", "-f"])
        .arg(&manifest)
        .env("HOME", env.dir())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("kubectl apply: {}", stderr.trim());
    assert!(
        !out.status.success(),
        "kubectl apply of readinessTimeout=-30s succeeded"
    );
    assert!(
        stderr.contains("is invalid") && stderr.contains("readinessTimeout"),
        "kubectl's error does not say what is invalid: {stderr}"
    );
    assert!(
        env.get("bad-kubectl").await.is_none(),
        "the refused KcpShard bad-kubectl was stored"
    );

    let left = env.shutdown(&[]).await;
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// A new shard whose kcp binary is missing: Degraded says so, and one RollBlocked Warning event
/// says it too (the status written after the front started already carried the block, which made
/// the next look take the event as sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_shard_without_its_binary_gets_one_roll_blocked_event() {
    let mut env = Env::start().await;
    let shard = "nobinary";
    env.apply(shard, "v0.0.1", &format!("127.0.0.1:{}", test_port())).await;
    env.until(
        shard,
        std::time::Duration::from_secs(60),
        "Degraded BinaryMissing",
        |o| {
            condition(o, "Degraded")
                .filter(|c| c["reason"] == "BinaryMissing")
                .map(|_| ())
        },
    )
    .await;
    let blocked = |events: &[k8s_openapi::api::core::v1::Event]| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("RollBlocked"))
            .map(|e| e.message.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while blocked(&env.events(shard).await).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Several more looks (one every 2 s) add no second event.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let events = env.events(shard).await;
    let messages = blocked(&events);
    assert_eq!(messages.len(), 1, "{}", summarize_events(&events));
    assert!(messages[0].contains("no kcp binary at"), "{}", messages[0]);
    env.shutdown(&[shard]).await;
}
