//! The reviews `kubectl auth can-i` and `kubectl auth whoami` send: SelfSubjectAccessReview,
//! SelfSubjectRulesReview (authorization.k8s.io/v1) and SelfSubjectReview
//! (authentication.k8s.io). This API has one credential, the bearer token in the kubeconfig serve
//! writes, and it may do everything: every review says so.
use serde_json::{Value, json};

/// The user the token authenticates as.
pub const USER: &str = "kcpshard-admin";

/// The answered review for a POST to `/apis/<group>/<version>/<plural>`, or None when no such
/// review is served.
pub fn answer(group: &str, version: &str, plural: &str, body: &Value) -> Option<Value> {
    let (kind, status) = match (group, version, plural) {
        ("authorization.k8s.io", "v1", "selfsubjectaccessreviews") => (
            "SelfSubjectAccessReview",
            json!({"allowed": true, "reason": "the kcpshard API token may do everything"}),
        ),
        ("authorization.k8s.io", "v1", "selfsubjectrulesreviews") => (
            "SelfSubjectRulesReview",
            json!({
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                "incomplete": false,
            }),
        ),
        ("authentication.k8s.io", "v1" | "v1beta1" | "v1alpha1", "selfsubjectreviews") => (
            "SelfSubjectReview",
            json!({"userInfo": {"username": USER, "groups": ["system:masters", "system:authenticated"]}}),
        ),
        _ => return None,
    };
    Some(json!({
        "kind": kind,
        "apiVersion": format!("{group}/{version}"),
        "metadata": {"creationTimestamp": null},
        "spec": body.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    }))
}
