//! The front as the controller drives it: kcpshard's own TCP front (a process it starts, adopts
//! and stops) or a caddy the user runs (only its reverse_proxy's upstreams are changed, through
//! the admin API; docs/background.md section 9). Both answer the same questions: is it up, where
//! does it listen, which serving set new connections are spread over, and (kcpshard's front only)
//! how many connections each slot has, retired ones included.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::{Error, Note};
use crate::api::{FrontSpec, FrontType};
use crate::front::caddy::CaddyAdmin;
use crate::front::{self, Backend, FrontClient, FrontError, FrontLaunch, SlotConnections, UpgradeStart};
use crate::process::{ProcessRecord, Runtime, UnitName};

/// The front of one shard.
pub enum Front {
    Tcp {
        binary: PathBuf,
        dir: PathBuf,
        listen: SocketAddr,
        /// The shard (names the front's unit) and the runtime that starts it.
        shard: String,
        runtime: Runtime,
    },
    Caddy {
        admin: CaddyAdmin,
        upstream_id: String,
        listen: SocketAddr,
    },
}

/// What [`Front::start`] did, or the check it leaves to the step.
pub enum FrontStart {
    /// What happened, for an event.
    Started(String),
    /// A caddy's admin API at `admin` is to be asked whether it has the handler: what it answered, for an event.
    Check {
        admin: String,
        check: std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, Error>> + Send>>,
    },
}

/// The front as observed.
pub struct FrontSeen {
    /// Where it listens (kcpshard's front says; a caddy's is the spec's).
    pub listen: SocketAddr,
    /// The serving set, where new connections go. A caddy names no slot: each slot is `""` until
    /// matched by port.
    pub backends: Vec<Backend>,
    /// Per slot name: open, total and failed connections, and of a retired slot's open ones those
    /// that may still carry a request to it (`retired_pending`: wait for 0 before stopping the
    /// slot) and those the front leaves to the slot (`retired_unjudged`). Empty for a caddy.
    pub connections: BTreeMap<String, SlotConnections>,
    /// kcpshard's front runs another binary than this `serve`'s: it hands its listening socket
    /// over to a successor of this binary (docs/front.md, Upgrades).
    pub outdated: bool,
    /// kcpshard's front process (a caddy is not kcpshard's to run).
    pub pid: Option<u32>,
    /// The successor of an upgrade that has not taken over yet, while it may still (its pid).
    pub upgrading: Option<u32>,
}

impl Front {
    pub fn from_spec(
        spec: &FrontSpec,
        binary: PathBuf,
        dir: PathBuf,
        shard: &str,
        runtime: &Runtime,
    ) -> Result<Front, Error> {
        let listen: SocketAddr = spec.listen.parse().map_err(|cause| Error::FrontListen {
            value: spec.listen.clone(),
            cause,
        })?;
        Ok(match spec.type_ {
            FrontType::Tcp => Front::Tcp {
                binary,
                dir,
                listen,
                shard: shard.to_string(),
                runtime: runtime.clone(),
            },
            FrontType::Caddy => {
                let caddy = spec.caddy.as_ref().ok_or(Error::CaddyUnset)?;
                Front::Caddy {
                    admin: CaddyAdmin::new(&caddy.admin_address),
                    upstream_id: caddy.upstream_id.clone(),
                    listen,
                }
            }
        })
    }

    pub fn listen(&self) -> SocketAddr {
        match self {
            Front::Tcp { listen, .. } | Front::Caddy { listen, .. } => *listen,
        }
    }

    /// What starts kcpshard's front, and its address; None for a caddy.
    fn launch(&self) -> Option<(FrontLaunch<'_>, SocketAddr)> {
        match self {
            Front::Tcp {
                binary,
                dir,
                listen,
                shard,
                runtime,
            } => Some((
                FrontLaunch {
                    runtime,
                    shard,
                    binary,
                    dir,
                },
                *listen,
            )),
            Front::Caddy { .. } => None,
        }
    }

