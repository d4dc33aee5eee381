//! `limit` and `continue` on lists: a page of at most `limit` items in the store's order
//! (namespace, name), and a token that resumes after the page's last item, as client-go's pager
//! and the Python client use them. The token carries the resourceVersion of the first page, which
//! every page of the list answers with; unlike etcd, later pages are read from the current state
//! (docs/api.md).
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::error::ApiError;

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    /// How many items follow this page (`remainingItemCount`), when there is a next page.
    pub remaining: Option<usize>,
}

fn position(object: &Value) -> (String, String) {
    let field = |name: &str| object["metadata"][name].as_str().unwrap_or_default().to_string();
    (field("namespace"), field("name"))
}

/// The page of `items` (in store order, listed at `resource_version`) that `limit` and `token` ask
/// for.
pub fn page(
    items: Vec<Value>,
    resource_version: u64,
    limit: Option<&str>,
    token: Option<&str>,
) -> Result<Page, ApiError> {
    let limit = match limit {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            // 0 and negative mean "no limit" on the real server.
            Ok(_) => None,
            Err(_) => {
                return Err(ApiError::BadRequest(format!(
                    "invalid limit {text:?}: must be a number"
                )));
            }
        },
    };
    let (mut items, resource_version) = match token {
        None => (items, resource_version),
        Some(token) => {
            let (rv, after) = decode(token)?;
            let rest: Vec<Value> = items.into_iter().filter(|item| position(item) > after).collect();
            (rest, rv)
        }
    };
    let Some(limit) = limit.filter(|limit| *limit < items.len()) else {
        return Ok(Page {
            items,
            resource_version,
            continue_token: None,
            remaining: None,
        });
    };
    let remaining = items.len() - limit;
    items.truncate(limit);
    let last = position(items.last().expect("a limit is at least 1"));
    Ok(Page {
        items,
        resource_version,
        continue_token: Some(encode(resource_version, &last)),
        remaining: Some(remaining),
    })
}

fn encode(resource_version: u64, (namespace, name): &(String, String)) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": resource_version, "ns": namespace, "name": name});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode(token: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "continue key is not valid: {token:?}: pass the continue value of the previous page"
        ))
    };
    let bytes = URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let text = |name: &str| value[name].as_str().map(str::to_string).ok_or_else(bad);
    Ok((value["rv"].as_u64().ok_or_else(bad)?, (text("ns")?, text("name")?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(names: &[&str]) -> Vec<Value> {
        names.iter().map(|n| json!({"metadata": {"name": n}})).collect()
    }

    #[test]
    fn pages_follow_each_other_to_the_end_at_the_first_pages_version() {
        let all = named(&["a", "b", "c"]);
        let first = page(all.clone(), 7, Some("2"), None).unwrap();
        assert_eq!(first.items, named(&["a", "b"]));
        assert_eq!(first.remaining, Some(1));
        let token = first.continue_token.unwrap();
        let second = page(all, 9, Some("2"), Some(&token)).unwrap();
        assert_eq!(second.items, named(&["c"]));
        assert_eq!(second.resource_version, 7);
        assert_eq!(second.continue_token, None);
    }

    #[test]
    fn bad_limits_and_tokens_are_400s() {
        assert!(page(vec![], 1, Some("x"), None).is_err());
        assert!(page(vec![], 1, None, Some("not a token")).is_err());
        assert_eq!(page(named(&["a"]), 1, Some("0"), None).unwrap().items.len(), 1);
    }
}
