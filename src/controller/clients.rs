//! Clients of the slots, kept between reconciles. Building one parses the slot's kubeconfig and
//! makes a TLS configuration, and its first request pays a handshake; the controller talks to the
//! active slot on every look (readiness every 2 s, then the Lease and the probe during a roll), so
//! reusing clients keeps the step from an old slot's exit to the Lease release short.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::slot::{SlotError, access};

/// Which identity a client carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Persistent across slots (kcp's `.admin-token-store`), from a slot's own `admin.kubeconfig`:
    /// readiness and the Lease.
    ShardAdmin,
    /// kcpshard's admin identity, a real user every slot accepts, from the shard's kubeconfig
    /// through the front (`base` context): creating workspaces.
    Admin,
}

/// A client is reused while the slot's port and kubeconfig stay the same (kcp rewrites a slot's
/// kubeconfig on every start; the shard's is rewritten when its identity is rotated).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kubeconfig: PathBuf,
    modified: Option<SystemTime>,
    port: u16,
    identity: Identity,
}

#[derive(Default)]
pub struct SlotClients {
    clients: Mutex<HashMap<Key, kube::Client>>,
}

impl SlotClients {
    pub async fn get(&self, kubeconfig: &Path, port: u16, identity: Identity) -> Result<kube::Client, SlotError> {
        let modified = std::fs::metadata(kubeconfig).and_then(|m| m.modified()).ok();
        let key = Key {
            kubeconfig: kubeconfig.to_path_buf(),
            modified,
            port,
            identity,
        };
        if let Some(client) = self.lock().get(&key) {
            return Ok(client.clone());
        }
        let url = access::slot_url(port);
        let client = match identity {
            Identity::ShardAdmin => access::shard_admin_client(kubeconfig, &url).await?,
            Identity::Admin => access::admin_client(kubeconfig, &url).await?,
        };
        let mut clients = self.lock();
        // Forget clients of slots that have since restarted or gone (a different mtime or port).
        clients.retain(|k, _| k.kubeconfig != key.kubeconfig || (k.modified == key.modified && k.port == key.port));
        clients.insert(key, client.clone());
        Ok(client)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, kube::Client>> {
        self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