    /// Err with why, when it does not run (or caddy's admin API does not answer).
    pub async fn observe(&self) -> Result<FrontSeen, String> {
        match self {
            Front::Tcp {
                dir, binary, runtime, ..
            } => {
                let down = |e: crate::front::FrontError| format!("the front is not running ({e})");
                let status = FrontClient::connect(dir)
                    .await
                    .map_err(down)?
                    .status()
                    .await
                    .map_err(down)?;
                Ok(FrontSeen {
                    listen: status.listen,
                    backends: status.backends,
                    connections: status.connections,
                    outdated: front::runs_other_binary(binary, dir, status.pid),
                    upgrading: front::upgrading(runtime, dir, status.pid),
                    pid: Some(status.pid),
                })
            }
            Front::Caddy {
                admin,
                upstream_id,
                listen,
            } => {
                let upstreams = admin.upstreams(upstream_id).await.map_err(|e| e.to_string())?;
                Ok(FrontSeen {
                    outdated: false,
                    upgrading: None,
                    pid: None,
                    listen: *listen,
                    backends: upstreams
                        .iter()
                        .filter_map(|dial| dial.parse().ok())
                        .map(|address| Backend {
                            slot: String::new(),
                            address,
                        })
                        .collect(),
                    connections: BTreeMap::new(),
                })
            }
        }
    }

    /// Starts kcpshard's front on the spec's address (once it is free: a front that holds it is named) and
    /// returns: looks see it starting ([`Front::starting`]) until it answers. Under systemd, a
    /// unit that restarts a front that crashed a moment ago is left to do so, on the socket it
    /// keeps (looks see it starting: [`Front::restarted_by_unit`]). For a caddy, the check that
    /// its admin API answers and has the handler, a request for the step to make beside the
    /// reconcile (controller/requests.rs): caddy is not kcpshard's to start.
    pub async fn start(&self) -> Result<FrontStart, Error> {
        match self {
            Front::Tcp { shard, runtime, .. } => {
                let (launch, listen) = self.launch().expect("a Tcp front has a launch");
                // A front that systemd restarts holds the address in its unit's descriptor store.
                if runtime.unit_active(&UnitName::front(shard)).await {
                    return match front::ensure_running(launch, listen).await {
                        Ok(client) => Ok(FrontStart::Started(format!(
                            "the front's unit restarted it on {listen} (pid {})",
                            client.status().await?.pid
                        ))),
                        // Looks see it starting until it answers.
                        Err(restarting @ FrontError::RestartingUnderUnit { .. }) => {
                            Ok(FrontStart::Started(restarting.to_string()))
                        }
                        Err(e) => Err(e.into()),
                    };
                }
                address_free(listen)?;
                let started = front::start_front(launch, listen).await?;
                Ok(FrontStart::Started(format!(
                    "started the front on {listen} (pid {}); it serves once it answers on its control socket",
                    started.pid
                )))
            }
            Front::Caddy { admin, upstream_id, .. } => {
                let (admin, upstream_id) = (admin.clone(), upstream_id.clone());
                Ok(FrontStart::Check {
                    admin: admin.address().to_string(),
                    check: Box::pin(async move {
                        admin.upstreams(&upstream_id).await?;
                        Ok(format!(
                            "caddy's admin API at {} answers and has the reverse_proxy @id {upstream_id}",
                            admin.address()
                        ))
                    }),
                })
            }
        }
    }

    /// Starts kcpshard's front on the socket process `pid` listens on at the spec's address (an
    /// adopted kcp's, at the switch: plan/adoption.rs) and returns: looks see it starting until
    /// it answers. It starts with no slot to send to: new connections wait in it.
    pub async fn start_taking(&self, pid: u32) -> Result<String, Error> {
        let (launch, listen) = self.launch().ok_or(Error::FrontNotTcp)?;
        let started = front::start_front_taking(launch, listen, pid).await?;
        Ok(format!(
            "started the front (pid {}) on the socket kcp pid {pid} listens on at {listen}: no connection to it is refused while kcp stops",
            started.pid
        ))
    }

    /// Starts a successor of this binary that takes kcpshard's front's listening socket over
    /// (docs/front.md, Upgrades) and returns: looks see the upgrade under way until it answers.
    /// When the last successor to this binary failed, says so instead (it is not tried again).
    pub async fn upgrade(&self) -> Result<Note, Error> {
        let Some((launch, listen)) = self.launch() else {
            return Ok(Note::normal("FrontUpgrading", "caddy is not kcpshard's to upgrade"));
        };
        let binary = launch.binary;
        Ok(match front::start_upgrade(launch).await? {
            UpgradeStart::Started { serving, successor } => Note::normal(
                "FrontUpgrading",
                format!(
                    "started {} (pid {successor}) to take the front's listening socket on {listen} over from pid {serving}, which drains its connections once it has",
                    binary.display()
                ),
            ),
            UpgradeStart::LastFailed { serving, error } => Note::warning(
                "FrontUpgradeFailed",
                format!(
                    "the front on {listen} (pid {serving}) could not hand its socket over to {}: {error}; it serves on, and this binary is not tried again",
                    binary.display()
                ),
            ),
        })
    }

