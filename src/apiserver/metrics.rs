//! Prometheus metrics of the API, served at `/metrics`: requests by verb and code, open watches.
use std::sync::atomic::AtomicI64;

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    code: u16,
}

pub struct ApiMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    pub watchers: Gauge<i64, AtomicI64>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kcpshard_api");
        let requests = Family::<RequestLabels, Counter>::default();
        let watchers = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "requests",
            "API requests by HTTP verb and response code",
            requests.clone(),
        );
        registry.register("watches", "Watches open now", watchers.clone());
        ApiMetrics {
            registry,
            requests,
            watchers,
        }
    }
}

impl ApiMetrics {
    pub fn observe(&self, method: &Method, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: method.as_str().to_string(),
                code,
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}
