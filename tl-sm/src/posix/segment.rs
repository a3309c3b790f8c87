//! Shared-memory segments: a named POSIX shm object with a header page the
//! owner writes (state, secret, range, rights) and the data after it.
//! A peer maps the segment by the name in the rkey and checks the header
//! before every access, so a region that was freed, a wrong secret, an
//! access outside the range or without the right is refused.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// The fixed part of a segment's header, as one peer read it.
#[derive(Debug, Clone, Copy)]
pub struct View {
    base: u64,
    len: u64,
    granted: u8,
    /// The secret matched and the range fits the mapping.
    valid: bool,
}

/// A mapping of a segment, owned or opened.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: the mapping is shared memory accessed through atomics (header)
// and checked copies (data); the pointer itself is never aliased mutably.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

fn os_err(what: &str) -> UctError {
    UctError::io(what, std::io::Error::last_os_error())
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
    fn map(fd: i32, size: usize, what: &str) -> Result<Mapping, UctError> {
        // SAFETY: mapping a shm fd we hold; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err(what));
        }
        Ok(Mapping {
            ptr: NonNull::new(p as *mut u8).ok_or_else(|| os_err(what))?,
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
        // reused.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_err(&format!(
                "posix: create shared memory {name} (is /dev/shm mounted and writable?)"
            )));
        }
        // SAFETY: fd was just opened.
        let r = unsafe { libc::ftruncate(fd, size as libc::off_t) };
        let mapped = if r != 0 {
            Err(UctError::NoMemory(format!(
                "posix: sizing {name} to {size} bytes failed: {}; /dev/shm may be full",
                std::io::Error::last_os_error()
            )))
        } else {
            Mapping::map(fd, size, "posix: map a new segment")
        };
        // SAFETY: closing our fd; the mapping keeps the segment.
        unsafe { libc::close(fd) };
        let m = match mapped {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: removing the name we created.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                return Err(e);
            }
        };
        m.init_header(secret, len, access);
        Ok(m)
    }

    fn init_header(&self, secret: u64, len: usize, access: Access) {
        let h = self.header();
        h.secret.store(secret, Ordering::Relaxed);
        h.base.store(self.data_ptr() as u64, Ordering::Relaxed);
        h.len.store(len as u64, Ordering::Relaxed);
        h.access.store(access.bits() as u64, Ordering::Relaxed);
        h.owner_pid
            .store(std::process::id() as u64, Ordering::Relaxed);
        h.state.store(LIVE, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
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
        // SAFETY: a valid nul-terminated label.
        let raw = unsafe { libc::memfd_create(clabel.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_err("memfd_create"));
        }
        // SAFETY: raw is a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is open.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(UctError::NoMemory(format!(
                "sizing a {size}-byte memfd failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let m = Mapping::map(fd.as_raw_fd(), size, "map a memfd")?;
        m.init_header(0, len, Access::empty());
        let path = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
        Ok((m, fd, path))
    }

    /// Maps a peer's anonymous segment through its `/proc/<pid>/fd/<fd>`
    /// path; nothing else is opened, whatever the peer sent.
    pub fn open_path(path: &str, region_id: u64) -> Result<Mapping, UctError> {
        let ok = path
            .strip_prefix("/proc/")
            .and_then(|r| r.split_once("/fd/"))
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
        // SAFETY: a valid nul-terminated path.
        let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => UctError::NoSuchRegion { region_id },
                Some(libc::EACCES) | Some(libc::EPERM) => UctError::EndpointFailed(format!(
                    "not permitted to open {path} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 0)"
                )),
                _ => UctError::io(format!("open {path}"), e),
            });
        }
        // SAFETY: raw is a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is open; fstat fills the struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(os_err("stat a peer's segment"));
        }
        let size = st.st_size as usize;
        if size < HEADER_SPACE {
            return Err(UctError::BadRkey(format!(
                "{path} is too small to be a uct segment"
            )));
        }
        let m = Mapping::map(fd.as_raw_fd(), size, "map a peer's segment")?;
        if m.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(UctError::BadRkey(format!("{path} is not a uct segment")));
        }
        Ok(m)
    }

    /// Maps an existing segment by name; a missing one was deregistered.
    pub fn open(name: &str, region_id: u64) -> Result<Mapping, UctError> {
        let cname = c_name(name)?;
        // SAFETY: a valid nul-terminated name.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::ENOENT) {
                UctError::NoSuchRegion { region_id }
            } else {
                UctError::io(format!("posix: open shared memory {name}"), e)
            });
        }
        // SAFETY: fd is open; fstat fills the struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::fstat(fd, &mut st) };
        let size = st.st_size as usize;
        let mapped = if r != 0 {
            Err(os_err("posix: stat a segment"))
        } else if size < HEADER_SPACE {
            Err(UctError::BadRkey(format!(
                "segment {name} is too small to be a uct segment"
            )))
        } else {
            Mapping::map(fd, size, "posix: map a peer's segment")
        };
        // SAFETY: closing our fd; the mapping keeps the segment.
        unsafe { libc::close(fd) };
        let m = mapped?;
        if m.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(UctError::BadRkey(format!("{name} is not a uct segment")));
        }
        Ok(m)
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the mapping is at least HEADER_SPACE bytes, page-aligned,
        // and SegHeader is all atomics.
        unsafe { &*(self.ptr.as_ptr() as *const SegHeader) }
    }

    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the mapping is at least HEADER_SPACE bytes.
        unsafe { self.ptr.as_ptr().add(HEADER_SPACE) }
    }

    /// Marks the segment freed: peers that still map it are refused.
    pub fn mark_dead(&self) {
        self.header().state.store(DEAD, Ordering::Release);
    }

    pub fn is_dead(&self) -> bool {
        self.header().state.load(Ordering::Acquire) != LIVE
    }

    /// Checks an access at the owner's address `addr` and returns where it
    /// is in this mapping.
    /// Reads the header fields that never change while the segment lives,
    /// and checks `secret` against them once.
    pub fn view(&self, secret: u64) -> View {
        let h = self.header();
        let len = h.len.load(Ordering::Relaxed);
        View {
            base: h.base.load(Ordering::Relaxed),
            len,
            granted: h.access.load(Ordering::Relaxed) as u8,
            valid: h.secret.load(Ordering::Relaxed) == secret
                && (HEADER_SPACE as u64).saturating_add(len) <= self.size as u64,
        }
    }

    /// Checks an access at the owner's address `addr` and returns where it
    /// is in this mapping. The fixed header fields come from `v`; only
    /// whether the segment is still alive is read from shared memory.
    #[inline]
    pub fn check_view(
        &self,
        v: &View,
        region_id: u64,
        secret: u64,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> Result<*mut u8, UctError> {
        let ok = v.valid
            && self.header().state.load(Ordering::Acquire) == LIVE
            && addr >= v.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= v.base.saturating_add(v.len))
            && v.granted & needed.bits() == needed.bits();
        if !ok {
            return Err(self.refusal(region_id, secret, addr, len, needed));
        }
        // SAFETY: the view was read from this mapping's header: addr - base
        // + len <= len and HEADER_SPACE + len <= size.
        Ok(unsafe { self.data_ptr().add((addr - v.base) as usize) })
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
        let h = self.header();
        if h.state.load(Ordering::Acquire) != LIVE {
            return UctError::NoSuchRegion { region_id };
        }
        if h.secret.load(Ordering::Relaxed) != secret {
            return UctError::BadSecret;
        }
        let base = h.base.load(Ordering::Relaxed);
        let rlen = h.len.load(Ordering::Relaxed);
        let granted = Access::from_bits_truncate(h.access.load(Ordering::Relaxed) as u8);
        if !granted.contains(needed) {
            return UctError::AccessDenied { needed, granted };
        }
        UctError::OutOfRange {
            addr,
            len,
            base,
            region_len: rlen,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped, once.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.size) };
    }
}

/// Removes a segment name (the mapping lives on until unmapped).
pub fn unlink(name: &str) {
    if let Ok(c) = c_name(name) {
        // SAFETY: a valid nul-terminated name.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

/// Removes segments left by processes of this tool that died without
/// cleaning up (`/dev/shm/uct-*-<pid>-*` of a pid that no longer exists).
pub fn remove_stale() {
    let Ok(rd) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("uct-") else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(_kind), Some(pid)) = (parts.next(), parts.next()) else {
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
