//! The keys of a store through etcd's v3 KV API (which kine serves too): connecting with the
//! spec's TLS files, clearing the keys under a prefix, copying them from one store into another as
//! they were at one revision, and applying the changes a watch of one store sees to another.
//!
//! Writes are transactions of one key guarded by its mod revision, in the shapes kine takes (kine
//! `pkg/server/limited.go` `Txn`: a create is `mod == 0 -> put`, `create.go` `isCreate`; an update
//! `mod == r -> put, else get`, `update.go` `isUpdate`; a delete `mod == r -> delete, else get`,
//! `delete.go` `isDelete`), which etcd runs as they read.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompactionOptions, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KeyValue, TlsOptions, Txn, TxnOp,
};
use futures::{StreamExt, TryStreamExt};

use super::StoreError;
use super::etcd::EtcdCluster;

/// The keys kcp keeps: kube-apiserver's default `--etcd-prefix` "/registry"
/// (k8s.io/apiserver `pkg/server/options/etcd.go`, `DefaultEtcdPathPrefix`), which kcp keeps.
pub const KCP_PREFIX: &str = "/registry/";

/// The key kine keeps for health checks under kcp's prefix (kine `pkg/server/types.go`
/// `HealthKey`), which every kine makes for itself: never copied, never cleared.
const KINE_HEALTH_KEY: &[u8] = b"/registry/health";

/// Keys, each with the revision of the store that last changed it (its mod revision).
pub type KeyRevisions = BTreeMap<Vec<u8>, i64>;

/// Keys read per Range.
const PAGE: i64 = 500;
/// Writes in flight at once.
const PARALLEL_WRITES: usize = 32;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A Range of one page, or a write of one key, that takes longer has met a store that does not
/// answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of `endpoints` (etcd's client URLs, or one `unix://` socket path), with the cluster's
/// TLS files when it has them.
pub async fn connect(endpoints: &[String], cluster: Option<&EtcdCluster>) -> Result<Client, StoreError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT);
    if let Some(tls) = cluster.map(tls_options).transpose()?.flatten() {
        options = options.with_tls(tls);
    }
    let cannot = |e: String| StoreError::Invalid(format!("cannot connect to etcd at {}: {e}", endpoints.join(", ")));
    match endpoints {
        // etcd-client dials URLs only; a unix socket's channel is made here.
        [socket] if socket.starts_with("unix:") => {
            let channel = tonic::transport::Endpoint::from_shared(socket.clone())
                .map_err(|e| cannot(e.to_string()))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .connect()
                .await
                .map_err(|e| cannot(e.to_string()))?;
            Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options)).await
        }
        _ => Client::connect(endpoints, Some(options)).await,
    }
    .map_err(|e| cannot(e.to_string()))
}

/// The TLS of spec.store.etcd's files; None when it names none (plain http endpoints).
fn tls_options(cluster: &EtcdCluster) -> Result<Option<TlsOptions>, StoreError> {
    let read = |path: &Path| std::fs::read(path).map_err(StoreError::io(path));
    let tls = &cluster.tls;
    if tls.ca_file.is_none() && tls.cert_file.is_none() {
        return Ok(None);
    }
    let mut options = TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(options))
}

/// Deletes every key under `prefix`; how many went.
pub async fn clear(client: &Client, prefix: &str) -> Result<u64, StoreError> {
    let mut deleted = 0;
    loop {
        let keys_only = GetOptions::new().with_prefix().with_keys_only().with_limit(PAGE);
        let page = client
            .kv_client()
            .get(prefix, Some(keys_only))
            .await
            .map_err(|e| failed(format!("cannot list the keys under {prefix}"), e))?;
        let keys = kcp_keys(page.kvs());
        if keys.is_empty() {
            return Ok(deleted);
        }
        deleted += write_each(client, keys, |kv| {
            Txn::new()
                .when([Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision())])
                .and_then([TxnOp::delete(kv.key(), None)])
                .or_else([TxnOp::get(kv.key(), None)])
        })
        .await?;
    }
}

/// Copies every key under `prefix` from `source` into `target`, as the keys were at one revision
/// of `source` (read in pages at that revision while it takes writes), creating each in `target`
/// (where none of them may exist). Returns that revision and the keys copied, each with its mod
/// revision in `source`.
pub async fn copy(source: &Client, target: &Client, prefix: &str) -> Result<(i64, KeyRevisions), StoreError> {
    // The revision first, then every page at it: a kine's unpinned list can answer with a
    // revision its rows are older than.
    let revision = revision(source).await?;
    let mut copied = KeyRevisions::new();
    let mut pages = std::pin::pin!(pages_at(source, prefix, revision, false));
    while let Some(page) = pages.try_next().await? {
        let keys = kcp_keys(&page);
        let revisions: Vec<_> = keys.iter().map(|kv| (kv.key().to_vec(), kv.mod_revision())).collect();
        if write_each(target, keys, create).await? != revisions.len() as u64 {
            return Err(StoreError::Invalid(format!(
                "the store being written already holds some of the keys under {prefix}: clear it first"
            )));
        }
        copied.extend(revisions);
    }
    Ok((revision, copied))
}

