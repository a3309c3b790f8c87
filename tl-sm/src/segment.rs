//! Shared-memory segments of the posix transport: a memfd with a header
//! page the owner writes (state, secret, range, rights) and the data after
//! it. The owner keeps the memfd open; a peer opens it as
//! `/proc/<pid>/fd/<fd>` (the rkey or the iface address carries pid and fd)
//! and checks the header before every access, so a region that was freed, a
//! wrong secret (an fd number reused for another segment), an access outside
//! the range or without the right is refused.
//!
//! The kernel enforces what the header cannot. Every segment is sealed
//! against shrinking and growing, and a peer maps one only after checking
//! those seals and its size, so its owner cannot cut pages from under a
//! peer's mapping (SIGBUS). A segment peers may only read is also sealed
//! against new writable mappings (`F_SEAL_FUTURE_WRITE`, after the owner's
//! own mapping), and peers map it `PROT_READ`: no peer can write it, or
//! rewrite its header, whatever it does.

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

impl View {
    /// Whether the secret matched and the header's range fits the mapping.
    pub fn is_valid(&self) -> bool {
        self.valid
    }
}

/// A mapping of a segment, owned or opened: `size` bytes at `ptr`, the
/// header first and the data from [`HEADER_SPACE`] on. Every constructor
/// makes sure `size >= HEADER_SPACE`.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    size: usize,
    /// Mapped PROT_WRITE; a read-only mapping grants no write or atomic,
    /// whatever its header says.
    writable: bool,
}

/// What peers may do with a segment, enforced by the kernel: how the owner
/// seals it and how a peer maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// Peers map it read-write (memory they may put to or run atomics on,
    /// and receive rings).
    ReadWrite,
    /// Peers map it read-only; the owner seals it against any new writable
    /// mapping.
    ReadOnly,
}

impl Peers {
    /// How peers must map memory granting `access`.
    pub fn for_access(access: Access) -> Peers {
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) {
            Peers::ReadWrite
        } else {
            Peers::ReadOnly
        }
    }
}

/// The seals every segment has: its size is fixed.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

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
/// `raw` must be the return value of such a call (open, memfd_create) made
/// just before, with errno untouched since: a new descriptor nothing else
/// owns, or -1 with errno set.
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

/// The size of the object behind `fd`, if it is a regular file.
fn regular_size(fd: BorrowedFd<'_>) -> std::io::Result<Option<usize>> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fd is an open descriptor borrowed for the call; fstat writes
    // one struct stat into `stat`, which has room for it.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    let regular = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
    Ok(regular.then(|| usize::try_from(stat.st_size).unwrap_or(0)))
}

/// `fcntl(fd, cmd, arg)` for the seal commands.
fn seal_op(fd: BorrowedFd<'_>, cmd: libc::c_int, arg: libc::c_int) -> std::io::Result<libc::c_int> {
    // SAFETY: F_ADD_SEALS and F_GET_SEALS take an int and touch no memory
    // of this process; fd is open for the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, arg) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// Seals a new segment: its size always, and for [`Peers::ReadOnly`] every
/// writable mapping made after the owner's. A kernel without
/// F_SEAL_FUTURE_WRITE (before 5.1) leaves the rights to the header check,
/// said once in the log.
fn seal(fd: BorrowedFd<'_>, peers: Peers) -> Result<(), UctError> {
    let seals = SIZE_SEALS | libc::F_SEAL_SEAL;
    if peers == Peers::ReadOnly {
        match seal_op(fd, libc::F_ADD_SEALS, seals | libc::F_SEAL_FUTURE_WRITE) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::warn!(
                        "posix: this kernel cannot seal memory against peers' writes \
                         (F_SEAL_FUTURE_WRITE needs Linux 5.1); read-only regions are \
                         protected by the segment header check only"
                    )
                });
            }
            Err(e) => return Err(UctError::io("posix: seal a read-only segment", e)),
        }
    }
    seal_op(fd, libc::F_ADD_SEALS, seals)
        .map(|_| ())
        .map_err(|e| UctError::io("posix: seal a segment", e))
}

