//! Errors in words for the people who read them: a chain of causes says each cause once, and an
//! answer of a Kubernetes API is its message (as kubectl prints it), not kube's Debug struct.
use std::error::Error;

/// `err` and its causes joined by ": ", leaving out a cause whose text is already said (a
/// message that includes its source would otherwise say it twice).
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![];
    let mut next = Some(err);
    while let Some(cause) = next {
        let (text, source) = match cause.downcast_ref::<kube::Error>() {
            // Its source is the same Status again.
            Some(kube::Error::Api(status)) => (api_status(status), None),
            _ => (cause.to_string(), cause.source()),
        };
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = source;
    }
    parts.join(": ")
}

/// "namespaces \"x\" not found (NotFound, 404)".
fn api_status(status: &kube::core::Status) -> String {
    match (status.reason.as_str(), status.code) {
        ("", 0) => status.message.clone(),
        ("", code) => format!("{} ({code})", status.message),
        (reason, code) => format!("{} ({reason}, {code})", status.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `anyhow::Context` wraps an error: a message of its own, the error as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot start the lease")]
    struct Outer(#[source] kube::Error);

    fn not_found() -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            message: "namespaces \"kcpshard-system\" not found".into(),
            reason: "NotFound".into(),
            code: 404,
            ..Default::default()
        }))
    }

    #[test]
    fn an_api_error_is_its_message_once_and_no_debug_struct() {
        let text = chain(&Outer(not_found()));
        assert_eq!(
            text.matches("namespaces \"kcpshard-system\" not found").count(),
            1,
            "{text}"
        );
        assert!(!text.contains("Status {"), "{text}");
        assert!(text.ends_with("(NotFound, 404)"), "{text}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write state.json: {0}")]
    struct SaysItsSource(#[source] std::io::Error);

    #[test]
    fn a_cause_that_the_message_already_says_is_left_out() {
        let wrapped = anyhow::Error::new(SaysItsSource(std::io::Error::other("disk full"))).context("the look failed");
        assert_eq!(
            chain(wrapped.as_ref()),
            "the look failed: cannot write state.json: disk full"
        );
    }
}
