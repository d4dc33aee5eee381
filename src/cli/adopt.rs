//! `kcpshard adopt ROOT_DIR --name NAME [--store STORE] [--front ADDRESS]`: writes a KcpShard that
//! takes over the kcp serving from ROOT_DIR (spec.adopt; docs/how-to/adopt.md, "Adopt a running
//! kcp") and follows it to its end, like `rollout status`. With `--dry-run` it only reports what
//! an adoption would take (its key material, tokens, store and flags) and whether it can: it reads,
//! writes nothing and signals no process. Either way it exits non-zero when the kcp cannot be
//! adopted, with each reason and what to do.
use std::path::PathBuf;

use anyhow::{Context, bail};
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

use super::connect::Conn;
use super::follow::{Progress, Wording, follow};
use crate::adopt;
use crate::api::StoreSpec;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The root directory the kcp to adopt serves from (its --root-directory).
    root_dir: PathBuf,
    /// The name of the KcpShard that runs it.
    #[arg(long)]
    name: String,
    /// The kcp release the shard runs (spec.version); it must be the one running. Default: the one
    /// running.
    #[arg(long)]
    version: Option<String>,
    /// Where the data moves (spec.store): a type (KineSqlite), or the whole spec.store as YAML or
    /// JSON, e.g. '{type: KinePostgres, kinePostgres: {host: 127.0.0.1, managed: true}}'.
    #[arg(long, default_value = "KineSqlite")]
    store: String,
    /// The address the shard's front listens on (spec.front.listen; a Tcp front). Default: the
    /// default of spec.front.
    #[arg(long)]
    front: Option<String>,
    /// Report what an adoption would take and whether it can, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Give up following after this many seconds (0: wait as long as it takes).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let found = adopt::inspect(&args.root_dir).await?;
    let version = args.version.clone().unwrap_or_else(|| found.process.version.clone());
    let refusals = found.refusals(&version);
    if args.dry_run {
        println!("KcpShard {} (dry run)", args.name);
        print!("{}", adopt::report::render(&found, &version, &refusals));
    }
    if let Some(refused) = refusals.first() {
        bail!("{} cannot be adopted: {refused}", args.root_dir.display());
    }
    if args.dry_run {
        return Ok(());
    }
    let store = store_spec(&args.store)?;
    let mut front = json!({ "type": "Tcp" });
    if let Some(listen) = &args.front {
        front["listen"] = json!(listen);
    }
    let object = json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": { "name": args.name },
        "spec": {
            "version": version,
            "kcp": { "extraArgs": adopt::flags::kept(&found.flags) },
            "store": store,
            "front": front,
            "adopt": { "rootDirectory": found.root_dir.display().to_string() },
        },
    });
    let cluster = args.conn.connect().await?;
    let object: DynamicObject = serde_json::from_value(object)?;
    cluster
        .kcpshards()
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| cluster.explain(e))?;
    println!(
        "{} \"{}\" created: it takes over kcp {} (pid {})",
        super::connect::QUALIFIED,
        args.name,
        found.process.version,
        found.process.pid
    );
    let words = Wording {
        done: "adopted",
        blocked: "adoption failed",
        waiting: "adoption to finish",
        timed_out: "to be adopted",
    };
    follow(&cluster, &args.name, args.timeout, &words, progress).await
}

/// spec.store from `--store`: a type name, or the whole spec.store.
fn store_spec(value: &str) -> anyhow::Result<StoreSpec> {
    let parsed: Value = serde_yaml::from_str(value).with_context(|| format!("--store {value}"))?;
    let spec = match parsed {
        Value::String(type_) => json!({ "type": type_ }),
        other => other,
    };
    serde_json::from_value(spec).with_context(|| format!("--store {value} is no spec.store"))
}

/// Where an adoption stands, read from the object: done once status.adoption says Complete,
/// blocked once it says Failed; else the controller's progress message.
fn progress(object: &Value) -> Progress {
    let adoption = &object["status"]["adoption"];
    let message = adoption["message"].as_str().unwrap_or_default().to_string();
    match adoption["phase"].as_str() {
        Some("Complete") => Progress::Done(format!(
            "{} serves in place of {}",
            object["metadata"]["name"], adoption["from"]
        )),
        Some("Failed") => Progress::Blocked(message),
        None => Progress::Stale,
        Some(phase) => {
            let progressing = object["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Progressing")
                .and_then(|c| c["message"].as_str())
                .unwrap_or_default();
            Progress::Moving(format!("{phase}: {progressing}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_a_type_or_the_whole_spec_store() {
        assert_eq!(
            store_spec("KineSqlite").unwrap().type_,
            crate::api::StoreType::KineSqlite
        );
        let postgres = store_spec("{type: KinePostgres, kinePostgres: {host: 127.0.0.1, managed: true}}").unwrap();
        assert!(postgres.kine_postgres.is_some_and(|p| p.managed));
        assert!(store_spec("Mongo").is_err());
    }

    #[test]
    fn an_adoption_is_done_when_complete_and_blocked_when_failed_with_the_controllers_words() {
        let object = |phase: &str, message: &str| {
            json!({ "metadata": { "name": "kcp" }, "status": {
                "adoption": { "phase": phase, "from": "kcp v0.31.2 (pid 7)", "message": message },
                "conditions": [{ "type": "Progressing", "message": "moving the data" }] } })
        };
        assert!(matches!(progress(&object("Complete", "")), Progress::Done(m) if m.contains("pid 7")));
        assert_eq!(
            progress(&object("Failed", "kcp v0.30.0 runs")),
            Progress::Blocked("kcp v0.30.0 runs".into())
        );
        assert_eq!(
            progress(&object("Serving", "")),
            Progress::Moving("Serving: moving the data".into())
        );
        assert_eq!(progress(&json!({ "status": {} })), Progress::Stale);
    }
}
