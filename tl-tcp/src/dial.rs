//! Connecting to a peer iface from our iface's own address: the peer checks
//! the IP our Hello claims against the one the connection comes from, and
//! on a host with several addresses the kernel would otherwise pick the
//! source by its routes.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use uct_core::UctError;

/// A socket address in the form the kernel takes.
fn raw_addr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and aligned
            // for any socket address; `storage` is a live local.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn os_error(what: String) -> UctError {
    UctError::Unreachable(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// Connects to `to` from `from` (any port), within `timeout`.
pub(crate) fn dial(from: IpAddr, to: SocketAddr, timeout: Duration) -> Result<TcpStream, UctError> {
    if from.is_ipv4() != to.is_ipv4() {
        // No source of the peer's family on this device: the kernel picks.
        return TcpStream::connect_timeout(&to, timeout)
            .map_err(|e| UctError::Unreachable(format!("tcp connect to {to}: {e}")));
    }
    let family = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket() takes no pointers; the result is checked below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(os_error(format!("tcp: socket for {to}")));
    }
    // SAFETY: `fd` is a new socket that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let (local, local_len) = raw_addr(SocketAddr::new(from, 0));
    // SAFETY: `local` is a live sockaddr of `local_len` bytes.
    if unsafe {
        libc::bind(
            sock.as_raw_fd(),
            &local as *const _ as *const libc::sockaddr,
            local_len,
        )
    } != 0
    {
        return Err(os_error(format!("tcp: bind to {from} to connect to {to}")));
    }
    let (remote, remote_len) = raw_addr(to);
    // SAFETY: `remote` is a live sockaddr of `remote_len` bytes.
    let status = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &remote as *const _ as *const libc::sockaddr,
            remote_len,
        )
    };
    if status != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(UctError::Unreachable(format!(
                "tcp connect from {from} to {to}: {e}"
            )));
        }
        wait_connected(&sock, to, timeout)?;
    }
    let stream = TcpStream::from(sock);
    if let Ok(Some(e)) = stream.take_error() {
        return Err(UctError::Unreachable(format!(
            "tcp connect from {from} to {to}: {e}"
        )));
    }
    Ok(stream)
}

/// Waits for a non-blocking connect to finish.
fn wait_connected(sock: &OwnedFd, to: SocketAddr, timeout: Duration) -> Result<(), UctError> {
    let t0 = Instant::now();
    loop {
        let left = timeout.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Err(UctError::Unreachable(format!(
                "tcp connect to {to}: no answer within {timeout:?}; is the peer's host up and its port reachable?"
            )));
        }
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one initialised pollfd, exclusively borrowed for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: SO_ERROR writes one int into `err`, whose size is `len`.
            let status = unsafe {
                libc::getsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    &mut err as *mut _ as *mut libc::c_void,
                    &mut len,
                )
            };
            if status != 0 {
                return Err(os_error(format!("tcp connect to {to}: SO_ERROR")));
            }
            if err != 0 {
                return Err(UctError::Unreachable(format!(
                    "tcp connect to {to}: {}",
                    std::io::Error::from_raw_os_error(err)
                )));
            }
            return Ok(());
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(os_error(format!("tcp connect to {to}: poll")));
        }
    }
}