impl Mapping {
    /// Maps `size` bytes of `fd`, shared, writable or not. The caller makes
    /// sure `size >= HEADER_SPACE` and that the object has that many bytes
    /// for as long as the mapping lives (a sealed size).
    fn map(
        fd: BorrowedFd<'_>,
        size: usize,
        writable: bool,
        what: &str,
    ) -> Result<Mapping, UctError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping a descriptor borrowed for the call; the kernel
        // picks a fresh address, so no existing memory is replaced.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                prot,
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
            writable,
        })
    }

    /// Creates a segment with `len` bytes of data, owned by this process:
    /// a memfd (named `label` in `/proc/<pid>/maps`), mapped read-write here,
    /// its header written, then sealed for `peers`. Peers open it through
    /// the returned descriptor, which the owner keeps open for as long as
    /// they may.
    pub fn create(
        label: &str,
        len: usize,
        secret: u64,
        access: Access,
        peers: Peers,
    ) -> Result<(Mapping, OwnedFd), UctError> {
        let size = HEADER_SPACE
            .checked_add(len.max(1))
            .ok_or_else(|| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        let clabel =
            CString::new(label).map_err(|_| UctError::InvalidParam("memfd label".into()))?;
        // SAFETY: a valid nul-terminated label; memfd_create returns a new
        // descriptor or -1 with errno set.
        let fd = unsafe {
            fd_from_call(libc::memfd_create(
                clabel.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            ))
        }
        .map_err(|e| UctError::io("posix: memfd_create for a segment", e))?;
        set_size(fd.as_fd(), size).map_err(|e| {
            UctError::NoMemory(format!(
                "posix: sizing a {size}-byte segment failed: {e}; memory is short"
            ))
        })?;
        let mapping = Mapping::map(fd.as_fd(), size, true, "posix: map a new segment")?;
        mapping.init_header(secret, len, access);
        seal(fd.as_fd(), peers)?;
        Ok((mapping, fd))
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

    /// Maps the segment that process `pid` keeps open as descriptor `fd`,
    /// as `peers` says (read-write or read-only), after checking that it is
    /// one: a memfd sealed against shrinking and growing, large enough for
    /// the header, with the magic. A missing descriptor was closed by its
    /// owner: [`UctError::NoSuchRegion`] with `region_id`.
    pub fn open(pid: u32, fd: u32, region_id: u64, peers: Peers) -> Result<Mapping, UctError> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let cpath = CString::new(path.as_str()).map_err(|_| UctError::BadRkey(path.clone()))?;
        let mode = match peers {
            Peers::ReadWrite => libc::O_RDWR,
            Peers::ReadOnly => libc::O_RDONLY,
        };
        // SAFETY: a valid nul-terminated path; open returns a new descriptor
        // or -1 with errno set. O_NONBLOCK: a descriptor that names a FIFO
        // must not block us; O_NOCTTY: nor become our terminal.
        let file = unsafe {
            fd_from_call(libc::open(
                cpath.as_ptr(),
                mode | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
            ))
        }
        .map_err(|e| match e.raw_os_error() {
            // ENXIO: the number now names a socket, so the region's was closed.
            Some(libc::ENOENT | libc::ESRCH | libc::ENXIO) => UctError::NoSuchRegion { region_id },
            Some(libc::EACCES) | Some(libc::EPERM) => UctError::EndpointFailed(format!(
                "not permitted to open {path} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 1)"
            )),
            _ => UctError::io(format!("posix: open {path}"), e),
        })?;
        let not_a_segment = |why: String| {
            UctError::BadRkey(format!(
                "{path} is not a sealed uct segment: {why}; its owner is broken or hostile"
            ))
        };
        // Sealed first, then sized: seals cannot be removed, so the size
        // read after them is the size for good.
        let seals = seal_op(file.as_fd(), libc::F_GET_SEALS, 0)
            .map_err(|e| not_a_segment(format!("no seals ({e})")))?;
        if seals & SIZE_SEALS != SIZE_SEALS {
            return Err(not_a_segment(format!(
                "seals {seals:#x} lack F_SEAL_SHRINK|F_SEAL_GROW, so its owner could shrink it under our mapping"
            )));
        }
        let size = regular_size(file.as_fd())
            .map_err(|e| UctError::io(format!("posix: stat {path}"), e))?
            .ok_or_else(|| not_a_segment("not a regular file".into()))?;
        if size < HEADER_SPACE {
            return Err(not_a_segment(format!("{size} bytes, less than its header")));
        }
        if peers == Peers::ReadWrite
            && seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0
        {
            return Err(UctError::AccessDenied {
                needed: Access::REMOTE_WRITE,
                granted: Access::REMOTE_READ,
            });
        }
        let mapping = Mapping::map(
            file.as_fd(),
            size,
            peers == Peers::ReadWrite,
            "posix: map a peer's segment",
        )?;
        if mapping.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(not_a_segment("no uct segment magic".into()));
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
        // Drop, which the returned borrow of self outlives. A read-only
        // mapping's header is only loaded (plain loads of aligned u64s),
        // never stored to (mark_dead checks).
        unsafe { &*(self.ptr.as_ptr() as *const SegHeader) }
    }

    /// Where the data starts in this mapping: one page in, page-aligned.
    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: every constructor maps at least HEADER_SPACE bytes, so the
        // result is inside the mapping or one past its end.
        unsafe { self.ptr.as_ptr().add(HEADER_SPACE) }
    }

    /// The rights the header grants, less what this mapping cannot do: a
    /// read-only mapping never writes, whatever the header says.
    fn granted(&self) -> Access {
        let granted =
            Access::from_bits_truncate(self.header().access.load(Ordering::Relaxed) as u8);
        if self.writable {
            granted
        } else {
            granted - (Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        }
    }

    /// Whether this mapping may be written.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Marks the segment freed: peers that still map it are refused.
    pub fn mark_dead(&self) {
        // Only owners mark, through their writable mapping; a store to a
        // read-only one would fault.
        if self.writable {
            self.header().state.store(DEAD, Ordering::Release);
        }
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
            granted: self.granted().bits(),
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
        let granted = self.granted();
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

#[cfg(test)]
mod tests;
