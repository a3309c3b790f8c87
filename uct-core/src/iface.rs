//! The transport interface: one transport on one device.

use std::sync::Arc;

use crate::ep::Endpoint;
use crate::error::Result;
use crate::md::MemoryDomain;
use crate::memory::MemoryType;

bitflags::bitflags! {
    /// What an iface can do.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Caps: u64 {
        /// Put from a small buffer inlined in the request.
        const PUT_SHORT = 1 << 0;
        /// Put copied through a transport buffer.
        const PUT_BCOPY = 1 << 1;
        /// Put straight from registered memory.
        const PUT_ZCOPY = 1 << 2;
        /// Get of a small value into a local buffer.
        const GET_SHORT = 1 << 3;
        /// Get copied through a transport buffer.
        const GET_BCOPY = 1 << 4;
        /// Get straight into registered memory.
        const GET_ZCOPY = 1 << 5;
        /// Active message with an 8-byte header and a small payload.
        const AM_SHORT = 1 << 6;
        /// Active message copied through a transport buffer.
        const AM_BCOPY = 1 << 7;
        /// Active message sent from registered memory.
        const AM_ZCOPY = 1 << 8;
        /// 32-bit atomics.
        const ATOMIC32 = 1 << 9;
        /// 64-bit atomics.
        const ATOMIC64 = 1 << 10;
        /// Flush: completes when every earlier operation has completed at the target.
        const FLUSH = 1 << 11;
        /// Fence: orders the operations before it before those after it.
        const FENCE = 1 << 12;
        /// Endpoints connect to a peer iface by its address.
        const CONNECT_TO_IFACE = 1 << 13;
        /// Endpoints connect to a peer endpoint by its address.
        const CONNECT_TO_EP = 1 << 14;
        /// Peer failure is reported on the endpoint instead of hanging.
        const ERRHANDLE_PEER_FAILURE = 1 << 15;
        /// Atomic swap (fetch-and-store), besides add, fetch-add and
        /// compare-and-swap; verbs NICs have no native swap.
        const ATOMIC_SWAP = 1 << 16;
        /// Put zcopy with 32-bit immediate data, delivered to the target
        /// iface's immediate handler after the data (RDMA WRITE WITH
        /// IMMEDIATE).
        const PUT_IMM = 1 << 17;
        /// Puts, gets and atomics reach target memory and complete without
        /// the target iface's progress, and so does any number of flushes
        /// of an endpoint that carried only those: a NIC (rc) or the
        /// initiator itself (posix, cma, self) does the work. A target
        /// with nothing else to do may then sleep instead of progressing
        /// (perftest's server does, in one-sided tests). Not active
        /// messages or puts with immediate data, which the target's
        /// handlers take in its progress (on rc each takes one of its
        /// receive buffers until then).
        const PASSIVE_TARGET = 1 << 18;
    }
}

impl Caps {
    /// Every put capability.
    pub const PUT: Caps = Caps::PUT_SHORT
        .union(Caps::PUT_BCOPY)
        .union(Caps::PUT_ZCOPY);
    /// Every get capability.
    pub const GET: Caps = Caps::GET_SHORT
        .union(Caps::GET_BCOPY)
        .union(Caps::GET_ZCOPY);
    /// Every active-message capability.
    pub const AM: Caps = Caps::AM_SHORT.union(Caps::AM_BCOPY).union(Caps::AM_ZCOPY);
}

/// Size limits of one operation class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeLimits {
    /// Largest short operation, in bytes (inlined in the request).
    pub max_short: usize,
    /// Largest bcopy operation, in bytes.
    pub max_bcopy: usize,
    /// Smallest size at which zcopy pays off.
    pub min_zcopy: usize,
    /// Largest zcopy operation, in bytes.
    pub max_zcopy: usize,
    /// Most iov entries in one zero-copy operation.
    pub max_iov: usize,
}

/// Attributes of an open iface.
#[derive(Debug, Clone)]
pub struct IfaceAttrs {
    /// What the iface can do.
    pub caps: Caps,
    /// Size limits of puts.
    pub put: SizeLimits,
    /// Size limits of gets.
    pub get: SizeLimits,
    /// Size limits of active messages.
    pub am: SizeLimits,
    /// Largest active-message header in a zero-copy AM.
    pub max_am_header: usize,
    /// Memory types the transport can touch.
    pub mem_types: Vec<MemoryType>,
    /// Estimated one-way latency in nanoseconds.
    pub latency_ns: f64,
    /// Estimated bandwidth in bytes per second.
    pub bandwidth_bps: f64,
    /// Overhead of posting one operation in nanoseconds.
    pub overhead_ns: f64,
    /// Length of the iface address.
    pub iface_addr_len: usize,
    /// Length of the device address.
    pub device_addr_len: usize,
    /// Length of an endpoint address (CONNECT_TO_EP).
    pub ep_addr_len: usize,
}

/// Kind of device a transport runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    /// Inside one process.
    SelfLoop,
    /// Shared memory between processes on one host.
    SharedMemory,
    /// A network interface.
    Network,
    /// An accelerator.
    Accelerator,
}

