//! The CUDA driver API, loaded at run time: the function pointers md-cuda
//! and the cuda_copy transport call, and thin wrappers that turn each
//! `CUresult` into a named [`CudaError`]. Nothing here keeps state beyond
//! the library; `device.rs` owns contexts, `stream.rs` streams and events.
//!
//! Nothing links libcuda: the library is opened with `dlopen` when the
//! first MD is asked for, so that every program and module builds and
//! runs without the NVIDIA driver, and says why CUDA is absent.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::error::{CudaError, Result};
use crate::result::{self, CuResult};

/// `CUdevice`: a device ordinal's handle.
pub type CuDevice = c_int;
/// `CUdeviceptr`: a device (or, with unified addressing, any) address.
pub type CuDevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque driver handles.
pub type CuHandle = *mut c_void;

/// The library's default name, found through the dynamic loader's path.
pub const DEFAULT_LIB: &str = "libcuda.so.1";

/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
pub const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context, not only the
/// current one.
pub const HOST_REGISTER_PORTABLE: c_uint = 0x1;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with stream 0.
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: the cheapest event, for completion only.
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const RANGE_HANDLE_DMA_BUF_FD: c_int = 0x1;
/// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (newer drivers).
pub const RANGE_FLAG_DMA_BUF_MAPPING_PCIE: u64 = 0x1;

// The driver API prototypes (cuda.h) of the functions called here. Every
// one returns a CUresult, an int-sized enum.
//
// The contract every call through [`Driver`] relies on: each pointer was
// resolved in [`Driver::load`], by its cuda.h name (with the `_v2` suffix
// where cuda.h maps the name to it), from the library the user named as
// the CUDA driver (`UCT_CUDA_LIB`, or `libcuda.so.1`), and typed with the
// prototype below that cuda.h declares for that name; the library stays
// loaded as long as the `Driver`. Calling one is then sound when its
// pointer arguments point to writable memory of the size the prototype
// requires, for the duration of the call; value arguments (ordinals,
// handles, addresses, sizes) need nothing: the driver checks them and
// fails with a CUresult. A library exporting these names with other
// prototypes breaks this contract; nothing at run time can tell.
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
type IntOutFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGetFn = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type DeviceStringFn = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
type TotalMemFn = unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult;
type AttributeFn = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
type CtxRetainFn = unsafe extern "C" fn(*mut CuHandle, CuDevice) -> CuResult;
type CtxReleaseFn = unsafe extern "C" fn(CuDevice) -> CuResult;
type HandleFn = unsafe extern "C" fn(CuHandle) -> CuResult;
type HandleOutFn = unsafe extern "C" fn(*mut CuHandle) -> CuResult;
type VoidFn = unsafe extern "C" fn() -> CuResult;
type MemAllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
type MemFreeFn = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
type HostRegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult;
type MemcpyAsyncFn = unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuHandle) -> CuResult;
type CreateFn = unsafe extern "C" fn(*mut CuHandle, c_uint) -> CuResult;
type EventRecordFn = unsafe extern "C" fn(CuHandle, CuHandle) -> CuResult;
type PointerAttrsFn =
    unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr) -> CuResult;
type RangeHandleFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult;
type ErrorNameFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

