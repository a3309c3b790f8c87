//! Owned verbs objects: each is a non-null pointer and the parent it needs,
//! destroyed in Drop (without panicking, whatever verbs answers).

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::*;
use uct_core::UctError;

/// The errno of the last failed call, as a named error.
pub fn last_error(what: &str) -> UctError {
    errno_error(
        what,
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    )
}

/// A verbs errno, as an error that says what failed and what to do.
pub fn errno_error(what: &str, errno: i32) -> UctError {
    let e = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::ENOMEM => "; raise the locked-memory limit (ulimit -l unlimited) or register less",
        libc::EPERM | libc::EACCES => {
            "; check the device permissions (/dev/infiniband) and the locked-memory limit"
        }
        libc::EOPNOTSUPP => "; the device does not support this",
        libc::EINVAL => "; a parameter is outside what the device accepts",
        _ => "",
    };
    UctError::Device {
        device: "verbs".into(),
        message: format!("{what}: {e}{hint}"),
        source: Some(e.into()),
    }
}

/// An open device.
pub struct Context {
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: verbs contexts are thread-safe (rdma-core locks internally).
unsafe impl Send for Context {}
// SAFETY: as for Send.
unsafe impl Sync for Context {}

impl Context {
    /// Opens device `name`.
    pub fn open(name: &str) -> Result<Arc<Context>, UctError> {
        let mut n = 0;
        // SAFETY: fills n; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(last_error("ibv_get_device_list"));
        }
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n entries of a valid list.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a device of the list; the name is a C string.
            let dname = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy();
            if dname == name {
                // SAFETY: dev is valid while the list is.
                found = Some(unsafe { ibv_open_device(dev) });
                break;
            }
        }
        // SAFETY: frees the list from ibv_get_device_list once; opened
        // contexts stay valid.
        unsafe { ibv_free_device_list(list) };
        match found {
            None => Err(UctError::NoDevice(format!("RDMA device {name}"))),
            Some(p) => NonNull::new(p)
                .map(|ptr| {
                    Arc::new(Context {
                        ptr,
                        name: name.to_string(),
                    })
                })
                .ok_or_else(|| last_error(&format!("ibv_open_device({name})"))),
        }
    }

    /// Names of the devices present.
    pub fn device_names() -> Vec<String> {
        let mut n = 0;
        // SAFETY: as in open.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        let names = (0..n.max(0) as usize)
            .map(|i| {
                // SAFETY: i < n entries; names are C strings.
                unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // SAFETY: frees the list once.
        unsafe { ibv_free_device_list(list) };
        names
    }

    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was opened by us and every child holds an
        // Arc to it, so none is alive now.
        unsafe { ibv_close_device(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    ptr: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe.
unsafe impl Send for Pd {}
// SAFETY: as for Send.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, UctError> {
        // SAFETY: a live context.
        let p = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| {
                Arc::new(Pd {
                    ptr,
                    ctx: ctx.clone(),
                })
            })
            .ok_or_else(|| last_error("ibv_alloc_pd"))
    }

    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it.
        unsafe { ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A memory region.
pub struct Mr {
    ptr: NonNull<ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: verbs objects are thread-safe; the MR's fields are read only.
unsafe impl Send for Mr {}
// SAFETY: as for Send.
unsafe impl Sync for Mr {}

impl Mr {
    /// Wraps a region returned by a registration call.
    pub fn from_raw(p: *mut ibv_mr, pd: &Arc<Pd>, what: &str) -> Result<Mr, UctError> {
        NonNull::new(p)
            .map(|ptr| Mr {
                ptr,
                _pd: pd.clone(),
            })
            .ok_or_else(|| last_error(what))
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once. An error leaves the
        // MR registered; there is nothing better to do in Drop.
        let r = unsafe { ibv_dereg_mr(self.ptr.as_ptr()) };
        if r != 0 {
            log::warn!(
                "verbs: ibv_dereg_mr failed: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
    }
}
