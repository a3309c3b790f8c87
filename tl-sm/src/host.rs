//! Facts about this host and its processes that both sm transports need.

use std::sync::OnceLock;

use uct_core::{DeviceType, TlResource, UctError};

/// Identifies this boot of this machine; peers with another id are on
/// another host (or another boot) and cannot be reached through memory.
pub fn boot_id() -> &'static [u8] {
    static ID: OnceLock<Vec<u8>> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().as_bytes().to_vec())
            .unwrap_or_else(|_| b"unknown-boot".to_vec())
    })
}

/// Whether process `pid` still exists.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is sent, and no memory of this process is touched.
    let status = unsafe { libc::kill(pid as libc::pid_t, 0) };
    status == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// An endpoint error for a peer process that is gone.
pub fn peer_gone(transport: &str, pid: u32) -> UctError {
    UctError::EndpointFailed(format!("{transport} peer process {pid} is gone"))
}

/// A random 64-bit value for secrets and names.
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy source: fall back to time and address bits, still
        // per-run, never a constant.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return nanos ^ (&bytes as *const _ as u64).rotate_left(29);
    }
    u64::from_ne_bytes(bytes)
}

/// Splits a device address into boot id and pid, as built by
/// [`device_address`].
pub fn parse_device_address(addr: &[u8]) -> Option<(&[u8], u32)> {
    if addr.len() < 4 {
        return None;
    }
    let (boot, pid) = addr.split_at(addr.len() - 4);
    Some((boot, u32::from_le_bytes(pid.try_into().ok()?)))
}

/// This process's device address: boot id, then pid.
pub fn device_address() -> Vec<u8> {
    let mut addr = boot_id().to_vec();
    addr.extend_from_slice(&std::process::id().to_le_bytes());
    addr
}

/// The one device of an sm transport: this host's memory.
pub fn memory_resource(transport: &str) -> TlResource {
    TlResource {
        transport: transport.into(),
        device: "memory".into(),
        device_type: DeviceType::SharedMemory,
        system_device: None,
    }
}
