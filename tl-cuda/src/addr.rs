//! Addresses of cuda_copy ifaces: the device address names this process
//! (its pid and a number drawn once, as pids repeat across pid namespaces)
//! and the iface address an iface id, looked up in this process's
//! directory. cuda_copy moves memory inside one process only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::iface::Shared;

/// Bytes of a device address: pid (4) and nonce (8).
pub const DEVICE_ADDR_LEN: usize = 12;
/// Bytes of an iface address: the iface id.
pub const IFACE_ADDR_LEN: usize = 8;

/// This process, as a device address.
pub fn this_process() -> [u8; DEVICE_ADDR_LEN] {
    static NONCE: OnceLock<u64> = OnceLock::new();
    let nonce = *NONCE.get_or_init(|| {
        let mut b = [0u8; 8];
        if getrandom::fill(&mut b).is_err() {
            // Distinct per process start, which is all it must be.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            b = (t ^ (&b as *const _ as u64)).to_le_bytes();
        }
        u64::from_le_bytes(b)
    });
    let mut addr = [0u8; DEVICE_ADDR_LEN];
    addr[..4].copy_from_slice(&std::process::id().to_le_bytes());
    addr[4..].copy_from_slice(&nonce.to_le_bytes());
    addr
}

/// What a pair of addresses names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// An iface of this process.
    Here(u64),
    /// Another process, by pid.
    Elsewhere(u32),
}

/// Parses a device and iface address; `None` when the lengths are wrong.
pub fn parse(device_addr: &[u8], iface_addr: &[u8]) -> Option<Target> {
    let process: [u8; DEVICE_ADDR_LEN] = device_addr.try_into().ok()?;
    let id = u64::from_le_bytes(iface_addr.try_into().ok()?);
    if process == this_process() {
        Some(Target::Here(id))
    } else {
        let pid: [u8; 4] = process[..4].try_into().ok()?;
        Some(Target::Elsewhere(u32::from_le_bytes(pid)))
    }
}

type Directory = Mutex<HashMap<u64, Weak<Shared>>>;

fn directory() -> &'static Directory {
    static DIR: OnceLock<Directory> = OnceLock::new();
    DIR.get_or_init(Default::default)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Enters an iface in the directory; returns its id.
pub(crate) fn enter(shared: &Arc<Shared>) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    directory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, Arc::downgrade(shared));
    id
}

/// Takes an iface out of the directory.
pub(crate) fn leave(id: u64) {
    directory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
}

/// The open iface `id` of this process.
pub(crate) fn lookup(id: u64) -> Option<Arc<Shared>> {
    directory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .and_then(Weak::upgrade)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_this_process_or_another() {
        let here = this_process();
        assert_eq!(parse(&here, &7u64.to_le_bytes()), Some(Target::Here(7)));
        let mut other = here;
        other[4] ^= 1;
        let pid = std::process::id();
        assert_eq!(
            parse(&other, &7u64.to_le_bytes()),
            Some(Target::Elsewhere(pid))
        );
        assert_eq!(parse(&here[..11], &7u64.to_le_bytes()), None);
        assert_eq!(parse(&here, &[0u8; 7]), None);
    }
}