impl DeviceType {
    /// Lower-case name for listings.
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::SelfLoop => "self",
            DeviceType::SharedMemory => "shared memory",
            DeviceType::Network => "network",
            DeviceType::Accelerator => "accelerator",
        }
    }
}

/// A transport on a device, as found by its memory domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlResource {
    /// Transport name, such as `posix` or `rc`.
    pub transport: String,
    /// Device name, such as `memory`, `lo` or `rxe0`.
    pub device: String,
    /// What kind of device it is.
    pub device_type: DeviceType,
    /// PCI address or other system device, where known.
    pub system_device: Option<String>,
}

/// How to reach the peer of a new endpoint.
#[derive(Debug, Clone)]
pub enum EpParams {
    /// Connect to a peer iface by its addresses (CONNECT_TO_IFACE).
    ToIface {
        /// The peer's [`Iface::device_address`].
        device_addr: Vec<u8>,
        /// The peer's [`Iface::iface_address`].
        iface_addr: Vec<u8>,
    },
    /// Create an endpoint to be connected later to a peer endpoint
    /// (CONNECT_TO_EP) with [`Endpoint::connect_to_ep`].
    Unconnected,
}

/// An incoming active message: its id and bytes. For AM short the bytes are
/// the 8-byte header (little-endian) followed by the payload.
#[derive(Debug)]
pub struct AmMessage<'a> {
    /// The id it was sent with.
    pub id: u8,
    /// Its bytes, valid only during the handler call.
    pub data: &'a [u8],
}

/// Active-message handler, called from `progress` of the receiving iface.
pub type AmHandler = Box<dyn FnMut(AmMessage<'_>) + Send>;

/// An incoming put with immediate data
/// ([`Endpoint::put_zcopy_imm`]), as the
/// target iface's immediate handler sees it: the write's data is already in
/// place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmEvent {
    /// The 32-bit immediate the writer chose.
    pub imm: u32,
    /// The bytes that write carried (for rc: the work completion's
    /// `byte_len`).
    pub len: usize,
}

/// Immediate-data handler, called from `progress` of the target iface once
/// per put with immediate data, in the order the puts were posted on one
/// endpoint.
pub type ImmHandler = Box<dyn FnMut(ImmEvent) + Send>;

/// The immediate-data handler of an iface, or none: every transport with
/// [`Caps::PUT_IMM`] delivers through [`deliver`](ImmHandlerSlot::deliver),
/// so an immediate that arrives with no handler (a peer may send one at any
/// time) is dropped in one place, with one warning rather than one per
/// immediate.
pub struct ImmHandlerSlot {
    handler: Option<ImmHandler>,
    transport: String,
    dropped: u64,
}

impl ImmHandlerSlot {
    /// No handler yet; `transport` names the iface in the warning.
    pub fn new(transport: impl Into<String>) -> Self {
        ImmHandlerSlot {
            handler: None,
            transport: transport.into(),
            dropped: 0,
        }
    }

    /// Installs `handler`, replacing any earlier one.
    pub fn set(&mut self, handler: ImmHandler) {
        self.handler = Some(handler);
    }

    /// Whether a handler is installed.
    pub fn has(&self) -> bool {
        self.handler.is_some()
    }

    /// Immediates dropped so far for want of a handler.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Calls the handler with `event`, or drops it when there is none;
    /// returns whether a handler ran.
    #[inline]
    pub fn deliver(&mut self, event: ImmEvent) -> bool {
        match self.handler.as_mut() {
            Some(handler) => {
                handler(event);
                true
            }
            None => {
                self.drop_event(event);
                false
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn drop_event(&mut self, event: ImmEvent) {
        self.dropped += 1;
        if self.dropped == 1 {
            log::warn!(
                "{}: dropped immediate {:#x} ({} bytes): no immediate handler set (set_imm_handler); later ones are dropped silently",
                self.transport,
                event.imm,
                event.len
            );
        } else {
            log::debug!(
                "{}: dropped immediate {:#x} ({} bytes), {} so far",
                self.transport,
                event.imm,
                event.len,
                self.dropped
            );
        }
    }
}

impl std::fmt::Debug for ImmHandlerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImmHandlerSlot")
            .field("transport", &self.transport)
            .field("set", &self.handler.is_some())
            .field("dropped", &self.dropped)
            .finish()
    }
}

/// Number of active-message ids.
pub const AM_ID_MAX: usize = 32;

/// The active-message handler table of an iface: one optional handler per
/// id below [`AM_ID_MAX`]. Every transport keeps one and delivers through
/// [`deliver`](AmHandlers::deliver), so ids are checked in one place.
pub struct AmHandlers {
    slots: Vec<Option<AmHandler>>,
    transport: String,
}

impl AmHandlers {
    /// An empty table; `transport` names the iface in the warning logged for
    /// a message that has no handler.
    pub fn new(transport: impl Into<String>) -> Self {
        AmHandlers {
            slots: (0..AM_ID_MAX).map(|_| None).collect(),
            transport: transport.into(),
        }
    }

