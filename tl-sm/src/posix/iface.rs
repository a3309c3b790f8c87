//! The posix iface: its receive ring, and the peer segments its endpoints
//! have mapped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uct_core::{
    AmHandler, AmHandlers, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType,
    Result, SizeLimits, UctError,
};

use super::component::TRANSPORT_NAME;
use super::ep::PosixEp;
use super::fifo::{self, Ring, SLOT_DATA};
use crate::host;
use crate::segment::{self, Mapping};

pub(crate) const MAX_SHORT: usize = SLOT_DATA;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
pub(crate) const MAX_IOV: usize = 16;
pub(crate) const MAX_AM_HEADER: usize = 256;

/// Peer segments mapped so far, by name.
pub(crate) type SegmentCache = Arc<Mutex<HashMap<String, Arc<Mapping>>>>;

fn attrs() -> IfaceAttrs {
    IfaceAttrs {
        caps: Caps::PUT
            | Caps::GET
            | Caps::AM
            | Caps::ATOMIC32
            | Caps::ATOMIC64
            | Caps::ATOMIC_SWAP
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_IFACE
            | Caps::ERRHANDLE_PEER_FAILURE,
        put: SizeLimits {
            max_short: MAX_SHORT,
            max_bcopy: MAX_BCOPY,
            min_zcopy: 0,
            max_zcopy: MAX_ZCOPY,
            max_iov: MAX_IOV,
        },
        get: SizeLimits {
            max_short: MAX_SHORT,
            max_bcopy: MAX_BCOPY,
            min_zcopy: 0,
            max_zcopy: MAX_ZCOPY,
            max_iov: MAX_IOV,
        },
        am: SizeLimits {
            max_short: SLOT_DATA,
            max_bcopy: SLOT_DATA,
            min_zcopy: 0,
            max_zcopy: SLOT_DATA,
            max_iov: MAX_IOV,
        },
        max_am_header: MAX_AM_HEADER,
        mem_types: vec![MemoryType::Host],
        latency_ns: 80.0,
        bandwidth_bps: 12.0e9,
        overhead_ns: 10.0,
        iface_addr_len: 64,
        device_addr_len: host::device_address().len(),
        ep_addr_len: 0,
    }
}

/// A posix iface: the receive ring its peers push active messages into
/// (a segment named by its iface address), its handlers, and the peer
/// segments its endpoints have mapped.
pub struct PosixIface {
    md: Arc<dyn MemoryDomain>,
    ring: Ring,
    ring_name: String,
    attrs: IfaceAttrs,
    handlers: AmHandlers,
    cache: SegmentCache,
}

impl PosixIface {
    pub(crate) fn open(md: Arc<dyn MemoryDomain>) -> Result<PosixIface> {
        let ring_name = format!(
            "/uct-fifo-{}-{:016x}{:016x}",
            std::process::id(),
            host::random_u64(),
            host::random_u64()
        );
        let mapping =
            Mapping::create(&ring_name, fifo::ring_bytes(), 0, uct_core::Access::empty())?;
        Ok(PosixIface {
            md,
            ring: Ring::init(mapping)?,
            ring_name,
            attrs: attrs(),
            handlers: AmHandlers::new(TRANSPORT_NAME),
            cache: Arc::default(),
        })
    }
}

impl Drop for PosixIface {
    fn drop(&mut self) {
        self.ring.mapping().mark_dead();
        segment::unlink(&self.ring_name);
    }
}

impl Iface for PosixIface {
    fn transport(&self) -> &str {
        TRANSPORT_NAME
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
        self.ring_name.as_bytes().to_vec()
    }

    fn is_reachable(&self, device_addr: &[u8], _iface_addr: &[u8]) -> bool {
        host::parse_device_address(device_addr).is_some_and(|(boot, _)| boot == host::boot_id())
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        let EpParams::ToIface {
            device_addr,
            iface_addr,
        } = params
        else {
            return Err(UctError::InvalidParam(
                "posix connects to ifaces; pass EpParams::ToIface".into(),
            ));
        };
        let (boot, pid) = host::parse_device_address(&device_addr)
            .ok_or_else(|| UctError::InvalidParam("not a posix device address".into()))?;
        if boot != host::boot_id() {
            return Err(UctError::Unreachable(
                "the peer is on another host; posix reaches processes on this host only, use tcp or rc".into(),
            ));
        }
        let name = std::str::from_utf8(&iface_addr)
            .map_err(|_| UctError::InvalidParam("not a posix iface address".into()))?;
        let mapping = Mapping::open(name, 0).map_err(|e| match e {
            UctError::NoSuchRegion { .. } => {
                UctError::Unreachable(format!("posix peer iface {name} is closed"))
            }
            other => other,
        })?;
        let ring = Ring::attach(mapping)?;
        if ring.owner_pid() != pid {
            return Err(UctError::Unreachable(
                "the posix peer address names another process".into(),
            ));
        }
        Ok(Box::new(PosixEp::new(ring, pid, self.cache.clone())))
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.handlers.set(id, handler)
    }

    fn progress(&mut self) -> usize {
        // The ring and the handlers are separate fields: the drain closure
        // borrows only the handlers.
        let handlers = &mut self.handlers;
        self.ring.drain(|id, data| {
            handlers.deliver(id, data);
        })
    }
}
