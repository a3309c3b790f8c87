//! One GPU: its identity (ordinal, model, memory, bus id, DMA-buf export),
//! and its primary context, retained on first use and made current on
//! each thread that calls the driver for it.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::driver::{CuDevice, CuHandle, Driver, ATTR_DMA_BUF_SUPPORTED};
use crate::error::{CudaError, Result};

/// A retained primary context.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Context(NonNull<c_void>);

// SAFETY: a CUcontext is a handle the driver API accepts from any thread
// (cuCtxSetCurrent binds it to the calling thread); the pointer is never
// dereferenced here.
unsafe impl Send for Context {}
// SAFETY: as above: shared references only copy the handle.
unsafe impl Sync for Context {}

/// A stream of this GPU that cuda_copy queues on: what a free waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
struct StreamHandle(NonNull<c_void>);

// SAFETY: a CUstream is a handle the driver API accepts from any thread;
// it is never dereferenced here.
unsafe impl Send for StreamHandle {}

/// One GPU of this host, as the driver numbers it.
pub struct Device {
    drv: Arc<Driver>,
    handle: CuDevice,
    /// The driver's ordinal (what CUDA_VISIBLE_DEVICES leaves visible).
    pub ordinal: i32,
    /// `cuda<ordinal>`: the memory domain's and transport device's name.
    pub name: String,
    /// The GPU's model, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// Device memory in bytes.
    pub total_mem: u64,
    /// PCI bus id, `0000:3b:00.0`.
    pub bus_id: String,
    /// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, and an export call present.
    pub dmabuf: bool,
    /// Retained on first use: a context costs GPU memory, and most
    /// programs that load the module never touch this GPU.
    ctx: OnceLock<std::result::Result<Context, CudaError>>,
    /// Operations (copies) queued on this GPU's streams and not yet seen
    /// complete: freeing memory waits for the GPU while there are any (see
    /// [`Device::quiesce`]).
    inflight: AtomicUsize,
    /// The live streams of md-cuda on this GPU; a stream is destroyed
    /// under this lock, so that [`Device::quiesce`] never waits on a
    /// destroyed one.
    streams: Mutex<Vec<StreamHandle>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("bus_id", &self.bus_id)
            .finish()
    }
}

/// Restores the context that was current before [`Device::enter`], where
/// there was another one: a caller's own context (PyTorch's current
/// device) is not changed behind its back. Where none was current, ours
/// stays, which spares the next call two driver calls.
pub struct Entered<'a> {
    drv: &'a Driver,
    previous: Option<CuHandle>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.previous.take() {
            // SAFETY: `prev` was current on this thread when the guard was
            // made; its owner (the caller's code) still holds it.
            if let Err(e) = unsafe { self.drv.ctx_set_current(prev) } {
                log::warn!("cuda: restoring the caller's context: {e}");
            }
        }
    }
}

impl Device {
    /// Opens ordinal `ordinal` (after `cuInit`): reads its identity, and
    /// retains nothing yet.
    pub fn open(drv: Arc<Driver>, ordinal: i32) -> Result<Device> {
        let handle = drv.device(ordinal)?;
        let model = drv.device_name(handle)?;
        let total_mem = drv.device_total_mem(handle)?;
        let bus_id = drv.device_bus_id(handle)?;
        let dmabuf =
            drv.has_dmabuf_export() && drv.device_attribute(handle, ATTR_DMA_BUF_SUPPORTED)? != 0;
        Ok(Device {
            drv,
            handle,
            ordinal,
            name: format!("cuda{ordinal}"),
            model,
            total_mem,
            bus_id,
            dmabuf,
            ctx: OnceLock::new(),
            inflight: AtomicUsize::new(0),
            streams: Mutex::new(Vec::new()),
        })
    }