/// The loaded driver and the functions md-cuda uses.
pub struct Driver {
    path: PathBuf,
    init: InitFn,
    driver_get_version: IntOutFn,
    device_get_count: IntOutFn,
    device_get: DeviceGetFn,
    device_get_name: DeviceStringFn,
    device_total_mem: TotalMemFn,
    device_get_pci_bus_id: DeviceStringFn,
    device_get_attribute: AttributeFn,
    primary_ctx_retain: CtxRetainFn,
    primary_ctx_release: CtxReleaseFn,
    ctx_set_current: HandleFn,
    ctx_get_current: HandleOutFn,
    ctx_synchronize: VoidFn,
    mem_alloc: MemAllocFn,
    mem_free: MemFreeFn,
    host_register: HostRegisterFn,
    host_unregister: HandleFn,
    memcpy_async: MemcpyAsyncFn,
    stream_create: CreateFn,
    stream_destroy: HandleFn,
    stream_synchronize: HandleFn,
    event_create: CreateFn,
    event_destroy: HandleFn,
    event_record: EventRecordFn,
    event_query: HandleFn,
    event_synchronize: HandleFn,
    pointer_get_attributes: PointerAttrsFn,
    /// Absent before CUDA 11.7: DMA-buf export is then refused by name.
    get_handle_for_range: Option<RangeHandleFn>,
    get_error_name: ErrorNameFn,
    /// Keeps the function pointers valid; never unloaded.
    _lib: Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("path", &self.path).finish()
    }
}

