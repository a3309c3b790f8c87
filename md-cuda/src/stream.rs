//! Streams and events of one GPU, owned: each is created in the GPU's
//! primary context and destroyed once, in `Drop`, which never panics. The
//! cuda_copy transport queues its copies on a [`Stream`] and learns their
//! completion from an [`Event`] recorded after them.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Device;
use crate::driver::CuDevicePtr;
use crate::error::{CudaError, Result};

fn non_null(raw: *mut c_void, call: &str) -> Result<NonNull<c_void>> {
    NonNull::new(raw).ok_or_else(|| CudaError::Driver {
        call: format!("{call} (it returned a null handle)"),
        code: crate::result::UNKNOWN,
        name: None,
    })
}

/// A non-blocking stream of one GPU.
pub struct Stream {
    dev: Arc<Device>,
    raw: NonNull<c_void>,
}

// SAFETY: a CUstream is a handle the driver API accepts from any thread;
// it is never dereferenced here, and destroyed once, by its owner.
unsafe impl Send for Stream {}

impl Stream {
    /// A new stream in `dev`'s primary context.
    pub fn new(dev: &Arc<Device>) -> Result<Stream> {
        let _in = dev.enter()?;
        let raw = non_null(dev.driver().stream_create()?, "cuStreamCreate")?;
        dev.add_stream(raw);
        Ok(Stream {
            dev: dev.clone(),
            raw,
        })
    }

    /// The GPU it belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Queues a copy of `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are device memory or host memory the driver may reach
    /// (unified addressing), and stay allocated until the copy completes:
    /// until an [`Event`] recorded after it says so, or the stream is
    /// synchronised.
    /// Count the operation with [`Device::ops_queued`] before the memory
    /// it touches may be freed.
    pub unsafe fn copy(&self, dst: CuDevicePtr, src: CuDevicePtr, len: usize) -> Result<()> {
        let _in = self.dev.enter()?;
        // SAFETY: the stream is live (self owns it) and its context was
        // made current above; the caller vouches for both ranges.
        unsafe {
            self.dev
                .driver()
                .memcpy_async(dst, src, len, self.raw.as_ptr())
        }
    }

    /// Waits until everything queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        let _in = self.dev.enter()?;
        // SAFETY: the stream is live (self owns it).
        unsafe { self.dev.driver().stream_synchronize(self.raw.as_ptr()) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Work still queued finishes first: destroying a stream does not
        // wait for it, and its copies may reach memory about to be freed.
        let done = self.synchronize();
        let destroyed = self.dev.remove_stream(self.raw, || {
            self.dev.enter().and_then(|_in| {
                // SAFETY: the stream is live and destroyed once, here,
                // after it left the device's list.
                unsafe { self.dev.driver().stream_destroy(self.raw.as_ptr()) }
            })
        });
        if let Err(e) = done.and(destroyed) {
            log::warn!("{}: destroying a stream: {e}", self.dev.name);
        }
    }
}

/// An event of one GPU, without timing: what completion is learnt from.
pub struct Event {
    dev: Arc<Device>,
    raw: NonNull<c_void>,
}

// SAFETY: a CUevent is a handle the driver API accepts from any thread;
// it is never dereferenced here, and destroyed once, by its owner.
unsafe impl Send for Event {}

impl Event {
    /// A new event in `dev`'s primary context.
    pub fn new(dev: &Arc<Device>) -> Result<Event> {
        let _in = dev.enter()?;
        let raw = non_null(dev.driver().event_create()?, "cuEventCreate")?;
        Ok(Event {
            dev: dev.clone(),
            raw,
        })
    }

    /// Records the event after everything queued so far on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let _in = self.dev.enter()?;
        // SAFETY: both handles are live (owned by self and `stream`).
        unsafe {
            self.dev
                .driver()
                .event_record(self.raw.as_ptr(), stream.raw.as_ptr())
        }
    }

    /// Whether the work before the event has finished (CUDA_ERROR_NOT_READY
    /// is `Ok(false)`); an error is the failure of that work.
    pub fn is_done(&self) -> Result<bool> {
        let _in = self.dev.enter()?;
        // SAFETY: the event is live (self owns it).
        unsafe { self.dev.driver().event_query(self.raw.as_ptr()) }
    }

    /// Waits for the work before the event.
    pub fn synchronize(&self) -> Result<()> {
        let _in = self.dev.enter()?;
        // SAFETY: the event is live (self owns it).
        unsafe { self.dev.driver().event_synchronize(self.raw.as_ptr()) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let destroyed = self.dev.enter().and_then(|_in| {
            // SAFETY: the event is live and destroyed once, here.
            unsafe { self.dev.driver().event_destroy(self.raw.as_ptr()) }
        });
        if let Err(e) = destroyed {
            log::warn!("{}: destroying an event: {e}", self.dev.name);
        }
    }
}
