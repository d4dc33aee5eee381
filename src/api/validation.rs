//! Server-side checks on a KcpShard that its schema cannot express: the settings block matches the
//! store and front types, addresses and URLs parse, durations are sane, no flag fights the ones
//! kcpshard sets, and no password is written into the object. The API server runs [`validate`] after
//! the structural schema check (so types, enums and patterns already hold) and answers 422 with
//! these causes. Each message says what to write instead.
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kube::ResourceExt;

use super::duration::parse_duration;
use super::kcpshard::{FrontType, KcpShard, SslMode, StoreType};
use crate::apiserver::error::FieldCause;

/// kcp flags (without `--`) kcpshard sets for every slot; `spec.kcp.extraArgs` may not set them
/// again: refused at admission, and by the slot's start (slot/args.rs) for a spec stored before.
pub const OWNED_KCP_FLAGS: [&str; 22] = [
    "root-directory",
    "bind-address",
    "secure-port",
    "permit-port-sharing",
    "etcd-servers",
    "etcd-cafile",
    "etcd-certfile",
    "etcd-keyfile",
    "enable-leader-election",
    // The lease kcpshard deletes after the old slot exits (kube-system/kcp-controllers).
    "leader-election-name",
    "leader-election-namespace",
    "shard-base-url",
    "shard-external-url",
    "shutdown-delay-duration",
    // The admin kubeconfig and shard-admin token hash must stay in the root directory, where the
    // shared material is seeded and captured.
    "kubeconfig-path",
    "authentication-admin-token-path",
    // The shard's admin identity, which the kubeconfig through the front carries.
    "token-auth-file",
    // A sharded kcp's (spec.shard).
    "shard-name",
    "root-shard-kubeconfig-file",
    "cache-kubeconfig",
    "logical-cluster-admin-kubeconfig",
    "external-logical-cluster-admin-kubeconfig",
];

/// The longest readinessTimeout or drainTimeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest shutdownDelay accepted.
pub const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(300);
/// Scheduled snapshots: at least this far apart (a snapshot of a large store takes seconds)...
pub const MIN_BACKUP_INTERVAL: Duration = Duration::from_secs(10);
/// ...and at most a week (a longer schedule is a cron job's: `kcpshard snapshot create`).
pub const MAX_BACKUP_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Every problem found in `obj.spec`, as field causes with dotted paths. Empty when valid.
pub fn validate(obj: &KcpShard) -> Vec<FieldCause> {
    let mut causes = Vec::new();
    let spec = &obj.spec;
    check_kcp(obj, &mut causes);
    check_store(obj, &mut causes);
    check_front(obj, &mut causes);
    check_shard(obj, &mut causes);
    check_adopt(obj, &mut causes);

    let readiness = check_duration(
        &mut causes,
        "spec.rollout.readinessTimeout",
        &spec.rollout.readiness_timeout,
        Duration::from_secs(1),
        MAX_TIMEOUT,
    );
    let drain = check_duration(
        &mut causes,
        "spec.rollout.drainTimeout",
        &spec.rollout.drain_timeout,
        Duration::from_secs(1),
        MAX_TIMEOUT,
    );
    // Below 3s a slot would be killed before its two failed looks (a second each) take it out of
    // the front.
    check_duration(
        &mut causes,
        "spec.rollout.livenessTimeout",
        &spec.rollout.liveness_timeout,
        Duration::from_secs(3),
        MAX_TIMEOUT,
    );
    let delay = check_duration(
        &mut causes,
        "spec.kcp.shutdownDelay",
        &spec.kcp.shutdown_delay,
        Duration::ZERO,
        MAX_SHUTDOWN_DELAY,
    );
    let _ = readiness;
    if let Some(interval) = &spec.backup.interval {
        check_duration(
            &mut causes,
            "spec.backup.interval",
            interval,
            MIN_BACKUP_INTERVAL,
            MAX_BACKUP_INTERVAL,
        );
    }
    if let (Some(delay), Some(drain)) = (delay, drain)
        && delay >= drain
    {
        causes.push(invalid(
            "spec.kcp.shutdownDelay",
            &spec.kcp.shutdown_delay,
            format!(
                "must be shorter than spec.rollout.drainTimeout ({}), or the old slot is killed while it still drains: lower shutdownDelay or raise drainTimeout",
                spec.rollout.drain_timeout
            ),
        ));
    }
    causes
}

