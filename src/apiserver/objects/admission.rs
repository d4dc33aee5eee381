//! The checks of a KcpShard against the other KcpShards, between the read of the others and the
//! write (an admission step of the real server's kind).
use super::*;

/// The checks of a KcpShard against the others (an admission step of the real server's kind): two
/// shards cannot share a front address, since the second front could never listen. Holds
/// [`Objects::admission`] from the read of the others to the write.
pub(super) struct Admission<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    others: Vec<Value>,
}

impl<'a> Admission<'a> {
    pub(super) fn new(objects: &'a Objects, resource: &Resource) -> Option<Admission<'a>> {
        if resource.storage != crate::apiserver::resources::KCPSHARDS {
            return None;
        }
        let guard = objects.admission.lock().unwrap_or_else(|p| p.into_inner());
        let (others, _) = objects.store.list(resource.storage, None);
        Some(Admission { _guard: guard, others })
    }

    pub(super) fn check(&self, resource: &Resource, next: &Value) -> ApiResult<()> {
        let name = next["metadata"]["name"].as_str().unwrap_or_default();
        let Some(listen) = front_listen(next) else {
            return Ok(());
        };
        let taken = self.others.iter().find(|other| {
            other["metadata"]["name"].as_str() != Some(name)
                && front_listen(other).is_some_and(|theirs| {
                    theirs.port() == listen.port()
                        && (theirs.ip() == listen.ip() || theirs.ip().is_unspecified() || listen.ip().is_unspecified())
                })
        });
        match taken {
            None => Ok(()),
            Some(other) => Err(invalid(
                resource,
                name,
                vec![FieldCause::invalid(
                    "spec.front.listen",
                    format!(
                        "Invalid value: {:?}: KcpShard {} already uses {} for its front; pick another address",
                        listen.to_string(),
                        other["metadata"]["name"].as_str().unwrap_or_default(),
                        other["spec"]["front"]["listen"].as_str().unwrap_or_default()
                    ),
                )],
            )),
        }
    }
}

pub(super) fn front_listen(shard: &Value) -> Option<std::net::SocketAddr> {
    shard["spec"]["front"]["listen"].as_str()?.parse().ok()
}
