//! The cuda_copy iface: one stream of one GPU, the copies queued on it
//! (completed from an event each, queried in `progress`), and a spare
//! list of events to reuse. Endpoints of this iface queue on its stream;
//! the iface they connect to only has to exist in this process.

use std::sync::{Arc, Mutex, MutexGuard};

use md_cuda::{result, CudaMd, Device, Event, Stream};
use uct_core::region_table::RegionTable;
use uct_core::{
    AmHandler, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType, Result,
    SizeLimits, UctError,
};

use crate::addr::{self, Target, DEVICE_ADDR_LEN, IFACE_ADDR_LEN};
use crate::ep::CudaCopyEp;
use crate::queue::{Done, OpQueue, Poll, Signal};

/// The transport's name.
pub const TRANSPORT: &str = "cuda_copy";
/// Copies in flight per iface before posts get NoResource.
pub const QUEUE_LEN: usize = 256;
/// Most pieces in one zero-copy operation.
pub const MAX_IOV: usize = 16;
/// Largest zero-copy operation.
pub const MAX_ZCOPY: usize = 1 << 40;

impl Signal for Event {
    fn poll(&self) -> Poll {
        match Event::is_done(self) {
            Ok(false) => Poll::Running,
            Ok(true) => Poll::Done,
            Err(e) if e.code().is_some_and(result::is_sticky) => Poll::Failed(e.into()),
            // Entering the context failed, or a transient error: the copy
            // may still run.
            Err(e) => Poll::Unknown(e.into()),
        }
    }
}

/// What the iface and its endpoints share.
pub(crate) struct Shared {
    pub(crate) dev: Arc<Device>,
    /// md-cuda's table: remote accesses are checked against it.
    pub(crate) table: Arc<RegionTable>,
    inner: Mutex<Inner>,
}

pub(crate) struct Inner {
    pub(crate) stream: Stream,
    pub(crate) queue: OpQueue<Event>,
    pub(crate) spare: Vec<Event>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes the copies that are done; returns how many.
    pub(crate) fn progress(&self) -> usize {
        let done = {
            let mut inner = self.lock();
            let Inner { queue, spare, .. } = &mut *inner;
            queue.take_done(|event| spare.push(event))
        };
        // Completions fire, and memory goes back, with the lock let go.
        let n = done.len();
        if n > 0 {
            // SAFETY: these were counted when queued, and their events
            // said they finished (take_done keeps any it cannot ask).
            unsafe { self.dev.ops_done(n) };
            done.into_iter().for_each(Done::complete);
        }
        n
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every copy finishes before its memory is let go and its
        // completion fires; a failed wait fails them all.
        let waited = self.stream.synchronize();
        // Waited for, or failed for good: nothing of the copies runs any
        // more. Otherwise (the context could not be entered) they may, and
        // their memory is leaked rather than freed under them.
        let copies_over = match &waited {
            Ok(()) => true,
            Err(e) => e.code().is_some_and(result::is_sticky),
        };
        if let Err(e) = &waited {
            log::error!("cuda_copy: waiting for the stream of a closing iface: {e}");
        }
        let result = waited.map_err(|e| {
            UctError::Canceled(format!(
                "the cuda_copy iface closed and its stream failed: {e}"
            ))
        });
        let drained = self.queue.drain(result, copies_over);
        // SAFETY: counted when queued; the stream was waited for, or it
        // failed for good, or their memory was leaked (drain above).
        unsafe { self.stream.device().ops_done(drained.len()) };
        drained.into_iter().for_each(Done::complete);
    }
}

fn attrs() -> IfaceAttrs {
    let zcopy = SizeLimits {
        max_short: 0,
        max_bcopy: 0,
        min_zcopy: 0,
        max_zcopy: MAX_ZCOPY,
        max_iov: MAX_IOV,
    };
    IfaceAttrs {
        caps: Caps::PUT_ZCOPY
            | Caps::GET_ZCOPY
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_IFACE,
        put: zcopy,
        get: zcopy,
        am: SizeLimits::default(),
        max_am_header: 0,
        mem_types: vec![MemoryType::Host, MemoryType::Cuda],
        latency_ns: 8_000.0,
        bandwidth_bps: 25.0e9,
        overhead_ns: 3_000.0,
        iface_addr_len: IFACE_ADDR_LEN,
        device_addr_len: DEVICE_ADDR_LEN,
        ep_addr_len: 0,
    }
}

/// A cuda_copy iface on one GPU.
pub struct CudaCopyIface {
    id: u64,
    shared: Arc<Shared>,
    md: Arc<dyn MemoryDomain>,
    attrs: IfaceAttrs,
}

impl CudaCopyIface {
    /// Opens an iface over `md`, which is `cuda` (the same MD, typed).
    pub fn open(md: Arc<dyn MemoryDomain>, cuda: &CudaMd) -> Result<CudaCopyIface> {
        let dev = cuda.device().clone();
        let stream = Stream::new(&dev)?;
        let shared = Arc::new(Shared {
            table: cuda.shared().table.clone(),
            dev,
            inner: Mutex::new(Inner {
                stream,
                queue: OpQueue::new(QUEUE_LEN),
                spare: Vec::new(),
            }),
        });
        let id = addr::enter(&shared);
        Ok(CudaCopyIface {
            id,
            shared,
            md,
            attrs: attrs(),
        })
    }
}

impl Drop for CudaCopyIface {
    fn drop(&mut self) {
        addr::leave(self.id);
    }
}

impl Iface for CudaCopyIface {
    fn transport(&self) -> &str {
        TRANSPORT
    }

    fn device(&self) -> &str {
        &self.shared.dev.name
    }

    fn attrs(&self) -> &IfaceAttrs {
        &self.attrs
    }

    fn md(&self) -> &Arc<dyn MemoryDomain> {
        &self.md
    }

    fn device_address(&self) -> Vec<u8> {
        addr::this_process().to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.id.to_le_bytes().to_vec()
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        matches!(addr::parse(device_addr, iface_addr), Some(Target::Here(id)) if addr::lookup(id).is_some())
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        let EpParams::ToIface {
            device_addr,
            iface_addr,
        } = params
        else {
            return Err(UctError::InvalidParam(
                "cuda_copy connects to ifaces only; pass EpParams::ToIface".into(),
            ));
        };
        let id = match addr::parse(&device_addr, &iface_addr) {
            Some(Target::Here(id)) => id,
            Some(Target::Elsewhere(pid)) => {
                return Err(UctError::Unreachable(format!(
                    "cuda_copy copies inside one process only (the peer is process {pid}); between processes use rc with cuda memory on a NIC that imports DMA-buf"
                )))
            }
            None => {
                return Err(UctError::InvalidParam(format!(
                    "not a cuda_copy address (expected {DEVICE_ADDR_LEN} + {IFACE_ADDR_LEN} bytes, got {} + {})",
                    device_addr.len(),
                    iface_addr.len()
                )))
            }
        };
        let target = addr::lookup(id).ok_or_else(|| {
            UctError::Unreachable(format!(
                "cuda_copy iface {id} does not exist in this process (closed?)"
            ))
        })?;
        Ok(Box::new(CudaCopyEp::new(
            self.shared.clone(),
            Arc::downgrade(&target),
        )))
    }

    fn set_am_handler(&mut self, _id: u8, _handler: AmHandler) -> Result<()> {
        Err(UctError::unsupported(TRANSPORT, "active messages"))
    }

    fn progress(&mut self) -> usize {
        self.shared.progress()
    }
}
