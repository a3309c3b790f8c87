//! The self iface: queues of incoming active messages and immediates and the
//! MD's region table, registered in a process-wide directory so endpoints can find them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::ep::SelfEp;
use crate::ep::Endpoint;
use crate::error::{Result, UctError};
use crate::iface::{
    AmHandler, AmHandlers, Caps, EpParams, Iface, IfaceAttrs, ImmEvent, ImmHandler, ImmHandlerSlot,
    SizeLimits,
};
use crate::md::MemoryDomain;
use crate::memory::MemoryType;
use crate::region_table::RegionTable;

/// Active messages queued to one iface before senders get NoResource.
pub const SELF_AM_QUEUE_LEN: usize = 1024;

/// Immediates (puts with immediate data) queued to one iface before writers
/// get NoResource.
pub const SELF_IMM_QUEUE_LEN: usize = 1024;

/// What endpoints share with the iface they target.
pub(super) struct SelfShared {
    /// The transport name (`self`, or a module's own, such as `loop`).
    pub(super) tl_name: &'static str,
    /// The region table of the iface's MD: remote accesses are checked and
    /// executed against it.
    pub(super) table: Arc<RegionTable>,
    /// Active messages and immediates waiting for the iface's `progress`,
    /// in one queue so that they are delivered in the order they were
    /// sent, as one connection delivers them.
    pub(super) incoming: Mutex<Incoming>,
}

/// One message for the target iface's `progress`.
pub(super) enum Event {
    /// An active message: its id and bytes.
    Am(u8, Vec<u8>),
    /// The immediate of a put whose data is already written.
    Imm(ImmEvent),
}

/// The queue of an iface, with what it holds of each kind: at most
/// [`SELF_AM_QUEUE_LEN`] messages and [`SELF_IMM_QUEUE_LEN`] immediates.
#[derive(Default)]
pub(super) struct Incoming {
    pub(super) events: VecDeque<Event>,
    pub(super) ams: usize,
    pub(super) imms: usize,
}

/// Every open self iface of this process, by iface id.
type Directory = Mutex<HashMap<u64, Weak<SelfShared>>>;

fn directory() -> &'static Directory {
    static DIR: OnceLock<Directory> = OnceLock::new();
    DIR.get_or_init(Default::default)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The open iface `id` of transport `tl_name`, if there is one.
pub(super) fn lookup(tl_name: &str, id: u64) -> Option<Arc<SelfShared>> {
    let dir = directory().lock().unwrap_or_else(|p| p.into_inner());
    dir.get(&id)
        .and_then(Weak::upgrade)
        .filter(|shared| shared.tl_name == tl_name)
}

/// The process id (device address, 4 bytes) and iface id (iface address,
/// 8 bytes) of a self address; None when the lengths are wrong.
/// This process, as self's device address names it: its pid and a random
/// number drawn once. The pid alone is not enough: processes in other pid
/// namespaces (containers) have the same pids, often 1.
fn this_process() -> [u8; 12] {
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
    let mut addr = [0u8; 12];
    addr[..4].copy_from_slice(&std::process::id().to_le_bytes());
    addr[4..].copy_from_slice(&nonce.to_le_bytes());
    addr
}

/// The iface id of a self address, when its device address is this
/// process's; `Err(pid)` when it names another process.
pub(super) fn parse_addresses(
    device_addr: &[u8],
    iface_addr: &[u8],
) -> Option<std::result::Result<u64, u32>> {
    let process: [u8; 12] = device_addr.try_into().ok()?;
    let iface_id = u64::from_le_bytes(iface_addr.try_into().ok()?);
    if process == this_process() {
        Some(Ok(iface_id))
    } else {
        Some(Err(u32::from_le_bytes(process[..4].try_into().ok()?)))
    }
}

pub(super) const MAX_SHORT: usize = 8 * 1024;
pub(super) const MAX_BCOPY: usize = 64 * 1024;
pub(super) const MAX_ZCOPY: usize = 1 << 30;
pub(super) const MAX_IOV: usize = 16;
pub(super) const MAX_AM_HEADER: usize = 256;

