//! `kcpshard delete NAME`: deletes and, like kubectl, waits until the object is gone. With
//! finalizers that wait lasts until their owners remove them; the command says which ones it is
//! waiting for, so a stuck delete is not a mystery.
use std::time::Duration;

use anyhow::bail;
use kube::api::DeleteParams;

use super::connect::{Conn, QUALIFIED, is_not_found};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The KcpShard to delete.
    name: String,
    /// Wait until the object is gone (finalizers done). `--wait=false` returns at once.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    wait: bool,
    /// Give up waiting after this many seconds (0: wait as long as it takes).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    /// Do not fail when the object does not exist.
    #[arg(long)]
    ignore_not_found: bool,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let cluster = args.conn.connect().await?;
    let api = cluster.kcpshards();
    let deleted = match api.delete(&args.name, &DeleteParams::default()).await {
        Ok(deleted) => deleted,
        Err(err) if args.ignore_not_found && is_not_found(&err) => return Ok(()),
        Err(err) => return Err(cluster.explain(err)),
    };
    println!("{QUALIFIED} \"{}\" deleted", args.name);
    if !args.wait {
        return Ok(());
    }
    // The deleted object, or (gone at once) a Status whose details name its uid.
    let uid = deleted.either(
        |object| object.metadata.uid,
        |status| status.details.map(|d| d.uid).filter(|uid| !uid.is_empty()),
    );
    let started = tokio::time::Instant::now();
    let mut told = Vec::new();
    loop {
        let current = api.get_opt(&args.name).await.map_err(|e| cluster.explain(e))?;
        let Some(current) = current else {
            return Ok(());
        };
        // A new object under the same name is not the one we deleted.
        if uid.is_some() && current.metadata.uid != uid {
            return Ok(());
        }
        let finalizers = current.metadata.finalizers.unwrap_or_default();
        if !finalizers.is_empty() && finalizers != told {
            eprintln!(
                "waiting for finalizers to be removed: {} (Ctrl-C stops waiting; the deletion stays requested)",
                finalizers.join(", ")
            );
            told = finalizers;
        }
        if args.timeout > 0 && started.elapsed() >= Duration::from_secs(args.timeout) {
            bail!(
                "{QUALIFIED} \"{}\" is still there after {}s; its finalizers: [{}]",
                args.name,
                args.timeout,
                told.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
