//! The controller's Prometheus metrics, served with the API's at `/metrics`: the steps it takes, by
//! shard, step and result; the rolls it completes; the phases of each shard's last roll; the exits
//! of the shard's processes it was woken by; the free space under each shard's store; each shard's
//! conditions as its status last said them (what an alert on "not Ready" or "Degraded" reads); and
//! each shard's front's connection counts as the last look saw them (`kcpshard_front_*`).
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::plan::Step;
use super::state::CompletedRoll;
use crate::apiserver::metrics::ApiMetrics;
use crate::front::FrontsSeen;
use crate::store::disk::DiskSpace;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    shard: String,
    step: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepKindLabels {
    shard: String,
    step: &'static str,
}

/// The step durations' buckets, in seconds: a step is meant to return within 0.1 s
/// (docs/architecture.md, "The steps").
const STEP_SECONDS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

fn step_histogram() -> Histogram {
    Histogram::new(STEP_SECONDS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiskLabels {
    shard: String,
    /// The filesystem's mount point.
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    shard: String,
    /// The condition's type: Ready, Progressing, Degraded, StoreReady, FrontReady, ...
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    shard: String,
    phase: &'static str,
}

/// Cheap to clone: every clone counts into the same metrics.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    steps: Family<StepLabels, Counter>,
    step_seconds: Family<StepKindLabels, Histogram, fn() -> Histogram>,
    rolls: Family<ShardLabels, Counter>,
    last_roll: Family<PhaseLabels, Gauge<f64, AtomicU64>>,
    process_exits: Family<ShardLabels, Counter>,
    store_free: Family<DiskLabels, Gauge>,
    store_size: Family<DiskLabels, Gauge>,
    conditions: Family<ConditionLabels, Gauge>,
    /// The condition types told per shard, to drop those a later status no longer has.
    condition_types: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    /// Each shard's front as last seen: its own series, `kcpshard_front_*{shard, slot}`.
    pub fronts: FrontsSeen,
}

fn condition_labels(shard: &str, condition: &str) -> ConditionLabels {
    ConditionLabels {
        shard: shard.to_string(),
        condition: condition.to_string(),
    }
}

impl Default for ControllerMetrics {
    fn default() -> ControllerMetrics {
        ControllerMetrics {
            steps: Family::default(),
            step_seconds: Family::new_with_constructor(step_histogram),
            rolls: Family::default(),
            last_roll: Family::default(),
            process_exits: Family::default(),
            store_free: Family::default(),
            store_size: Family::default(),
            conditions: Family::default(),
            condition_types: Arc::default(),
            fronts: FrontsSeen::by_shard(),
        }
    }
}

impl ControllerMetrics {
    /// Adds these metrics to serve's: `kcpshard_controller_*`, and the fronts' `kcpshard_front_*`.
    pub fn register_in(&self, metrics: &ApiMetrics) {
        metrics.register("controller", |registry| self.register(registry));
        metrics.register("front", |registry| {
            registry.register_collector(Box::new(self.fronts.clone()))
        });
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "steps",
            "Steps the controller took, by shard, step (Idle and the waits included) and result: ok, or what failed (io, store, job, process, kcp, no_serving_slot, spec, front, front_address, caddy, unanswered, state, api)",
            self.steps.clone(),
        );
        registry.register(
            "step_duration_seconds",
            "How long each step took to act, by shard and step (the waits included), failed ones too",
            self.step_seconds.clone(),
        );
        registry.register(
            "rolls",
            "Rolls completed, a shard's first start included",
            self.rolls.clone(),
        );
        registry.register(
            "last_roll_seconds",
            "The shard's last completed roll, by phase: total (started to completed), kcp_start_up (the new slot started to ready), no_leader (the old slot stopped listening to a probe workspace Ready)",
            self.last_roll.clone(),
        );
        registry.register(
            "process_exits",
            "Exits of the shard's processes (slots, kines, the front, a managed PostgreSQL) that woke the controller, the ones it stopped itself included",
            self.process_exits.clone(),
        );
        registry.register(
            "store_free_bytes",
            "Free bytes on each filesystem that holds the shard's store or the state dir, by mount point (statvfs f_bavail)",
            self.store_free.clone(),
        );
        registry.register(
            "store_size_bytes",
            "Size of each filesystem that holds the shard's store or the state dir, by mount point",
            self.store_size.clone(),
        );
        registry.register(
            "condition",
            "Each condition of the shard as its status last said it, by type: 1 when True, 0 when False or Unknown",
            self.conditions.clone(),
        );
    }

    /// The shard's status was written with `conditions`: each one's gauge follows it, and a type
    /// the status no longer has goes.
    pub fn conditions_written(&self, shard: &str, conditions: &[Condition]) {
        let mut told = self.condition_types.lock().unwrap_or_else(|p| p.into_inner());
        let types = told.entry(shard.to_string()).or_default();
        for gone in types.iter().filter(|t| !conditions.iter().any(|c| &c.type_ == *t)) {
            self.conditions.remove(&condition_labels(shard, gone));
        }
        types.clear();
        for condition in conditions {
            self.conditions
                .get_or_create(&condition_labels(shard, &condition.type_))
                .set(i64::from(condition.status == "True"));
            types.insert(condition.type_.clone());
        }
    }

    /// The shard is gone: its conditions and its front are no longer told.
    pub fn shard_gone(&self, shard: &str) {
        self.fronts.shard_gone(shard);
        let mut told = self.condition_types.lock().unwrap_or_else(|p| p.into_inner());
        for gone in told.remove(shard).unwrap_or_default() {
            self.conditions.remove(&condition_labels(shard, &gone));
        }
    }

    /// The free space [`crate::store::disk::free_space`] found under the shard's store.
    pub fn store_disk_seen(&self, shard: &str, spaces: &[DiskSpace]) {
        for space in spaces {
            let labels = DiskLabels {
                shard: shard.to_string(),
                path: space.mount_point.display().to_string(),
            };
            let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            self.store_free.get_or_create(&labels).set(bytes(space.available));
            self.store_size.get_or_create(&labels).set(bytes(space.total));
        }
    }

    pub fn process_exited(&self, shard: &str) {
        self.process_exits
            .get_or_create(&ShardLabels {
                shard: shard.to_string(),
            })
            .inc();
    }

    /// A step was taken in `took`; `error` is the failure's label (see
    /// [`super::Error::metric_label`]).
    pub fn step_taken(&self, shard: &str, step: &Step, took: std::time::Duration, error: Option<&'static str>) {
        self.step_seconds
            .get_or_create(&StepKindLabels {
                shard: shard.to_string(),
                step: step.name(),
            })
            .observe(took.as_secs_f64());
        self.steps
            .get_or_create(&StepLabels {
                shard: shard.to_string(),
                step: step.name(),
                result: error.unwrap_or("ok"),
            })
            .inc();
    }

    /// A reconcile failed before or after its step (observing, writing status, the finalizer).
    pub fn step_failed_outside(&self, shard: &str, error: &'static str) {
        self.steps
            .get_or_create(&StepLabels {
                shard: shard.to_string(),
                step: "Reconcile",
                result: error,
            })
            .inc();
    }

    pub fn roll_completed(&self, shard: &str, done: &CompletedRoll) {
        self.rolls
            .get_or_create(&ShardLabels {
                shard: shard.to_string(),
            })
            .inc();
        let r = &done.roll;
        let seconds = |from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>| {
            (to - from).num_microseconds().unwrap_or_default() as f64 / 1e6
        };
        let phases = [
            ("total", Some(seconds(r.started_at, done.completed_at))),
            (
                "kcp_start_up",
                r.new_slot_started_at
                    .zip(r.new_slot_ready_at)
                    .map(|(a, b)| seconds(a, b)),
            ),
            (
                "no_leader",
                r.old_slot_stopped_listening_at
                    .zip(r.probe_succeeded_at)
                    .map(|(a, b)| seconds(a, b)),
            ),
        ];
        for (phase, value) in phases {
            let labels = PhaseLabels {
                shard: shard.to_string(),
                phase,
            };
            match value {
                Some(value) => {
                    self.last_roll.get_or_create(&labels).set(value);
                }
                // A first start has no old slot: no stale figure from an earlier roll stays.
                None => {
                    self.last_roll.remove(&labels);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::RollRecord;
    use chrono::TimeZone;

    fn exposition(metrics: &ControllerMetrics) -> String {
        let mut registry = Registry::with_prefix("kcpshard_controller");
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn the_metrics_table_of_monitoring_md_lists_every_series_serve_exposes_and_no_other() {
        use crate::apiserver::metrics::{ApiMetrics, series_in_doc, series_of};
        let api = ApiMetrics::default();
        api.observe(&http::Method::GET, 200);
        busy().register_in(&api);
        let exposed = series_of(&api.encode());
        let documented = series_in_doc("docs/how-to/monitoring.md", |l| l.starts_with("| `kcpshard_"));
        assert_eq!(
            exposed, documented,
            "serve's /metrics against docs/how-to/monitoring.md, Metrics"
        );
        assert!(exposed.contains("kcpshard_controller_steps_total"), "{exposed:?}");
    }

    /// Metrics of a shard that took steps (one failed), rolled once, saw a process exit and the
    /// free space under its store: every series has a sample.
    fn busy() -> ControllerMetrics {
        let metrics = ControllerMetrics::default();
        let ms = std::time::Duration::from_millis;
        metrics.step_taken("dev", &Step::Probe, ms(3), None);
        metrics.step_taken("dev", &Step::Probe, ms(40), None);
        metrics.step_taken("dev", &Step::EnsureStore, ms(700), Some("store"));
        metrics.process_exited("dev");
        metrics.conditions_written("dev", &[condition("Ready", "True")]);
        let slot = crate::front::Backend {
            slot: "a".into(),
            address: "127.0.0.1:7001".parse().unwrap(),
        };
        let counts = crate::front::SlotConnections {
            total: 7,
            failed: 1,
            ..Default::default()
        };
        metrics
            .fronts
            .seen("dev", &BTreeMap::from([("a".to_string(), counts)]), &[slot]);
        metrics.store_disk_seen(
            "dev",
            &[DiskSpace {
                mount_point: "/state".into(),
                paths: vec!["/state/shards/dev/store".into()],
                available: 12 << 20,
                total: 150 << 20,
            }],
        );
        let at = |ms: i64| chrono::Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap();
        let roll = RollRecord {
            from_version: Some("v1".into()),
            to_version: "v2".into(),
            started_at: at(0),
            new_slot_started_at: Some(at(100)),
            new_slot_ready_at: Some(at(8_100)),
            old_slot_stopped_listening_at: Some(at(8_700)),
            probe_succeeded_at: Some(at(11_200)),
            ..Default::default()
        };
        metrics.roll_completed(
            "dev",
            &CompletedRoll {
                roll,
                completed_at: at(11_300),
            },
        );
        metrics
    }

    #[test]
    fn steps_rolls_and_the_free_space_under_the_store_are_exposed_per_shard() {
        let metrics = busy();
        let text = exposition(&metrics);
        for line in [
            r#"kcpshard_controller_steps_total{shard="dev",step="Probe",result="ok"} 2"#,
            r#"kcpshard_controller_steps_total{shard="dev",step="EnsureStore",result="store"} 1"#,
            r#"kcpshard_controller_step_duration_seconds_bucket{le="0.005",shard="dev",step="Probe"} 1"#,
            r#"kcpshard_controller_step_duration_seconds_bucket{le="0.1",shard="dev",step="Probe"} 2"#,
            r#"kcpshard_controller_step_duration_seconds_bucket{le="0.5",shard="dev",step="EnsureStore"} 0"#,
            r#"kcpshard_controller_step_duration_seconds_bucket{le="1.0",shard="dev",step="EnsureStore"} 1"#,
            r#"kcpshard_controller_step_duration_seconds_count{shard="dev",step="EnsureStore"} 1"#,
            r#"kcpshard_controller_rolls_total{shard="dev"} 1"#,
            r#"kcpshard_controller_process_exits_total{shard="dev"} 1"#,
            r#"kcpshard_controller_store_free_bytes{shard="dev",path="/state"} 12582912"#,
            r#"kcpshard_controller_store_size_bytes{shard="dev",path="/state"} 157286400"#,
            r#"kcpshard_controller_last_roll_seconds{shard="dev",phase="total"} 11.3"#,
            r#"kcpshard_controller_last_roll_seconds{shard="dev",phase="kcp_start_up"} 8.0"#,
            r#"kcpshard_controller_last_roll_seconds{shard="dev",phase="no_leader"} 2.5"#,
        ] {
            assert!(text.contains(line), "{line} is not in:\n{text}");
        }
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "AsExpected".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }
    }

    /// The shipped alert rules (manifests/prometheus/alerts.yaml) and the dashboard's panels
    /// (manifests/grafana/kcpshard.json) name only series serve exports: a rule on a series that
    /// does not exist never fires, a panel on one stays empty, and nothing tells.
    #[test]
    fn the_shipped_alert_rules_and_dashboard_read_series_serve_exports() {
        use crate::apiserver::metrics::{ApiMetrics, series_of};
        let api = ApiMetrics::default();
        busy().register_in(&api);
        // A family of counters is exported once it has a sample: serve has answered a request.
        api.observe(&http::Method::GET, 200);
        let exposed = series_of(&api.encode());
        let read = |what: &str, expr: &str| {
            let named: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("kcpshard_"))
                .collect();
            assert!(!named.is_empty(), "{what} reads no kcpshard series: {expr}");
            for series in named {
                // A histogram's TYPE line names it without the suffixes of its samples.
                let histogram = series.strip_suffix("_bucket").unwrap_or(series);
                assert!(
                    exposed.contains(series) || exposed.contains(histogram),
                    "{what} reads {series}, which serve does not export"
                );
            }
        };
        let manifest = |path: &str| std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let rules: serde_yaml::Value = serde_yaml::from_str(&manifest("manifests/prometheus/alerts.yaml")).unwrap();
        let rules = rules["groups"][0]["rules"].as_sequence().expect("a group of rules");
        for rule in rules {
            read(rule["alert"].as_str().unwrap(), rule["expr"].as_str().unwrap());
        }
        assert!(rules.len() >= 5, "{} alerts", rules.len());
        let dashboard: serde_json::Value = serde_json::from_str(&manifest("manifests/grafana/kcpshard.json")).unwrap();
        let panels = dashboard["panels"].as_array().expect("panels");
        for panel in panels {
            let targets = panel["targets"].as_array().expect("each panel has targets");
            assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
            for target in targets {
                read(panel["title"].as_str().unwrap(), target["expr"].as_str().unwrap());
            }
        }
        assert!(panels.len() >= 10, "{} panels", panels.len());
    }

    #[test]
    fn each_condition_follows_the_last_status_written_and_goes_with_the_shard() {
        let metrics = ControllerMetrics::default();
        metrics.conditions_written(
            "dev",
            &[
                condition("Ready", "True"),
                condition("Degraded", "False"),
                condition("FrontReady", "True"),
            ],
        );
        metrics.conditions_written("other", &[condition("Ready", "False")]);
        let text = exposition(&metrics);
        for line in [
            r#"kcpshard_controller_condition{shard="dev",condition="Ready"} 1"#,
            r#"kcpshard_controller_condition{shard="dev",condition="Degraded"} 0"#,
            r#"kcpshard_controller_condition{shard="other",condition="Ready"} 0"#,
        ] {
            assert!(text.contains(line), "{line} is not in:\n{text}");
        }
        metrics.conditions_written("dev", &[condition("Ready", "False"), condition("Degraded", "True")]);
        let text = exposition(&metrics);
        assert!(
            text.contains(r#"kcpshard_controller_condition{shard="dev",condition="Degraded"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("FrontReady"),
            "a condition the status no longer has is still told:\n{text}"
        );
        metrics.shard_gone("dev");
        let text = exposition(&metrics);
        assert!(
            !text.contains(r#"shard="dev""#),
            "a deleted shard is still told:\n{text}"
        );
        assert!(text.contains(r#"shard="other""#), "{text}");
    }

    #[test]
    fn each_shards_front_is_told_by_shard_as_last_seen_and_goes_with_the_shard() {
        use crate::apiserver::metrics::ApiMetrics;
        let metrics = busy();
        let api = ApiMetrics::default();
        metrics.register_in(&api);
        let text = api.encode();
        for line in [
            r#"kcpshard_front_connections_total{shard="dev",slot="a"} 7"#,
            r#"kcpshard_front_connections_failed_total{shard="dev",slot="a"} 1"#,
            r#"kcpshard_front_connections_open{shard="dev",slot="a"} 0"#,
            r#"kcpshard_front_backend{shard="dev",slot="a",address="127.0.0.1:7001"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        // A later look replaces the counts: a front restarted counts from 0 again.
        metrics.fronts.seen("dev", &BTreeMap::new(), &[]);
        let text = api.encode();
        assert!(
            !text.contains(r#"kcpshard_front_connections_total{shard="dev""#),
            "{text}"
        );
        metrics
            .fronts
            .seen("dev", &BTreeMap::from([("b".to_string(), Default::default())]), &[]);
        metrics.shard_gone("dev");
        assert!(
            !api.encode().contains(r#"kcpshard_front_connections_total{"#),
            "a deleted shard's front is still told"
        );
    }

    #[test]
    fn a_first_start_leaves_no_leaderless_figure_behind() {
        let metrics = ControllerMetrics::default();
        let at = |s: i64| chrono::Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap();
        let mut roll = RollRecord {
            from_version: Some("v1".into()),
            started_at: at(0),
            old_slot_stopped_listening_at: Some(at(5)),
            probe_succeeded_at: Some(at(7)),
            ..Default::default()
        };
        metrics.roll_completed(
            "dev",
            &CompletedRoll {
                roll: roll.clone(),
                completed_at: at(8),
            },
        );
        assert!(exposition(&metrics).contains(r#"phase="no_leader"} 2.0"#));
        roll.from_version = None;
        roll.old_slot_stopped_listening_at = None;
        metrics.roll_completed(
            "dev",
            &CompletedRoll {
                roll,
                completed_at: at(8),
            },
        );
        let text = exposition(&metrics);
        assert!(!text.contains(r#"phase="no_leader""#), "{text}");
        assert!(
            text.contains(r#"kcpshard_controller_rolls_total{shard="dev"} 2"#),
            "{text}"
        );
    }
}