/// The problems of a change from `old` to `new` that [`validate`] cannot see in `new` alone: a
/// spec.store that puts the data somewhere else once a slot has started on the old store
/// (status.store.dataSince), where kcpshard cannot move the data ([`StoreSpec::move_refused`]). A
/// slot started on the new store would serve an empty kcp while the data stayed behind.
pub fn validate_update(old: &KcpShard, new: &KcpShard) -> Vec<FieldCause> {
    let Some(since) = old
        .status
        .as_ref()
        .and_then(|s| s.store.as_ref())
        .and_then(|s| s.data_since.as_ref())
    else {
        return Vec::new();
    };
    let Some(field) = new.spec.store.moved_at(&old.spec.store) else {
        return Vec::new();
    };
    let Some(why) = old.spec.store.move_refused(&new.spec.store) else {
        return Vec::new();
    };
    let name = new.name_any();
    vec![forbidden(
        field,
        format!(
            "the data of KcpShard {name} is in {} (since {}), and {why}: a slot started on {} would serve an empty kcp. Put spec.store back as it was. To run the shard on the new store without its data, delete the KcpShard, move its store directory (<state dir>/shards/{name}/store) aside, and create it again (docs/how-to/stores.md, \"Move a shard to another store\")",
            old.spec.store.describe(),
            since.0,
            new.spec.store.describe(),
        ),
    )]
}

fn check_kcp(obj: &KcpShard, causes: &mut Vec<FieldCause>) {
    let kcp = &obj.spec.kcp;
    let binary = kcp.binary.as_str();
    if binary.trim().is_empty() || binary.contains('\0') {
        causes.push(invalid(
            "spec.kcp.binary",
            binary,
            "write a path such as \"bin/kcp-{version}\" or \"/usr/local/bin/kcp\"",
        ));
    } else if binary.replace("{version}", "").contains(['{', '}']) {
        causes.push(invalid(
            "spec.kcp.binary",
            binary,
            "the only placeholder is \"{version}\", e.g. \"bin/kcp-{version}\"",
        ));
    } else if binary.ends_with('/') {
        causes.push(invalid(
            "spec.kcp.binary",
            binary,
            "names a directory: write the path of the kcp binary itself",
        ));
    }
    for (i, arg) in kcp.extra_args.iter().enumerate() {
        let flag = arg.split('=').next().unwrap_or(arg);
        if flag
            .strip_prefix("--")
            .is_some_and(|name| OWNED_KCP_FLAGS.contains(&name))
        {
            let hint = match flag {
                "--shutdown-delay-duration" => "set spec.kcp.shutdownDelay instead",
                "--etcd-servers" | "--etcd-cafile" | "--etcd-certfile" | "--etcd-keyfile" => "set spec.store instead",
                "--shard-base-url" | "--shard-external-url" | "--bind-address" => "set spec.front.listen instead",
                "--shard-name" | "--root-shard-kubeconfig-file" | "--cache-kubeconfig" => "set spec.shard instead",
                _ => "kcpshard sets it for each slot: remove it",
            };
            causes.push(FieldCause {
                reason: "FieldValueForbidden",
                field: format!("spec.kcp.extraArgs[{i}]"),
                message: format!("Forbidden: {flag} is set by kcpshard: {hint}"),
            });
        }
    }
}

