//! An etcd cluster the user runs (spec.store.etcd): kcpshard starts nothing; every slot dials the
//! endpoints with the spec's TLS files, and the store counts as up while one endpoint accepts TCP.
use std::path::PathBuf;
use std::time::Duration;

use crate::api::EtcdStore;

/// How long a TCP connect to one endpoint may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);

/// The etcd members and the files that authenticate to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCluster {
    pub endpoints: Vec<String>,
    pub tls: EtcdTls,
}

/// kcp's `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl EtcdCluster {
    pub fn from_spec(spec: &EtcdStore) -> EtcdCluster {
        EtcdCluster {
            endpoints: spec.endpoints.clone(),
            tls: EtcdTls {
                ca_file: spec.ca_file.as_ref().map(PathBuf::from),
                cert_file: spec.cert_file.as_ref().map(PathBuf::from),
                key_file: spec.key_file.as_ref().map(PathBuf::from),
            },
        }
    }

    /// The cluster as arguments of a `kcpshard job`: `--<prefix>endpoint` per member, then
    /// `--<prefix>cacert`, `--<prefix>cert`, `--<prefix>key` for the files it has, made absolute
    /// (a job runs in a directory of its own).
    pub fn job_args(&self, prefix: &str) -> Result<Vec<String>, super::StoreError> {
        let mut args = Vec::new();
        for endpoint in &self.endpoints {
            args.extend([format!("--{prefix}endpoint"), endpoint.clone()]);
        }
        for (flag, file) in [
            ("cacert", &self.tls.ca_file),
            ("cert", &self.tls.cert_file),
            ("key", &self.tls.key_file),
        ] {
            if let Some(file) = file {
                args.extend([format!("--{prefix}{flag}"), super::snapshot::absolute_arg(file)?]);
            }
        }
        Ok(args)
    }

    /// `--etcd-servers` for the slots.
    pub fn etcd_servers(&self) -> String {
        self.endpoints.join(",")
    }

    /// Ok when one endpoint accepts a TCP connection; else what each said.
    pub async fn check(&self) -> Result<(), String> {
        let mut failures = Vec::new();
        for endpoint in &self.endpoints {
            let Some(address) = host_port(endpoint) else {
                failures.push(format!("{endpoint}: not a URL with a host"));
                continue;
            };
            match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(&address)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => failures.push(format!("{endpoint}: {e}")),
                Err(_) => failures.push(format!("{endpoint}: no answer within {DIAL_TIMEOUT:?}")),
            }
        }
        Err(format!(
            "no etcd endpoint accepts connections ({}); start etcd or fix spec.store.etcd.endpoints",
            failures.join("; ")
        ))
    }
}

/// `host:port` of an endpoint URL; etcd's client port 2379 when it names none.
fn host_port(endpoint: &str) -> Option<String> {
    let uri: http::Uri = endpoint.parse().ok()?;
    let authority = uri.authority()?;
    Some(format!("{}:{}", authority.host(), authority.port_u16().unwrap_or(2379)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_dial_addresses_and_one_flag() {
        assert_eq!(host_port("https://127.0.0.1:2379").as_deref(), Some("127.0.0.1:2379"));
        assert_eq!(host_port("http://etcd-0").as_deref(), Some("etcd-0:2379"));
        assert_eq!(host_port("not a url"), None);
        let cluster = EtcdCluster {
            endpoints: vec!["https://a:2379".into(), "https://b:2379".into()],
            tls: EtcdTls::default(),
        };
        assert_eq!(cluster.etcd_servers(), "https://a:2379,https://b:2379");
    }

    #[tokio::test]
    async fn a_cluster_with_no_listening_member_says_which_failed() {
        // Bound, not listening: a connection to it is refused, and nothing else can take it.
        let member = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        member
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let port = member.local_addr().unwrap().as_socket().unwrap().port();
        let cluster = EtcdCluster {
            endpoints: vec![format!("http://127.0.0.1:{port}")],
            tls: EtcdTls::default(),
        };
        let error = cluster.check().await.unwrap_err();
        assert!(
            error.contains(&format!("127.0.0.1:{port}")) && error.contains("fix spec.store.etcd"),
            "{error}"
        );
        member.listen(1).unwrap();
        assert_eq!(cluster.check().await, Ok(()));
    }
}
