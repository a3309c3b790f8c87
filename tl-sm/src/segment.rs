//! Shared-memory segments: a named POSIX shm object with a header page the
//! owner writes (state, secret, range, rights) and the data after it.
//! A peer maps the segment by the name in the rkey and checks the header
//! before every access, so a region that was freed, a wrong secret, an
//! access outside the range or without the right is refused.
//!
//! Both sm transports use them: posix for its memory and its receive rings
//! (named segments), cma for its registration-record table (an anonymous
//! segment, [`Mapping::create_anonymous`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use uct_core::{Access, UctError};

/// Bytes before the data: one page, so the data is page-aligned.
pub const HEADER_SPACE: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"UCTSEG01");
const LIVE: u64 = 1;
const DEAD: u64 = 2;

/// The header at the start of a segment, written by its owner.
#[repr(C)]
pub struct SegHeader {
    magic: AtomicU64,
    state: AtomicU64,
    secret: AtomicU64,
    /// The owner's address of the data, which peers address.
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU64,
    owner_pid: AtomicU64,
}

// The header must fit the space before the data, which is page-aligned.
const _: () = assert!(std::mem::size_of::<SegHeader>() <= HEADER_SPACE);

/// The fixed part of a segment's header, as one peer read it.
#[derive(Debug, Clone, Copy)]
pub struct View {
    base: u64,
    len: u64,
    granted: u8,
    /// The secret matched and the range fits the mapping.
    valid: bool,
}

/// A mapping of a segment, owned or opened: `size` bytes at `ptr`, the
/// header first and the data from [`HEADER_SPACE`] on. Every constructor
/// makes sure `size >= HEADER_SPACE`.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: a Mapping owns its mmap region (unmapped once, in Drop) and holds
// no reference into it: the header is read and written through atomics
// only, and the data only through raw pointers handed to callers, so moving
// a Mapping to another thread, or sharing &Mapping between threads, creates
// no unsynchronised Rust references.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

fn os_err(what: &str) -> UctError {
    UctError::io(what, std::io::Error::last_os_error())
}

