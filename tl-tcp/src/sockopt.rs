//! Socket options of a connection: how long a silent or unacknowledging
//! peer is tolerated before the kernel reports the connection failed, and
//! the abortive close of one that failed.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use uct_core::UctError;

fn setsockopt(
    stream: &TcpStream,
    level: i32,
    name: i32,
    value: i32,
    what: &str,
) -> Result<(), UctError> {
    // SAFETY: the fd is a live socket owned by `stream`; the option value is
    // an int of the size passed.
    let status = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if status != 0 {
        return Err(UctError::io(
            format!("tcp: set {what}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Sets TCP_USER_TIMEOUT and keepalive from the peer timeout `t`.
pub(crate) fn set_peer_timeout(stream: &TcpStream, t: Duration) -> Result<(), UctError> {
    let ms = t.as_millis().clamp(1, i32::MAX as u128) as i32;
    let idle = (t.as_secs() / 3).clamp(1, 3600) as i32;
    setsockopt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        ms,
        "TCP_USER_TIMEOUT",
    )?;
    setsockopt(
        stream,
        libc::SOL_SOCKET,
        libc::SO_KEEPALIVE,
        1,
        "SO_KEEPALIVE",
    )?;
    setsockopt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPIDLE,
        idle,
        "TCP_KEEPIDLE",
    )?;
    setsockopt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        1,
        "TCP_KEEPINTVL",
    )?;
    setsockopt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPCNT,
        3,
        "TCP_KEEPCNT",
    )
}

/// TCP_QUICKACK on a socket, errors ignored: it only moves ACKs in time.
fn set_quickack(fd: RawFd, value: i32) {
    // SAFETY: TCP_QUICKACK reads one int at the pointer, a live local of
    // the size passed; a bad fd is an error return, nothing more.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
    }
}

/// Bytes read since the last held-back ACK above which it is not sent:
/// that much is more than one full-sized segment (every MSS is below
/// 64 KiB), so the kernel has ACKed at least once meanwhile, during our
/// reads. Not necessarily the last segment: a tail of up to one segment
/// may wait for the next arrival's ACK or the delayed-ACK timer (40 ms
/// and up), which then leaves delayed mode until a smaller read sends the
/// pair again. Nothing of ours waits for an ACK (completions fire when
/// the socket takes the bytes). What was saved is the two setsockopt
/// calls (nstat counted no extra segment): tcp am_lat 64 KiB, 5
/// interleaved rounds, 56.9 us with them, 32.2 without, ucx_perftest 28.4.
pub(crate) const SKIP_ACK_ABOVE: usize = 65_535;

/// Whether the held-back ACK is sent after `read_since_ack` bytes read.
pub(crate) fn owes_ack(read_since_ack: usize) -> bool {
    read_since_ack > 0 && read_since_ack <= SKIP_ACK_ABOVE
}

/// Puts the socket's ACKs in delayed mode (TCP_QUICKACK off): a read no
/// longer sends an ACK for each small frame on the spot. A link carries
/// frames one way only, so no data of ours takes the ACK along, and a pure
/// ACK sent inside the recv of a request delays its answer (each costs a
/// segment through the stack). [`send_owed_ack`] sends it once this side
/// has answered and the link is quiet; the kernel still ACKs when more
/// than one full-sized segment came, on some reads that empty the queue,
/// and on its delayed-ACK timer.
pub(crate) fn delay_acks(fd: RawFd) {
    set_quickack(fd, 0);
}

/// Sends the ACK the socket owes for what was read, if any, and goes back
/// to delayed mode (the kernel leaves it when its delayed-ACK timer fires).
/// Two calls: TCP_QUICKACK 2 alone would leave delayed mode for good when
/// no ACK is owed.
pub(crate) fn send_owed_ack(fd: RawFd) {
    set_quickack(fd, 1);
    set_quickack(fd, 0);
}

/// Sets SO_LINGER {on, 0}: closing the socket then drops what the kernel
/// still holds to send and resets the connection, where a plain close
/// sends it on, for up to the peer timeout. Should the option not take,
/// the close stays a plain one.
pub(crate) fn set_linger_zero(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the fd is a live socket owned by `stream`; SO_LINGER reads
    // one `linger` at the pointer, a live local of the size passed.
    let status = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if status != 0 {
        log::debug!(
            "tcp: SO_LINGER 0 refused ({}); the failed connection closes plainly",
            std::io::Error::last_os_error()
        );
    }
}

/// A TCP socket connected to nothing: what a failed connection keeps in
/// place of its socket once that is reset.
pub(crate) fn unconnected() -> std::io::Result<TcpStream> {
    // SAFETY: socket() takes no pointers; its result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just made, owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(TcpStream::from(owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_back_ack_is_sent_after_reads_up_to_64_kib() {
        assert!(!owes_ack(0), "nothing read, nothing owed");
        assert!(owes_ack(1));
        assert!(owes_ack(8 * 1024), "under one loopback segment");
        assert!(owes_ack(SKIP_ACK_ABOVE));
        // A 64 KiB message and its frame header: more than any MSS.
        assert!(!owes_ack(64 * 1024 + 32));
        assert!(!owes_ack(usize::MAX));
    }
}
