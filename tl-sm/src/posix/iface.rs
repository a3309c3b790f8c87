//! The posix iface: its receive ring, and the peer segments its endpoints
//! have mapped.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uct_core::{
    AmHandler, AmHandlers, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType,
    Result, SizeLimits, UctError,
};

use super::component::TRANSPORT_NAME;
use super::ep::PosixEp;
use super::fifo::{self, Ring, SLOT_DATA};
use super::health::{Health, Watchlist};
use crate::host;
use crate::segment::{Mapping, Peers};

pub(crate) const MAX_SHORT: usize = SLOT_DATA;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
pub(crate) const MAX_IOV: usize = 16;
pub(crate) const MAX_AM_HEADER: usize = 256;

/// Peer segments mapped so far, by owner pid, descriptor and whether the
/// mapping is writable.
pub(crate) type SegmentCache = Arc<Mutex<HashMap<(u32, u32, bool), Arc<Mapping>>>>;

/// A posix iface address: the descriptor of the ring's segment in the
/// owner (the device address carries its pid) and the secret in the
/// segment's header, which tells this ring from a later one on the same
/// descriptor number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAddress {
    /// The owner's descriptor of the ring's segment.
    pub fd: u32,
    /// The secret in the segment's header.
    pub secret: u64,
}

impl RingAddress {
    /// Bytes of an encoded address.
    pub const LEN: usize = 12;

    /// The address as bytes: fd then secret, little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.fd.to_le_bytes().to_vec();
        bytes.extend_from_slice(&self.secret.to_le_bytes());
        bytes
    }

    /// Decodes [`encode`](Self::encode)'s bytes; anything else is `None`.
    pub fn decode(bytes: &[u8]) -> Option<RingAddress> {
        if bytes.len() != Self::LEN {
            return None;
        }
        let (fd, secret) = bytes.split_at(4);
        Some(RingAddress {
            fd: u32::from_le_bytes(fd.try_into().ok()?),
            secret: u64::from_le_bytes(secret.try_into().ok()?),
        })
    }
}

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
        iface_addr_len: RingAddress::LEN,
        device_addr_len: host::device_address().len(),
        ep_addr_len: 0,
    }
}

/// A posix iface: the receive ring its peers push active messages into
/// (a segment its iface address names), its handlers, and the peer
/// segments its endpoints have mapped.
pub struct PosixIface {
    md: Arc<dyn MemoryDomain>,
    ring: Ring,
    /// Keeps the ring's segment open for peers.
    ring_fd: OwnedFd,
    address: RingAddress,
    attrs: IfaceAttrs,
    handlers: AmHandlers,
    cache: SegmentCache,
    /// Its endpoints' peers, probed from progress.
    watchlist: Watchlist,
    /// UCT_POSIX_PEER_TIMEOUT, for its endpoints.
    peer_timeout: Duration,
}

impl PosixIface {
    pub(crate) fn open(md: Arc<dyn MemoryDomain>) -> Result<PosixIface> {
        let secret = host::random_u64();
        let (mapping, ring_fd) = Mapping::create(
            "uct-posix-ring",
            fifo::ring_bytes(),
            secret,
            uct_core::Access::empty(),
            Peers::ReadWrite,
        )?;
        let address = RingAddress {
            fd: ring_fd.as_raw_fd() as u32,
            secret,
        };
        Ok(PosixIface {
            md,
            ring: Ring::init(mapping)?,
            ring_fd,
            address,
            attrs: attrs(),
            handlers: AmHandlers::new(TRANSPORT_NAME),
            cache: Arc::default(),
            watchlist: Watchlist::default(),
            peer_timeout: super::component::peer_timeout(),
        })
    }
}

impl Drop for PosixIface {
    fn drop(&mut self) {
        // Peers that still map the ring see it closed; the descriptor closes
        // after this, so no new peer opens it.
        self.ring.mapping().mark_dead();
        let _ = &self.ring_fd;
    }
}

/// Maps the ring of process `pid` at `addr` and checks that it is the one
/// the address names: its secret, its geometry, its owner.
fn attach(pid: u32, addr: RingAddress) -> Result<Ring> {
    let mapping = Mapping::open(pid, addr.fd, 0, Peers::ReadWrite).map_err(|e| match e {
        UctError::NoSuchRegion { .. } => {
            UctError::Unreachable(format!("the posix iface of process {pid} is closed"))
        }
        UctError::BadRkey(why) => {
            UctError::Unreachable(format!("process {pid}'s posix iface address: {why}"))
        }
        other => other,
    })?;
    // Our mapping's size first: a short segment is refused for what it is,
    // whatever its header claims.
    let ring = Ring::attach(mapping)?;
    if !ring.mapping().view(addr.secret).is_valid() || ring.mapping().is_dead() {
        return Err(UctError::Unreachable(format!(
            "the posix iface address names no open ring of process {pid} (a closed iface whose descriptor was reused?)"
        )));
    }
    if ring.owner_pid() != pid {
        return Err(UctError::Unreachable(format!(
            "the posix ring at that address belongs to process {}, not {pid}",
            ring.owner_pid()
        )));
    }
    Ok(ring)
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
        self.address.encode()
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
        let addr = RingAddress::decode(&iface_addr).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "a posix iface address has {} bytes, not {}",
                RingAddress::LEN,
                iface_addr.len()
            ))
        })?;
        let ring = attach(pid, addr)?;
        let health = Health::new(pid);
        self.watchlist.add(&health);
        Ok(Box::new(PosixEp::new(
            ring,
            pid,
            self.cache.clone(),
            health,
            self.peer_timeout,
        )))
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.handlers.set(id, handler)
    }

    fn progress(&mut self) -> usize {
        // The ring and the handlers are separate fields: the drain closure
        // borrows only the handlers.
        let handlers = &mut self.handlers;
        let n = self.ring.drain(|id, data| {
            handlers.deliver(id, data);
        });
        self.watchlist.tick();
        n
    }
}