/// Takes ownership of the descriptor a call that opens one returned.
///
/// # Safety
/// `raw` must be the return value of such a call (shm_open, open,
/// memfd_create) made just before, with errno untouched since: a new
/// descriptor nothing else owns, or -1 with errno set.
unsafe fn fd_from_call(raw: libc::c_int) -> std::io::Result<OwnedFd> {
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: by the caller's contract, raw is a new descriptor owned by
    // nobody else; the OwnedFd closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Sets the size of the object behind `fd`.
fn set_size(fd: BorrowedFd<'_>, size: usize) -> std::io::Result<()> {
    // SAFETY: fd is an open descriptor borrowed for the call; ftruncate
    // touches no memory of this process.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The size of the object behind `fd`.
fn size_of_fd(fd: BorrowedFd<'_>) -> std::io::Result<usize> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fd is an open descriptor borrowed for the call; fstat writes
    // one struct stat into `stat`, which has room for it.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.st_size.max(0) as usize)
}

fn c_name(name: &str) -> Result<CString, UctError> {
    if !name.starts_with('/') || name.len() > 200 || name[1..].contains('/') {
        return Err(UctError::BadRkey(format!(
            "'{name}' is not a shared-memory segment name"
        )));
    }
    CString::new(name).map_err(|_| UctError::BadRkey("segment name contains a nul byte".into()))
}

impl Mapping {
    /// Maps `size` bytes of `fd`, shared and writable. The caller makes
    /// sure `size >= HEADER_SPACE`.
    fn map(fd: BorrowedFd<'_>, size: usize, what: &str) -> Result<Mapping, UctError> {
        // SAFETY: mapping a descriptor borrowed for the call; the kernel
        // picks a fresh address, so no existing memory is replaced.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(os_err(what));
        }
        Ok(Mapping {
            ptr: NonNull::new(addr as *mut u8).ok_or_else(|| os_err(what))?,
            size,
        })
    }

    /// Creates segment `name` with `len` bytes of data, owned by this
    /// process, and maps it.
    pub fn create(
        name: &str,
        len: usize,
        secret: u64,
        access: Access,
    ) -> Result<Mapping, UctError> {
        let cname = c_name(name)?;
        let size = HEADER_SPACE
            .checked_add(len.max(1))
            .ok_or_else(|| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        // SAFETY: a valid nul-terminated name; O_EXCL so a name is never
        // reused; shm_open returns a new descriptor or -1 with errno set.
        let fd = unsafe {
            fd_from_call(libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            ))
        }
        .map_err(|e| {
            UctError::io(
                format!("posix: create shared memory {name} (is /dev/shm mounted and writable?)"),
                e,
            )
        })?;
        let mapped = match set_size(fd.as_fd(), size) {
            Err(e) => Err(UctError::NoMemory(format!(
                "posix: sizing {name} to {size} bytes failed: {e}; /dev/shm may be full"
            ))),
            Ok(()) => Mapping::map(fd.as_fd(), size, "posix: map a new segment"),
        };
        // The mapping keeps the segment; the descriptor is closed here.
        drop(fd);
        let mapping = match mapped {
            Ok(mapping) => mapping,
            Err(e) => {
                unlink(name);
                return Err(e);
            }
        };
        mapping.init_header(secret, len, access);
        Ok(mapping)
    }

    fn init_header(&self, secret: u64, len: usize, access: Access) {
        let header = self.header();
        header.secret.store(secret, Ordering::Relaxed);
        header.base.store(self.data_ptr() as u64, Ordering::Relaxed);
        header.len.store(len as u64, Ordering::Relaxed);
        header.access.store(access.bits() as u64, Ordering::Relaxed);
        header
            .owner_pid
            .store(std::process::id() as u64, Ordering::Relaxed);
        header.state.store(LIVE, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
    }

    /// An anonymous segment (memfd): peers open it as
    /// `/proc/<pid>/fd/<fd>` (which needs the same permission as cma), and
    /// it disappears with its last user, even if the owner is killed.
    pub fn create_anonymous(
        label: &str,
        len: usize,
    ) -> Result<(Mapping, OwnedFd, String), UctError> {
        let size = HEADER_SPACE
            .checked_add(len.max(1))
            .ok_or_else(|| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        let clabel =
            CString::new(label).map_err(|_| UctError::InvalidParam("memfd label".into()))?;
        // SAFETY: a valid nul-terminated label; memfd_create returns a new
        // descriptor or -1 with errno set.
        let fd = unsafe { fd_from_call(libc::memfd_create(clabel.as_ptr(), libc::MFD_CLOEXEC)) }
            .map_err(|e| UctError::io("memfd_create", e))?;
        set_size(fd.as_fd(), size)
            .map_err(|e| UctError::NoMemory(format!("sizing a {size}-byte memfd failed: {e}")))?;
        let mapping = Mapping::map(fd.as_fd(), size, "map a memfd")?;
        mapping.init_header(0, len, Access::empty());
        let path = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
        Ok((mapping, fd, path))
    }

    /// Maps a peer's anonymous segment through its `/proc/<pid>/fd/<fd>`
    /// path; nothing else is opened, whatever the peer sent.
    pub fn open_path(path: &str, region_id: u64) -> Result<Mapping, UctError> {
        let ok = path
            .strip_prefix("/proc/")
            .and_then(|rest| rest.split_once("/fd/"))
            .is_some_and(|(pid, fd)| {
                !pid.is_empty()
                    && !fd.is_empty()
                    && pid.bytes().all(|b| b.is_ascii_digit())
                    && fd.bytes().all(|b| b.is_ascii_digit())
            });
        if !ok {
            return Err(UctError::BadRkey(format!(
                "'{path}' is not a /proc/<pid>/fd/<fd> path"
            )));
        }
        let cpath =
            CString::new(path).map_err(|_| UctError::BadRkey("path contains a nul byte".into()))?;
        // SAFETY: a valid nul-terminated path; open returns a new
        // descriptor or -1 with errno set.
        let fd = unsafe { fd_from_call(libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC)) }
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => UctError::NoSuchRegion { region_id },
                Some(libc::EACCES) | Some(libc::EPERM) => UctError::EndpointFailed(format!(
                    "not permitted to open {path} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 0)"
                )),
                _ => UctError::io(format!("open {path}"), e),
            })?;
        Mapping::map_existing(
            fd.as_fd(),
            ["stat a peer's segment", "map a peer's segment"],
            path,
            path,
        )
    }

    /// Maps an existing segment by name; a missing one was deregistered.
    pub fn open(name: &str, region_id: u64) -> Result<Mapping, UctError> {
        let cname = c_name(name)?;
        // SAFETY: a valid nul-terminated name; shm_open returns a new
        // descriptor or -1 with errno set.
        let fd = unsafe { fd_from_call(libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0)) }.map_err(
            |e| {
                if e.raw_os_error() == Some(libc::ENOENT) {
                    UctError::NoSuchRegion { region_id }
                } else {
                    UctError::io(format!("posix: open shared memory {name}"), e)
                }
            },
        )?;
        // The mapping keeps the segment; the descriptor is closed on return.
        Mapping::map_existing(
            fd.as_fd(),
            ["posix: stat a segment", "posix: map a peer's segment"],
            &format!("segment {name}"),
            name,
        )
    }

    /// Maps the whole existing segment behind `fd` after checking that it
    /// is one: large enough for the header, with the magic. `what` says what
    /// failed for the stat and the map; `sized` and `named` name the
    /// segment in the errors for its size and its magic.
    fn map_existing(
        fd: BorrowedFd<'_>,
        what: [&str; 2],
        sized: &str,
        named: &str,
    ) -> Result<Mapping, UctError> {
        let [stat_what, map_what] = what;
        let size = size_of_fd(fd).map_err(|e| UctError::io(stat_what, e))?;
        if size < HEADER_SPACE {
            return Err(UctError::BadRkey(format!(
                "{sized} is too small to be a uct segment"
            )));
        }
        let mapping = Mapping::map(fd, size, map_what)?;
        if mapping.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(UctError::BadRkey(format!("{named} is not a uct segment")));
        }
        Ok(mapping)
    }

    /// Bytes of data after the header in this mapping (what the segment
    /// really has, whatever its header says).
    pub fn data_len(&self) -> usize {
        self.size - HEADER_SPACE
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: every constructor maps at least HEADER_SPACE bytes, and
        // SegHeader fits in them (asserted above); mmap returns a
        // page-aligned address, which satisfies SegHeader's 8-byte
        // alignment; SegHeader is all atomics, so other processes writing it
        // at the same time is no data race; the memory stays mapped until
        // Drop, which the returned borrow of self outlives.
        unsafe { &*(self.ptr.as_ptr() as *const SegHeader) }
    }

    /// Where the data starts in this mapping: one page in, page-aligned.
    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: every constructor maps at least HEADER_SPACE bytes, so the
        // result is inside the mapping or one past its end.
        unsafe { self.ptr.as_ptr().add(HEADER_SPACE) }
    }

    /// Marks the segment freed: peers that still map it are refused.
    pub fn mark_dead(&self) {
        self.header().state.store(DEAD, Ordering::Release);
    }

    /// Whether the owner freed the segment (or never finished creating it).
    pub fn is_dead(&self) -> bool {
        self.header().state.load(Ordering::Acquire) != LIVE
    }

    /// Reads the header fields that never change while the segment lives,
    /// and checks `secret` against them once.
    pub fn view(&self, secret: u64) -> View {
        let header = self.header();
        let len = header.len.load(Ordering::Relaxed);
        View {
            base: header.base.load(Ordering::Relaxed),
            len,
            granted: header.access.load(Ordering::Relaxed) as u8,
            valid: header.secret.load(Ordering::Relaxed) == secret
                && (HEADER_SPACE as u64).saturating_add(len) <= self.size as u64,
        }
    }

    /// Checks an access at the owner's address `addr` and returns where it
    /// is in this mapping. The fixed header fields come from `view`; only
    /// whether the segment is still alive is read from shared memory.
    #[inline]
    pub fn check_view(
        &self,
        view: &View,
        region_id: u64,
        secret: u64,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> Result<*mut u8, UctError> {
        let ok = view.valid
            && self.header().state.load(Ordering::Acquire) == LIVE
            && addr >= view.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= view.base.saturating_add(view.len))
            && view.granted & needed.bits() == needed.bits()
            // A view read from another, larger mapping must not reach past
            // this one. (addr - base + len <= view.len, which fits a usize.)
            && (addr - view.base + len) as usize <= self.data_len();
        if !ok {
            return Err(self.refusal(region_id, secret, addr, len, needed));
        }
        // SAFETY: addr - base + len <= data_len() (checked above), so the
        // offset is inside the data area of this mapping.
        Ok(unsafe { self.data_ptr().add((addr - view.base) as usize) })
    }

    /// Which check refused an access, as a named error (the slow path).
    #[cold]
    #[inline(never)]
    fn refusal(
        &self,
        region_id: u64,
        secret: u64,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> UctError {
        let header = self.header();
        if header.state.load(Ordering::Acquire) != LIVE {
            return UctError::NoSuchRegion { region_id };
        }
        if header.secret.load(Ordering::Relaxed) != secret {
            return UctError::BadSecret;
        }
        let base = header.base.load(Ordering::Relaxed);
        let region_len = header.len.load(Ordering::Relaxed);
        let granted = Access::from_bits_truncate(header.access.load(Ordering::Relaxed) as u8);
        if !granted.contains(needed) {
            return UctError::AccessDenied { needed, granted };
        }
        UctError::OutOfRange {
            addr,
            len,
            base,
            region_len,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the `size` bytes at `ptr` that `map`
        // mapped, once; no borrow of the mapping outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.size) };
    }
}

/// Removes a segment name (the mapping lives on until unmapped).
pub fn unlink(name: &str) {
    if let Ok(cname) = c_name(name) {
        // SAFETY: a valid nul-terminated name, alive for the call.
        unsafe { libc::shm_unlink(cname.as_ptr()) };
    }
}

/// Removes segments left by processes of this tool that died without
/// cleaning up (`/dev/shm/uct-*-<pid>-*` of a pid that no longer exists).
pub fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("uct-") else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(_purpose), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        if let Ok(pid) = pid.parse::<u32>() {
            if !crate::host::pid_alive(pid) {
                log::debug!("posix: removing stale segment /dev/shm/{name}");
                unlink(&format!("/{name}"));
            }
        }
    }
}

#[cfg(test)]
mod tests;
