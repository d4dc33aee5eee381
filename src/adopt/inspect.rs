//! Reading a kcp root directory and the process that serves from it. Nothing here writes.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::flags::{self, Flag};
use super::{AdoptError, Found, OldStore, RunningKcp, StoreSize};
use crate::process::procfs;
use crate::store::etcd::{EtcdCluster, EtcdTls};
use crate::store::etcd_keys;

/// kcp's defaults for what its flags do not say (kcp `pkg/server/options`: `--root-directory`
/// ".kcp" in the working directory; `--embedded-etcd-directory` "etcd-server" in the root
/// directory, clients on port 2379 (module github.com/kcp-dev/embeddedetcd, `options/embedded.go`);
/// `--secure-port` 6443 on every address (k8s.io/apiserver `SecureServingOptions`).
const DEFAULT_ROOT: &str = ".kcp";
const DEFAULT_ETCD_DIR: &str = "etcd-server";
const DEFAULT_ETCD_CLIENT_PORT: &str = "2379";
const DEFAULT_SECURE_PORT: &str = "6443";
/// How long `kcp --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads what an adoption of the kcp serving from `root_dir` would take (see [`Found`]). Fails
/// when `root_dir` is no kcp root, no kcp (or more than one) serves from it, or its store cannot
/// be read.
pub async fn inspect(root_dir: &Path) -> Result<Found, AdoptError> {
    let root_dir = root_dir.canonicalize().map_err(|source| AdoptError::Io {
        dir: root_dir.to_path_buf(),
        source,
    })?;
    if !root_dir.join("admin.kubeconfig").exists() && !root_dir.join("apiserver.crt").exists() {
        return Err(AdoptError::NotAKcpRoot {
            dir: root_dir,
            missing: "admin.kubeconfig or apiserver.crt".into(),
        });
    }
    let (pid, argv, cwd) = serving_process(&root_dir)?;
    let flags = absolute_paths(flags::parse(&argv), &cwd);
    let path_of = |flag: &str, default: &str| match flags::value(&flags, flag) {
        Some(value) => cwd.join(value),
        None => root_dir.join(default),
    };
    // The names slot/material.rs gives the shared files, and where this kcp has them.
    let material = vec![
        ("apiserver.crt", path_of("tls-cert-file", "apiserver.crt")),
        ("apiserver.key", path_of("tls-private-key-file", "apiserver.key")),
        ("sa.key", root_dir.join("sa.key")),
        (
            ".admin-token-store",
            path_of("authentication-admin-token-path", ".admin-token-store"),
        ),
        ("admin.kubeconfig", path_of("kubeconfig-path", "admin.kubeconfig")),
    ];
    let missing: Vec<String> = material
        .iter()
        .filter(|(_, path)| !path.is_file())
        .map(|(_, path)| path.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(AdoptError::NotAKcpRoot {
            dir: root_dir,
            missing: missing.join(", "),
        });
    }
    let (_, kubeconfig) = material
        .iter()
        .find(|(name, _)| *name == "admin.kubeconfig")
        .expect("admin.kubeconfig is one of the material's files");
    let contexts = contexts(kubeconfig).map_err(|problem| AdoptError::Unreadable {
        dir: root_dir.clone(),
        problem,
    })?;
    let token_file = flags::value(&flags, "token-auth-file").map(|file| cwd.join(file));
    let static_tokens = match &token_file {
        Some(file) => token_lines(file)
            .map_err(|source| AdoptError::Io {
                dir: file.clone(),
                source,
            })?
            .len(),
        None => 0,
    };
    let exe = procfs::exe(pid).unwrap_or_else(|| PathBuf::from(&argv[0]));
    let process = RunningKcp {
        pid,
        uid: std::fs::metadata(format!("/proc/{pid}")).map_or(0, |m| m.uid()),
        version: release_of(pid, &exe).await?,
        url: url(&flags),
        exe,
    };
    let store = old_store(&flags, &root_dir, &cwd);
    let cluster = store.cluster();
    let unreadable = |cause: String| AdoptError::StoreUnreadable {
        store: store.to_string(),
        cause,
    };
    let client = etcd_keys::connect(&cluster.endpoints, Some(cluster))
        .await
        .map_err(|e| unreadable(e.to_string()))?;
    let (keys, revision) = etcd_keys::count(&client, etcd_keys::KCP_PREFIX)
        .await
        .map_err(|e| unreadable(e.to_string()))?;
    Ok(Found {
        root_dir,
        process,
        flags,
        store,
        store_size: StoreSize { keys, revision },
        material,
        contexts,
        token_file,
        static_tokens,
    })
}