    /// kcpshard's front was started a moment ago and may not answer on its control socket yet:
    /// its pid.
    pub fn starting(&self) -> Option<u32> {
        match self {
            Front::Tcp { dir, .. } => front::starting(dir).map(|p| p.pid),
            Front::Caddy { .. } => None,
        }
    }

    /// Why kcpshard's last front exited at its start (it said so in its dir), while no front runs.
    pub fn start_error(&self) -> Option<String> {
        match self {
            Front::Tcp { dir, .. } => front::start_error(dir).map(|e| e.to_string()),
            Front::Caddy { .. } => None,
        }
    }

    /// Makes `to` the serving set: new connections go to one of them (kcpshard's front: the one
    /// with the fewest open connections; caddy: its load balancing, over the upstreams that pass
    /// its active `/readyz` checks). A slot left out is retired: its open connections stay.
    pub async fn serve(&self, to: &[Backend]) -> Result<(), Error> {
        match self {
            Front::Tcp { dir, .. } => FrontClient::connect(dir).await?.serve(to).await?,
            Front::Caddy { admin, upstream_id, .. } => {
                let addresses: Vec<SocketAddr> = to.iter().map(|b| b.address).collect();
                admin.serve(upstream_id, &addresses).await?;
            }
        }
        Ok(())
    }

    /// Ends the front's connections to `address` (a slot past its shutdown delay), so watches
    /// re-establish through the new slot. Caddy keeps proxied streams until the slot ends them.
    pub async fn close(&self, address: SocketAddr) {
        if let Front::Tcp { dir, .. } = self {
            match FrontClient::connect(dir).await {
                Ok(front) => {
                    if let Err(e) = front.close(address).await {
                        tracing::warn!(%address, error = %e, "cannot close the front's connections to a stopping slot");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot reach the front"),
            }
        }
    }

    /// kcpshard's front process, by its own pid record: what deleting the shard stops. None
    /// when none runs, and for a caddy, which is the user's and stays.
    pub fn process(&self) -> Option<ProcessRecord> {
        match self {
            Front::Tcp { dir, .. } => front::recorded_process(dir),
            Front::Caddy { .. } => None,
        }
    }

    /// Under systemd, kcpshard's front's unit is active while no front answers: the unit restarts a
    /// front that crashed a moment ago (on the socket it keeps).
    pub async fn restarted_by_unit(&self) -> bool {
        match self {
            Front::Tcp { shard, runtime, .. } => runtime.unit_active(&UnitName::front(shard)).await,
            Front::Caddy { .. } => false,
        }
    }

    /// kcpshard's front process, by its recorded pid, still runs (whether or not it answers).
    pub fn recorded_pid_alive(&self) -> bool {
        match self {
            Front::Tcp { dir, .. } => front::recorded_pid(dir).is_some(),
            Front::Caddy { .. } => false,
        }
    }

    /// SIGKILL for kcpshard's front by its recorded pid (it does not answer on its control socket);
    /// the pid, if one was killed.
    pub fn kill(&self) -> Option<u32> {
        let Front::Tcp { dir, .. } = self else {
            return None;
        };
        let pid = front::recorded_pid(dir)?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .ok()?;
        Some(pid)
    }

    /// Whether kcpshard runs this front's process (deleting the shard stops it).
    pub fn is_ours(&self) -> bool {
        matches!(self, Front::Tcp { .. })
    }
}

/// The front's address can be listened on (tried, then let go): a front that moves is not
/// stopped, and none is started, for an address it could not get.
pub(super) fn address_free(listen: std::net::SocketAddr) -> Result<(), Error> {
    match std::net::TcpListener::bind(listen) {
        Ok(_) => Ok(()),
        Err(cause) => Err(Error::FrontAddress {
            listen,
            holder: crate::process::procfs::listener_pid(listen.port()).map(crate::process::procfs::describe),
            cause,
        }),
    }
}
