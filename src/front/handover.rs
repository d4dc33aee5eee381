//! Passing the listening socket to a successor front (SCM_RIGHTS over the control socket).
//!
//! The socket itself moves, not its address: the kernel keeps one accept queue, both processes may
//! accept from it for a moment, and no connection is refused during an upgrade. SO_REUSEPORT would
//! give each process its own queue, and connections queued on the old one would be reset when it
//! closes; that is why it is never used here.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

const CMSG_SPACE: usize = 64;

#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_SPACE]);

fn sendmsg_fd(socket: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = CmsgBuf([0; CMSG_SPACE]);
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call, and the
    // control buffer is aligned and large enough for one cmsghdr carrying one int.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        assert!(space <= CMSG_SPACE);
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
        let n = libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

fn write_raw(socket: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe a live slice.
    let n = unsafe {
        libc::send(
            socket,
            bytes.as_ptr() as *const libc::c_void,
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn recvmsg_fd(socket: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = CmsgBuf([0; CMSG_SPACE]);
    // SAFETY: as in sendmsg_fd; the kernel writes at most msg_controllen bytes of control data,
    // and every fd it hands over is wrapped in an OwnedFd at once (MSG_CMSG_CLOEXEC keeps it from
    // leaking into children).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = CMSG_SPACE as _;
        let n = libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut received = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize - header) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    // Keep the first; any extra fd is closed when dropped here.
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 && received.is_none() {
            return Err(io::Error::other("the passed file descriptor was truncated away"));
        }
        Ok((n as usize, received))
    }
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
