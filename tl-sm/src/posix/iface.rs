//! The posix iface: its receive ring, and the peer segments its endpoints
//! have mapped.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use uct_core::{
    AmHandler, AmHandlers, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType,
    Result, SizeLimits, UctError,
};

use super::cache::SegmentCache;
use super::component::TRANSPORT_NAME;
use super::ep::PosixEp;
use super::fifo::{self, Ring, SLOT_DATA};
use super::health::{Health, Watchlist};
use super::ident;
use crate::host;
use crate::segment::{Mapping, Peers};

pub(crate) const MAX_SHORT: usize = SLOT_DATA;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
pub(crate) const MAX_IOV: usize = 16;
pub(crate) const MAX_AM_HEADER: usize = 256;

/// A posix iface address: the owner's descriptors (the device address
/// carries its pid) of the ring's segment and of its identity page
/// ([`ident`](super::ident)), and the secret in the identity page's header,
/// which tells this iface from a later one on the same descriptor numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAddress {
    /// The owner's descriptor of the ring's segment.
    pub fd: u32,
    /// The owner's descriptor of the iface's identity page, which peers
    /// map read-only.
    pub id_fd: u32,
    /// The secret in the identity page's header.
    pub secret: u64,
}

impl RingAddress {
    /// Bytes of an encoded address.
    pub const LEN: usize = 16;

    /// The address as bytes: fd, id_fd, then secret, little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.fd.to_le_bytes().to_vec();
        bytes.extend_from_slice(&self.id_fd.to_le_bytes());
        bytes.extend_from_slice(&self.secret.to_le_bytes());
        bytes
    }

    /// Decodes [`encode`](Self::encode)'s bytes; anything else is `None`.
    pub fn decode(bytes: &[u8]) -> Option<RingAddress> {
        if bytes.len() != Self::LEN {
            return None;
        }
        let (fd, rest) = bytes.split_at(4);
        let (id_fd, secret) = rest.split_at(4);
        Some(RingAddress {
            fd: u32::from_le_bytes(fd.try_into().ok()?),
            id_fd: u32::from_le_bytes(id_fd.try_into().ok()?),
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
            | Caps::ERRHANDLE_PEER_FAILURE
            // Puts, gets and atomics are the initiator's own accesses to
            // the mapped segment.
            | Caps::PASSIVE_TARGET,
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
    /// The identity page: marked dead when the iface closes.
    ident: Mapping,
    /// Keeps the identity page open for peers.
    ident_fd: OwnedFd,
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
            (secret, 0),
            uct_core::Access::empty(),
            Peers::ReadWrite,
        )?;
        let (ident, ident_fd) = ident::create(secret, ring_fd.as_fd())?;
        let address = RingAddress {
            fd: ring_fd.as_raw_fd() as u32,
            id_fd: ident_fd.as_raw_fd() as u32,
            secret,
        };
        let peer_timeout = super::component::peer_timeout();
        let mut ring = Ring::init(mapping)?;
        ring.set_stuck_after(stuck_after(peer_timeout));
        Ok(PosixIface {
            md,
            ring,
            ring_fd,
            ident,
            ident_fd,
            address,
            attrs: attrs(),
            handlers: AmHandlers::new(TRANSPORT_NAME),
            cache: SegmentCache::default(),
            watchlist: Watchlist::default(),
            peer_timeout,
        })
    }
}

/// How long a slot of our ring may stay claimed and unpublished before it
/// is skipped as a dead sender's: well within the peer timeout, after
/// which the other senders would take us for stalled, and at most 1 s (an
/// honest sender publishes within microseconds of its claim).
fn stuck_after(peer_timeout: std::time::Duration) -> std::time::Duration {
    (peer_timeout / 2).min(std::time::Duration::from_secs(1))
}

impl Drop for PosixIface {
    fn drop(&mut self) {
        // Peers that still map the identity page see the iface closed; the
        // descriptors close after this, so no new peer opens them.
        self.ident.mark_dead();
        self.ring.mapping().mark_dead();
        let _ = (&self.ring_fd, &self.ident_fd);
    }
}

/// Maps the identity page and the ring of process `pid` at `addr`: the
/// page's secret, owner and state (memory only its owner writes), then the
/// ring it names, of a ring's size.
fn attach(pid: u32, addr: RingAddress) -> Result<(Ring, Mapping)> {
    let (ident, ring_id) = ident::open(pid, addr)?;
    let mapping =
        Mapping::open_shared(pid, addr.fd, fifo::ring_bytes(), ring_id).map_err(|e| match e {
            UctError::NoSuchRegion { .. } => {
                UctError::Unreachable(format!("the posix iface of process {pid} is closed"))
            }
            UctError::BadRkey(why) => {
                UctError::Unreachable(format!("process {pid}'s posix iface address: {why}"))
            }
            other => other,
        })?;
    Ok((Ring::attach(mapping, pid)?, ident))
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
        let (ring, ident) = attach(pid, addr)?;
        let health = Health::new(pid);
        self.watchlist.add(&health);
        Ok(Box::new(PosixEp::new(
            ring,
            ident,
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
