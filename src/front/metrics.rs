//! Prometheus metrics of the front, rendered from a status snapshot at scrape time: the counts in
//! `status` and on `/metrics` are the same numbers by construction.
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::front::protocol::FrontStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlotLabels {
    slot: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    slot: String,
    address: String,
}

/// The text exposition of `status`.
pub fn render(status: &FrontStatus) -> String {
    let mut registry = Registry::with_prefix("kcpshard_front");
    let open = Family::<SlotLabels, Gauge<u64, AtomicU64>>::default();
    let total = Family::<SlotLabels, Counter>::default();
    let failed = Family::<SlotLabels, Counter>::default();
    let replayed = Family::<SlotLabels, Counter>::default();
    let retired_pending = Family::<SlotLabels, Gauge<u64, AtomicU64>>::default();
    let retired_unjudged = Family::<SlotLabels, Gauge<u64, AtomicU64>>::default();
    let backend = Family::<BackendLabels, Gauge>::default();
    registry.register(
        "connections_open",
        "Client connections pinned to a slot now",
        open.clone(),
    );
    registry.register("connections", "Client connections given to a slot", total.clone());
    registry.register(
        "connections_failed",
        "Client connections closed because their slot did not accept within the retry window",
        failed.clone(),
    );
    registry.register(
        "connections_replayed",
        "Client connections a slot did not answer (it failed or stayed silent) that went on to another slot",
        replayed.clone(),
    );
    registry.register(
        "connections_retired_pending",
        "Open kept-alive connections to a slot out of the serving set that may still carry a request to it",
        retired_pending.clone(),
    );
    registry.register(
        "connections_retired_unjudged",
        "Open connections to a slot out of the serving set that the front leaves to the slot (HTTP/2, not TLS)",
        retired_unjudged.clone(),
    );
    registry.register(
        "backend",
        "A slot of the serving set, which new connections go to (value 1)",
        backend.clone(),
    );
    for (slot, counts) in &status.connections {
        let labels = SlotLabels { slot: slot.clone() };
        open.get_or_create(&labels).set(counts.open);
        total.get_or_create(&labels).inc_by(counts.total);
        failed.get_or_create(&labels).inc_by(counts.failed);
        replayed.get_or_create(&labels).inc_by(counts.replayed);
        retired_pending.get_or_create(&labels).set(counts.retired_pending);
        retired_unjudged.get_or_create(&labels).set(counts.retired_unjudged);
    }
    for b in &status.backends {
        backend
            .get_or_create(&BackendLabels {
                slot: b.slot.clone(),
                address: b.address.to_string(),
            })
            .set(1);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::front::protocol::{Backend, SlotConnections};

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
