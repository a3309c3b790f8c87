//! The cma iface: only an address (this process); cma receives nothing
//! itself, the kernel moves the data.

use std::sync::Arc;

use uct_core::{
    AmHandler, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType, Result,
    SizeLimits, UctError,
};

use super::ep::CmaEp;
use crate::host;

pub(crate) const MAX_SHORT: usize = 8 * 1024;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
pub(crate) const MAX_IOV: usize = 16;

fn attrs() -> IfaceAttrs {
    let lim = SizeLimits {
        max_short: MAX_SHORT,
        max_bcopy: MAX_BCOPY,
        min_zcopy: 0,
        max_zcopy: MAX_ZCOPY,
        max_iov: MAX_IOV,
    };
    IfaceAttrs {
        // No AM and no atomics: process_vm_* only copies.
        caps: Caps::PUT
            | Caps::GET
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_IFACE
            | Caps::ERRHANDLE_PEER_FAILURE
            // process_vm_* runs in the initiator's system call.
            | Caps::PASSIVE_TARGET,
        put: lim,
        get: lim,
        am: SizeLimits::default(),
        max_am_header: 0,
        mem_types: vec![MemoryType::Host],
        latency_ns: 500.0,
        bandwidth_bps: 10.0e9,
        overhead_ns: 300.0,
        iface_addr_len: 0,
        device_addr_len: host::device_address().len(),
        ep_addr_len: 0,
    }
}

/// A cma iface.
pub struct CmaIface {
    md: Arc<dyn MemoryDomain>,
    attrs: IfaceAttrs,
}

impl CmaIface {
    pub(crate) fn open(md: Arc<dyn MemoryDomain>) -> CmaIface {
        CmaIface { md, attrs: attrs() }
    }
}

impl Iface for CmaIface {
    fn transport(&self) -> &str {
        "cma"
    }

    fn device(&self) -> &str {
        "memory"
    }

    fn attrs(&self) -> &IfaceAttrs {
        &self.attrs
    }

    fn md(&self) -> &Arc<dyn MemoryDomain> {
        &self.md
    }

    fn device_address(&self) -> Vec<u8> {
        host::device_address()
    }

    fn iface_address(&self) -> Vec<u8> {
        Vec::new()
    }

    fn is_reachable(&self, device_addr: &[u8], _iface_addr: &[u8]) -> bool {
        host::parse_device_address(device_addr)
            .is_some_and(|(boot, pid)| boot == host::boot_id() && host::pid_alive(pid))
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        let EpParams::ToIface { device_addr, .. } = params else {
            return Err(UctError::InvalidParam(
                "cma connects to ifaces; pass EpParams::ToIface".into(),
            ));
        };
        let (boot, pid) = host::parse_device_address(&device_addr)
            .ok_or_else(|| UctError::InvalidParam("not a cma device address".into()))?;
        if boot != host::boot_id() {
            return Err(UctError::Unreachable(
                "the peer is on another host; cma reaches processes on this host only, use tcp or rc".into(),
            ));
        }
        if !host::pid_alive(pid) {
            return Err(UctError::Unreachable(format!(
                "cma peer process {pid} does not exist"
            )));
        }
        Ok(Box::new(CmaEp::new(pid)))
    }

    fn set_am_handler(&mut self, _id: u8, _handler: AmHandler) -> Result<()> {
        Err(UctError::unsupported(
            "cma",
            "active messages (cma only moves memory; use posix for messages on this host)",
        ))
    }

    fn progress(&mut self) -> usize {
        0
    }
}
