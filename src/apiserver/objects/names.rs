//! Object names as the real server checks them (DNS-1123), and the names it makes up.
use super::*;

pub(super) fn check_body_name(body: &Value, name: &str) -> ApiResult<()> {
    match body["metadata"]["name"].as_str() {
        Some(n) if !n.is_empty() && n != name => Err(ApiError::BadRequest(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// The namespace the object lives in: the URL's, which a namespace in the body must match.
pub(super) fn scope(resource: &Resource, url_namespace: Option<&str>, object: &Value) -> ApiResult<Option<String>> {
    let body_namespace = object["metadata"]["namespace"].as_str().filter(|ns| !ns.is_empty());
    if !resource.namespaced {
        return Ok(None);
    }
    match (url_namespace, body_namespace) {
        (Some(url), Some(body)) if url != body => Err(ApiError::BadRequest(format!(
            "the namespace of the provided object ({body}) does not match the namespace sent on the request ({url})"
        ))),
        (Some(ns), _) => Ok(Some(ns.to_string())),
        (None, _) => Err(ApiError::BadRequest(format!(
            "{} are namespaced: create them under /namespaces/<namespace>/",
            resource.plural
        ))),
    }
}

/// Names are DNS-1123 subdomains: they become file names, so nothing else may pass.
pub fn check_name(resource: &Resource, name: &str) -> ApiResult<()> {
    if let Some(problem) = dns1123_subdomain_problem(name) {
        return Err(invalid(
            resource,
            name,
            vec![FieldCause::invalid(
                "metadata.name",
                format!("Invalid value: {name:?}: {problem}"),
            )],
        ));
    }
    Ok(())
}

/// Namespaces are DNS-1123 labels (so `.`, `..` and `_cluster` never name one).
pub fn dns1123_label_problem(name: &str) -> Option<&'static str> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!ok).then_some(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    )
}

pub fn dns1123_subdomain_problem(name: &str) -> Option<&'static str> {
    const RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')";
    if name.is_empty() || name.len() > 253 {
        return Some("must be no more than 253 characters and not empty");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if !name.split('.').all(label_ok) {
        return Some(RULE);
    }
    None
}

pub(super) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS provides random bytes");
    bytes
}

/// Five characters for `generateName`, from the alphabet Kubernetes uses (no vowels, no look-alikes).
pub(super) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    random_bytes::<5>()
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}
