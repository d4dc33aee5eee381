//! The kcp command line of a slot (docs/background.md sections 1-4).
//!
//! Every slot of a shard runs with:
//! - `--etcd-servers=<the shard's store>`: never kcp's embedded etcd, which one process owns.
//! - `--enable-leader-election`: kcp's default is off, and two slots without it double-run every
//!   controller (docs/background.md section 3: 120-150 write conflicts per second during the overlap).
//! - `--shard-base-url` and `--shard-external-url` = the front: every start rewrites the Shard
//!   object and every workspace URL with these (docs/background.md section 4); a slot's own port would leak to
//!   clients and be cut by the next roll.
//! - its own `--root-directory`, `--secure-port` on `--bind-address=127.0.0.1`, and
//!   `--shutdown-delay-duration` so that in-flight requests finish after the front has moved on.
//! - `--permit-port-sharing`: the controller holds the port until kcp has bound it beside its own
//!   socket (`crate::process::PortReservation`).
//! - `--token-auth-file` = the slot's own token file: the shard's admin identities this slot
//!   accepts (`super::identity`), written before it starts. kcp takes one such file, so a user's
//!   own static tokens cannot be added beside it; client certificates (`--client-ca-file`), OIDC
//!   (`--oidc-*`) and `--authentication-config` are free for the user's identities.
//!
//! Extra arguments from the slot template may add flags but never replace one of these: a
//! template that tries is refused with the flag named. They may set again what kcpshard only
//! defaults: how long kcp's checks of its store may take ([`STORE_CHECK_TIMEOUT`]).
//!
//! Flag names verified against `kcp start options` of v0.31.0, v0.31.2, v0.32.2 and v0.32.3 (and
//! `pkg/server/options/{options,controllers,flags}.go` of v0.32.3). `--batteries-included` may be
//! given but must keep the `admin` battery, which writes the `admin.kubeconfig` the controller uses.
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::validation::OWNED_KCP_FLAGS;

/// `--etcd-healthcheck-timeout` and `--etcd-readycheck-timeout` (kcp's default: 2 s each). kcp's
/// `/readyz` (and `/livez`) include a read of its store, the `etcd` and `etcd-readiness` checks
/// (k8s.io/apiserver `pkg/server/options/etcd.go:359-369`); a read that takes longer than this
/// fails them, and that failure is the answer of every check until the next read, let through
/// only every half of this (`pkg/storage/storagebackend/factory/etcd3.go:198-220`; both in the
/// kcp-dev/kubernetes fork kcp v0.31 builds with). A kcp catching up on 1,000 workspaces after it
/// took the Lease read its store in more than 2 s while it served everything else, and its
/// `/readyz` answered clients 500 `[-]etcd failed` (docs/benchmarks.md, "A shard shaped like
/// production"). A store that does not answer within this still fails them.
pub const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(8);

/// Everything that makes one slot's kcp command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLaunch {
    /// The slot's name (`a`, `b`); for logs.
    pub name: String,
    /// The kcp version this slot runs, e.g. `v0.31.2`.
    pub version: String,
    /// The kcp binary for `version`.
    pub binary: PathBuf,
    /// The slot's own root directory (absolute), seeded with the shared material before start.
    pub root_dir: PathBuf,
    /// Where the slot listens: loopback, where only the front and the controller reach it.
    pub bind_address: IpAddr,
    /// The slot's own secure port (not the front's).
    pub port: u16,
    /// `--etcd-servers`: the shard's store, e.g. `http://127.0.0.1:2379`.
    pub etcd_servers: String,
    /// `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile` for an Etcd store with TLS.
    pub etcd_tls: crate::store::EtcdTls,
    /// The front's URL, e.g. `https://127.0.0.1:6443`.
    pub front_url: String,
    /// `--shutdown-delay-duration`: after SIGTERM, /readyz fails but requests are still served
    /// for this long.
    pub shutdown_delay: Duration,
    /// `--token-auth-file`: the admin identities this slot accepts (absolute, 0600).
    pub token_auth_file: PathBuf,
    /// More flags from the slot template, appended after the safety flags.
    pub extra_args: Vec<String>,
    /// A shard of a sharded kcp: the flags that join it to its root and the front-proxy.
    pub sharded: Option<ShardedLaunch>,
}

