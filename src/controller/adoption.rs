//! The steps of an adoption (plan/adoption.rs): each records what it decides in controller.json and
//! returns. What reads the old kcp is src/adopt; what moves its data is the move of
//! controller/migration.rs.
use std::path::{Path, PathBuf};

use chrono::Utc;

use super::Note;
use super::act::{Actor, Notes};
use super::error::Error;
use super::plan::{AdoptionRecord, SLOT_NAMES};
use super::state::{DataVersion, ShardDirs, SlotRecord, StoreRecord};
use crate::adopt::{Found, OldStore};
use crate::api::{EtcdStore, StoreSpec, StoreType};
use crate::front::caddy::CaddyAdmin;
use crate::fsutil;
use crate::process::Runtime;
use crate::slot::{self, access, identity, material};

/// The static tokens every slot accepts besides the shard's admin identities, taken from an
/// adopted kcp: its kcp-admin token and its `--token-auth-file` lines (in the shard's `shared/`).
pub const ADOPTED_TOKENS: &str = "adopted-token-auth-file";

/// Who the controllers Lease names while the adopted kcp runs its controllers without one.
pub const LEASE_HOLDER: &str = "kcpshard-adoption";

/// How long that Lease is valid: longer than any move of the data. The switch deletes it; after a
/// failed adoption it stays in the old store until deleted (docs/how-to/adopt.md).
const LEASE_SECONDS: u32 = 24 * 60 * 60;

/// kcp's own admin user (`kcp-admin` of `admin.kubeconfig`): a token kcp makes anew per process
/// and accepts as a member of `system:kcp:admin` (kcp `pkg/server/options/authentication.go`).
const KCP_ADMIN: &str = "kcp-admin";
const KCP_ADMIN_GROUP: &str = "system:kcp:admin";

/// AdoptKcp: inspects the kcp spec.adopt names and takes it over, or records why it cannot. A
/// kcp taken over that exited before the switch is taken over again (its new process, the
/// adoption's record otherwise kept: the Lease it holds and its caddy's upstream stay as they are).
pub async fn adopt(actor: &Actor<'_>) -> Result<Notes, Error> {
    let now = Utc::now();
    let resumed = actor
        .world
        .state
        .adoption
        .clone()
        .filter(|a| a.slot.is_some() && a.completed_at.is_none());
    let root = match &resumed {
        Some(previous) => previous.root_directory.clone(),
        None => actor.desired.adopt.clone().ok_or(Error::NoAdoption)?,
    };
    let version = actor.desired.template.version.clone();
    let mut record = match resumed.clone() {
        Some(previous) => AdoptionRecord {
            inspected_at: now,
            refused: None,
            ..previous
        },
        None => AdoptionRecord {
            root_directory: root.clone(),
            version: version.clone(),
            started_at: now,
            inspected_at: now,
            from: String::new(),
            slot: None,
            data_dir: None,
            lease_held_at: None,
            address: String::new(),
            caddy_admin_address: actor
                .shard
                .spec
                .adopt
                .as_ref()
                .and_then(|a| a.caddy_admin_address.clone()),
            proxy_moved_at: None,
            takes_address: false,
            switched_at: None,
            completed_at: None,
            refused: None,
        },
    };
    let inspected = match refused_at_once(actor, &root, resumed.is_some()) {
        Some(refused) => Err(refused),
        None => {
            let inspection = inspect(
                root.clone(),
                version.clone(),
                actor.shard.spec.kcp.extra_args.clone(),
                actor
                    .shard
                    .spec
                    .adopt
                    .as_ref()
                    .and_then(|a| a.caddy_admin_address.clone()),
            );
            let about = root.display().to_string();
            let asked = actor.ask(&about, async move { Ok(inspection.await) });
            match asked.await? {
                Some(inspected) => inspected,
                None => return Ok(vec![]),
            }
        }
    };
    match inspected {
        Ok(found) => {
            let name = SLOT_NAMES[0];
            take_over(actor, &found, name)?;
            record.from = describe(&found);
            record.address = address(&found);
            record.takes_address = takes_address(actor, &record.address);
            record.slot = Some(name.to_string());
            record.data_dir = match &found.store {
                OldStore::Embedded { directory, .. } => Some(directory.clone()),
                OldStore::Servers(_) => None,
            };
            save(actor.dirs, record.clone())?;
            let message = if resumed.is_some() {
                format!(
                    "took over {} again, which exited before the switch: it serves as slot {name}, and the move of its data goes on",
                    record.from
                )
            } else {
                format!(
                    "took over {}: its certificate, keys and tokens are the shard's, and it serves behind the front as slot {name} while its data ({} keys) moves to {}. At the switch it is stopped; {} is left as it was (starting kcp from it again is the way back)",
                    record.from,
                    found.store_size.keys,
                    actor.shard.spec.store.describe(),
                    root.display(),
                )
            };
            Ok(vec![Note::normal("AdoptionStarted", message)])
        }
        Err(refused) => {
            let refused = match resumed {
                Some(_) => format!(
                    "the adopted {} exited before the switch, and cannot be taken over again: {refused}. Start it again as it ran; nothing else serves its data until then",
                    record.from
                ),
                None => refused,
            };
            record.refused = Some(refused.clone());
            save(actor.dirs, record)?;
            Ok(vec![Note::warning("AdoptionFailed", refused)])
        }
    }
}

