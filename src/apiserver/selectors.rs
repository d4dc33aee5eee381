//! Label and field selectors, as `kubectl get -l` and `--field-selector` send them
//! (k8s.io/apimachinery/pkg/labels and pkg/fields). Field selectors name a dotted path in the
//! object as served (`metadata.name`, `involvedObject.uid`); a missing field reads as "".
use serde_json::Value;

use super::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector` and `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

impl Selector {
    pub fn parse(label_selector: Option<&str>, field_selector: Option<&str>) -> Result<Selector, ApiError> {
        Ok(Selector {
            labels: label_selector.map(parse_labels).transpose()?.unwrap_or_default(),
            fields: field_selector.map(parse_fields).transpose()?.unwrap_or_default(),
        })
    }

    /// Whether `object` (as served to the client) is selected.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_string);
        let field = |k: &str| Some(field_value(object, k));
        self.labels.iter().all(|r| r.matches(&label)) && self.fields.iter().all(|r| r.matches(&field))
    }

    /// Refuses field selectors on fields the resource cannot be selected by (`allowed`), as the
    /// real server does with a 400.
    pub fn check_fields(&self, allowed: &[&str]) -> Result<(), ApiError> {
        for requirement in &self.fields {
            let (Requirement::Equals(field, _) | Requirement::NotEquals(field, _)) = requirement else {
                continue;
            };
            if !allowed.contains(&field.as_str()) {
                let known: Vec<String> = allowed.iter().map(|f| format!("{f:?}")).collect();
                return Err(ApiError::BadRequest(format!(
                    "{field:?} is not a known field selector: only {}",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

impl Requirement {
    fn matches(&self, get: &impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Requirement::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k).as_deref() != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        }
    }
}

fn field_value(object: &Value, path: &str) -> String {
    let value = path.split('.').try_fold(object, |v, part| v.get(part));
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Splits on commas that are not inside `( )`.
fn split_terms(selector: &str) -> Vec<&str> {
    let (mut terms, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect()
}

fn parse_labels(selector: &str) -> Result<Vec<Requirement>, ApiError> {
    split_terms(selector)
        .into_iter()
        .map(|term| parse_label_term(term).and_then(|r| checked_label(term, r)))
        .collect()
}

/// Label keys and values must be ones a label could have (the real server answers 400 otherwise).
fn checked_label(term: &str, requirement: Requirement) -> Result<Requirement, ApiError> {
    let (key, values): (&str, Vec<&str>) = match &requirement {
        Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, vec![v.as_str()]),
        Requirement::In(k, vs) | Requirement::NotIn(k, vs) => (k, vs.iter().map(String::as_str).collect()),
        Requirement::Exists(k) | Requirement::DoesNotExist(k) => (k, Vec::new()),
    };
    let bad = |what: &str, problem: &str| {
        ApiError::BadRequest(format!("unable to parse requirement: {what} in {term:?}: {problem}"))
    };
    if let Some(problem) = super::metadata::qualified_name_problem(key) {
        return Err(bad(&format!("key {key:?}"), problem));
    }
    for value in values {
        if let Some(problem) = super::metadata::label_value_problem(value) {
            return Err(bad(&format!("value {value:?}"), problem));
        }
    }
    Ok(requirement)
}

fn parse_label_term(term: &str) -> Result<Requirement, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "unable to parse requirement: invalid label selector term {term:?}"
        ))
    };
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key.trim().to_string()));
    }
    for (op, set_op) in [(" notin ", false), (" in ", true)] {
        if let Some((key, values)) = term.split_once(op) {
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(bad)?;
            let values = values
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            let key = key.trim().to_string();
            return Ok(if set_op {
                Requirement::In(key, values)
            } else {
                Requirement::NotIn(key, values)
            });
        }
    }
    parse_equality(term).map(|r| r.unwrap_or_else(|| Requirement::Exists(term.to_string())))
}

fn parse_fields(selector: &str) -> Result<Vec<Requirement>, ApiError> {
    split_terms(selector)
        .into_iter()
        .map(|term| {
            parse_equality(term)?.ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "invalid field selector {term:?}: use key=value, key==value or key!=value"
                ))
            })
        })
        .collect()
}

fn parse_equality(term: &str) -> Result<Option<Requirement>, ApiError> {
    let pair = |(k, v): (&str, &str)| (k.trim().to_string(), v.trim().to_string());
    if let Some((k, v)) = term.split_once("!=").map(pair) {
        return Ok(Some(Requirement::NotEquals(k, v)));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')).map(pair) {
        if k.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "invalid selector {term:?}: the key is empty"
            )));
        }
        return Ok(Some(Requirement::Equals(k, v)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj() -> Value {
        json!({"metadata": {"name": "dev", "labels": {"env": "prod", "tier": "a"}}, "involvedObject": {"uid": "u1"}})
    }

    fn selects(labels: Option<&str>, fields: Option<&str>) -> bool {
        Selector::parse(labels, fields).unwrap().matches(&obj())
    }

    #[test]
    fn label_selectors_follow_kubectl_syntax() {
        assert!(selects(Some("env=prod"), None));
        assert!(selects(Some("env==prod,tier"), None));
        assert!(!selects(Some("env!=prod"), None));
        assert!(selects(Some("env in (prod, dev),!missing"), None));
        assert!(!selects(Some("env notin (prod)"), None));
        assert!(!selects(Some("missing"), None));
    }

    #[test]
    fn field_selectors_read_dotted_paths() {
        assert!(selects(None, Some("metadata.name=dev,involvedObject.uid=u1")));
        assert!(!selects(None, Some("metadata.name=other")));
        assert!(
            selects(None, Some("involvedObject.namespace=")),
            "a missing field reads as empty"
        );
        assert!(Selector::parse(None, Some("metadata.name")).is_err());
    }

    #[test]
    fn malformed_label_selectors_are_refused() {
        for bad in ["a b=c", "=x", "env=bad value", "env in (a b)", "!!x", "a/b/c=d"] {
            assert!(Selector::parse(Some(bad), None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_known_fields_are_selectable() {
        let selector = Selector::parse(None, Some("metadata.name=dev")).unwrap();
        assert!(selector.check_fields(&["metadata.name"]).is_ok());
        let selector = Selector::parse(None, Some("spec.version=v1")).unwrap();
        assert!(selector.check_fields(&["metadata.name", "metadata.namespace"]).is_err());
    }
}