/// The flags of a slot of a sharded kcp (docs/architecture.md, "A sharded kcp"; the files are
/// `super::sharded`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedLaunch {
    /// `--shard-name`: `root`, or the shard's name.
    pub shard_name: String,
    /// `--shard-external-url`: the front-proxy, which workspace URLs name.
    pub external_url: String,
    /// `--logical-cluster-admin-kubeconfig`: how kcp reaches another shard directly.
    pub shards_kubeconfig: PathBuf,
    /// `--external-logical-cluster-admin-kubeconfig`: how kcp reaches a workspace through the
    /// front-proxy.
    pub external_kubeconfig: PathBuf,
    /// `--requestheader-client-ca-file`: the CA of the front-proxy's client certificate.
    pub requestheader_ca: PathBuf,
    /// A non-root shard: `--root-shard-kubeconfig-file` (the root through its front) and
    /// `--cache-kubeconfig`.
    pub root: Option<RootLinks>,
}

/// How a non-root shard reaches its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootLinks {
    pub root_kubeconfig: PathBuf,
    pub cache_kubeconfig: PathBuf,
}

/// Flags that kcpshard sets for a slot of a sharded kcp and that extra arguments may not set again.
pub const SHARDED_FLAGS: [&str; 10] = [
    "shard-name",
    "root-shard-kubeconfig-file",
    "cache-kubeconfig",
    "logical-cluster-admin-kubeconfig",
    "external-logical-cluster-admin-kubeconfig",
    "requestheader-client-ca-file",
    "requestheader-username-headers",
    "requestheader-group-headers",
    "requestheader-extra-headers-prefix",
    "requestheader-allowed-names",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "extra argument {arg:?} sets --{flag}, which kcpshard sets for every slot (it keeps slots safe to run side by side); remove it from the slot template"
    )]
    SafetyFlagOverridden { flag: String, arg: String },
    #[error(
        "extra argument {arg:?} drops the admin battery, which writes the admin.kubeconfig kcpshard needs; keep `admin` in --batteries-included"
    )]
    AdminBatteryDropped { arg: String },
    #[error("extra argument {arg:?} is not a flag (kcpshard runs `kcp start` with flags only)")]
    NotAFlag { arg: String },
    #[error("slot {slot}: {what}")]
    Invalid { slot: String, what: String },
}

/// The `--root-directory=<dir>` argument, which also identifies a slot's process by its argv
/// (see [`crate::process::Runtime::find_by_argument`]).
pub fn root_dir_arg(root_dir: &Path) -> String {
    format!("--root-directory={}", root_dir.display())
}

/// A duration as Go's `time.ParseDuration` reads it: whole seconds as `3s`, else milliseconds.
pub fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `kcp start ...` arguments (without the program) for a slot.
pub fn kcp_args(launch: &SlotLaunch) -> Result<Vec<String>, ArgsError> {
    let invalid = |what: String| ArgsError::Invalid {
        slot: launch.name.clone(),
        what,
    };
    if !launch.root_dir.is_absolute() {
        return Err(invalid(format!(
            "root directory {} is not absolute",
            launch.root_dir.display()
        )));
    }
    if launch.port == 0 {
        return Err(invalid("port 0: the controller picks and records a free port".into()));
    }
    if launch.etcd_servers.trim().is_empty() {
        return Err(invalid(
            "no store (--etcd-servers would be empty, and kcp would run its own etcd)".into(),
        ));
    }
    if !launch.front_url.starts_with("https://") {
        return Err(invalid(format!("front URL {:?} is not https://", launch.front_url)));
    }
    if !launch.token_auth_file.is_absolute() {
        return Err(invalid(format!(
            "token file {} is not absolute",
            launch.token_auth_file.display()
        )));
    }
    check_extra_args(&launch.extra_args)?;
    if launch.sharded.is_some()
        && let Some((flag, arg)) = sets_flag(&launch.extra_args, &SHARDED_FLAGS)
    {
        return Err(ArgsError::SafetyFlagOverridden { flag, arg });
    }
    let external_url = launch.sharded.as_ref().map_or(&launch.front_url, |s| &s.external_url);

    let mut args = vec![
        "start".to_string(),
        root_dir_arg(&launch.root_dir),
        format!("--bind-address={}", launch.bind_address),
        format!("--secure-port={}", launch.port),
        "--permit-port-sharing=true".to_string(),
        format!("--etcd-servers={}", launch.etcd_servers),
        "--enable-leader-election=true".to_string(),
        format!("--shard-base-url={}", launch.front_url),
        format!("--shard-external-url={external_url}"),
        format!("--shutdown-delay-duration={}", go_duration(launch.shutdown_delay)),
        format!("--token-auth-file={}", launch.token_auth_file.display()),
        format!("--etcd-healthcheck-timeout={}", go_duration(STORE_CHECK_TIMEOUT)),
        format!("--etcd-readycheck-timeout={}", go_duration(STORE_CHECK_TIMEOUT)),
    ];
    let tls = &launch.etcd_tls;
    for (flag, file) in [
        ("etcd-cafile", &tls.ca_file),
        ("etcd-certfile", &tls.cert_file),
        ("etcd-keyfile", &tls.key_file),
    ] {
        if let Some(file) = file {
            args.push(format!("--{flag}={}", file.display()));
        }
    }
    if let Some(sharded) = &launch.sharded {
        args.extend(sharded_args(sharded));
    }
    args.extend(launch.extra_args.iter().cloned());
    Ok(args)
}

