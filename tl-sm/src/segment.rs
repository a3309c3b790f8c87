//! Shared-memory segments of the posix transport: a memfd with a header
//! page the owner writes (state, region id, secret, range, rights) and the data after
//! it. The owner keeps the memfd open; a peer opens it as
//! `/proc/<pid>/fd/<fd>` (the rkey or the iface address carries pid and fd)
//! and checks the header before every access, so a region that was freed,
//! another region (an fd number reused for a later segment), a wrong
//! secret, an access outside the range or without the right is refused.
//!
//! The kernel enforces what the header cannot. Every segment is sealed
//! against shrinking and growing, and a peer maps one only after checking
//! those seals and its size, so its owner cannot cut pages from under a
//! peer's mapping (SIGBUS). A segment peers may only read is also sealed
//! against new writable mappings (`F_SEAL_FUTURE_WRITE`, after the owner's
//! own mapping), and peers map it `PROT_READ`: no peer can write it, or
//! rewrite its header, whatever it does.
//!
//! What a peer names is checked before it costs us anything: its descriptor
//! is opened `O_PATH` and must be a regular file before it is opened for
//! reading or writing, and only what its header claims is mapped, at most
//! [`MAX_PEER_DATA`] bytes. A header whose base is not page-aligned is
//! refused, so an aligned owner's address is aligned in our mapping too.

use std::ffi::CString;

pub use peer::file_id;
use peer::PeerFile;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use uct_core::{Access, UctError};

/// Bytes before the data: one page, so the data is page-aligned.
pub const HEADER_SPACE: usize = 4096;
/// The most data of a peer's segment this process maps: what the posix MD
/// allocates at most. A header that claims more is refused, so that a
/// peer's sparse segment cannot take our address space.
pub const MAX_PEER_DATA: usize = 1 << 40;
const MAGIC: u64 = u64::from_le_bytes(*b"UCTSEG02");
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
    /// The region id its rkeys carry: descriptor numbers are reused, so a
    /// stale rkey may open a later segment, which this tells apart from a
    /// forged secret.
    region_id: AtomicU64,
}

// The header must fit the space before the data, which is page-aligned.
const _: () = assert!(std::mem::size_of::<SegHeader>() <= HEADER_SPACE);

/// The fixed part of a segment's header, as one peer read it.
#[derive(Debug, Clone, Copy)]
pub struct View {
    base: u64,
    len: u64,
    granted: u8,
    /// The region id and the secret matched and the range fits the mapping.
    valid: bool,
}