/// Why the kcp at `root` cannot be taken over into this shard, whatever it runs: the shard is not
/// new (and this is not an adoption that goes on).
fn refused_at_once(actor: &Actor<'_>, root: &Path, resumed: bool) -> Option<String> {
    let since = actor.world.store.since.filter(|_| !resumed)?;
    Some(format!(
        "spec.adopt takes a kcp over into a new shard, and this shard's data has been in {} since {since}: create another KcpShard for {}",
        actor.world.store.store.describe(),
        root.display()
    ))
}

/// The kcp at `root`, if it can be taken over into a shard of kcp `version` whose slots run with
/// `extra_args`, behind the caddy at `caddy` if one is named; else why not, saying what to do.
/// A request (it runs `kcp --version`, asks caddy), which the controller makes beside its
/// reconcile.
async fn inspect(
    root: PathBuf,
    version: String,
    extra_args: Vec<String>,
    caddy: Option<String>,
) -> Result<Found, String> {
    let found = crate::adopt::inspect(&root).await.map_err(|e| e.to_string())?;
    let refusals: Vec<String> = found.refusals(&version).iter().map(ToString::to_string).collect();
    if !refusals.is_empty() {
        return Err(refusals.join("; "));
    }
    let missing: Vec<String> = crate::adopt::flags::kept(&found.flags)
        .into_iter()
        .filter(|flag| !extra_args.contains(flag))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "kcp pid {} runs with {}, which every slot must run with too: add them to spec.kcp.extraArgs (kcpshard adopt --dry-run lists the flags kept)",
            found.process.pid,
            missing.join(" ")
        ));
    }
    let local = ["https://127.0.0.1:", "https://localhost:"];
    if !local.iter().any(|l| found.process.url.starts_with(l)) {
        return Err(format!(
            "kcp pid {} listens on {} only, and kcpshard's front reaches a slot on 127.0.0.1: start it with --bind-address=127.0.0.1 (or 0.0.0.0)",
            found.process.pid, found.process.url
        ));
    }
    if let Some(caddy) = caddy {
        let old = address(&found);
        let upstreams = CaddyAdmin::new(caddy.as_str())
            .dialling(&old)
            .await
            .map_err(|e| format!("spec.adopt.caddyAdminAddress: {e}"))?;
        if upstreams == 0 {
            return Err(format!(
                "the caddy at {caddy} (spec.adopt.caddyAdminAddress) has no reverse_proxy upstream that dials {old}, where kcp pid {} listens: name the caddy in front of this kcp, or leave the field unset",
                found.process.pid
            ));
        }
    }
    Ok(found)
}

/// Whether the shard's Tcp front is to listen where the old kcp does (`address`): the same port,
/// on the same address or on every one.
fn takes_address(actor: &Actor<'_>, address: &str) -> bool {
    let front = &actor.shard.spec.front;
    let (Ok(listen), Some(port)) = (
        front.listen.parse::<std::net::SocketAddr>(),
        address.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()),
    ) else {
        return false;
    };
    front.type_ == crate::api::FrontType::Tcp && listen.port() == port
}

