//! The shipped monitoring (manifests/prometheus/): promtool (`bin/promtool`, Debian's prometheus,
//! installed by hack/install-deps.sh) checks the alert rules and runs their unit tests
//! (alerts_test.yaml: each alert on series shaped as serve's /metrics writes them). Which series
//! the rules may read is checked against the code in src/controller/metrics.rs.
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
