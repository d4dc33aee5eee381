//! A resumable watch over raw HTTP, for `get -w`: one JSON event per line; bookmarks move the
//! resume point; a watch the server ends (its timeout) is reopened from the last resourceVersion,
//! so a quiet `get -w` runs for as long as the user wants.
use anyhow::{Context, bail};
use futures::stream::BoxStream;
use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use serde_json::Value;

use super::connect::Cluster;

/// Below kube's default read timeout, so a quiet watch ends cleanly and is resumed.
const TIMEOUT_SECONDS: u32 = 240;

pub struct Watch {
    /// Collection path with its query (selectors), without the watch parameters.
    path: String,
    accept: &'static str,
    resource_version: String,
    lines: Option<BoxStream<'static, std::io::Result<String>>>,
}

impl Watch {
    pub fn new(path: String, accept: &'static str, resource_version: String) -> Self {
        Watch {
            path,
            accept,
            resource_version,
            lines: None,
        }
    }

    /// The next ADDED, MODIFIED or DELETED event, as (type, object).
    pub async fn next(&mut self, cluster: &Cluster) -> anyhow::Result<(String, Value)> {
        loop {
            let lines = match &mut self.lines {
                Some(lines) => lines,
                None => self.lines.insert(self.open(cluster).await?),
            };
            let Some(line) = lines.try_next().await.context("the watch connection failed")? else {
                self.lines = None;
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            let event: Value = serde_json::from_str(&line)
                .with_context(|| format!("the server sent an invalid watch event: {line}"))?;
            let kind = event["type"].as_str().unwrap_or_default().to_string();
            let object = event["object"].clone();
            if kind == "ERROR" {
                bail!(
                    "the watch ended with an error from the server ({}): {}",
                    object["reason"].as_str().unwrap_or("Unknown"),
                    object["message"].as_str().unwrap_or_default()
                );
            }
            if let Some(rv) = resource_version_of(&object) {
                self.resource_version = rv;
            }
            if kind == "BOOKMARK" {
                continue;
            }
            return Ok((kind, object));
        }
    }

    async fn open(&self, cluster: &Cluster) -> anyhow::Result<BoxStream<'static, std::io::Result<String>>> {
        let separator = if self.path.contains('?') { '&' } else { '?' };
        let mut url = format!(
            "{}{separator}watch=true&allowWatchBookmarks=true&timeoutSeconds={TIMEOUT_SECONDS}",
            self.path
        );
        if !self.resource_version.is_empty() {
            url.push_str(&format!("&resourceVersion={}", self.resource_version));
        }
        let request = http::Request::get(&url)
            .header(http::header::ACCEPT, self.accept)
            .body(Vec::new())?;
        let body = cluster
            .client
            .request_stream(request)
            .await
            .map_err(|e| cluster.explain(e))?;
        Ok(body.lines().boxed())
    }
}

/// The resourceVersion an event moves the watch to: the object's own, or for a Table, its row's.
fn resource_version_of(object: &Value) -> Option<String> {
    let own = object["metadata"]["resourceVersion"].as_str();
    let row = object["rows"][0]["object"]["metadata"]["resourceVersion"].as_str();
    row.or(own).filter(|rv| !rv.is_empty()).map(str::to_string)
}