/// Starts the front on the adopted kcp's own listening socket, at the switch (BeginSwitch), when
/// it is to take the kcp's address. Returns what happened, or None when it is not.
pub async fn take_address(actor: &Actor<'_>) -> Result<Option<Note>, Error> {
    let Some(adoption) = actor
        .world
        .state
        .adoption
        .as_ref()
        .filter(|a| a.before_switch() && a.takes_address)
    else {
        return Ok(None);
    };
    let name = adoption.slot.as_deref().ok_or(Error::NoAdoption)?;
    let process = actor
        .world
        .slot(name)
        .and_then(|s| s.process.as_ref())
        .ok_or_else(|| Error::NoSuchSlot(name.to_string()))?;
    let started = actor
        .ctx
        .front(actor.shard, actor.dirs)?
        .start_taking(process.pid)
        .await?;
    Ok(Some(Note::normal("FrontStarted", started)))
}

/// `host:port` where clients reach the old kcp.
fn address(found: &Found) -> String {
    found.process.url.trim_start_matches("https://").to_string()
}

/// The kcp, as status.adoption.from and the events name it.
fn describe(found: &Found) -> String {
    format!(
        "kcp {} (pid {}) at {} on {}",
        found.process.version, found.process.pid, found.process.url, found.store
    )
}

/// Makes the old kcp's material and tokens the shard's, and records its process as slot `name`,
/// its store as the shard's store, and its version as the data's.
fn take_over(actor: &Actor<'_>, found: &Found, name: &str) -> Result<(), Error> {
    let shared = actor.dirs.shared();
    fsutil::create_private_dir(&shared)?;
    let mut kubeconfig = Vec::new();
    for (file, path) in &found.material {
        let bytes = std::fs::read(path)?;
        fsutil::write_atomically(&shared.join(file), &bytes)?;
        if *file == material::ADMIN_KUBECONFIG {
            kubeconfig = bytes;
        }
    }
    let mut tokens = String::new();
    if let Some(token) = identity::user_token(&kubeconfig, KCP_ADMIN) {
        tokens.push_str(&format!("{token},{KCP_ADMIN},{KCP_ADMIN},\"{KCP_ADMIN_GROUP}\"\n"));
    }
    if let Some(file) = &found.token_file {
        for line in crate::adopt::token_lines(file)? {
            tokens.push_str(&line);
            tokens.push('\n');
        }
    }
    fsutil::write_atomically(&shared.join(ADOPTED_TOKENS), tokens.as_bytes())?;

    let pid = found.process.pid;
    let process = Runtime::observe(pid).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("kcp pid {pid} exited while it was taken over"),
        )
    })?;
    let port = address(found)
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no port in {}", found.process.url)))?;
    let slot_dirs = actor.dirs.slot(name);
    // The slot's root holds a copy of the material, as a slot kcpshard started does: its health
    // checks read the shard-admin token there.
    slot::material::seed_root(&shared, &slot_dirs.root())?;
    process.save(&slot_dirs.process())?;
    let now = Utc::now();
    slot_dirs.save(&SlotRecord {
        name: name.to_string(),
        template: actor.desired.template.clone(),
        port,
        created_at: now,
        served_at: None,
        left_front_at: None,
        stop: None,
        store: None,
    })?;
    actor.dirs.save_store_record(&StoreRecord {
        store: store_spec(&found.store),
        since: now,
    })?;
    actor.dirs.save_data_version(&DataVersion {
        version: found.process.version.clone(),
        since: now,
        template: Some(actor.desired.template.clone()),
    })?;
    Ok(())
}

/// The old store as the shard's store: an Etcd store at its client URLs.
fn store_spec(store: &OldStore) -> StoreSpec {
    let cluster = store.cluster();
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    StoreSpec {
        type_: StoreType::Etcd,
        kine_sqlite: None,
        kine_postgres: None,
        etcd: Some(EtcdStore {
            endpoints: cluster.endpoints.clone(),
            ca_file: path(&cluster.tls.ca_file),
            cert_file: path(&cluster.tls.cert_file),
            key_file: path(&cluster.tls.key_file),
        }),
    }
}