/// The flags of [`ShardedLaunch`]: kcp's `pkg/server/options/options.go:171-180` and
/// `cache.go`, as kcp's `cmd/sharded-test-server/shard.go:78-110` gives them to its shards.
fn sharded_args(sharded: &ShardedLaunch) -> Vec<String> {
    use super::sharded::{EXTRA_HEADERS_PREFIX, FRONT_PROXY_USER, GROUP_HEADER, USERNAME_HEADER};
    let mut args = vec![
        format!("--shard-name={}", sharded.shard_name),
        format!(
            "--logical-cluster-admin-kubeconfig={}",
            sharded.shards_kubeconfig.display()
        ),
        format!(
            "--external-logical-cluster-admin-kubeconfig={}",
            sharded.external_kubeconfig.display()
        ),
        format!("--requestheader-client-ca-file={}", sharded.requestheader_ca.display()),
        format!("--requestheader-username-headers={USERNAME_HEADER}"),
        format!("--requestheader-group-headers={GROUP_HEADER}"),
        format!("--requestheader-extra-headers-prefix={EXTRA_HEADERS_PREFIX}"),
        format!("--requestheader-allowed-names={FRONT_PROXY_USER}"),
    ];
    if let Some(root) = &sharded.root {
        args.push(format!(
            "--root-shard-kubeconfig-file={}",
            root.root_kubeconfig.display()
        ));
        args.push(format!("--cache-kubeconfig={}", root.cache_kubeconfig.display()));
    }
    args
}

/// The first of `flags` that `extra` sets, in any spelling, and the argument that does.
fn sets_flag(extra: &[String], flags: &[&str]) -> Option<(String, String)> {
    extra.iter().find_map(|arg| {
        let body = arg.strip_prefix("--")?;
        let name = body.split_once('=').map_or(body, |(n, _)| n);
        flags.contains(&name).then(|| (name.to_string(), arg.clone()))
    })
}

