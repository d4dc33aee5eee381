//! Prometheus metrics of fronts' connections, rendered from status snapshots at scrape time: the
//! counts in `status` and on `/metrics` are the same numbers by construction. A front's own
//! `/metrics` (`kcpshard front --metrics-listen`) tells its counts by slot; serve's `/metrics` tells
//! each shard's front as the controller's last look at it saw them, by shard and slot, under the
//! same names.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::front::protocol::{Backend, FrontStatus, SlotConnections};

/// One number of a slot's [`SlotConnections`] as a series.
struct Series {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    value: fn(&SlotConnections) -> u64,
}

const SERIES: [Series; 6] = [
    Series {
        name: "connections_open",
        help: "Client connections pinned to a slot now",
        kind: MetricType::Gauge,
        value: |c| c.open,
    },
    Series {
        name: "connections",
        help: "Client connections given to a slot",
        kind: MetricType::Counter,
        value: |c| c.total,
    },
    Series {
        name: "connections_failed",
        help: "Client connections closed because their slot did not accept within the retry window, or failed before answering with no other slot to take them",
        kind: MetricType::Counter,
        value: |c| c.failed,
    },
    Series {
        name: "connections_replayed",
        help: "Client connections a slot did not answer (it failed or stayed silent) that went on to another slot",
        kind: MetricType::Counter,
        value: |c| c.replayed,
    },
    Series {
        name: "connections_retired_pending",
        help: "Open kept-alive connections to a slot out of the serving set that may still carry a request to it",
        kind: MetricType::Gauge,
        value: |c| c.retired_pending,
    },
    Series {
        name: "connections_retired_unjudged",
        help: "Open connections to a slot out of the serving set that the front leaves to the slot (HTTP/2, not TLS)",
        kind: MetricType::Gauge,
        value: |c| c.retired_unjudged,
    },
];

/// What a front said of its connections and serving set.
#[derive(Debug, Default)]
struct Counts {
    connections: BTreeMap<String, SlotConnections>,
    backends: Vec<Backend>,
}

/// The fronts' counts as last seen, by shard: the series of serve's `/metrics`, labelled by shard.
/// Cheap to clone: every clone tells the same fronts.
#[derive(Clone, Debug, Default)]
pub struct FrontsSeen {
    fronts: Arc<Mutex<BTreeMap<String, Counts>>>,
    /// Whether the series carry a `shard` label (serve's) or not (a front's own).
    by_shard: bool,
}

impl FrontsSeen {
    /// The fronts of serve's shards, labelled by shard and slot.
    pub fn by_shard() -> FrontsSeen {
        FrontsSeen {
            by_shard: true,
            ..FrontsSeen::default()
        }
    }

    /// `shard`'s front told these counts and serving set.
    pub fn seen(&self, shard: &str, connections: &BTreeMap<String, SlotConnections>, backends: &[Backend]) {
        let counts = Counts {
            connections: connections.clone(),
            backends: backends.to_vec(),
        };
        self.lock().insert(shard.to_string(), counts);
    }

    /// The shard is gone: its front is no longer told.
    pub fn shard_gone(&self, shard: &str) {
        self.lock().remove(shard);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Counts>> {
        self.fronts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn labels(&self, shard: &str, more: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
        let shard = self.by_shard.then(|| ("shard", shard.to_string()));
        shard.into_iter().chain(more.iter().cloned()).collect()
    }
}

impl Collector for FrontsSeen {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let fronts = self.lock();
        for series in &SERIES {
            let mut metric = encoder.encode_descriptor(series.name, series.help, None, series.kind)?;
            for (shard, counts) in fronts.iter() {
                for (slot, connections) in &counts.connections {
                    let labels = self.labels(shard, &[("slot", slot.clone())]);
                    let value = (series.value)(connections);
                    let sample = metric.encode_family(&labels)?;
                    match series.kind {
                        MetricType::Counter => ConstCounter::new(value).encode(sample)?,
                        _ => ConstGauge::new(value).encode(sample)?,
                    }
                }
            }
        }
        let mut metric = encoder.encode_descriptor(
            "backend",
            "A slot of the serving set, which new connections go to (value 1)",
            None,
            MetricType::Gauge,
        )?;
        for (shard, counts) in fronts.iter() {
            for backend in &counts.backends {
                let labels = self.labels(
                    shard,
                    &[("slot", backend.slot.clone()), ("address", backend.address.to_string())],
                );
                ConstGauge::new(1u64).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The text exposition of a front's own `status`.
pub fn render(status: &FrontStatus) -> String {
    let own = FrontsSeen::default();
    own.seen("", &status.connections, &status.backends);
    let mut registry = Registry::with_prefix("kcpshard_front");
    registry.register_collector(Box::new(own));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn front_md_lists_every_series_the_front_exposes_and_no_other() {
        let status = FrontStatus {
            pid: 1,
            listen: "127.0.0.1:6443".parse().unwrap(),
            backends: vec![Backend {
                slot: "a".into(),
                address: "127.0.0.1:7002".parse().unwrap(),
            }],
            connections: BTreeMap::from([("a".to_string(), SlotConnections::default())]),
        };
        let exposed = crate::apiserver::metrics::series_of(&render(&status));
        let documented =
            crate::apiserver::metrics::series_in_doc("docs/front.md", |l| l.starts_with("- `kcpshard_front_"));
        assert_eq!(
            exposed, documented,
            "the front's /metrics against docs/front.md, Metrics"
        );
        assert_eq!(exposed.len(), 7, "{exposed:?}");
    }

    #[test]
    fn counts_per_slot_and_the_backend_are_exposed() {
        let status = FrontStatus {
            pid: 1,
            listen: "127.0.0.1:6443".parse().unwrap(),
            backends: vec![
                Backend {
                    slot: "green".into(),
                    address: "127.0.0.1:7002".parse().unwrap(),
                },
                Backend {
                    slot: "red".into(),
                    address: "127.0.0.1:7003".parse().unwrap(),
                },
            ],
            connections: BTreeMap::from([
                (
                    "blue".to_string(),
                    SlotConnections {
                        open: 1,
                        total: 7,
                        failed: 2,
                        replayed: 5,
                        retired_pending: 1,
                        ..SlotConnections::default()
                    },
                ),
                (
                    "green".to_string(),
                    SlotConnections {
                        open: 3,
                        total: 4,
                        ..SlotConnections::default()
                    },
                ),
            ]),
        };
        let text = render(&status);
        for line in [
            "kcpshard_front_connections_open{slot=\"blue\"} 1",
            "kcpshard_front_connections_open{slot=\"green\"} 3",
            "kcpshard_front_connections_total{slot=\"blue\"} 7",
            "kcpshard_front_connections_failed_total{slot=\"blue\"} 2",
            "kcpshard_front_connections_replayed_total{slot=\"blue\"} 5",
            "kcpshard_front_connections_retired_pending{slot=\"blue\"} 1",
            "kcpshard_front_connections_retired_unjudged{slot=\"blue\"} 0",
            "kcpshard_front_backend{slot=\"green\",address=\"127.0.0.1:7002\"} 1",
            "kcpshard_front_backend{slot=\"red\",address=\"127.0.0.1:7003\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }
}