/// spec.adopt: an absolute root directory, a caddy admin address as `host:port`, and a lone kcp
/// (kcpshard adopts a kcp that is its own root shard). Whether a kcp runs there is the
/// controller's to say (AdoptionFailed), on the host that runs the shard.
fn check_adopt(obj: &KcpShard, causes: &mut Vec<FieldCause>) {
    let Some(adopt) = &obj.spec.adopt else {
        return;
    };
    if !adopt.root_directory.starts_with('/') {
        causes.push(invalid(
            "spec.adopt.rootDirectory",
            &adopt.root_directory,
            "write the absolute path of the directory the kcp runs with (its --root-directory)",
        ));
    }
    if let Some(address) = &adopt.caddy_admin_address
        && address
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        causes.push(invalid(
            "spec.adopt.caddyAdminAddress",
            address,
            "write caddy's admin address as host:port, e.g. 127.0.0.1:2019",
        ));
    }
    if obj.spec.shard.is_some() {
        causes.push(forbidden(
            "spec.adopt",
            "kcpshard adopts a kcp of one shard: remove spec.shard, or adopt into a KcpShard without it",
        ));
    }
}

/// spec.shard: a root names no root and says where the front-proxy is; any other shard names its
/// root and may name a cache server. Whether the root exists and is one is the controller's to
/// say (a condition), since it may be applied later.
fn check_shard(obj: &KcpShard, causes: &mut Vec<FieldCause>) {
    let Some(shard) = &obj.spec.shard else {
        return;
    };
    if shard.is_root() {
        if shard.root_shard.is_some() {
            causes.push(forbidden(
                "spec.shard.rootShard",
                "the root shard has no root: remove rootShard, or give this shard another name",
            ));
        }
        if shard.cache_kubeconfig.is_some() {
            causes.push(forbidden(
                "spec.shard.cacheKubeconfig",
                "the root shard runs kcp's cache server itself: remove cacheKubeconfig",
            ));
        }
        match &shard.external_url {
            None => causes.push(required(
                "spec.shard.externalURL",
                "the root shard needs the URL of the kcp-front-proxy in front of the sharded kcp, e.g. https://127.0.0.1:6443",
            )),
            Some(url) if !url.starts_with("https://") || url.len() <= "https://".len() => causes.push(invalid(
                "spec.shard.externalURL",
                url,
                "write the front-proxy's https:// URL, e.g. https://127.0.0.1:6443",
            )),
            Some(_) => {}
        }
    } else {
        match &shard.root_shard {
            None => causes.push(required(
                "spec.shard.rootShard",
                "a shard other than the root names the KcpShard of its root shard",
            )),
            Some(root) if root == &obj.name_any() => causes.push(invalid(
                "spec.shard.rootShard",
                root,
                "names this KcpShard itself: name the KcpShard whose spec.shard.name is root",
            )),
            Some(_) => {}
        }
        if shard.external_url.is_some() {
            causes.push(forbidden(
                "spec.shard.externalURL",
                "only the root shard says where the front-proxy is; this shard takes it from its root",
            ));
        }
        if shard.cache_kubeconfig.as_deref().is_some_and(|p| p.trim().is_empty()) {
            causes.push(invalid(
                "spec.shard.cacheKubeconfig",
                "",
                "write the path of a kubeconfig, or remove the field to use the root's cache server",
            ));
        }
    }
}

