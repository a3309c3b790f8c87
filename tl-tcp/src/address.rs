//! tcp addresses. The device address is the interface's IP as 16 bytes
//! (IPv4 mapped into IPv6). The iface address is versioned: version (1
//! byte, [`IFACE_ADDR_VERSION`]), the listening port (2 bytes) and the
//! iface's cookie (8 bytes), little-endian. The cookie is drawn at random
//! when the iface opens; a peer learns it only from the address exchange,
//! and echoes it in its Hello, so that the iface knows who connects got its
//! address legitimately (see `hello.rs`). An endpoint's address is its
//! iface's.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use uct_core::UctError;

/// Length of a device address.
pub const DEVICE_ADDR_LEN: usize = 16;
/// Version of the iface address layout this build writes and reads.
pub const IFACE_ADDR_VERSION: u8 = 1;
/// Length of an iface address (and of an endpoint address).
pub const IFACE_ADDR_LEN: usize = 11;

/// A peer iface: where it listens, and its cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    pub sock: SocketAddr,
    pub cookie: u64,
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.sock)
    }
}

/// Why bytes are not a tcp address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressError {
    /// The device address is not 16 bytes.
    DeviceLength(usize),
    /// The iface address is not IFACE_ADDR_LEN bytes.
    IfaceLength(usize),
    /// The iface address has another layout version.
    Version(u8),
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressError::DeviceLength(n) => write!(
                f,
                "not a tcp device address: {n} bytes, expected {DEVICE_ADDR_LEN} (an IP); was it made by another transport?"
            ),
            AddressError::IfaceLength(n) => write!(
                f,
                "not a tcp iface address: {n} bytes, expected {IFACE_ADDR_LEN} (version, port, cookie); was it made by another transport or an older uct-rs?"
            ),
            AddressError::Version(v) => write!(
                f,
                "tcp iface address of layout version {v}, this build reads version {IFACE_ADDR_VERSION}; run the same uct-rs version on both sides"
            ),
        }
    }
}

impl std::error::Error for AddressError {}

impl From<AddressError> for UctError {
    fn from(e: AddressError) -> Self {
        UctError::InvalidParam(e.to_string())
    }
}

/// The 16 bytes of a device address.
pub fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP of a device address's 16 bytes (IPv4 when mapped).
pub fn ip_of(bytes: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(bytes);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// An iface address: where the iface listens and its cookie.
pub fn iface_addr(port: u16, cookie: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(IFACE_ADDR_LEN);
    out.push(IFACE_ADDR_VERSION);
    out.extend_from_slice(&port.to_le_bytes());
    out.extend_from_slice(&cookie.to_le_bytes());
    out
}

/// The peer iface that a device and an iface address name.
pub fn parse_addr(device_addr: &[u8], iface_addr: &[u8]) -> Result<PeerAddr, AddressError> {
    let ip: [u8; 16] = device_addr
        .try_into()
        .map_err(|_| AddressError::DeviceLength(device_addr.len()))?;
    if iface_addr.len() != IFACE_ADDR_LEN {
        // A version byte we do not know says more than the length does.
        return match iface_addr.first() {
            Some(&v) if v != IFACE_ADDR_VERSION => Err(AddressError::Version(v)),
            _ => Err(AddressError::IfaceLength(iface_addr.len())),
        };
    }
    if iface_addr[0] != IFACE_ADDR_VERSION {
        return Err(AddressError::Version(iface_addr[0]));
    }
    let port = u16::from_le_bytes([iface_addr[1], iface_addr[2]]);
    let mut cookie = [0u8; 8];
    cookie.copy_from_slice(&iface_addr[3..]);
    Ok(PeerAddr {
        sock: SocketAddr::new(ip_of(ip), port),
        cookie: u64::from_le_bytes(cookie),
    })
}

/// A random cookie for a new iface.
pub(crate) fn new_cookie() -> Result<u64, UctError> {
    let mut bytes = [0u8; 8];
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: the pointer and length name the unfilled tail of `bytes`,
        // a live local array; getrandom writes at most that many bytes.
        let n = unsafe {
            libc::getrandom(
                bytes[at..].as_mut_ptr() as *mut libc::c_void,
                bytes.len() - at,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(UctError::io(
                "tcp: draw the iface cookie (getrandom); the kernel has no entropy source",
                e,
            ));
        }
        at += n as usize;
    }
    Ok(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_round_trips_and_every_malformed_one_is_named() {
        let ip = ip_bytes("127.0.0.1".parse().unwrap());
        let a = parse_addr(&ip, &iface_addr(4242, 0xfeed)).unwrap();
        assert_eq!(a.sock, "127.0.0.1:4242".parse().unwrap());
        assert_eq!(a.cookie, 0xfeed);
        let v6 = ip_bytes("::1".parse().unwrap());
        assert!(parse_addr(&v6, &iface_addr(1, 2)).unwrap().sock.is_ipv6());

        assert_eq!(
            parse_addr(&ip[..4], &iface_addr(1, 2)),
            Err(AddressError::DeviceLength(4))
        );
        // The 2-byte port of the unversioned layout.
        assert_eq!(
            parse_addr(&ip, &4242u16.to_le_bytes()),
            Err(AddressError::Version(0x92))
        );
        assert_eq!(parse_addr(&ip, &[]), Err(AddressError::IfaceLength(0)));
        assert_eq!(parse_addr(&ip, &[1, 2]), Err(AddressError::IfaceLength(2)));
        let mut v2 = iface_addr(1, 2);
        v2[0] = 2;
        assert_eq!(parse_addr(&ip, &v2), Err(AddressError::Version(2)));
        let mut long = iface_addr(1, 2);
        long.push(0);
        assert_eq!(parse_addr(&ip, &long), Err(AddressError::IfaceLength(12)));
        for e in [
            AddressError::DeviceLength(4),
            AddressError::IfaceLength(2),
            AddressError::Version(2),
        ] {
            assert!(UctError::from(e).to_string().contains("tcp"));
        }
    }

    #[test]
    fn cookies_differ() {
        let a = new_cookie().unwrap();
        let b = new_cookie().unwrap();
        assert_ne!(a, b);
    }
}
