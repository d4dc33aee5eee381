//! The metrics `kcpshard serve` exposes at `/metrics` (Prometheus text): the API's requests by verb
//! and code and its open watches (`kcpshard_api_*`), and whatever other parts of the process
//! register (the controller's, `kcpshard_controller_*`).
use std::sync::Mutex;
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
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    pub watchers: Gauge<i64, AtomicI64>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kcpshard");
        let requests = Family::<RequestLabels, Counter>::default();
        let watchers = Gauge::<i64, AtomicI64>::default();
        let api = registry.sub_registry_with_prefix("api");
        api.register(
            "requests",
            "API requests by HTTP verb and response code",
            requests.clone(),
        );
        api.register("watches", "Watches open now", watchers.clone());
        ApiMetrics {
            registry: Mutex::new(registry),
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

    /// Adds another part of the process's metrics, named `kcpshard_<prefix>_...`.
    pub fn register(&self, prefix: &str, part: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.lock().expect("metrics registry lock");
        part(registry.sub_registry_with_prefix(prefix));
    }

    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().expect("metrics registry lock");
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
        text
    }
}

/// The series of a text exposition, as a query names them (a counter's with its `_total`): what
/// the metrics references in docs/ must list (controller/metrics.rs, front/metrics.rs).
#[cfg(test)]
pub(crate) fn series_of(exposition: &str) -> std::collections::BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some(match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            })
        })
        .collect()
}

/// The `kcpshard_*` series a doc names, in backquotes, on the lines `keep` picks.
#[cfg(test)]
pub(crate) fn series_in_doc(doc: &str, keep: impl Fn(&str) -> bool) -> std::collections::BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| keep(l))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
        .filter_map(|quoted| {
            let name = quoted.split('{').next()?;
            name.starts_with("kcpshard_").then(|| name.to_string())
        })
        .collect()
}
