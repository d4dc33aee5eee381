//! `kcpshard events [--for kcpshard/NAME]`: what `kubectl events` prints (LAST SEEN, TYPE, REASON,
//! OBJECT as Kind/name, MESSAGE), oldest first, over every namespace (KcpShards are
//! cluster-scoped, so their events land in `default`).
use anyhow::bail;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

use super::connect::{Conn, KIND};
use super::describe::last_seen;
use super::table::{self, tabwrite};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only events about this object, as `kcpshard/NAME` (or `ks/NAME`, `kcpshards/NAME`).
    #[arg(long = "for")]
    for_object: Option<String>,
    /// Only events of this type (Normal or Warning).
    #[arg(long = "types")]
    types: Vec<String>,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut params = ListParams::default();
    if let Some(target) = &args.for_object {
        let Some((kind, name)) = target.split_once('/') else {
            bail!("--for takes KIND/NAME, such as kcpshard/dev; got {target:?}");
        };
        let kind = kind.to_lowercase();
        let known = ["kcpshard", "kcpshards", "ks", "kcpshard.kcpshard.io"];
        if !known.contains(&kind.as_str()) {
            bail!("--for only knows kcpshard/NAME; got {target:?} (use kubectl for other kinds)");
        }
        params = params.fields(&format!("involvedObject.kind={KIND},involvedObject.name={name}"));
    }
    let cluster = args.conn.connect().await?;
    let api: Api<Event> = Api::all(cluster.client.clone());
    let mut events = api.list(&params).await.map_err(|e| cluster.explain(e))?.items;
    events.retain(|e| args.types.is_empty() || args.types.iter().any(|t| Some(t.as_str()) == e.type_.as_deref()));
    if events.is_empty() {
        eprintln!("No events found.");
        return Ok(());
    }
    events.sort_by_key(last_seen);
    let mut text = String::from("LAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE\n");
    for event in &events {
        let object = &event.involved_object;
        text.push_str(&format!(
            "{}\t{}\t{}\t{}/{}\t{}\n",
            table::age(last_seen(event).as_deref()),
            event.type_.as_deref().unwrap_or(""),
            event.reason.as_deref().unwrap_or(""),
            object.kind.as_deref().unwrap_or(""),
            object.name.as_deref().unwrap_or(""),
            event.message.as_deref().unwrap_or("").trim()
        ));
    }
    print!("{}", tabwrite(&text, 3));
    Ok(())
}