impl Driver {
    /// Loads the library at `path` (a bare name goes through the loader's
    /// search path) and resolves every function. Does not call the driver.
    pub fn load(path: &Path) -> Result<Driver> {
        let shown = path.display().to_string();
        // SAFETY: loading runs the library's initialisers; the library is
        // the one the user named as the CUDA driver, whose initialisers
        // have no preconditions.
        let lib = unsafe { Library::new(path) }.map_err(|e| CudaError::LibraryNotLoaded {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the library claims to be the CUDA driver, whose
                // symbol $name has the prototype $ty (cuda.h); the copied
                // pointer is kept beside the library in `Driver`, so it
                // never outlives it.
                let symbol = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
                *symbol.map_err(|_| CudaError::MissingSymbol {
                    path: shown.clone(),
                    symbol: $name,
                })?
            }};
        }
        // SAFETY: as in `sym!`; the symbol is optional (CUDA 11.7+).
        let range = unsafe { lib.get::<RangeHandleFn>(b"cuMemGetHandleForAddressRange\0") };
        let get_handle_for_range = range.ok().map(|s| *s);
        Ok(Driver {
            path: path.to_path_buf(),
            init: sym!("cuInit", InitFn),
            driver_get_version: sym!("cuDriverGetVersion", IntOutFn),
            device_get_count: sym!("cuDeviceGetCount", IntOutFn),
            device_get: sym!("cuDeviceGet", DeviceGetFn),
            device_get_name: sym!("cuDeviceGetName", DeviceStringFn),
            device_total_mem: sym!("cuDeviceTotalMem_v2", TotalMemFn),
            device_get_pci_bus_id: sym!("cuDeviceGetPCIBusId", DeviceStringFn),
            device_get_attribute: sym!("cuDeviceGetAttribute", AttributeFn),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain", CtxRetainFn),
            primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2", CtxReleaseFn),
            ctx_set_current: sym!("cuCtxSetCurrent", HandleFn),
            ctx_get_current: sym!("cuCtxGetCurrent", HandleOutFn),
            ctx_synchronize: sym!("cuCtxSynchronize", VoidFn),
            mem_alloc: sym!("cuMemAlloc_v2", MemAllocFn),
            mem_free: sym!("cuMemFree_v2", MemFreeFn),
            host_register: sym!("cuMemHostRegister_v2", HostRegisterFn),
            host_unregister: sym!("cuMemHostUnregister", HandleFn),
            memcpy_async: sym!("cuMemcpyAsync", MemcpyAsyncFn),
            stream_create: sym!("cuStreamCreate", CreateFn),
            stream_destroy: sym!("cuStreamDestroy_v2", HandleFn),
            stream_synchronize: sym!("cuStreamSynchronize", HandleFn),
            event_create: sym!("cuEventCreate", CreateFn),
            event_destroy: sym!("cuEventDestroy_v2", HandleFn),
            event_record: sym!("cuEventRecord", EventRecordFn),
            event_query: sym!("cuEventQuery", HandleFn),
            event_synchronize: sym!("cuEventSynchronize", HandleFn),
            pointer_get_attributes: sym!("cuPointerGetAttributes", PointerAttrsFn),
            get_handle_for_range,
            get_error_name: sym!("cuGetErrorName", ErrorNameFn),
            _lib: lib,
        })
    }

    /// The library it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The driver's name for `code` (`cuGetErrorName`).
    pub fn error_name(&self, code: CuResult) -> Option<String> {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `cuGetErrorName` has the prototype ErrorNameFn (see the
        // contract on the prototypes); it writes one pointer to `text`.
        let rc = unsafe { (self.get_error_name)(code, &mut text) };
        if rc != result::SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: on success the driver points `text` at a static
        // NUL-terminated string, which lives as long as the library.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// `Ok` for CUDA_SUCCESS, else the named error of `call`.
    pub fn check(&self, code: CuResult, call: impl FnOnce() -> String) -> Result<()> {
        if code == result::SUCCESS {
            return Ok(());
        }
        Err(CudaError::Driver {
            call: call(),
            code,
            name: result::name(code)
                .is_none()
                .then(|| self.error_name(code))
                .flatten(),
        })
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: `cuInit` has the prototype InitFn (see the contract on
        // the prototypes); its one argument is a value.
        let rc = unsafe { (self.init)(0) };
        self.check(rc, || "cuInit(0)".into())
    }

    /// `cuDriverGetVersion`: e.g. 13000 for CUDA 13.0.
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: IntOutFn writes one int to `v` (see the contract).
        let rc = unsafe { (self.driver_get_version)(&mut v) };
        self.check(rc, || "cuDriverGetVersion".into())?;
        Ok(v)
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: IntOutFn writes one int to `n` (see the contract).
        let rc = unsafe { (self.device_get_count)(&mut n) };
        self.check(rc, || "cuDeviceGetCount".into())?;
        Ok(n)
    }

    /// `cuDeviceGet(ordinal)`.
    pub fn device(&self, ordinal: i32) -> Result<CuDevice> {
        let mut dev = 0;
        // SAFETY: DeviceGetFn writes one CUdevice to `dev` (see the
        // contract); the ordinal is a value.
        let rc = unsafe { (self.device_get)(&mut dev, ordinal) };
        self.check(rc, || format!("cuDeviceGet({ordinal})"))?;
        Ok(dev)
    }

    fn device_string(&self, f: DeviceStringFn, call: &str, dev: CuDevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: DeviceStringFn writes at most `len` bytes, NUL included,
        // into the buffer (see the contract); `buf` has that many.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        self.check(rc, || format!("{call}(device {dev})"))?;
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (last byte set above) and lives
        // until the copy is made.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `cuDeviceGetName`: the GPU's model name.
    pub fn device_name(&self, dev: CuDevice) -> Result<String> {
        self.device_string(self.device_get_name, "cuDeviceGetName", dev)
    }

    /// `cuDeviceGetPCIBusId`, as `0000:3b:00.0` (lower case, as sysfs).
    pub fn device_bus_id(&self, dev: CuDevice) -> Result<String> {
        self.device_string(self.device_get_pci_bus_id, "cuDeviceGetPCIBusId", dev)
            .map(|s| s.to_ascii_lowercase())
    }

    /// `cuDeviceTotalMem_v2`.
    pub fn device_total_mem(&self, dev: CuDevice) -> Result<u64> {
        let mut bytes = 0usize;
        // SAFETY: TotalMemFn writes one size_t to `bytes` (see the
        // contract).
        let rc = unsafe { (self.device_total_mem)(&mut bytes, dev) };
        self.check(rc, || format!("cuDeviceTotalMem_v2(device {dev})"))?;
        Ok(bytes as u64)
    }

    /// `cuDeviceGetAttribute(attr)`.
    pub fn device_attribute(&self, dev: CuDevice, attr: c_int) -> Result<i32> {
        let mut v = 0;
        // SAFETY: AttributeFn writes one int to `v` (see the contract).
        let rc = unsafe { (self.device_get_attribute)(&mut v, attr, dev) };
        self.check(rc, || {
            format!("cuDeviceGetAttribute(attribute {attr}, device {dev})")
        })?;
        Ok(v)
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_ctx_retain(&self, dev: CuDevice) -> Result<CuHandle> {
        let mut ctx: CuHandle = std::ptr::null_mut();
        // SAFETY: CtxRetainFn writes one handle to `ctx` (see the
        // contract).
        let rc = unsafe { (self.primary_ctx_retain)(&mut ctx, dev) };
        self.check(rc, || format!("cuDevicePrimaryCtxRetain(device {dev})"))?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease_v2`.
    ///
    /// # Safety
    /// The caller retained the context once with
    /// [`primary_ctx_retain`](Self::primary_ctx_retain), releases it once,
    /// and nothing of md-cuda uses it after (no memory, stream, event or
    /// copy of it is left): the last release destroys the context, and
    /// with it the memory and the copies in flight.
    pub(crate) unsafe fn primary_ctx_release(&self, dev: CuDevice) -> Result<()> {
        // SAFETY: CtxReleaseFn takes a value (see the contract); the
        // caller vouches for the rest.
        let rc = unsafe { (self.primary_ctx_release)(dev) };
        self.check(rc, || format!("cuDevicePrimaryCtxRelease_v2(device {dev})"))
    }

    /// `cuCtxGetCurrent` (null when none is current).
    pub fn ctx_current(&self) -> Result<CuHandle> {
        let mut ctx: CuHandle = std::ptr::null_mut();
        // SAFETY: HandleOutFn writes one handle to `ctx` (see the
        // contract).
        let rc = unsafe { (self.ctx_get_current)(&mut ctx) };
        self.check(rc, || "cuCtxGetCurrent".into())?;
        Ok(ctx)
    }

    /// `cuCtxSetCurrent`.
    ///
    /// # Safety
    /// `ctx` is a live context: one retained, or what `cuCtxGetCurrent`
    /// returned and its owner still holds.
    pub unsafe fn ctx_set_current(&self, ctx: CuHandle) -> Result<()> {
        // SAFETY: HandleFn takes a handle by value (see the contract); the
        // caller vouches that it is a live context.
        let rc = unsafe { (self.ctx_set_current)(ctx) };
        self.check(rc, || "cuCtxSetCurrent".into())
    }

    /// `cuCtxSynchronize` of the current context.
    pub fn ctx_synchronize(&self) -> Result<()> {
        // SAFETY: VoidFn takes no arguments (see the contract).
        let rc = unsafe { (self.ctx_synchronize)() };
        self.check(rc, || "cuCtxSynchronize".into())
    }

    /// `cuMemAlloc_v2` in the current context.
    pub fn mem_alloc(&self, len: usize) -> Result<CuDevicePtr> {
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: MemAllocFn writes one CUdeviceptr to `ptr` (see the
        // contract).
        let rc = unsafe { (self.mem_alloc)(&mut ptr, len) };
        self.check(rc, || format!("cuMemAlloc_v2({len} bytes)"))?;
        Ok(ptr)
    }

    /// `cuMemFree_v2`.
    ///
    /// # Safety
    /// `ptr` came from [`mem_alloc`](Self::mem_alloc), is freed once, and
    /// nothing (no queued copy, no NIC registration) uses it any more.
    pub unsafe fn mem_free(&self, ptr: CuDevicePtr) -> Result<()> {
        // SAFETY: MemFreeFn takes a value (see the contract); the caller
        // vouches that the allocation is no longer used.
        let rc = unsafe { (self.mem_free)(ptr) };
        self.check(rc, || format!("cuMemFree_v2({ptr:#x})"))
    }

    /// `cuMemHostRegister_v2(PORTABLE)`: pins host memory.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is host memory mapped for as long as it stays
    /// registered.
    pub unsafe fn host_register(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: HostRegisterFn takes the range by value (see the
        // contract); the caller vouches that it is mapped host memory.
        let rc = unsafe { (self.host_register)(ptr.cast(), len, HOST_REGISTER_PORTABLE) };
        self.check(rc, || {
            format!("cuMemHostRegister_v2({ptr:p}, {len} bytes, PORTABLE)")
        })
    }

    /// `cuMemHostUnregister`.
    ///
    /// # Safety
    /// `ptr` was registered by [`host_register`](Self::host_register) and
    /// no queued copy uses it any more.
    pub unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: HandleFn takes the pointer by value (see the contract).
        let rc = unsafe { (self.host_unregister)(ptr.cast()) };
        self.check(rc, || format!("cuMemHostUnregister({ptr:p})"))
    }

    /// `cuMemcpyAsync(dst, src, len, stream)`.
    ///
    /// # Safety
    /// Both ranges are memory the driver may reach (device memory, or host
    /// memory with unified addressing) and stay allocated until the copy
    /// has completed on `stream`, a live stream of the current context.
    pub unsafe fn memcpy_async(
        &self,
        dst: CuDevicePtr,
        src: CuDevicePtr,
        len: usize,
        stream: CuHandle,
    ) -> Result<()> {
        // SAFETY: MemcpyAsyncFn takes values (see the contract); the
        // caller vouches for both ranges until the copy completes.
        let rc = unsafe { (self.memcpy_async)(dst, src, len, stream) };
        self.check(rc, || {
            format!("cuMemcpyAsync({dst:#x} <- {src:#x}, {len} bytes)")
        })
    }

    /// `cuStreamCreate(NON_BLOCKING)` in the current context.
    pub fn stream_create(&self) -> Result<CuHandle> {
        let mut s: CuHandle = std::ptr::null_mut();
        // SAFETY: CreateFn writes one handle to `s` (see the contract).
        let rc = unsafe { (self.stream_create)(&mut s, STREAM_NON_BLOCKING) };
        self.check(rc, || "cuStreamCreate(NON_BLOCKING)".into())?;
        Ok(s)
    }

    /// `cuStreamDestroy_v2`.
    ///
    /// # Safety
    /// `s` is a live stream, destroyed once.
    pub unsafe fn stream_destroy(&self, s: CuHandle) -> Result<()> {
        // SAFETY: HandleFn takes the handle by value (see the contract).
        let rc = unsafe { (self.stream_destroy)(s) };
        self.check(rc, || "cuStreamDestroy_v2".into())
    }

    /// `cuStreamSynchronize`.
    ///
    /// # Safety
    /// `s` is a live stream.
    pub unsafe fn stream_synchronize(&self, s: CuHandle) -> Result<()> {
        // SAFETY: HandleFn takes the handle by value (see the contract).
        let rc = unsafe { (self.stream_synchronize)(s) };
        self.check(rc, || "cuStreamSynchronize".into())
    }

    /// `cuEventCreate(DISABLE_TIMING)` in the current context.
    pub fn event_create(&self) -> Result<CuHandle> {
        let mut e: CuHandle = std::ptr::null_mut();
        // SAFETY: CreateFn writes one handle to `e` (see the contract).
        let rc = unsafe { (self.event_create)(&mut e, EVENT_DISABLE_TIMING) };
        self.check(rc, || "cuEventCreate(DISABLE_TIMING)".into())?;
        Ok(e)
    }

    /// `cuEventDestroy_v2`.
    ///
    /// # Safety
    /// `e` is a live event, destroyed once.
    pub unsafe fn event_destroy(&self, e: CuHandle) -> Result<()> {
        // SAFETY: HandleFn takes the handle by value (see the contract).
        let rc = unsafe { (self.event_destroy)(e) };
        self.check(rc, || "cuEventDestroy_v2".into())
    }

    /// `cuEventRecord(event, stream)`.
    ///
    /// # Safety
    /// Both are live handles of the current context.
    pub unsafe fn event_record(&self, e: CuHandle, s: CuHandle) -> Result<()> {
        // SAFETY: EventRecordFn takes the handles by value (see the
        // contract).
        let rc = unsafe { (self.event_record)(e, s) };
        self.check(rc, || "cuEventRecord".into())
    }

    /// `cuEventQuery`: `Ok(true)` once the work before the event is done,
    /// `Ok(false)` while it runs (CUDA_ERROR_NOT_READY).
    ///
    /// # Safety
    /// `e` is a live event.
    pub unsafe fn event_query(&self, e: CuHandle) -> Result<bool> {
        // SAFETY: HandleFn takes the handle by value (see the contract).
        let rc = unsafe { (self.event_query)(e) };
        if rc == result::NOT_READY {
            return Ok(false);
        }
        self.check(rc, || "cuEventQuery".into())?;
        Ok(true)
    }

    /// `cuEventSynchronize`.
    ///
    /// # Safety
    /// `e` is a live event.
    pub unsafe fn event_synchronize(&self, e: CuHandle) -> Result<()> {
        // SAFETY: HandleFn takes the handle by value (see the contract).
        let rc = unsafe { (self.event_synchronize)(e) };
        self.check(rc, || "cuEventSynchronize".into())
    }

    /// `cuPointerGetAttributes` of `attrs` at `ptr`: the raw status and one
    /// 8-byte slot per attribute, which the driver fills with the
    /// attribute's value (at most 8 bytes each, zeroed first).
    pub fn pointer_attributes<const N: usize>(
        &self,
        ptr: CuDevicePtr,
        attrs: [c_int; N],
    ) -> (CuResult, [[u8; 8]; N]) {
        let mut attrs = attrs;
        let mut slots = [[0u8; 8]; N];
        let mut data: [*mut c_void; N] = [std::ptr::null_mut(); N];
        for (d, s) in data.iter_mut().zip(slots.iter_mut()) {
            *d = s.as_mut_ptr().cast();
        }
        // SAFETY: PointerAttrsFn (see the contract) reads N attribute
        // codes from `attrs` and writes each value, at most 8 bytes for
        // the attributes md-cuda asks (an int, a bool, a CUdeviceptr, a
        // size_t), through the N pointers in `data`, which point at the N
        // 8-byte `slots`; all live until the call returns.
        let rc = unsafe {
            (self.pointer_get_attributes)(N as c_uint, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)
        };
        (rc, slots)
    }

    /// Whether this driver can export DMA-bufs at all (CUDA 11.7+).
    pub fn has_dmabuf_export(&self) -> bool {
        self.get_handle_for_range.is_some()
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD, flags)`: a new DMA-buf
    /// fd for `[base, base + size)`, both page-aligned.
    pub fn dmabuf_export(
        &self,
        base: CuDevicePtr,
        size: usize,
        flags: u64,
    ) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let f = self
            .get_handle_for_range
            .ok_or_else(|| CudaError::MissingSymbol {
                path: self.path.display().to_string(),
                symbol: "cuMemGetHandleForAddressRange",
            })?;
        let mut fd: c_int = -1;
        // SAFETY: RangeHandleFn (see the contract) writes, for the DMA-buf
        // handle type, one int through the handle pointer, which points at
        // `fd`; the range and flags are values the driver checks.
        let rc = unsafe {
            f(
                (&mut fd as *mut c_int).cast(),
                base,
                size,
                RANGE_HANDLE_DMA_BUF_FD,
                flags,
            )
        };
        self.check(rc, || {
            format!("cuMemGetHandleForAddressRange({base:#x}, {size} bytes, DMA_BUF_FD, flags {flags:#x})")
        })?;
        if fd < 0 {
            return Err(CudaError::Driver {
                call: "cuMemGetHandleForAddressRange".into(),
                code: result::UNKNOWN,
                name: None,
            });
        }
        // SAFETY: on success the driver opened `fd` for its caller and
        // keeps no copy, so nothing else owns or closes it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }
}