/// Every key under `prefix` as it was at `revision` of `client`'s store, with its mod revision.
pub async fn key_revisions(client: &Client, prefix: &str, revision: i64) -> Result<KeyRevisions, StoreError> {
    pages_at(client, prefix, revision, true)
        .try_fold(KeyRevisions::new(), |mut keys, page| async move {
            keys.extend(kcp_keys(&page).iter().map(|kv| (kv.key().to_vec(), kv.mod_revision())));
            Ok(keys)
        })
        .await
}

/// The keys under `prefix` at `revision`, a page at a time (values left out if `keys_only`).
fn pages_at<'a>(
    client: &'a Client,
    prefix: &'a str,
    revision: i64,
    keys_only: bool,
) -> impl futures::Stream<Item = Result<Vec<KeyValue>, StoreError>> + 'a {
    let end = prefix_end(prefix.as_bytes());
    futures::stream::try_unfold(Some(prefix.as_bytes().to_vec()), move |from| {
        let end = end.clone();
        async move {
            let Some(from) = from else { return Ok(None) };
            let mut options = GetOptions::new()
                .with_range(end)
                .with_limit(PAGE)
                .with_revision(revision);
            if keys_only {
                options = options.with_keys_only();
            }
            let mut page = client
                .kv_client()
                .get(from, Some(options))
                .await
                .map_err(|e| failed(format!("cannot read the keys under {prefix} at revision {revision}"), e))?;
            let more = page.more();
            let kvs = page.take_kvs();
            let next = kvs.last().filter(|_| more).map(|last| {
                let mut next = last.key().to_vec();
                next.push(0);
                next
            });
            Ok(Some((kvs, next)))
        }
    })
}

/// The current revision of `client`'s store. A range that finds a key: kine answers one that
/// finds none with the revision its own poll loop last saw (`pkg/logstructured/sqllog/sql.go`
/// `List` -> `CurrentRevision`), which lags what other kines on the same database wrote; a row
/// carries the database's highest id.
pub async fn revision(client: &Client) -> Result<i64, StoreError> {
    let response = client
        .kv_client()
        .get(
            KCP_PREFIX,
            Some(GetOptions::new().with_prefix().with_keys_only().with_limit(1)),
        )
        .await
        .map_err(|e| failed(format!("cannot read the revision of the keys under {KCP_PREFIX}"), e))?;
    Ok(response.header().map_or(0, |h| h.revision()))
}

/// Raises an etcd cluster's revision above `above`: etcd hands out one revision per write and
/// has no way to skip ahead online (`etcdutl snapshot restore --bump-revision` only restores), so
/// a key outside kcp's prefix is written until the revision is there, then deleted, and the
/// history those writes left is compacted away. Returns the revision reached.
pub async fn raise_revision(client: &Client, above: i64) -> Result<i64, StoreError> {
    let mut reached = revision(client).await?;
    while reached <= above {
        let writes = (above - reached + 1).min(RAISE_ROUND);
        reached = futures::stream::iter(0..writes)
            .map(|_| async {
                let put = client.kv_client().put(RAISE_KEY, "", None).await;
                put.map(|r| r.header().map_or(0, |h| h.revision()))
                    .map_err(|e| failed(format!("cannot raise the revision above {above}"), e))
            })
            .buffer_unordered(PARALLEL_WRITES)
            .try_fold(reached, |highest, revision| async move { Ok(highest.max(revision)) })
            .await?;
        tracing::info!(reached, above, "raising the store's revision");
    }
    let deleted = client
        .kv_client()
        .delete(RAISE_KEY, None)
        .await
        .map_err(|e| failed(format!("cannot delete {RAISE_KEY}"), e))?;
    let last = deleted.header().map_or(reached, |h| h.revision());
    client
        .kv_client()
        .compact(last, Some(CompactionOptions::new().with_physical()))
        .await
        .map_err(|e| failed(format!("cannot compact the revisions up to {last}"), e))?;
    Ok(last)
}

/// The key [`raise_revision`] writes: outside kcp's prefix, so kcp never sees it.
const RAISE_KEY: &str = "/kcpshard/revision-raise";
/// Writes per round of [`raise_revision`] (each round's progress is a log line).
const RAISE_ROUND: i64 = 10_000;

