//! tcp addresses: the device address is the interface's IP as 16 bytes
//! (IPv4 mapped into IPv6), the iface address the listening port as 2 bytes
//! little-endian. An endpoint's address is its iface's.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The 16 bytes of a device address.
pub(crate) fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Where a peer iface listens, from its device and iface addresses; None
/// when their lengths are wrong.
pub(crate) fn parse_addr(device_addr: &[u8], iface_addr: &[u8]) -> Option<SocketAddr> {
    let ip: [u8; 16] = device_addr.try_into().ok()?;
    let port = u16::from_le_bytes(iface_addr.try_into().ok()?);
    let v6 = Ipv6Addr::from(ip);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    Some(SocketAddr::new(ip, port))
}