fn check_store(obj: &KcpShard, causes: &mut Vec<FieldCause>) {
    let store = &obj.spec.store;
    let present = [
        (StoreType::KineSqlite, store.kine_sqlite.is_some()),
        (StoreType::KinePostgres, store.kine_postgres.is_some()),
        (StoreType::Etcd, store.etcd.is_some()),
    ];
    for (kind, is_set) in present {
        if is_set && kind != store.type_ {
            causes.push(forbidden(
                format!("spec.store.{}", kind.settings_field()),
                format!(
                    "may only be set when spec.store.type is {}: remove it, or set type: {}",
                    kind.as_str(),
                    kind.as_str()
                ),
            ));
        }
    }
    match store.type_ {
        StoreType::KineSqlite => {}
        StoreType::KinePostgres => match &store.kine_postgres {
            None => causes.push(required(
                "spec.store.kinePostgres",
                "type KinePostgres needs its settings, e.g. kinePostgres: {host: 127.0.0.1, passwordFrom: {file: /etc/kcpshard/pgpass}}",
            )),
            Some(pg) => {
                if pg.host.contains("://") || pg.host.contains(['@', '/', '?', ' ']) {
                    causes.push(invalid(
                        "spec.store.kinePostgres.host",
                        &pg.host,
                        "write a bare host name or IP address; set port, database, user and passwordFrom in their own fields (never a password in the object)",
                    ));
                }
                if pg.user.contains([':', '@', '/', ' ']) {
                    causes.push(invalid(
                        "spec.store.kinePostgres.user",
                        &pg.user,
                        "write the user name alone; the password comes from passwordFrom.file or passwordFrom.env",
                    ));
                }
                if pg.managed && !is_loopback_host(&pg.host) {
                    causes.push(invalid(
                        "spec.store.kinePostgres.host",
                        &pg.host,
                        "a managed PostgreSQL runs on this host: write 127.0.0.1, ::1 or localhost, or set managed: false",
                    ));
                }
                match (&pg.ca_file, pg.ssl_mode) {
                    (Some(file), _) if file.trim().is_empty() => causes.push(invalid(
                        "spec.store.kinePostgres.caFile",
                        file,
                        "write the path of a PEM file holding the CA certificate, e.g. /etc/kcpshard/pg-ca.pem, or remove caFile",
                    )),
                    (Some(file), SslMode::Disable) => causes.push(invalid(
                        "spec.store.kinePostgres.caFile",
                        file,
                        "sslMode is disable, so no certificate is verified: set sslMode to require, verify-ca or verify-full, or remove caFile",
                    )),
                    _ => {}
                }
                if let Some(from) = &pg.password_from {
                    match (&from.file, &from.env) {
                        (Some(_), Some(_)) => causes.push(invalid(
                            "spec.store.kinePostgres.passwordFrom",
                            "file and env",
                            "set exactly one of file or env",
                        )),
                        (None, None) => causes.push(required(
                            "spec.store.kinePostgres.passwordFrom",
                            "set file (a path holding the password) or env (a variable name), or remove passwordFrom for password-less authentication",
                        )),
                        (Some(file), None) if file.trim().is_empty() => causes.push(invalid(
                            "spec.store.kinePostgres.passwordFrom.file",
                            file,
                            "write the path of a file holding the password, e.g. /etc/kcpshard/pgpass",
                        )),
                        (None, Some(env)) if !is_env_name(env) => causes.push(invalid(
                            "spec.store.kinePostgres.passwordFrom.env",
                            env,
                            "write the name of an environment variable, e.g. KCPSHARD_PG_PASSWORD (the value itself never goes in the object)",
                        )),
                        _ => {}
                    }
                }
            }
        },
        StoreType::Etcd => match &store.etcd {
            None => causes.push(required(
                "spec.store.etcd",
                "type Etcd needs its settings, e.g. etcd: {endpoints: [\"https://127.0.0.1:2379\"]}",
            )),
            Some(etcd) => {
                if etcd.endpoints.is_empty() {
                    causes.push(required("spec.store.etcd.endpoints", "list at least one URL, e.g. https://127.0.0.1:2379"));
                }
                for (i, endpoint) in etcd.endpoints.iter().enumerate() {
                    if let Err(why) = check_endpoint_url(endpoint) {
                        causes.push(invalid(format!("spec.store.etcd.endpoints[{i}]"), endpoint, why));
                    }
                }
                match (&etcd.cert_file, &etcd.key_file) {
                    (Some(_), None) => causes.push(required("spec.store.etcd.keyFile", "certFile is set: set keyFile to its private key, or remove certFile")),
                    (None, Some(_)) => causes.push(required("spec.store.etcd.certFile", "keyFile is set: set certFile to its certificate, or remove keyFile")),
                    _ => {}
                }
                for (field, value) in [("caFile", &etcd.ca_file), ("certFile", &etcd.cert_file), ("keyFile", &etcd.key_file)] {
                    if let Some(path) = value
                        && path.trim().is_empty()
                    {
                        causes.push(invalid(format!("spec.store.etcd.{field}"), path, "write a file path, or remove the field"));
                    }
                }
            }
        },
    }
}

