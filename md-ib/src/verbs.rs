//! Owned verbs objects: each is a non-null pointer and the parent it needs,
//! destroyed in Drop (without panicking, whatever verbs answers).

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::*;
use uct_core::UctError;

use crate::error::{errno, VerbsError};

/// An open device.
pub struct Context {
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: an ibv_context is not tied to the thread that opened it: any
// thread may use it and close it.
unsafe impl Send for Context {}
// SAFETY: the verbs calls made through `&Context` (query, create CQ/PD)
// are thread-safe by the libibverbs API: rdma-core serialises them with
// the context's own locks.
unsafe impl Sync for Context {}

impl Context {
    /// Opens device `name`.
    pub fn open(name: &str) -> Result<Arc<Context>, UctError> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::last("ibv_get_device_list").into());
        }
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: the list is non-null and holds `n` entries; i < n.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is an entry of the list, which is not freed yet;
            // ibv_get_device_name returns a NUL-terminated string it owns.
            let dname = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy();
            if dname == name {
                // SAFETY: dev is an entry of the list, which is not freed
                // yet (an opened context outlives the list).
                let ctx = unsafe { ibv_open_device(dev) };
                // Read now: freeing the list below may change it.
                found = Some((ctx, errno()));
                break;
            }
        }
        // SAFETY: the list came from ibv_get_device_list and is freed once;
        // an opened context stays valid without it.
        unsafe { ibv_free_device_list(list) };
        match found {
            None => Err(UctError::NoDevice(format!("RDMA device {name}"))),
            Some((p, errno)) => NonNull::new(p)
                .map(|ptr| {
                    Arc::new(Context {
                        ptr,
                        name: name.to_string(),
                    })
                })
                .ok_or_else(|| VerbsError::new(format!("ibv_open_device({name})"), errno).into()),
        }
    }

    /// Names of the devices present.
    pub fn device_names() -> Vec<String> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        let names = (0..n.max(0) as usize)
            .map(|i| {
                // SAFETY: the list is non-null with `n` entries and i < n; the
                // name is a NUL-terminated string owned by the list, copied
                // before the list is freed.
                unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // SAFETY: the list came from ibv_get_device_list and is freed
        // once; nothing borrowed from it is kept.
        unsafe { ibv_free_device_list(list) };
        names
    }

    /// The raw context, valid while this `Context` lives.
    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    /// The device's name (`mlx5_0`, `rxe0`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was opened in `open` and is closed only here;
        // every child object (PD, CQ, ...) holds an Arc to it, so none is
        // alive now.
        unsafe { ibv_close_device(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    ptr: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is not tied to the thread that allocated it.
unsafe impl Send for Pd {}
// SAFETY: through `&Pd` the PD is only passed to verbs calls (register,
// create QP), which libibverbs makes thread-safe; it is never written.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: `ctx` is an open context, kept open by the Arc.
        let p = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| {
                Arc::new(Pd {
                    ptr,
                    ctx: ctx.clone(),
                })
            })
            .ok_or_else(|| VerbsError::last("ibv_alloc_pd").on(ctx.name()))
    }

    /// The raw PD, valid while this `Pd` lives.
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, deallocated only here; every MR and QP
        // of this PD holds an Arc to it, so none is alive now.
        unsafe { ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A memory region.
///
/// Its owner calls [`deregister`](Mr::deregister) with what keeps the
/// registered memory alive, before that memory can go: if the NIC refuses
/// to let go of the registration, the memory is leaked rather than freed
/// under it.
pub struct Mr {
    /// Read only at registration and passed to `dereg`: after a
    /// deregistration it points at freed memory.
    ptr: NonNull<ibv_mr>,
    /// The keys, read at registration, so that they never read `ptr`.
    lkey: u32,
    rkey: u32,
    /// Kept (leaked) when deregistration fails: the MR still lives in it.
    pd: Arc<Pd>,
    /// Deregistration was tried: Drop does not try again.
    released: bool,
    /// ibv_dereg_mr, or a test's stand-in.
    dereg: Dereg,
}

/// How an MR is deregistered: ibv_dereg_mr's signature.
type Dereg = unsafe fn(*mut ibv_mr) -> libc::c_int;

/// ibv_dereg_mr as a Rust function pointer.
///
/// # Safety
/// As ibv_dereg_mr: `mr` is a live MR, deregistered once.
unsafe fn dereg_mr(mr: *mut ibv_mr) -> libc::c_int {
    // SAFETY: forwarded contract.
    unsafe { ibv_dereg_mr(mr) }
}

// SAFETY: an MR is not tied to the thread that registered it.
unsafe impl Send for Mr {}
// SAFETY: through `&Mr` only the MR's keys are read; verbs never writes
// them after registration.
unsafe impl Sync for Mr {}

impl Mr {
    /// Wraps a region returned by a registration call on `pd`; a null
    /// pointer is the error the call (described by `call`, formatted only
    /// then) failed with: `errno`, which the caller read with [`errno`]
    /// right after the call, before anything could change it.
    ///
    /// # Safety
    /// `p` is null or an MR registered on `pd` and owned by nobody else:
    /// the `Mr` deregisters it when dropped.
    ///
    /// Safe code cannot wrap just any pointer (issue 12, finding 8):
    ///
    /// ```compile_fail,E0133
    /// fn wrap(pd: &std::sync::Arc<md_ib::verbs::Pd>) {
    ///     let _ = md_ib::verbs::Mr::from_raw(0xdead as *mut rdma_sys::ibv_mr, pd, 0, String::new);
    /// }
    /// ```
    pub unsafe fn from_raw(
        p: *mut ibv_mr,
        pd: &Arc<Pd>,
        errno: i32,
        call: impl FnOnce() -> String,
    ) -> Result<Mr, VerbsError> {
        match NonNull::new(p) {
            // SAFETY: by the contract, a non-null `p` is a live MR, not yet
            // deregistered: its keys can be read.
            Some(ptr) => Ok(unsafe { Mr::wrap(ptr, pd, dereg_mr) }),
            None => Err(VerbsError::new(call(), errno).on(pd.context().name())),
        }
    }

    /// An Mr of `ptr`, deregistered through `dereg`; the keys are read
    /// now and never again.
    ///
    /// # Safety
    /// `ptr` is a live MR of `pd`, owned by nobody else, that `dereg`
    /// deregisters.
    pub(crate) unsafe fn wrap(ptr: NonNull<ibv_mr>, pd: &Arc<Pd>, dereg: Dereg) -> Mr {
        // SAFETY: by the contract `ptr` is a live MR.
        let (lkey, rkey) = unsafe { ((*ptr.as_ptr()).lkey, (*ptr.as_ptr()).rkey) };
        Mr {
            ptr,
            lkey,
            rkey,
            pd: pd.clone(),
            released: false,
            dereg,
        }
    }

    /// The local key, for work requests. After
    /// [`deregister`](Mr::deregister), the key the MR had (which names
    /// nothing, or another registration, by then).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key, for peers; after a deregistration, as `lkey`.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Mr {
    /// Deregisters the MR now. `covers` is what keeps the memory of the
    /// registration alive (its allocation, the handle of its owner): it is
    /// dropped once the NIC has let go of the memory. If ibv_dereg_mr fails,
    /// the NIC may still read or write that memory, so `covers` is leaked
    /// (never dropped, so never freed) and the failure logged as an error.
    /// Returns whether the MR was deregistered; a second call does nothing.
    /// The MR itself is never read again (the keys were read at
    /// registration).
    pub fn deregister<T>(&mut self, covers: T) -> bool {
        if std::mem::replace(&mut self.released, true) {
            drop(covers);
            return true;
        }
        let (ptr, dereg) = (self.ptr.as_ptr(), self.dereg);
        let pd = self.pd.clone();
        release(
            "a memory region",
            // SAFETY: `wrap` made this Mr the MR's only owner, and
            // `released` makes this the only deregistration.
            || unsafe { dereg(ptr) },
            (covers, pd),
        )
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // An owner that did not deregister: nothing known to keep, but the
        // protection domain the MR lives in.
        self.deregister(());
    }
}

/// Deregisters a memory region through `dereg` (ibv_dereg_mr, or a test's
/// stand-in). `covers` is what keeps the memory of the registration alive:
/// dropped after a successful deregistration, leaked after a failed one,
/// because the NIC may still reach the memory. Returns whether the MR was
/// deregistered.
fn release<T>(what: &str, dereg: impl FnOnce() -> libc::c_int, covers: T) -> bool {
    let r = dereg();
    if r == 0 {
        drop(covers);
        return true;
    }
    std::mem::forget(covers);
    log::error!(
        "verbs: ibv_dereg_mr of {what} failed: {}; the NIC may still read or write its memory, so that memory is leaked (never freed) until the process exits",
        crate::error::errno_text(r)
    );
    false
}

/// Fake verbs objects for host tests of what owns what (no NIC here).
#[cfg(test)]
pub(crate) mod fakes {
    use super::*;

    /// A protection domain that is never used: its pointers dangle, so it
    /// must never be dropped (the tests forget a reference to it).
    pub(crate) fn fake_pd() -> Arc<Pd> {
        let ctx = Arc::new(Context {
            ptr: NonNull::dangling(),
            name: "fake0".into(),
        });
        let pd = Arc::new(Pd {
            ptr: NonNull::dangling(),
            ctx,
        });
        std::mem::forget(pd.clone());
        pd
    }

    /// An ibv_mr with keys 7 and 9, on the heap (a test's dereg frees it).
    pub(crate) fn fake_mr() -> NonNull<ibv_mr> {
        // SAFETY: ibv_mr is plain C data: all zeroes is a valid value.
        let mut mr: Box<ibv_mr> = Box::new(unsafe { std::mem::zeroed() });
        mr.lkey = 7;
        mr.rkey = 9;
        NonNull::from(Box::leak(mr))
    }

    /// A dereg that fails as a NIC that keeps the registration does.
    pub(crate) unsafe fn busy(_: *mut ibv_mr) -> libc::c_int {
        libc::EBUSY
    }
}

#[cfg(test)]
mod tests {
    use super::fakes::{busy, fake_mr, fake_pd};
    use super::*;
    use uct_core::host_alloc::HostAlloc;

    /// A dereg that succeeds, and scribbles over the freed MR the way a
    /// reuse of its memory would.
    unsafe fn scribble(mr: *mut ibv_mr) -> libc::c_int {
        // SAFETY: `mr` came from `fake_mr` (a leaked Box), deregistered
        // once.
        unsafe {
            (*mr).lkey = 0xdead;
            (*mr).rkey = 0xdead;
        }
        0
    }

    /// A failed registration reports the errno read right after the call,
    /// whatever the message's formatting did to the thread's errno since.
    #[test]
    fn a_failed_registration_keeps_the_errno_read_after_the_call() {
        let pd = fake_pd();
        let clobber = || {
            // What an allocation may do: set errno to something else.
            // SAFETY: __errno_location is this thread's errno.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            "ibv_reg_dmabuf_mr(fd 9)".to_string()
        };
        // SAFETY: a null MR: nothing is wrapped.
        let e = unsafe { Mr::from_raw(std::ptr::null_mut(), &pd, crate::error::ENOTSUPP, clobber) }
            .err()
            .expect("a null MR is an error");
        assert_eq!(e.errno, crate::error::ENOTSUPP);
        assert!(e.to_string().contains("ibv_reg_dmabuf_mr(fd 9)"), "{e}");
        assert_eq!(errno(), libc::ENOMEM, "the stand-in allocation ran");
    }

    /// Finding 12.7, through `Mr::deregister` (what IbBacking's Drop
    /// calls) with a failing ibv_dereg_mr: what keeps the memory alive is
    /// leaked, and the memory stays mapped.
    #[test]
    fn a_failed_dereg_leaks_the_memory_it_covers() {
        let len = 4 << 20;
        let mem = HostAlloc::new(len).expect("alloc");
        let addr = mem.as_ptr();
        let owner = Arc::new(());
        let pd = fake_pd();
        // SAFETY: a fake MR of a fake PD, deregistered by `busy` only.
        let mut mr = unsafe { Mr::wrap(fake_mr(), &pd, busy) };
        assert!(!mr.deregister((mem, owner.clone())));
        drop(mr);
        assert_eq!(
            Arc::strong_count(&owner),
            2,
            "what kept the memory alive was dropped after a failed ibv_dereg_mr"
        );
        let mut pages = vec![0u8; len / 4096];
        // SAFETY: mincore only reports on the range; it touches no memory
        // but `pages`, which has one byte per page of it.
        let r = unsafe { libc::mincore(addr.cast(), len, pages.as_mut_ptr()) };
        assert_eq!(
            r,
            0,
            "the memory under a live MR was unmapped (freed): {}",
            std::io::Error::last_os_error()
        );
    }

    #[test]
    fn a_successful_dereg_frees_what_it_covered() {
        let owner = Arc::new(());
        let pd = fake_pd();
        // SAFETY: a fake MR of a fake PD, deregistered by `scribble` only.
        let mut mr = unsafe { Mr::wrap(fake_mr(), &pd, scribble) };
        assert!(mr.deregister(owner.clone()));
        assert_eq!(Arc::strong_count(&owner), 1);
        assert!(mr.deregister(owner.clone()), "a second call does nothing");
        assert_eq!(Arc::strong_count(&owner), 1);
    }

    /// Review finding 4: `deregister` is safe, so the keys must not be
    /// read from the freed ibv_mr after it.
    #[test]
    fn the_keys_after_a_deregistration_are_not_read_from_the_freed_mr() {
        let pd = fake_pd();
        // SAFETY: a fake MR of a fake PD, deregistered by `scribble` only.
        let mut mr = unsafe { Mr::wrap(fake_mr(), &pd, scribble) };
        assert!(mr.deregister(()));
        assert_eq!((mr.lkey(), mr.rkey()), (7, 9), "read from the freed MR");
    }
}