    /// Installs the handler for `id`; an id at or above [`AM_ID_MAX`] is an
    /// error that names the limit.
    pub fn set(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        let slot = self.slots.get_mut(id as usize).ok_or_else(|| {
            crate::error::UctError::InvalidParam(format!(
                "active message id {id} is not below {AM_ID_MAX}"
            ))
        })?;
        *slot = Some(handler);
        Ok(())
    }

    /// Whether a handler is installed for `id`.
    pub fn has(&self, id: u8) -> bool {
        matches!(self.slots.get(id as usize), Some(Some(_)))
    }

    /// Calls the handler of `id` with `data`. A message with no handler (or
    /// an id out of range, which a peer may send) is dropped with a warning;
    /// returns whether a handler ran.
    #[inline]
    pub fn deliver(&mut self, id: u8, data: &[u8]) -> bool {
        match self.slots.get_mut(id as usize).and_then(Option::as_mut) {
            Some(handler) => {
                handler(AmMessage { id, data });
                true
            }
            None => {
                self.dropped(id, data.len());
                false
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn dropped(&self, id: u8, len: usize) {
        log::warn!(
            "{}: dropped active message {id} ({len} bytes): no handler set",
            self.transport
        );
    }
}

impl std::fmt::Debug for AmHandlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect();
        f.debug_struct("AmHandlers")
            .field("transport", &self.transport)
            .field("ids", &ids)
            .finish()
    }
}

/// Parameters of a new iface.
#[derive(Debug, Clone, Default)]
pub struct IfaceParams {
    /// Bytes of receive buffering, where the transport has any (0: default).
    pub rx_buffer: usize,
}

/// One transport on one device. Owned by one thread at a time, which drives
/// [`progress`](Iface::progress).
pub trait Iface: Send {
    /// Transport name.
    fn transport(&self) -> &str;
    /// Device name.
    fn device(&self) -> &str;
    /// Capabilities and limits.
    fn attrs(&self) -> &IfaceAttrs;
    /// The memory domain whose memory this iface moves.
    fn md(&self) -> &Arc<dyn MemoryDomain>;
    /// This device's address, for peers (packed, opaque).
    fn device_address(&self) -> Vec<u8>;
    /// This iface's address, for peers (packed, opaque).
    fn iface_address(&self) -> Vec<u8>;
    /// Whether a peer with these addresses can be reached from here.
    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool;
    /// Creates an endpoint to a peer.
    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>>;
    /// Installs the handler for active messages with `id` (< [`AM_ID_MAX`]).
    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()>;
    /// Installs the handler for puts with immediate data
    /// ([`Caps::PUT_IMM`]), replacing any earlier one. It is called from
    /// this iface's [`progress`](Iface::progress), once per immediate write,
    /// in the order the writes were posted on one endpoint, and only after
    /// that write's data is visible in the target memory. Immediates that
    /// arrive while no handler is installed are dropped with a warning.
    /// tcp delivers immediates only from ifaces this one has connected an
    /// endpoint to (as rc's come only over a connection both sides made):
    /// create the endpoint back to the writer. Until then the writer's put
    /// with immediate data waits unexecuted (and what it sent after it),
    /// and the writer's endpoint fails after its peer timeout.
    fn set_imm_handler(&mut self, handler: ImmHandler) -> Result<()> {
        let _ = handler;
        Err(crate::error::UctError::unsupported(
            self.transport(),
            "put with immediate data (PUT_IMM)",
        ))
    }
    /// Drives receives and completions; returns how many events it handled.
    fn progress(&mut self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn am_handlers_deliver_to_the_installed_id_only() {
        let hits = Arc::new(AtomicUsize::new(0));
        let mut table = AmHandlers::new("test");
        let h = hits.clone();
        table
            .set(
                3,
                Box::new(move |m| {
                    assert_eq!(m.id, 3);
                    h.fetch_add(m.data.len(), Ordering::Relaxed);
                }),
            )
            .unwrap();
        assert!(table.has(3));
        assert!(!table.has(4));
        assert!(table.deliver(3, &[1, 2, 3]));
        assert!(!table.deliver(4, &[1]));
        assert!(!table.deliver(255, &[1]));
        assert_eq!(hits.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn imm_slot_delivers_to_its_handler_and_counts_drops() {
        let mut slot = ImmHandlerSlot::new("test");
        let ev = ImmEvent { imm: 7, len: 3 };
        assert!(!slot.has());
        assert!(!slot.deliver(ev));
        assert!(!slot.deliver(ev));
        assert_eq!(slot.dropped(), 2);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        slot.set(Box::new(move |e| s.lock().unwrap().push(e)));
        assert!(slot.has());
        assert!(slot.deliver(ev));
        assert_eq!(*seen.lock().unwrap(), vec![ev]);
        assert_eq!(slot.dropped(), 2);
    }

    #[test]
    fn am_handlers_refuse_ids_at_the_limit() {
        let mut table = AmHandlers::new("test");
        let err = table.set(AM_ID_MAX as u8, Box::new(|_| {})).unwrap_err();
        assert!(err.to_string().contains("not below 32"), "{err}");
        assert!(table.set(AM_ID_MAX as u8 - 1, Box::new(|_| {})).is_ok());
    }
}
