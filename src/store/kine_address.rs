//! Where a kine listens, and how kcp and kcpshard reach it.
//!
//! A kine listens on a unix socket in its own directory (`kine.sock`, 0600: kine chmods it,
//! `pkg/endpoint/endpoint.go` createListener), which kcp dials as `--etcd-servers=unix://PATH`
//! (the etcd client dials unix endpoints itself; k3s runs its apiserver on kine this way). No port
//! is picked for it, so none can be taken by another program between the pick and kine's bind,
//! and a kine that dies comes back at the same address. Two cases keep a loopback port: a socket
//! path longer than a `sockaddr_un` holds (a long state dir and shard name), and a kine started by
//! an earlier kcpshard, whose slots dial its port.
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The socket file in a kine's directory.
pub const SOCKET_FILE: &str = "kine.sock";
/// The longest path a unix socket may have (`sun_path` is 108 bytes, one for the NUL; unix(7)).
const MAX_SOCKET_PATH: usize = 107;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KineAddress {
    Unix(PathBuf),
    Tcp(u16),
}

impl KineAddress {
    /// The address of a new kine whose directory is `dir`: its socket there (an absolute path:
    /// kcp dials it from another working directory), or, when that path is too long for a socket,
    /// a loopback port that was free a moment ago.
    pub fn for_new_kine(dir: &Path) -> std::io::Result<KineAddress> {
        let socket = std::path::absolute(dir.join(SOCKET_FILE))?;
        if socket.as_os_str().len() <= MAX_SOCKET_PATH {
            return Ok(KineAddress::Unix(socket));
        }
        tracing::warn!(
            socket = %socket.display(),
            "a unix socket path holds at most {MAX_SOCKET_PATH} bytes: this kine listens on a loopback port instead (a shorter --state-dir avoids it)"
        );
        crate::process::free_port().map(KineAddress::Tcp)
    }

    /// The address in a kine's `--listen-address=` argument.
    pub fn from_args(args: &[String]) -> Option<KineAddress> {
        let listen = args.iter().find_map(|a| a.strip_prefix("--listen-address="))?;
        match listen.strip_prefix("unix://") {
            Some(path) => Some(KineAddress::Unix(PathBuf::from(path))),
            None => listen
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse().ok())
                .map(KineAddress::Tcp),
        }
    }

    /// kine's `--listen-address` argument.
    pub fn listen_arg(&self) -> String {
        match self {
            KineAddress::Unix(path) => format!("--listen-address=unix://{}", path.display()),
            KineAddress::Tcp(port) => format!("--listen-address=127.0.0.1:{port}"),
        }
    }

    /// The URL kcp's `--etcd-servers` takes.
    pub fn url(&self) -> String {
        match self {
            KineAddress::Unix(path) => format!("unix://{}", path.display()),
            KineAddress::Tcp(port) => format!("http://127.0.0.1:{port}"),
        }
    }

    /// Whether a connection to it succeeds within 200 ms.
    pub async fn accepts(&self) -> bool {
        let timeout = Duration::from_millis(200);
        match self {
            KineAddress::Unix(path) => matches!(
                tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path)).await,
                Ok(Ok(_))
            ),
            KineAddress::Tcp(port) => {
                match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(("127.0.0.1", *port))).await {
                    // Kine's ports are in the ephemeral range: a connect to one nobody listens on
                    // can pick that very port as its source and connect to itself (TCP
                    // simultaneous open), which looks like a listener that nobody holds.
                    Ok(Ok(stream)) => stream.local_addr().ok() != stream.peer_addr().ok(),
                    _ => false,
                }
            }
        }
    }
}

impl std::fmt::Display for KineAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_round_trips_through_kine_s_argument() {
        for address in [
            KineAddress::Unix("/state/shards/dev/store/kine.sock".into()),
            KineAddress::Tcp(23790),
        ] {
            assert_eq!(KineAddress::from_args(&[address.listen_arg()]), Some(address));
        }
        assert_eq!(KineAddress::Unix("/s/kine.sock".into()).url(), "unix:///s/kine.sock");
        assert_eq!(KineAddress::Tcp(23790).url(), "http://127.0.0.1:23790");
        assert_eq!(KineAddress::from_args(&["--endpoint=x".to_string()]), None);
    }

    #[test]
    fn a_new_kine_listens_in_its_directory_unless_the_path_is_too_long_for_a_socket() {
        let dir = Path::new("/var/lib/kcpshard/shards/dev/store");
        assert_eq!(
            KineAddress::for_new_kine(dir).unwrap(),
            KineAddress::Unix(dir.join("kine.sock"))
        );
        let long = Path::new("/var/lib/kcpshard/shards")
            .join("n".repeat(63))
            .join("slots/a/store");
        assert!(matches!(KineAddress::for_new_kine(&long).unwrap(), KineAddress::Tcp(_)));
    }

    #[tokio::test]
    async fn a_socket_accepts_while_something_listens_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let address = KineAddress::for_new_kine(dir.path()).unwrap();
        assert!(!address.accepts().await);
        let KineAddress::Unix(path) = &address else {
            panic!("a short path listens on a socket: {address}")
        };
        let _listener = tokio::net::UnixListener::bind(path).unwrap();
        assert!(address.accepts().await);
    }
}