fn save(dirs: &ShardDirs, record: AdoptionRecord) -> Result<(), Error> {
    let mut state = dirs.load_state()?;
    state.adoption = Some(record);
    dirs.save_state(&state)?;
    Ok(())
}

fn update(dirs: &ShardDirs, change: impl FnOnce(&mut AdoptionRecord)) -> Result<AdoptionRecord, Error> {
    let mut state = dirs.load_state()?;
    let record = state
        .adoption
        .as_mut()
        .filter(|a| a.under_way())
        .ok_or(Error::NoAdoption)?;
    change(record);
    let updated = record.clone();
    dirs.save_state(&state)?;
    Ok(updated)
}

/// HoldControllersLease, through the adopted kcp.
pub async fn hold_lease(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = actor.world.state.adoption.as_ref().ok_or(Error::NoAdoption)?;
    let name = record.slot.as_deref().ok_or(Error::NoAdoption)?;
    let slot = actor
        .world
        .slot(name)
        .ok_or_else(|| Error::NoSuchSlot(name.to_string()))?;
    let url = access::slot_url(slot.record.port);
    let client = access::shard_admin_client(&slot.dirs.admin_kubeconfig(), &url).await?;
    let hold = async move { Ok(access::hold_controllers_lease(&client, LEASE_HOLDER, LEASE_SECONDS).await?) };
    let Some(created) = actor.ask(&url, hold).await? else {
        return Ok(vec![]);
    };
    update(actor.dirs, |a| a.lease_held_at = Some(Utc::now()))?;
    let message = if created {
        format!(
            "the controllers Lease (kube-system/kcp-controllers in system:admin) now names {LEASE_HOLDER}: the adopted kcp runs its controllers without leader election, and a slot on the new store follows until the switch deletes the Lease"
        )
    } else {
        "the adopted kcp leads its controllers with the Lease: a slot on the new store follows it".to_string()
    };
    Ok(vec![Note::normal("AdoptionLeaseHeld", message)])
}

/// RedirectProxy: the caddy in front of the old kcp sends to the front what it sent to the kcp.
pub async fn redirect_proxy(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = actor.world.state.adoption.as_ref().ok_or(Error::NoAdoption)?;
    let caddy = record.caddy_admin_address.as_deref().ok_or(Error::NoAdoption)?;
    let front = actor.shard.spec.front.listen.clone();
    let redirect = {
        let (caddy, from, to) = (caddy.to_string(), record.address.clone(), front.clone());
        async move { Ok(CaddyAdmin::new(caddy.as_str()).redirect(&from, &to).await?) }
    };
    let Some(moved) = actor.ask(caddy, redirect).await? else {
        return Ok(vec![]);
    };
    update(actor.dirs, |a| a.proxy_moved_at = Some(Utc::now()))?;
    Ok(vec![Note::normal(
        "AdoptionProxyMoved",
        format!(
            "the caddy at {caddy} sends to the front ({front}) what it sent to the adopted kcp at {} ({moved} upstreams, one config change); the front sends it on to the kcp until the switch",
            record.address
        ),
    )])
}

/// At the end of the move's switch (controller/migration.rs `switched`): the adopted kcp has
/// exited and the new store has its last change.
pub fn switched(state: &mut super::state::ControllerState) -> Option<Note> {
    let adoption = state.adoption.as_mut().filter(|a| a.before_switch())?;
    adoption.switched_at = Some(Utc::now());
    Some(Note::normal(
        "AdoptionSwitched",
        format!(
            "{} has exited and its data is in the shard's store: the shard's slots serve in its place. {} is as it was",
            adoption.from,
            adoption.root_directory.display()
        ),
    ))
}

/// CompleteAdoption.
pub fn complete(actor: &Actor<'_>) -> Result<Notes, Error> {
    let record = update(actor.dirs, |a| a.completed_at = Some(Utc::now()))?;
    Ok(vec![Note::normal(
        "AdoptionComplete",
        format!(
            "the shard has taken over {}: its data is in {}, its clients' certificates and tokens work on every slot. To go back, stop the shard and start the old kcp from {} as it ran (it has the data up to the switch)",
            record.from,
            actor.shard.spec.store.describe(),
            record.root_directory.display()
        ),
    )])
}
