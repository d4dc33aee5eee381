//! The shipped alert rules (manifests/prometheus/alerts.yaml) against samples a real serve wrote:
//! `promtool test rules` on the sample's own series and labels.
use std::process::Command;

/// Asserts that `alert` fires on the counter sample `sample` (a line of serve's `/metrics`, such
/// as `kcpshard_controller_steps_total{shard="dev",step="EnsureFront",result="front_address"} 3`)
/// once it has risen from 0, with these labels besides the sample's and this summary.
pub fn assert_fires_on_counter(sample: &str, alert: &str, severity: &str, summary: &str) {
    let (series, value) = sample.rsplit_once(' ').expect("a sample is `series value`");
    let labels = series
        .split_once('{')
        .and_then(|(_, rest)| rest.strip_suffix('}'))
        .expect("a sample with labels");
    let mut expected: serde_json::Map<String, serde_json::Value> = labels
        .split(',')
        .map(|pair| {
            let (name, value) = pair.split_once('=').expect("label=\"value\"");
            (name.to_string(), value.trim_matches('"').into())
        })
        .collect();
    expected.insert("severity".into(), severity.into());
    let rules = super::repo_root().join("manifests/prometheus/alerts.yaml");
    let test = serde_json::json!({
        "rule_files": [rules],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{ "series": series, "values": format!("0 {value}") }],
            "alert_rule_test": [{
                "eval_time": "1m",
                "alertname": alert,
                "exp_alerts": [{ "exp_labels": expected, "exp_annotations": { "summary": summary } }],
            }],
        }],
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alert_test.yaml");
    std::fs::write(&path, serde_yaml::to_string(&test).unwrap()).unwrap();
    let out = Command::new(super::require("promtool"))
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{alert} does not fire as expected on serve's sample {sample}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
