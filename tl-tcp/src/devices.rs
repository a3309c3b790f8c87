//! Network interfaces usable by tcp: up, with an IPv4 address.

use std::net::{IpAddr, Ipv4Addr};

/// A network interface and the address tcp listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice {
    pub name: String,
    pub addr: IpAddr,
}

/// Every interface that is up and has an IPv4 address, loopback included.
pub fn list() -> Vec<NetDevice> {
    let mut out: Vec<NetDevice> = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        log::warn!(
            "tcp: getifaddrs failed: {}; no tcp devices",
            std::io::Error::last_os_error()
        );
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is non-null (loop condition) and a node of the list
        // getifaddrs returned, which lives until freeifaddrs below.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        if ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null (checked above) and points at a
        // sockaddr in the list.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family != libc::AF_INET {
            continue;
        }
        // SAFETY: sa_family is AF_INET, so getifaddrs stored a (suitably
        // aligned) sockaddr_in at ifa_addr; it lives as long as the list.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is non-null (checked above) and a nul-terminated
        // string owned by the list; it is copied before the list is freed.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        if !out.iter().any(|d| d.name == name) {
            out.push(NetDevice {
                name,
                addr: IpAddr::V4(ip),
            });
        }
    }
    // SAFETY: frees the list from getifaddrs exactly once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}