    /// The driver this device was opened with.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.drv
    }

    fn context(&self) -> Result<Context> {
        self.ctx
            .get_or_init(|| {
                let raw = self.drv.primary_ctx_retain(self.handle)?;
                NonNull::new(raw).map(Context).ok_or(CudaError::Driver {
                    call: format!("cuDevicePrimaryCtxRetain(device {})", self.ordinal),
                    code: crate::result::UNKNOWN,
                    name: None,
                })
            })
            .clone()
    }

    /// Makes this GPU's primary context current on the calling thread (it
    /// is retained on the first call) until the guard drops.
    pub fn enter(&self) -> Result<Entered<'_>> {
        let ours = self.context()?.0.as_ptr();
        let current = self.drv.ctx_current()?;
        if current == ours {
            return Ok(Entered {
                drv: &self.drv,
                previous: None,
            });
        }
        // SAFETY: `ours` is the primary context this device retained, held
        // until the device drops.
        unsafe { self.drv.ctx_set_current(ours) }?;
        Ok(Entered {
            drv: &self.drv,
            previous: (!current.is_null()).then_some(current),
        })
    }

    /// Counts `n` operations queued on a stream of this GPU; the transport
    /// counts them while the memory they touch is still locked for them,
    /// so that a free that comes after sees them. Safe: counting too many
    /// only makes frees wait for the GPU when they need not.
    pub fn ops_queued(&self, n: usize) {
        self.inflight.fetch_add(n, Ordering::SeqCst);
    }

    /// Counts `n` operations seen complete (or abandoned after a wait).
    ///
    /// # Safety
    /// The `n` operations were counted with [`ops_queued`](Self::ops_queued)
    /// and have finished on the GPU (their event said so, or their stream
    /// was synchronised), or their memory is never let go: a free while the
    /// count reads zero frees at once, with no wait for the GPU, so
    /// counting an operation done while it runs lets memory be freed under
    /// its DMA.
    pub unsafe fn ops_done(&self, n: usize) {
        let _ = self
            .inflight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// Operations queued and not yet seen complete.
    pub fn ops_in_flight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    fn streams(&self) -> MutexGuard<'_, Vec<StreamHandle>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists a stream just created on this GPU.
    pub(crate) fn add_stream(&self, raw: NonNull<c_void>) {
        self.streams().push(StreamHandle(raw));
    }

    /// Takes a stream off the list and runs `destroy` under the list's
    /// lock: a [`quiesce`](Self::quiesce) either waits on it before, or
    /// no longer sees it.
    pub(crate) fn remove_stream<T>(&self, raw: NonNull<c_void>, destroy: impl FnOnce() -> T) -> T {
        let mut streams = self.streams();
        streams.retain(|&s| s != StreamHandle(raw));
        destroy()
    }

    /// Waits until the copies queued on this GPU have finished, so that
    /// memory a queued copy may still touch can be freed: a
    /// `cuStreamSynchronize` of each of md-cuda's streams (not of the
    /// application's), and only while operations are in flight. Errors
    /// are logged: this runs in `Drop`.
    pub fn quiesce(&self) {
        if self.ops_in_flight() == 0 || self.ctx.get().is_none() {
            return;
        }
        let streams = self.streams();
        if streams.is_empty() {
            return;
        }
        let synced = self.enter().and_then(|_in| {
            streams.iter().try_for_each(|s| {
                // SAFETY: listed streams are live: one is destroyed only
                // after it is taken off the list, under this lock.
                unsafe { self.drv.stream_synchronize(s.0.as_ptr()) }
            })
        });
        if let Err(e) = synced {
            log::error!(
                "{}: waiting for queued copies before a free: {e}",
                self.name
            );
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(Ok(_)) = self.ctx.get() {
            // SAFETY: retained once, in `context`; released once, here,
            // when the device drops: every handle, stream and event of
            // md-cuda holds an Arc of it, so none is left.
            if let Err(e) = unsafe { self.drv.primary_ctx_release(self.handle) } {
                log::warn!("{}: releasing the primary context: {e}", self.name);
            }
        }
    }
}