/// Refuses extra arguments that set a safety flag, in any spelling pflag accepts
/// (`--flag`, `--flag=value`, `--flag value`).
pub fn check_extra_args(extra: &[String]) -> Result<(), ArgsError> {
    let mut after_flag = false;
    for (i, arg) in extra.iter().enumerate() {
        let Some(body) = arg.strip_prefix("--") else {
            // A value for the flag before it (`--audit-log-path /x`), or a stray word.
            if after_flag || arg.starts_with('-') {
                after_flag = false;
                continue;
            }
            return Err(ArgsError::NotAFlag { arg: arg.clone() });
        };
        let name = body.split_once('=').map_or(body, |(n, _)| n);
        if let Some(flag) = OWNED_KCP_FLAGS.iter().find(|f| **f == name) {
            return Err(ArgsError::SafetyFlagOverridden {
                flag: flag.to_string(),
                arg: arg.clone(),
            });
        }
        if name == "batteries-included" {
            let value = match body.split_once('=') {
                Some((_, v)) => v,
                None => extra.get(i + 1).map_or("", String::as_str),
            };
            let batteries: Vec<&str> = value.split(',').map(str::trim).collect();
            let prefixed = batteries.iter().all(|b| b.starts_with('+') || b.starts_with('-'));
            // A list of +x/-x edits the default set, which has admin; a plain list replaces it.
            let keeps_admin = if prefixed {
                !batteries.contains(&"-admin")
            } else {
                batteries.contains(&"admin")
            };
            if !keeps_admin {
                return Err(ArgsError::AdminBatteryDropped { arg: arg.clone() });
            }
        }
        after_flag = !body.contains('=');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> SlotLaunch {
        SlotLaunch {
            name: "b".into(),
            version: "v0.32.3".into(),
            binary: "/opt/bin/kcp-v0.32.3".into(),
            root_dir: "/state/shards/dev/slot-b".into(),
            bind_address: "127.0.0.1".parse().unwrap(),
            port: 16444,
            etcd_servers: "http://127.0.0.1:23790".into(),
            etcd_tls: Default::default(),
            front_url: "https://127.0.0.1:6443".into(),
            shutdown_delay: Duration::from_secs(2),
            token_auth_file: "/state/shards/dev/slots/b/admin-tokens.csv".into(),
            extra_args: vec!["--feature-gates=WorkspaceMounts=true".into()],
            sharded: None,
        }
    }

    fn sharded(root: bool) -> ShardedLaunch {
        ShardedLaunch {
            shard_name: if root { "root".into() } else { "shard-2".into() },
            external_url: "https://127.0.0.1:6443".into(),
            shards_kubeconfig: "/s/slot-b/sharded-shards.kubeconfig".into(),
            external_kubeconfig: "/s/slot-b/sharded-external.kubeconfig".into(),
            requestheader_ca: "/s/root/sharded/requestheader-ca.crt".into(),
            root: (!root).then(|| RootLinks {
                root_kubeconfig: "/s/slot-b/sharded-root.kubeconfig".into(),
                cache_kubeconfig: "/s/slot-b/sharded-root.kubeconfig".into(),
            }),
        }
    }

    #[test]
    fn a_shard_of_a_sharded_kcp_advertises_its_front_as_base_and_the_front_proxy_as_external() {
        let mut l = launch();
        l.sharded = Some(sharded(false));
        let args = kcp_args(&l).unwrap();
        for want in [
            "--shard-base-url=https://127.0.0.1:6443",
            "--shard-external-url=https://127.0.0.1:6443",
            "--shard-name=shard-2",
            "--root-shard-kubeconfig-file=/s/slot-b/sharded-root.kubeconfig",
            "--cache-kubeconfig=/s/slot-b/sharded-root.kubeconfig",
            "--logical-cluster-admin-kubeconfig=/s/slot-b/sharded-shards.kubeconfig",
            "--external-logical-cluster-admin-kubeconfig=/s/slot-b/sharded-external.kubeconfig",
            "--requestheader-client-ca-file=/s/root/sharded/requestheader-ca.crt",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-allowed-names=kcp-front-proxy",
        ] {
            assert!(has(&args, want), "{want} in {args:?}");
        }
        l.front_url = "https://127.0.0.1:7444".into();
        let args = kcp_args(&l).unwrap();
        assert!(has(&args, "--shard-base-url=https://127.0.0.1:7444"), "{args:?}");
        assert!(has(&args, "--shard-external-url=https://127.0.0.1:6443"), "{args:?}");
    }

    #[test]
    fn the_root_shard_gets_no_root_or_cache_flags_and_sharded_flags_cannot_be_overridden() {
        let mut l = launch();
        l.sharded = Some(sharded(true));
        let args = kcp_args(&l).unwrap();
        assert!(has(&args, "--shard-name=root"), "{args:?}");
        assert!(
            !args.iter().any(|a| a.starts_with("--root-shard-kubeconfig-file")),
            "{args:?}"
        );
        assert!(!args.iter().any(|a| a.starts_with("--cache-kubeconfig")), "{args:?}");
        l.extra_args = vec!["--requestheader-client-ca-file=/mine.crt".into()];
        assert!(matches!(
            kcp_args(&l),
            Err(ArgsError::SafetyFlagOverridden { flag, .. }) if flag == "requestheader-client-ca-file"
        ));
        // A lone shard leaves requestheader authentication to the user.
        l.sharded = None;
        assert!(kcp_args(&l).is_ok());
    }

    fn has(args: &[String], want: &str) -> bool {
        args.iter().any(|a| a == want)
    }

    #[test]
    fn the_first_argument_is_the_start_command() {
        assert_eq!(kcp_args(&launch()).unwrap()[0], "start");
    }

    #[test]
    fn leader_election_is_always_on() {
        let args = kcp_args(&launch()).unwrap();
        assert!(has(&args, "--enable-leader-election=true"), "{args:?}");
    }

    #[test]
    fn the_store_is_external() {
        let args = kcp_args(&launch()).unwrap();
        assert!(has(&args, "--etcd-servers=http://127.0.0.1:23790"), "{args:?}");
    }

    #[test]
    fn an_etcd_store_with_tls_gives_kcp_its_files_and_extra_args_cannot_override_them() {
        let mut l = launch();
        l.etcd_servers = "https://10.0.0.1:2379,https://10.0.0.2:2379".into();
        l.etcd_tls = crate::store::EtcdTls {
            ca_file: Some("/etc/etcd/ca.crt".into()),
            cert_file: Some("/etc/etcd/client.crt".into()),
            key_file: Some("/etc/etcd/client.key".into()),
        };
        let args = kcp_args(&l).unwrap();
        for want in [
            "--etcd-servers=https://10.0.0.1:2379,https://10.0.0.2:2379",
            "--etcd-cafile=/etc/etcd/ca.crt",
            "--etcd-certfile=/etc/etcd/client.crt",
            "--etcd-keyfile=/etc/etcd/client.key",
        ] {
            assert!(has(&args, want), "{want} in {args:?}");
        }
        l.extra_args = vec!["--etcd-keyfile=/tmp/other.key".into()];
        assert!(matches!(kcp_args(&l), Err(ArgsError::SafetyFlagOverridden { .. })));
        l.extra_args.clear();
        l.etcd_tls = Default::default();
        assert!(!kcp_args(&l).unwrap().iter().any(|a| a.starts_with("--etcd-cafile")));
    }

    #[test]
    fn both_shard_urls_are_the_front() {
        let args = kcp_args(&launch()).unwrap();
        assert!(has(&args, "--shard-base-url=https://127.0.0.1:6443"), "{args:?}");
        assert!(has(&args, "--shard-external-url=https://127.0.0.1:6443"), "{args:?}");
    }

    #[test]
    fn the_slot_has_its_own_root_port_and_loopback_address() {
        let args = kcp_args(&launch()).unwrap();
        assert!(has(&args, "--root-directory=/state/shards/dev/slot-b"), "{args:?}");
        assert!(has(&args, "--secure-port=16444"), "{args:?}");
        assert!(has(&args, "--bind-address=127.0.0.1"), "{args:?}");
    }

    #[test]
    fn every_slot_accepts_the_admin_identities_of_its_token_file_by_path_never_by_value() {
        let args = kcp_args(&launch()).unwrap();
        assert!(
            has(&args, "--token-auth-file=/state/shards/dev/slots/b/admin-tokens.csv"),
            "{args:?}"
        );
        // kcp takes one token file: extra args may not replace kcpshard's.
        let mut l = launch();
        l.extra_args = vec!["--token-auth-file=/tmp/mine.csv".into()];
        assert!(matches!(
            kcp_args(&l),
            Err(ArgsError::SafetyFlagOverridden { flag, .. }) if flag == "token-auth-file"
        ));
        // The user's own identities go beside it.
        l.extra_args = vec![
            "--client-ca-file=/etc/kcp/users-ca.crt".into(),
            "--oidc-issuer-url=https://idp.example".into(),
        ];
        let args = kcp_args(&l).unwrap();
        assert!(has(&args, "--client-ca-file=/etc/kcp/users-ca.crt"));
        assert!(args.iter().filter(|a| a.starts_with("--token-auth-file")).count() == 1);
        l.token_auth_file = "relative.csv".into();
        assert!(matches!(kcp_args(&l), Err(ArgsError::Invalid { .. })));
    }

    #[test]
    fn store_checks_get_longer_than_kcps_2s_and_extra_args_may_set_them_again() {
        let args = kcp_args(&launch()).unwrap();
        assert!(has(&args, "--etcd-healthcheck-timeout=8s"));
        assert!(has(&args, "--etcd-readycheck-timeout=8s"));
        let mut l = launch();
        l.extra_args = vec!["--etcd-readycheck-timeout=3s".into()];
        let args = kcp_args(&l).unwrap();
        // pflag keeps the last value given: the user's.
        let last = args.iter().rev().find(|a| a.starts_with("--etcd-readycheck-timeout="));
        assert_eq!(last.map(String::as_str), Some("--etcd-readycheck-timeout=3s"));
    }

    #[test]
    fn the_shutdown_delay_is_a_go_duration() {
        assert!(has(&kcp_args(&launch()).unwrap(), "--shutdown-delay-duration=2s"));
        let mut l = launch();
        l.shutdown_delay = Duration::from_millis(1500);
        assert!(has(&kcp_args(&l).unwrap(), "--shutdown-delay-duration=1500ms"));
        l.shutdown_delay = Duration::ZERO;
        assert!(has(&kcp_args(&l).unwrap(), "--shutdown-delay-duration=0s"));
    }

    #[test]
    fn extra_args_come_after_the_safety_flags() {
        let args = kcp_args(&launch()).unwrap();
        assert_eq!(args.last().unwrap(), "--feature-gates=WorkspaceMounts=true");
    }

    #[test]
    fn every_safety_flag_is_refused_in_extra_args_in_every_spelling() {
        for flag in OWNED_KCP_FLAGS {
            for extra in [
                vec![format!("--{flag}=x")],
                vec![format!("--{flag}"), "x".to_string()],
                vec![format!("--{flag}")],
            ] {
                let mut l = launch();
                l.extra_args = extra.clone();
                match kcp_args(&l) {
                    Err(ArgsError::SafetyFlagOverridden { flag: f, .. }) => assert_eq!(f, flag),
                    other => panic!("{extra:?} gave {other:?}"),
                }
            }
        }
        let mut l = launch();
        l.extra_args = vec!["--enable-leader-election=false".into()];
        let err = kcp_args(&l).unwrap_err().to_string();
        assert!(err.contains("--enable-leader-election"), "{err}");
    }

    #[test]
    fn flags_with_values_in_the_next_argument_are_allowed() {
        let mut l = launch();
        l.extra_args = vec![
            "--audit-log-path".into(),
            "/var/log/kcp-audit.log".into(),
            "--v=2".into(),
        ];
        assert!(kcp_args(&l).is_ok());
        l.extra_args = vec!["stray".into()];
        assert_eq!(kcp_args(&l), Err(ArgsError::NotAFlag { arg: "stray".into() }));
    }

    #[test]
    fn the_admin_battery_stays() {
        let mut l = launch();
        for ok in [
            "--batteries-included=admin,user",
            "--batteries-included=+user",
            "--batteries-included=-workspace-types",
        ] {
            l.extra_args = vec![ok.into()];
            assert!(kcp_args(&l).is_ok(), "{ok}");
        }
        for bad in [
            "--batteries-included=workspace-types",
            "--batteries-included=-admin",
            "--batteries-included=",
        ] {
            l.extra_args = vec![bad.into()];
            assert!(
                matches!(kcp_args(&l), Err(ArgsError::AdminBatteryDropped { .. })),
                "{bad}"
            );
        }
        l.extra_args = vec!["--batteries-included".into(), "user".into()];
        assert!(matches!(kcp_args(&l), Err(ArgsError::AdminBatteryDropped { .. })));
    }

    #[test]
    fn a_similar_but_different_flag_is_not_a_safety_flag() {
        let mut l = launch();
        l.extra_args = vec!["--shard-virtual-workspace-url=https://127.0.0.1:6443".into()];
        assert!(kcp_args(&l).is_ok());
    }

    #[test]
    fn nonsense_launches_are_refused() {
        let mut l = launch();
        l.etcd_servers = String::new();
        assert!(matches!(kcp_args(&l), Err(ArgsError::Invalid { .. })));
        let mut l = launch();
        l.port = 0;
        assert!(matches!(kcp_args(&l), Err(ArgsError::Invalid { .. })));
        let mut l = launch();
        l.front_url = "http://127.0.0.1:6443".into();
        assert!(matches!(kcp_args(&l), Err(ArgsError::Invalid { .. })));
        let mut l = launch();
        l.root_dir = "relative".into();
        assert!(matches!(kcp_args(&l), Err(ArgsError::Invalid { .. })));
    }
}
