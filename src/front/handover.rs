//! Passing the listening socket to a successor front (SCM_RIGHTS over the control socket).
//!
//! The socket itself moves, not its address: the kernel keeps one accept queue, both processes may
//! accept from it for a moment, and no connection is refused during an upgrade. SO_REUSEPORT would
//! give each process its own queue, and connections queued on the old one would be reset when it
//! closes; that is why it is never used here.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, MsgFlags};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Sends `bytes` with `fd` attached as SCM_RIGHTS ancillary data.
pub async fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut sent = 0;
    // The fd rides on the first sendmsg; the rest of a long message (never, in practice) follows.
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        let n = if sent == 0 {
            stream
                .async_io(Interest::WRITABLE, || sendmsg_fd(stream.as_raw_fd(), rest, fd))
                .await?
        } else {
            stream
                .async_io(Interest::WRITABLE, || write_raw(stream.as_raw_fd(), rest))
                .await?
        };
        sent += n;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and the fd sent with them, if any.
pub async fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    stream
        .async_io(Interest::READABLE, || recvmsg_fd(stream.as_raw_fd(), buf))
        .await
}

fn sendmsg_fd(socket: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<usize> {
    let fds = [fd];
    Ok(socket::sendmsg::<()>(
        socket,
        &[io::IoSlice::new(bytes)],
        &[socket::ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?)
}

fn write_raw(socket: RawFd, bytes: &[u8]) -> io::Result<usize> {
    Ok(socket::send(socket, bytes, MsgFlags::MSG_NOSIGNAL)?)
}

/// MSG_CMSG_CLOEXEC keeps a received fd from leaking into children; each one is owned at once.
fn recvmsg_fd(socket: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut control = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let message = socket::recvmsg::<()>(socket, &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut received = None;
    for cmsg in message.cmsgs()? {
        if let socket::ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: the kernel just installed this descriptor in this process for this
                // message, and nothing else knows of it.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                // Keep the first; any extra fd is closed when dropped here.
                if received.is_none() {
                    received = Some(fd);
                }
            }
        }
    }
    if message.flags.contains(MsgFlags::MSG_CTRUNC) && received.is_none() {
        return Err(io::Error::other("the passed file descriptor was truncated away"));
    }
    Ok((message.bytes, received))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listening_socket_passed_over_a_unix_socket_still_accepts() {
        let (a, b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        send_with_fd(&a, b"hello\n", listener.as_raw_fd()).await.unwrap();
        drop(listener);
        let mut buf = [0u8; 64];
        let (n, fd) = recv_with_fd(&b, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"hello\n");
        let received = std::net::TcpListener::from(fd.expect("an fd"));
        assert_eq!(received.local_addr().unwrap(), address);
        let _client = std::net::TcpStream::connect(address).unwrap();
        received.accept().unwrap();
    }
}