/// `flags` with each value that names a file or directory relative to kcp's working directory
/// `cwd` made absolute: the slots that keep a flag (e.g. `--audit-policy-file`) run elsewhere.
fn absolute_paths(flags: Vec<Flag>, cwd: &Path) -> Vec<Flag> {
    flags
        .into_iter()
        .map(|mut flag| {
            if let Some(value) = &flag.value
                && !value.is_empty()
                && !value.starts_with('/')
                && cwd.join(value).exists()
            {
                flag.value = Some(cwd.join(value).display().to_string());
            }
            flag
        })
        .collect()
}

/// The one `kcp start` process whose root directory is `root_dir`: its pid, argv and working
/// directory (which its relative paths are relative to).
fn serving_process(root_dir: &Path) -> Result<(u32, Vec<String>, PathBuf), AdoptError> {
    let mut found = Vec::new();
    for pid in procfs::pids() {
        let Some(argv) = procfs::cmdline(pid) else {
            continue;
        };
        let is_kcp = argv.first().and_then(|a| Path::new(a).file_name()).is_some_and(|name| {
            name.to_string_lossy().starts_with("kcp") && !name.to_string_lossy().starts_with("kcpshard")
        });
        if !is_kcp || !argv.iter().any(|a| a == "start") {
            continue;
        }
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        let parsed = flags::parse(&argv);
        let root = flags::value(&parsed, "root-directory").unwrap_or(DEFAULT_ROOT);
        if cwd.join(root).canonicalize().is_ok_and(|r| r == root_dir) && procfs::stat(pid).is_some_and(|s| !s.is_dead())
        {
            found.push((pid, argv, cwd));
        }
    }
    match found.len() {
        0 => Err(AdoptError::NotRunning {
            dir: root_dir.to_path_buf(),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(AdoptError::ManyProcesses {
            dir: root_dir.to_path_buf(),
            pids: found.into_iter().map(|(pid, ..)| pid).collect(),
        }),
    }
}

/// The kcp release of the binary pid `pid` runs, from `kcp --version` ("kcp version
/// v1.34.2+kcp-v0.30.0"). Run through `/proc/<pid>/exe`, so that it is the binary the process
/// runs even when the file it came from was replaced or removed since.
async fn release_of(pid: u32, exe: &Path) -> Result<String, AdoptError> {
    let unknown = |cause: String| AdoptError::VersionUnknown {
        pid,
        exe: exe.to_path_buf(),
        cause,
    };
    let run = tokio::process::Command::new(format!("/proc/{pid}/exe"))
        .arg("--version")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(VERSION_TIMEOUT, run)
        .await
        .map_err(|_| unknown(format!("no answer within {VERSION_TIMEOUT:?}")))?
        .map_err(|e| unknown(e.to_string()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    release_in(&text).ok_or_else(|| unknown(format!("it printed {:?}", text.trim())))
}

/// "v0.30.0" from "kcp version v1.34.2+kcp-v0.30.0".
fn release_in(version_output: &str) -> Option<String> {
    let release = version_output.split("+kcp-").nth(1)?.split_whitespace().next()?;
    release.starts_with('v').then(|| release.to_string())
}

/// Where clients reach the process: its bind address (any address: loopback) and secure port.
fn url(flags: &[Flag]) -> String {
    let host = match flags::value(flags, "bind-address") {
        None | Some("0.0.0.0") | Some("::") | Some("") => "127.0.0.1",
        Some(address) => address,
    };
    let port = flags::value(flags, "secure-port").unwrap_or(DEFAULT_SECURE_PORT);
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The store of a kcp started with `flags`: its `--etcd-servers`, or its embedded etcd, whose
/// client certificates it makes in `<dir>/secrets` (embeddedetcd `config.go`
/// `generateClientAndServerCerts`) for the name "localhost".
fn old_store(flags: &[Flag], root_dir: &Path, cwd: &Path) -> OldStore {
    let file = |name: &str| flags::value(flags, name).map(|f| cwd.join(f));
    if let Some(servers) = flags::value(flags, "etcd-servers").filter(|s| !s.is_empty()) {
        return OldStore::Servers(EtcdCluster {
            endpoints: servers.split(',').map(str::to_string).collect(),
            tls: EtcdTls {
                ca_file: file("etcd-cafile"),
                cert_file: file("etcd-certfile"),
                key_file: file("etcd-keyfile"),
            },
        });
    }
    let directory = root_dir.join(flags::value(flags, "embedded-etcd-directory").unwrap_or(DEFAULT_ETCD_DIR));
    let port = flags::value(flags, "embedded-etcd-client-port").unwrap_or(DEFAULT_ETCD_CLIENT_PORT);
    let secrets = directory.join("secrets");
    OldStore::Embedded {
        cluster: EtcdCluster {
            endpoints: vec![format!("https://localhost:{port}")],
            tls: EtcdTls {
                ca_file: Some(secrets.join("ca/cert.pem")),
                cert_file: Some(secrets.join("client/cert.pem")),
                key_file: Some(secrets.join("client/key.pem")),
            },
        },
        directory,
    }
}

/// The contexts of a kubeconfig, each with its user.
fn contexts(kubeconfig: &Path) -> Result<Vec<(String, String)>, String> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    Ok(config
        .contexts
        .into_iter()
        .map(|c| {
            let user = c.context.and_then(|c| c.user).unwrap_or_default();
            (c.name, user)
        })
        .collect())
}

/// The tokens of a static token file (kcp's `--token-auth-file`: one `token,user,uid,...` line
/// each; blank lines and `#` comments are not tokens).
/// The tokens of a static token file (`--token-auth-file`: `token,user,uid,"group,..."` lines).
pub fn token_lines(file: &Path) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_to_string(file)?
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_that_names_a_file_relative_to_kcps_working_directory_is_made_absolute() {
        let cwd = tempfile::tempdir().unwrap();
        std::fs::write(cwd.path().join("audit.yaml"), "").unwrap();
        let flags = absolute_paths(
            flags("kcp start --audit-policy-file=audit.yaml --secure-port=6443"),
            cwd.path(),
        );
        assert_eq!(
            flags::value(&flags, "audit-policy-file"),
            Some(cwd.path().join("audit.yaml").to_str().unwrap())
        );
        assert_eq!(flags::value(&flags, "secure-port"), Some("6443"), "not a file there");
    }

    fn flags(args: &str) -> Vec<Flag> {
        flags::parse(&args.split_whitespace().map(str::to_string).collect::<Vec<_>>())
    }

    #[test]
    fn the_release_is_read_from_what_kcp_version_prints() {
        assert_eq!(
            release_in("kcp version v1.34.2+kcp-v0.30.0\n").as_deref(),
            Some("v0.30.0")
        );
        assert_eq!(
            release_in("kcp version v1.33.3+kcp-v0.31.2-dirty"),
            Some("v0.31.2-dirty".into())
        );
        assert_eq!(release_in("Kubernetes v1.34.2"), None);
    }

    #[test]
    fn clients_reach_the_bind_address_or_loopback_on_the_secure_port() {
        assert_eq!(url(&flags("kcp start")), "https://127.0.0.1:6443");
        assert_eq!(
            url(&flags("kcp start --bind-address=10.0.0.5 --secure-port=7443")),
            "https://10.0.0.5:7443"
        );
        assert_eq!(url(&flags("kcp start --bind-address ::1")), "https://[::1]:6443");
    }

    #[test]
    fn the_store_is_the_etcd_servers_or_the_embedded_etcd_with_its_own_certificates() {
        let root = Path::new("/var/lib/kcp");
        let cwd = Path::new("/home/kcp");
        let servers = old_store(
            &flags("kcp start --etcd-servers=https://a:2379,https://b:2379 --etcd-cafile ca.pem"),
            root,
            cwd,
        );
        let OldStore::Servers(cluster) = servers else {
            panic!("{servers:?}")
        };
        assert_eq!(cluster.endpoints, ["https://a:2379", "https://b:2379"]);
        assert_eq!(cluster.tls.ca_file.as_deref(), Some(Path::new("/home/kcp/ca.pem")));

        let embedded = old_store(&flags("kcp start --embedded-etcd-client-port=12379"), root, cwd);
        let OldStore::Embedded { directory, cluster } = embedded else {
            panic!("{embedded:?}")
        };
        assert_eq!(directory, Path::new("/var/lib/kcp/etcd-server"));
        assert_eq!(cluster.endpoints, ["https://localhost:12379"]);
        assert_eq!(
            cluster.tls.key_file.as_deref(),
            Some(Path::new("/var/lib/kcp/etcd-server/secrets/client/key.pem"))
        );
    }
}