/// The keys of `page` that are kcp's (not kine's own health key).
fn kcp_keys(page: &[KeyValue]) -> Vec<&KeyValue> {
    page.iter().filter(|kv| kv.key() != KINE_HEALTH_KEY).collect()
}

/// Runs `txn_of` each of `keys` in `client`, [`PARALLEL_WRITES`] at a time; how many conditions
/// held.
async fn write_each(
    client: &Client,
    keys: Vec<&KeyValue>,
    txn_of: impl Fn(&KeyValue) -> Txn,
) -> Result<u64, StoreError> {
    futures::stream::iter(keys.into_iter().map(|kv| write(client, txn_of(kv), kv.key())))
        .buffer_unordered(PARALLEL_WRITES)
        .try_fold(0, |n, done| async move { Ok(n + u64::from(done)) })
        .await
}

/// A transaction that creates `kv`'s key with its value, if the key does not exist.
fn create(kv: &KeyValue) -> Txn {
    Txn::new()
        .when([Compare::mod_revision(kv.key(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(kv.key(), kv.value(), None)])
}

/// Runs `txn` (about `key`); whether its condition held.
async fn write(client: &Client, txn: Txn, key: &[u8]) -> Result<bool, StoreError> {
    client
        .kv_client()
        .txn(txn)
        .await
        .map(|r| r.succeeded())
        .map_err(|e| failed(format!("cannot write {}", String::from_utf8_lossy(key)), e))
}

/// Applies one change a watch of another store saw to `target`: its key written with its value,
/// or deleted. kine's own health key is left alone. Whether it was a change of kcp's.
pub async fn apply(target: &Client, event: &etcd_client::Event) -> Result<bool, StoreError> {
    let Some(kv) = event.kv().filter(|kv| kv.key() != KINE_HEALTH_KEY) else {
        return Ok(false);
    };
    match event.event_type() {
        EventType::Put => upsert(target, kv.key(), kv.value()).await?,
        EventType::Delete => remove(target, kv.key()).await?,
    }
    Ok(true)
}

/// How many keys `client`'s store holds under `prefix`, and its revision then.
pub async fn count(client: &Client, prefix: &str) -> Result<(i64, i64), StoreError> {
    let response = client
        .kv_client()
        .get(prefix, Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .map_err(|e| failed(format!("cannot count the keys under {prefix}"), e))?;
    Ok((response.count(), response.header().map_or(0, |h| h.revision())))
}

/// Whether `client` holds a key under `prefix` (other than kine's health key).
pub async fn holds_keys(client: &Client, prefix: &str) -> Result<bool, StoreError> {
    let page = client
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only().with_limit(2)),
        )
        .await
        .map_err(|e| failed(format!("cannot list the keys under {prefix}"), e))?;
    Ok(!kcp_keys(page.kvs()).is_empty())
}

/// Writes `value` under `key` in `target`, whatever is there: a guarded write, retried with the
/// mod revision the target answers with (kine's update shape, `update.go` `isUpdate`; 0 creates).
async fn upsert(target: &Client, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
    let mut expected = 0;
    loop {
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)]);
        let response = target
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| failed(format!("cannot write {}", String::from_utf8_lossy(key)), e))?;
        if response.succeeded() {
            return Ok(());
        }
        expected = current_revision(&response);
    }
}

/// Deletes `key` from `target` if it is there (kine's delete shape).
async fn remove(target: &Client, key: &[u8]) -> Result<(), StoreError> {
    let mut expected = target
        .kv_client()
        .get(key, None)
        .await
        .map_err(|e| failed(format!("cannot read {}", String::from_utf8_lossy(key)), e))?
        .kvs()
        .first()
        .map(|kv| kv.mod_revision());
    while let Some(revision) = expected {
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key, None)])
            .or_else([TxnOp::get(key, None)]);
        let response = target
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| failed(format!("cannot delete {}", String::from_utf8_lossy(key)), e))?;
        if response.succeeded() {
            return Ok(());
        }
        expected = Some(current_revision(&response)).filter(|r| *r != 0);
    }
    Ok(())
}

/// The mod revision of the key a failed guarded write read back (0: none).
fn current_revision(response: &etcd_client::TxnResponse) -> i64 {
    response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => Some(get.kvs().first().map_or(0, |kv| kv.mod_revision())),
            _ => None,
        })
        .unwrap_or(0)
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

pub(super) fn failed(what: String, e: etcd_client::Error) -> StoreError {
    StoreError::Invalid(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"/registry/"), b"/registry0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0], "every key");
    }
}