fn self_attrs() -> IfaceAttrs {
    let limits = |max_zcopy| SizeLimits {
        max_short: MAX_SHORT,
        max_bcopy: MAX_BCOPY,
        min_zcopy: 0,
        max_zcopy,
        max_iov: MAX_IOV,
    };
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
            | Caps::PUT_IMM
            // The initiator copies within its own process.
            | Caps::PASSIVE_TARGET,
        put: limits(MAX_ZCOPY),
        get: limits(MAX_ZCOPY),
        am: limits(MAX_BCOPY),
        max_am_header: MAX_AM_HEADER,
        mem_types: vec![MemoryType::Host],
        latency_ns: 0.0,
        bandwidth_bps: 6.0e9,
        overhead_ns: 10.0,
        iface_addr_len: 8,
        device_addr_len: 12,
        ep_addr_len: 0,
    }
}

/// A self iface: its entry in the process-wide directory, which endpoints
/// look up by iface id, and its active-message handlers.
pub struct SelfIface {
    id: u64,
    shared: Arc<SelfShared>,
    md: Arc<dyn MemoryDomain>,
    attrs: IfaceAttrs,
    handlers: AmHandlers,
    imm: ImmHandlerSlot,
}

impl SelfIface {
    pub(super) fn new(
        tl_name: &'static str,
        md: Arc<dyn MemoryDomain>,
        table: Arc<RegionTable>,
    ) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(SelfShared {
            tl_name,
            table,
            incoming: Mutex::new(Incoming::default()),
        });
        directory()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::downgrade(&shared));
        SelfIface {
            id,
            shared,
            md,
            attrs: self_attrs(),
            handlers: AmHandlers::new(tl_name),
            imm: ImmHandlerSlot::new(tl_name),
        }
    }
}

impl Drop for SelfIface {
    fn drop(&mut self) {
        directory()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Iface for SelfIface {
    fn transport(&self) -> &str {
        self.shared.tl_name
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
        this_process().to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.id.to_le_bytes().to_vec()
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        match parse_addresses(device_addr, iface_addr) {
            Some(Ok(iface_id)) => lookup(self.shared.tl_name, iface_id).is_some(),
            _ => false,
        }
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        let EpParams::ToIface {
            device_addr,
            iface_addr,
        } = params
        else {
            return Err(UctError::InvalidParam(format!(
                "{} connects to ifaces only; pass EpParams::ToIface",
                self.shared.tl_name
            )));
        };
        let found = parse_addresses(&device_addr, &iface_addr).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "not a {} address (expected 12 + 8 bytes, got {} + {})",
                self.shared.tl_name,
                device_addr.len(),
                iface_addr.len()
            ))
        })?;
        let iface_id = found.map_err(|pid| {
            UctError::Unreachable(format!(
                "{} reaches ifaces of its own process only (the peer is process {pid}, maybe in another pid namespace); use posix, cma or tcp between processes",
                self.shared.tl_name
            ))
        })?;
        let target = lookup(self.shared.tl_name, iface_id).ok_or_else(|| {
            UctError::Unreachable(format!(
                "{} iface {iface_id} does not exist in this process (closed?)",
                self.shared.tl_name
            ))
        })?;
        Ok(Box::new(SelfEp::new(
            self.shared.tl_name,
            Arc::downgrade(&target),
        )))
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.handlers.set(id, handler)
    }

    fn set_imm_handler(&mut self, handler: ImmHandler) -> Result<()> {
        self.imm.set(handler);
        Ok(())
    }

    fn progress(&mut self) -> usize {
        // Take the whole batch so handlers may send to this iface again.
        let batch = std::mem::take(
            &mut *self
                .shared
                .incoming
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let delivered = batch.events.len();
        for event in batch.events {
            match event {
                Event::Am(id, data) => {
                    self.handlers.deliver(id, &data);
                }
                Event::Imm(event) => {
                    self.imm.deliver(event);
                }
            }
        }
        delivered
    }
}
