//! The backlog of a kcp's controllers: how many keys wait in their work queues, read from its
//! `/metrics` (client-go's `workqueue_depth{name=...}` gauge, one per queue).
//!
//! A new leader on a big shard works through every logical cluster before a new workspace gets
//! Ready (at 400 workspaces, seen on kcp v0.31.2: 1,170 keys queued, most in `kcp-apibinding` and
//! `kcp-replication-controller`, down to 479 some 40 s later): the backlog says that it is busy
//! catching up rather than stuck.
use http::{Method, StatusCode};

use super::SlotError;
use super::access::{call, unexpected};

/// How many of the deepest queues a backlog names.
const DEEPEST: usize = 3;

/// The keys queued in a kcp's controllers' work queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// All queues together.
    pub queued: u64,
    /// The deepest queues, deepest first, with their depth. Queues kcp keeps per logical cluster
    /// (`gc-<cluster>`, `quota-<cluster>`) count as one (`gc-*`).
    pub deepest: Vec<(String, u64)>,
}

impl Backlog {
    /// Sums the `workqueue_depth` samples of a Prometheus text exposition.
    pub fn parse(metrics: &str) -> Backlog {
        let mut queues: Vec<(String, u64)> = Vec::new();
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix("workqueue_depth{name=\"") else {
                continue;
            };
            let Some((name, value)) = rest.split_once("\"} ") else {
                continue;
            };
            let Ok(depth) = value.trim().parse::<f64>() else {
                continue;
            };
            let queue = per_cluster_family(name).unwrap_or_else(|| name.to_string());
            match queues.iter_mut().find(|(q, _)| *q == queue) {
                Some((_, total)) => *total += depth as u64,
                None => queues.push((queue, depth as u64)),
            }
        }
        let queued = queues.iter().map(|(_, d)| d).sum();
        queues.retain(|(_, d)| *d > 0);
        queues.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        queues.truncate(DEEPEST);
        Backlog {
            queued,
            deepest: queues,
        }
    }

    /// "46 keys queued (kcp-workspace 40, gc-* 4, kcp-apibinding 2)".
    pub fn describe(&self) -> String {
        let deepest: Vec<String> = self.deepest.iter().map(|(q, d)| format!("{q} {d}")).collect();
        match deepest.is_empty() {
            true => format!("{} keys queued", self.queued),
            false => format!("{} keys queued ({})", self.queued, deepest.join(", ")),
        }
    }
}

/// `gc-*` for `gc-1fod72itf7mwbkx2`: a queue kcp runs per logical cluster, named after the
/// cluster's 16-character id.
fn per_cluster_family(name: &str) -> Option<String> {
    let (family, id) = name.rsplit_once('-')?;
    let is_cluster_id = id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    is_cluster_id.then(|| format!("{family}-*"))
}

/// The backlog of the kcp `client` reaches (the shard admin, on the slot's own port).
pub async fn read(client: &kube::Client) -> Result<Backlog, SlotError> {
    let (status, body) = call(client, Method::GET, "/metrics", None).await?;
    match status {
        StatusCode::OK => Ok(Backlog::parse(&String::from_utf8_lossy(&body))),
        s => Err(unexpected("GET", "/metrics", s, &body)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_sums_every_queue_and_names_the_deepest_with_per_cluster_queues_as_one() {
        let metrics = r#"# HELP workqueue_depth [ALPHA] Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="ClusterRoleAggregator"} 0
workqueue_depth{name="gc-1fod72itf7mwbkx2"} 3
workqueue_depth{name="gc-1g3vmvaabm9ww6lf"} 4
workqueue_depth{name="kcp-apibinding"} 4
workqueue_depth{name="kcp-workspace"} 46
workqueue_depth{name="kcp-workspacetypes-bootstrap-root:universal"} 2
workqueue_adds_total{name="kcp-workspace"} 2904
"#;
        let backlog = Backlog::parse(metrics);
        assert_eq!(backlog.queued, 59);
        assert_eq!(
            backlog.deepest,
            vec![
                ("kcp-workspace".to_string(), 46),
                ("gc-*".to_string(), 7),
                ("kcp-apibinding".to_string(), 4)
            ]
        );
        assert_eq!(
            backlog.describe(),
            "59 keys queued (kcp-workspace 46, gc-* 7, kcp-apibinding 4)"
        );
        assert_eq!(
            Backlog::parse("workqueue_depth{name=\"namespace\"} 0\n").describe(),
            "0 keys queued"
        );
    }
}
