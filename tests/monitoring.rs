//! The shipped monitoring (manifests/prometheus/): promtool (`bin/promtool`, Debian's prometheus,
//! installed by hack/install-deps.sh) checks the alert rules and runs their unit tests
//! (alerts_test.yaml: each alert on series shaped as serve's /metrics writes them). Which series
//! the rules may read is checked against the code in src/controller/metrics.rs. The Grafana
//! dashboard (manifests/grafana/kcpshard.json): each panel's query is PromQL promtool parses.
mod support;

use std::process::Command;

#[test]
fn the_alert_rules_are_valid_and_fire_as_their_tests_say() {
    let promtool = support::require("promtool");
    let dir = support::repo_root().join("manifests/prometheus");
    for args in [["check", "rules", "alerts.yaml"], ["test", "rules", "alerts_test.yaml"]] {
        let out = Command::new(&promtool).args(args).current_dir(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_query_of_the_dashboard_is_promql() {
    let promtool = support::require("promtool");
    let path = support::repo_root().join("manifests/grafana/kcpshard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // Each query as a recording rule, which `promtool check rules` parses; Grafana's `$shard`
    // (All: the regex `.*`) as Grafana substitutes it.
    let mut rules = Vec::new();
    for (i, panel) in dashboard["panels"].as_array().expect("panels").iter().enumerate() {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr").replace("$shard", ".*");
            rules.push(serde_json::json!({ "record": format!("panel_{i}:{}", rules.len()), "expr": expr }));
        }
    }
    let file = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    let dir = tempfile::tempdir().unwrap();
    let rules_path = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&rules_path, serde_yaml::to_string(&file).unwrap()).unwrap();
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules on the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