fn check_front(obj: &KcpShard, causes: &mut Vec<FieldCause>) {
    let front = &obj.spec.front;
    match front.listen.parse::<SocketAddr>() {
        Ok(addr) if addr.port() == 0 => causes.push(invalid(
            "spec.front.listen",
            &front.listen,
            "clients need a fixed port: write one such as 127.0.0.1:6443",
        )),
        Ok(_) => {}
        Err(_) => causes.push(invalid(
            "spec.front.listen",
            &front.listen,
            "write an IP address and a port, e.g. 127.0.0.1:6443, 0.0.0.0:6443 or [::1]:6443",
        )),
    }
    match (front.type_, &front.caddy) {
        (FrontType::Tcp, Some(_)) => causes.push(forbidden(
            "spec.front.caddy",
            "may only be set when spec.front.type is Caddy: remove it, or set type: Caddy",
        )),
        (FrontType::Caddy, None) => causes.push(required(
            "spec.front.caddy",
            "type Caddy needs its settings, e.g. caddy: {adminAddress: \"127.0.0.1:2019\", upstreamId: kcp-proxy}",
        )),
        (FrontType::Caddy, Some(caddy)) => {
            if let Err(why) = check_host_port(&caddy.admin_address) {
                causes.push(invalid("spec.front.caddy.adminAddress", &caddy.admin_address, why));
            }
            if caddy.upstream_id.contains(['/', '?', '#', ' ']) {
                causes.push(invalid(
                    "spec.front.caddy.upstreamId",
                    &caddy.upstream_id,
                    "write the @id of the caddy handler alone, e.g. kcp-proxy",
                ));
            }
        }
        (FrontType::Tcp, None) => {}
    }
}

/// Parses a duration field and checks its bounds; pushes a cause and returns None when it fails.
fn check_duration(
    causes: &mut Vec<FieldCause>,
    field: &str,
    text: &str,
    min: Duration,
    max: Duration,
) -> Option<Duration> {
    match parse_duration(text) {
        Err(why) => {
            causes.push(invalid(field, text, why));
            None
        }
        Ok(d) if d < min => {
            causes.push(invalid(field, text, format!("must be at least {}", human(min))));
            None
        }
        Ok(d) if d > max => {
            causes.push(invalid(field, text, format!("must be at most {}", human(max))));
            None
        }
        Ok(d) => Some(d),
    }
}

fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `http(s)://host:port` with an optional trailing `/`, no credentials and no path.
fn check_endpoint_url(url: &str) -> Result<(), String> {
    let hint = "write a URL such as https://127.0.0.1:2379";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("has no scheme: {hint}"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("the scheme must be http or https: {hint}"));
    }
    if rest.contains('@') {
        return Err(format!("must not carry credentials (use certFile and keyFile): {hint}"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err(format!("must not have a path: {hint}"));
    }
    check_host_port(authority).map_err(|_| format!("needs a host and a port: {hint}"))
}

/// `host:port` where host is an IP address (IPv6 in brackets) or a DNS name, and port is 1..65535.
fn check_host_port(text: &str) -> Result<(), String> {
    let hint = "write host:port, e.g. 127.0.0.1:2019 or localhost:2019";
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return if addr.port() == 0 {
            Err(format!("port 0 is not dialable: {hint}"))
        } else {
            Ok(())
        };
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("has no port: {hint}"));
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if port_ok && host_ok {
        Ok(())
    } else {
        Err(hint.to_string())
    }
}

fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn invalid(field: impl Into<String>, value: impl Display, why: impl Display) -> FieldCause {
    FieldCause::invalid(field, format!("Invalid value: \"{value}\": {why}"))
}

fn required(field: impl Into<String>, hint: impl Display) -> FieldCause {
    FieldCause {
        reason: "FieldValueRequired",
        field: field.into(),
        message: format!("Required value: {hint}"),
    }
}

fn forbidden(field: impl Into<String>, why: impl Display) -> FieldCause {
    FieldCause {
        reason: "FieldValueForbidden",
        field: field.into(),
        message: format!("Forbidden: {why}"),
    }
}

#[cfg(test)]
mod tests;
