//! Taking over the listening socket of another process, so that a program can replace the one
//! that serves an address without a connection refused in between: the socket itself is
//! duplicated into this process (`pidfd_getfd(2)`, Linux 5.6), not its address bound again. Both
//! processes then accept from one accept queue; once the other closes its descriptor (it stops or
//! exits), the socket lives on in this one and every connection queued or still to come is
//! accepted here. (Binding the address again, with SO_REUSEPORT where the other set it, would give
//! each its own queue, and what was queued on the other's would be reset when it closes.)
//!
//! Taking a descriptor needs the right to ptrace the process: root, or its own user where the
//! kernel's Yama setting allows it.
use std::net::{SocketAddr, TcpListener};

use super::exits::pidfd_open;
use super::procfs;

/// Why a listening socket could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TakeListenerError {
    #[error("process {pid} holds no listening socket on port {port} that this user can see")]
    NotListening { pid: u32, port: u16 },
    #[error(
        "cannot take the listening socket of process {pid}: {source} (it takes the right to ptrace it: run as root or as its user)"
    )]
    Denied { pid: u32, source: std::io::Error },
    #[error("process {pid}'s socket on port {port} listens on {found}, not {wanted}")]
    OtherAddress {
        pid: u32,
        port: u16,
        found: SocketAddr,
        wanted: SocketAddr,
    },
}

/// The socket process `pid` listens on at `address`, duplicated into this process.
pub fn take_listener(pid: u32, address: SocketAddr) -> Result<TcpListener, TakeListenerError> {
    let port = address.port();
    let fd = procfs::listening_fd(pid, port).ok_or(TakeListenerError::NotListening { pid, port })?;
    let denied = |source: std::io::Error| TakeListenerError::Denied { pid, source };
    let pidfd = pidfd_open(pid).map_err(denied)?;
    let taken = rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())
        .map_err(|e| denied(e.into()))?;
    let listener = TcpListener::from(taken);
    match listener.local_addr() {
        Ok(found) if found == address => Ok(listener),
        Ok(found) => Err(TakeListenerError::OtherAddress {
            pid,
            port,
            found,
            wanted: address,
        }),
        Err(source) => Err(denied(source)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn a_socket_of_this_process_is_taken_and_accepts_what_was_queued_on_it() {
        let original = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = original.local_addr().unwrap();
        let mut queued = TcpStream::connect(address).unwrap();
        let taken = take_listener(std::process::id(), address).unwrap();
        drop(original);
        queued.write_all(b"hi").unwrap();
        let (mut accepted, _) = taken.accept().unwrap();
        let mut greeting = [0; 2];
        accepted.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting, b"hi");

        let elsewhere: SocketAddr = format!("127.0.0.2:{}", address.port()).parse().unwrap();
        assert!(matches!(
            take_listener(std::process::id(), elsewhere),
            Err(TakeListenerError::OtherAddress { found, .. }) if found == address
        ));
        drop(taken);
        assert!(matches!(
            take_listener(std::process::id(), address),
            Err(TakeListenerError::NotListening { .. })
        ));
    }
}