impl View {
    /// Whether the region id and the secret matched and the header's range
    /// fits the mapping.
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
        (secret, region_id): (u64, u64),
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
        mapping.init_header(secret, region_id, len, access);
        seal(fd.as_fd(), peers)?;
        Ok((mapping, fd))
    }

    /// `len` bytes of data (after a header, as in a segment) in private
    /// anonymous memory: for memory no peer may reach, which therefore has
    /// no descriptor any process could open through `/proc`.
    pub fn anonymous(len: usize, secret: u64, access: Access) -> Result<Mapping, UctError> {
        let size = HEADER_SPACE
            .checked_add(len.max(1))
            .ok_or_else(|| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // picks; no existing memory is replaced.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(UctError::NoMemory(format!(
                "posix: mapping {size} bytes of local memory failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mapping = Mapping {
            ptr: NonNull::new(addr as *mut u8).ok_or_else(|| os_err("posix: mmap"))?,
            size,
            writable: true,
        };
        mapping.init_header(secret, 0, len, access);
        Ok(mapping)
    }

    fn init_header(&self, secret: u64, region_id: u64, len: usize, access: Access) {
        let header = self.header();
        header.secret.store(secret, Ordering::Relaxed);
        header.region_id.store(region_id, Ordering::Relaxed);
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
    /// the header, with the magic. A file sealed against writes is mapped
    /// read-only even when `peers` asks for writes (the checks refuse them
    /// once the header says it is the region named). Only as much as its header claims is
    /// mapped, and never more than [`MAX_PEER_DATA`] bytes of data. A
    /// missing descriptor was closed by its owner:
    /// [`UctError::NoSuchRegion`] with `region_id`.
    pub fn open(pid: u32, fd: u32, region_id: u64, peers: Peers) -> Result<Mapping, UctError> {
        let peer = PeerFile::open(pid, fd, region_id, peers)?;
        // The header as a copy, before anything is mapped.
        let word = |offset: usize| peer.read_u64(offset);
        if word(std::mem::offset_of!(SegHeader, magic))? != MAGIC {
            return Err(peer.not_a_segment("no uct segment magic".into()));
        }
        // A stale rkey whose descriptor number now names a later segment,
        // or a segment its owner freed, costs no mapping: it is refused
        // here, from the copy (the mapped header decides again later).
        if word(std::mem::offset_of!(SegHeader, region_id))? != region_id
            || word(std::mem::offset_of!(SegHeader, state))? != LIVE
        {
            return Err(UctError::NoSuchRegion { region_id });
        }
        let len = word(std::mem::offset_of!(SegHeader, len))?;
        if len > MAX_PEER_DATA as u64 {
            return Err(peer.not_a_segment(format!(
                "its header claims {len} bytes of data, more than the {MAX_PEER_DATA} a peer maps"
            )));
        }
        // What the owner's create made of that length, or the whole object
        // when its header claims more (then every access is refused).
        let size = peer.size.min(HEADER_SPACE + (len as usize).max(1));
        // A segment sealed read-only is mapped read-only even when writes
        // were asked for: whether it is the region the rkey names is told
        // by its header, before any rights are judged.
        Mapping::map(
            peer.file.as_fd(),
            size,
            peer.writable,
            "posix: map a peer's segment",
        )
    }

    /// Maps `HEADER_SPACE + bytes` of the segment that process `pid` keeps
    /// open as descriptor `fd`, read-write, after checking that it is the
    /// object `file_id` names (see [`file_id`]), sealed against shrinking and
    /// growing, and that large. Nothing in it is read: every process that
    /// maps it read-write can write all of it.
    pub fn open_shared(
        pid: u32,
        fd: u32,
        bytes: usize,
        expected: (u64, u64),
    ) -> Result<Mapping, UctError> {
        let peer = PeerFile::open(pid, fd, 0, Peers::ReadWrite)?;
        if peer.id != expected {
            return Err(peer.not_a_segment(format!(
                "it is object {:?}, not the {expected:?} its owner named",
                peer.id
            )));
        }
        if !peer.writable {
            return Err(UctError::BadRkey(format!(
                "process {pid}'s posix ring (descriptor {fd}) is sealed against writes, and a ring must be writable: the peer is another uct-rs version, or broken or hostile; connect to another peer"
            )));
        }
        let size = HEADER_SPACE.saturating_add(bytes);
        if peer.size < size {
            return Err(peer.not_a_segment(format!(
                "{} bytes, less than the {size} it must hold",
                peer.size
            )));
        }
        Mapping::map(
            peer.file.as_fd(),
            size,
            true,
            "posix: map a peer's shared segment",
        )
    }

    /// Bytes this mapping maps, header included (address space it costs).
    pub fn mapped_bytes(&self) -> usize {
        self.size
    }

    /// The process that created the segment, as its header says.
    pub fn owner_pid(&self) -> u64 {
        self.header().owner_pid.load(Ordering::Relaxed)
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
    /// and checks `region_id` and `secret` against them once.
    pub fn view(&self, region_id: u64, secret: u64) -> View {
        let header = self.header();
        let len = header.len.load(Ordering::Relaxed);
        let base = header.base.load(Ordering::Relaxed);
        View {
            base,
            len,
            granted: self.granted().bits(),
            // A base off its page would put the owner's aligned addresses
            // at misaligned places in our mapping.
            valid: header.region_id.load(Ordering::Relaxed) == region_id
                && header.secret.load(Ordering::Relaxed) == secret
                && base.is_multiple_of(HEADER_SPACE as u64)
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
            // A view read from a writable mapping, used on a read-only one,
            // must not let a store through (it would fault).
            && (self.writable || !needed.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC))
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

    /// [`check_view`](Self::check_view) for an atomic of `width` bytes at
    /// the owner's address `addr`: `addr` must be aligned to `width`, and so
    /// must the place it has in this mapping, whatever the header's base
    /// says, before any atomic touches it.
    #[inline]
    pub fn check_atomic(
        &self,
        view: &View,
        region_id: u64,
        secret: u64,
        addr: u64,
        width: usize,
    ) -> Result<*mut u8, UctError> {
        uct_core::atomic_ops::check_aligned(addr, width)?;
        let word = self.check_view(
            view,
            region_id,
            secret,
            addr,
            width as u64,
            Access::REMOTE_ATOMIC,
        )?;
        if !(word as usize).is_multiple_of(width) {
            return Err(misplaced(view.base));
        }
        Ok(word)
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
        // A segment that is gone, or another one behind the descriptor
        // number the rkey names (a stale rkey), is not the region named.
        if header.state.load(Ordering::Acquire) != LIVE
            || header.region_id.load(Ordering::Relaxed) != region_id
        {
            return UctError::NoSuchRegion { region_id };
        }
        if header.secret.load(Ordering::Relaxed) != secret {
            return UctError::BadSecret;
        }
        let base = header.base.load(Ordering::Relaxed);
        if !base.is_multiple_of(HEADER_SPACE as u64) {
            return misplaced(base);
        }
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

/// The error for a header whose base is not page-aligned, as no owner of
/// this library writes it.
#[cold]
fn misplaced(base: u64) -> UctError {
    UctError::BadRkey(format!(
        "the segment header's base {base:#x} is not page-aligned: its owner, or a peer that \
         may write it, is broken or hostile; accesses through it are refused"
    ))
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the `size` bytes at `ptr` that `map`
        // mapped, once; no borrow of the mapping outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.size) };
    }
}

pub(crate) mod peer;
#[cfg(test)]
mod tests;
