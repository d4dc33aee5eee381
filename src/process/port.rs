//! A port for a kcp to bind, held until it has: no other program can take it in between.
//!
//! kcp takes its port as a number (`--secure-port`), not as a socket. Binding port 0 and closing
//! the socket before kcp binds leaves a moment in which the kernel may hand the port to anyone.
//! Instead the socket stays bound, with SO_REUSEPORT and never listening, and kcp binds the same
//! port with `--permit-port-sharing` (SO_REUSEPORT too, from
//! `k8s.io/apiserver/pkg/server/options/serving.go`'s `PermitPortSharing`). Linux lets a second
//! socket bind a port only when both set SO_REUSEPORT and belong to one user (socket(7)); kcp runs
//! as serve's user. Connections reach listening sockets only, so none ever reach ours, and a bind
//! to port 0 never picks a port a socket already holds, so no two kcps share one.
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

/// A port on 127.0.0.1 that this process holds and a kcp started with `--permit-port-sharing`
/// may bind.
#[derive(Debug)]
pub struct PortReservation {
    socket: Socket,
    port: u16,
}

impl PortReservation {
    pub fn new() -> std::io::Result<PortReservation> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        socket.set_reuse_port(true)?;
        socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
        let port = socket
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| std::io::Error::other("a TCP socket without an IP address"))?;
        Ok(PortReservation { socket, port })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Keeps the port held for `duration` more, in the background, while the process it was
    /// reserved for binds it (kcp binds its port while it builds its config, long before it is
    /// ready: holding it for the readiness timeout covers every kcp that can still become ready).
    pub fn hold_for(self, duration: Duration) {
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            drop(self.socket);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_port_refuses_connections_and_other_binds_but_admits_a_sharing_one() {
        let reserved = PortReservation::new().unwrap();
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved.port()));
        // Nobody listens: a connection is refused, not accepted by the reservation.
        assert!(tokio::net::TcpStream::connect(address).await.is_err());
        // A program that does not share ports cannot take it.
        assert!(std::net::TcpListener::bind(address).is_err());
        // The kcp it is for can, and then gets every connection.
        let kcp = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        kcp.set_reuse_port(true).unwrap();
        kcp.bind(&address.into()).unwrap();
        kcp.listen(8).unwrap();
        kcp.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(kcp.into()).unwrap();
        assert!(tokio::net::TcpStream::connect(address).await.is_ok());
        assert!(listener.accept().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_port_held_for_a_while_is_let_go_after_it() {
        let reserved = PortReservation::new().unwrap();
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved.port()));
        reserved.hold_for(Duration::from_secs(120));
        tokio::time::sleep(Duration::from_secs(119)).await;
        assert!(std::net::TcpListener::bind(address).is_err());
        tokio::time::sleep(Duration::from_secs(2)).await;
        std::net::TcpListener::bind(address).unwrap();
    }
}
