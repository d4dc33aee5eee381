//! Does a slot serve kcp's own APIs? `/readyz` alone does not say so.
//!
//! kcp v0.31.2 serves `tenancy.kcp.io`, `topology.kcp.io` and `shards.core.kcp.io` in `root` (and
//! every API that comes in through an APIBinding, in any workspace) from an APIBinding informer
//! that its `kcp-start-informers` post-start hook starts only after root phase 0 of its bootstrap
//! (`pkg/server/server.go:562`, lister wired at `pkg/server/config.go:706`). When the store fails
//! the APIBinding create of phase 0 (`config/helpers/binds.go:67-75`, not retried), the hook logs
//! "failed to bootstrap root workspace phase 0" and returns nil (`server.go:527-530`): `/readyz`
//! counts the hook as done and answers `ok`, while every request for those APIs gets
//! `404 page not found`, for as long as the process lives (docs/reliability.md, "A slot that
//! answers /readyz but not kcp's APIs").
//!
//! [`serves_kcp_apis`] asks, on the slot's own port as the shard admin, `/readyz` and then one
//! list of `tenancy.kcp.io` workspaces in `root`, and classifies a failure ([`NotServingKind`]):
//! `Broken` (kcp answered `/readyz` ok and 404 for its own API: it will never serve it; restart it)
//! or `Slow` (anything else: starting, the store away, no answer; wait).
use std::time::Duration;

use http::{Method, StatusCode};

use super::NotServing;
use super::access::call;

/// The request that tells a slot that serves kcp's own APIs from one that does not: cheap (one
/// item at most) and the API the workspace probe and most clients of a shard use first.
pub const KCP_API_PATH: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1";
/// On a non-root shard of a sharded kcp, which holds no `root` workspace and runs no root
/// bootstrap: a list in the shard's own `system:admin` cluster, where its controllers' Lease is.
pub const SHARD_API_PATH: &str =
    "/clusters/system:admin/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?limit=1";
const READYZ_PATH: &str = "/readyz";

/// The requests of [`serves_kcp_apis`], in the order it sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `GET /readyz`.
    Readyz,
    /// `GET` [`KCP_API_PATH`].
    KcpApi,
    /// `GET` [`SHARD_API_PATH`].
    ShardApi,
}

impl Request {
    fn path(self) -> &'static str {
        match self {
            Request::Readyz => READYZ_PATH,
            Request::KcpApi => KCP_API_PATH,
            Request::ShardApi => SHARD_API_PATH,
        }
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GET {}", self.path())
    }
}

/// What a failed [`serves_kcp_apis`] means for the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotServingKind {
    /// kcp is up (its `/readyz` is ok) and answers 404 for its own API: its start-up lost a
    /// bootstrap step and nothing in the process redoes it. Only a restart helps.
    Broken,
    /// Starting, shutting down, the store away, overloaded or not answering: wait (a start-up is
    /// bounded by readinessTimeout elsewhere).
    Slow,
}

/// What answered (or did not) a request of [`serves_kcp_apis`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// No HTTP answer: refused, reset, TLS failure or timed out.
    None(String),
    /// An HTTP status, with the line of the body that says what failed (for `/readyz`, its first
    /// failing check; else the body's first line).
    Http { status: u16, line: String },
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::None(why) => write!(f, "no answer: {why}"),
            Answer::Http { status, line } if line.is_empty() => write!(f, "HTTP {status}"),
            Answer::Http { status, line } => write!(f, "HTTP {status}: {line}"),
        }
    }
}

impl NotServing {
    /// Broken or slow: see [`NotServingKind`]. Only a 404 for kcp's own API after `/readyz` said
    /// ok is broken; [`serves_kcp_apis`] asks for the API only once `/readyz` is ok.
    pub fn kind(&self) -> NotServingKind {
        match (self.request, &self.answer) {
            (Request::KcpApi, Answer::Http { status: 404, .. }) => NotServingKind::Broken,
            _ => NotServingKind::Slow,
        }
    }
}

/// Ok when the slot `client` dials answers `/readyz` with `ok` and lists `tenancy.kcp.io`
/// workspaces in `root` (HTTP 200); else what failed, first failure first. Each request waits at
/// most `timeout`. Two requests when the slot is ready, one while it is not.
///
/// `client` must dial the slot's own port as the shard admin (`access::shard_admin_client`): a
/// user without the right to list workspaces in `root` gets 403, which reads as slow.
pub async fn serves_kcp_apis(client: &kube::Client, api: Request, timeout: Duration) -> Result<(), NotServing> {
    let (status, body) = send(client, Request::Readyz, timeout).await?;
    if status != StatusCode::OK || String::from_utf8_lossy(&body).trim() != "ok" {
        return Err(not_serving(Request::Readyz, status, &body));
    }
    let (status, body) = send(client, api, timeout).await?;
    if status != StatusCode::OK {
        return Err(not_serving(api, status, &body));
    }
    Ok(())
}

async fn send(client: &kube::Client, request: Request, timeout: Duration) -> Result<(StatusCode, Vec<u8>), NotServing> {
    let no_answer = |why: String| NotServing {
        request,
        answer: Answer::None(why),
    };
    match tokio::time::timeout(timeout, call(client, Method::GET, request.path(), None)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(no_answer(e.to_string())),
        Err(_) => Err(no_answer(format!("none within {timeout:?}"))),
    }
}

fn not_serving(request: Request, status: StatusCode, body: &[u8]) -> NotServing {
    NotServing {
        request,
        answer: Answer::Http {
            status: status.as_u16(),
            line: telling_line(&String::from_utf8_lossy(body)),
        },
    }
}

/// The line of a body that says what failed: `/readyz` lists every check (`[+]ping ok`) before
/// its failing ones (`[-]poststarthook/... failed: reason withheld`), so the first `[-]` line;
/// else the first non-empty line. At most 200 characters.
fn telling_line(body: &str) -> String {
    let mut lines = body.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = lines
        .clone()
        .find(|l| l.starts_with("[-]"))
        .or_else(|| lines.next())
        .unwrap_or_default();
    line.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(request: Request, status: u16, body: &str) -> NotServing {
        not_serving(request, StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn a_404_for_kcps_own_api_after_readyz_ok_is_broken() {
        let e = http(Request::KcpApi, 404, "404 page not found\n");
        assert_eq!(e.kind(), NotServingKind::Broken);
        assert_eq!(
            e.to_string(),
            "GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1: HTTP 404: 404 page not found"
        );
    }

    #[test]
    fn a_slot_that_is_starting_or_whose_store_is_away_is_slow() {
        for (request, status, body) in [
            // While kcp starts, or the store is away: /readyz fails.
            (
                Request::Readyz,
                500,
                "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n",
            ),
            (Request::Readyz, 503, ""),
            // The API answers, but the store behind it does not.
            (
                Request::KcpApi,
                500,
                r#"{"kind":"Status","message":"etcdserver: request timed out"}"#,
            ),
            (Request::KcpApi, 503, ""),
            (Request::KcpApi, 429, "Too many requests, please try again later.\n"),
            (Request::KcpApi, 504, ""),
            // Not the shard admin: a configuration to fix, which a restart does not.
            (Request::KcpApi, 403, "forbidden"),
            (Request::KcpApi, 401, "Unauthorized"),
        ] {
            assert_eq!(
                http(request, status, body).kind(),
                NotServingKind::Slow,
                "{request} {status}"
            );
        }
        let none = NotServing {
            request: Request::KcpApi,
            answer: Answer::None("none within 2s".into()),
        };
        assert_eq!(none.kind(), NotServingKind::Slow);
        assert_eq!(
            none.to_string(),
            "GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1: no answer: none within 2s"
        );
    }

    #[test]
    fn a_404_for_readyz_is_not_a_broken_kcp() {
        // Something else on the port (no kcp's /readyz): not a kcp start-up that lost a step.
        assert_eq!(
            http(Request::Readyz, 404, "404 page not found").kind(),
            NotServingKind::Slow
        );
    }

    #[test]
    fn a_failing_readyz_names_its_first_failing_check() {
        let body = "[+]ping ok\n[+]etcd ok\n[-]poststarthook/kcp-start-informers failed: reason withheld\n\
                    [-]poststarthook/kcp-start-controllers failed: reason withheld\nreadyz check failed\n";
        assert_eq!(
            http(Request::Readyz, 500, body).to_string(),
            "GET /readyz: HTTP 500: [-]poststarthook/kcp-start-informers failed: reason withheld"
        );
        assert_eq!(http(Request::Readyz, 503, "").to_string(), "GET /readyz: HTTP 503");
        assert_eq!(telling_line(&"x".repeat(500)).len(), 200);
    }
}
