//! The memory of a cma record table: one sealed memfd per process, a
//! header page (the magic, and which process holds each counter area), the
//! records (which only the owner writes) and one area of busy counters per
//! peer process (which that peer writes, see [`records`](super::records)).
//!
//! A peer maps a table through `/proc/<pid>/fd/<fd>` of the process it is
//! connected to, and accepts it only when it is a regular file of exactly
//! [`SIZE`] bytes sealed against shrinking and growing: the size is ours,
//! never read from the table, and the seals (read before the size, so that
//! the size is for good) mean the owner cannot cut pages from under our
//! mapping (which would be SIGBUS on our next record check). The peer's
//! descriptor is resolved with `O_PATH` and reopened only once it is known
//! to be a regular file. The records are mapped read-only on the peer
//! side, so no bug of a peer can rewrite them; only the header (to claim an
//! area) and the peer's own counter area are writable.
//!
//! The counter areas are most of the file, but sparse: a page of them takes
//! memory only once a peer counts an access to one of its records (or the
//! owner reads one at a deregistration); a released area is punched out.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use uct_core::UctError;

use super::records::{Record, CAPACITY};
use crate::segment::peer::{memfd_dev, statx_cached};

/// The header page: the magic, so that a peer refuses a file that is not a
/// table, then the claims, one u32 per counter area: 0 when free, else the
/// pid of the peer process that counts in it ([`RECLAIMING`] while an area
/// is being cleared). Page-sized, so that the records are page-aligned.
const HEADER: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"UCTCMAT3");
/// Where the claims begin in the header.
const CLAIMS: usize = 64;
/// Counter areas, one per peer process mapping the table at a time: a
/// peer past them is refused until one is released or its holder exits.
pub(crate) const PEERS: usize = 512;
/// The claim of an area being cleared (no pid is this large).
pub(crate) const RECLAIMING: u32 = u32::MAX;
const PAGE: usize = 4096;
/// Bytes of the records: [`CAPACITY`] of them, a whole number of pages so
/// that the counters after them can be mapped writable on their own.
pub(crate) const RECORDS_BYTES: usize =
    (CAPACITY as usize * std::mem::size_of::<Record>()).next_multiple_of(PAGE);
/// Bytes of one peer's counter area: one u32 per record, whole pages.
pub(crate) const AREA_BYTES: usize = (CAPACITY as usize * 4).next_multiple_of(PAGE);
/// The size of every table, owner's and peers'.
pub const SIZE: usize = HEADER + RECORDS_BYTES + PEERS * AREA_BYTES;

const _: () = assert!(CLAIMS + PEERS * 4 <= HEADER);

/// A mapping of a whole table: [`SIZE`] bytes at `ptr`, and its file.
#[derive(Debug)]
pub(crate) struct TableMemory {
    ptr: NonNull<u8>,
    /// The memfd, open read-write: areas are cleared through it.
    fd: OwnedFd,
    /// The file's device and inode: the same table mapped twice.
    id: (u64, u64),
}

// SAFETY: a TableMemory owns its mmap region (unmapped once, in Drop) and
// hands out only raw pointers into it, which callers use through atomics;
// moving or sharing it between threads creates no unsynchronised reference.
unsafe impl Send for TableMemory {}
// SAFETY: as for Send.
unsafe impl Sync for TableMemory {}

fn os_err(what: &str) -> UctError {
    UctError::io(what, std::io::Error::last_os_error())
}

/// Takes ownership of the descriptor that `open` or `memfd_create` returned.
///
/// # Safety
/// `raw` must be that call's return value, with errno untouched since: a
/// new descriptor nothing else owns, or -1 with errno set.
unsafe fn owned(raw: libc::c_int) -> std::io::Result<OwnedFd> {
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: by the caller's contract, a new descriptor owned by nobody.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `fcntl(fd, cmd, arg)` for the seal commands, as an io::Result.
fn seals(fd: &OwnedFd, cmd: libc::c_int, arg: libc::c_int) -> std::io::Result<libc::c_int> {
    // SAFETY: F_ADD_SEALS/F_GET_SEALS take an int and touch no memory of
    // this process; fd is open for the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, arg) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// `fstat(fd)`.
fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one struct stat into `stat`, which has room.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the struct.
    Ok(unsafe { stat.assume_init() })
}

/// Whether `fd` is a regular file of exactly [`SIZE`] bytes.
fn is_table_sized(fd: &OwnedFd) -> std::io::Result<bool> {
    let stat = fstat(fd)?;
    Ok(stat.st_mode & libc::S_IFMT == libc::S_IFREG && stat.st_size == SIZE as libc::off_t)
}

/// The pid a `/proc/<pid>/fd/<fd>` path names, if it is one.
pub(crate) fn path_pid(path: &str) -> Option<u32> {
    let (pid, fd) = path.strip_prefix("/proc/")?.split_once("/fd/")?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(fd)).then(|| pid.parse().ok())?
}

/// Refuses a table path that is not `/proc/<pid>/fd/<fd>` of process `pid`.
pub(crate) fn check_path(path: &str, pid: u32) -> Result<(), UctError> {
    match path_pid(path) {
        Some(found) if found == pid => Ok(()),
        Some(found) => Err(UctError::BadRkey(format!(
            "the cma rkey of process {pid} names the record table {path} of process {found}; it is forged or corrupt, ask process {pid} for its own rkey"
        ))),
        None => Err(UctError::BadRkey(format!(
            "'{path}' is not a /proc/<pid>/fd/<fd> path of a cma record table"
        ))),
    }
}

impl TableMemory {
    /// Maps all of `fd` shared with `prot`.
    fn map(fd: OwnedFd, prot: libc::c_int, what: &str) -> Result<TableMemory, UctError> {
        let stat = fstat(&fd).map_err(|e| UctError::io(what, e))?;
        // SAFETY: mapping a descriptor open for the call; the kernel picks a
        // fresh address, so no existing memory is replaced.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(os_err(what));
        }
        let ptr = NonNull::new(addr as *mut u8).ok_or_else(|| os_err(what))?;
        Ok(TableMemory {
            ptr,
            fd,
            id: (stat.st_dev, stat.st_ino),
        })
    }

    fn magic(&self) -> &AtomicU64 {
        // SAFETY: the mapping is SIZE > 8 bytes, page-aligned; an atomic
        // read of shared memory another process may write is no data race;
        // the borrow is tied to self, which keeps the mapping.
        unsafe { &*(self.ptr.as_ptr() as *const AtomicU64) }
    }

    /// This process's table: a memfd of [`SIZE`] bytes, mapped read-write,
    /// sealed against resizing before any peer can see it. Returns the
    /// mapping (whose descriptor keeps `/proc/<pid>/fd/<fd>` open for peers)
    /// and that path.
    pub(crate) fn create() -> Result<(TableMemory, String), UctError> {
        let label = CString::new("uct-cma-records").map_err(|_| os_err("memfd label"))?;
        // SAFETY: a valid nul-terminated label; memfd_create returns a new
        // descriptor or -1 with errno set.
        let fd = unsafe {
            owned(libc::memfd_create(
                label.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            ))
        }
        .map_err(|e| UctError::io("cma: memfd_create for the record table", e))?;
        // SAFETY: ftruncate on a descriptor open for the call touches no
        // memory of this process.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } != 0 {
            return Err(UctError::NoMemory(format!(
                "cma: sizing the {SIZE}-byte record table failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        seals(
            &fd,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
        .map_err(|e| UctError::io("cma: sealing the record table", e))?;
        let path = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
        let mem = TableMemory::map(
            fd,
            libc::PROT_READ | libc::PROT_WRITE,
            "cma: map the record table",
        )?;
        mem.magic().store(MAGIC, Ordering::Release);
        Ok((mem, path))
    }

    /// Maps the table of process `pid` at `path`, after checking that the
    /// path is that process's, and that the file is a table (see the module
    /// documentation). Nothing but `/proc/<pid>/fd/<fd>` is ever opened, and
    /// that only as a path (`O_PATH`) until it is known to be a regular
    /// file: a FIFO or a device of the peer's is never opened.
    pub(crate) fn open(path: &str, pid: u32, region_id: u64) -> Result<TableMemory, UctError> {
        check_path(path, pid)?;
        let cpath =
            CString::new(path).map_err(|_| UctError::BadRkey("path contains a nul byte".into()))?;
        // SAFETY: a valid nul-terminated path; open returns a new descriptor
        // or -1 with errno set. O_PATH only resolves the path: the file
        // itself is not opened, whatever it is.
        let opath = unsafe { owned(libc::open(cpath.as_ptr(), libc::O_PATH | libc::O_CLOEXEC)) }
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => UctError::NoSuchRegion { region_id },
                Some(libc::EACCES) | Some(libc::EPERM) => UctError::EndpointFailed(format!(
                    "cma: not permitted to open {path} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 0)"
                )),
                _ => UctError::io(format!("cma: open the record table {path}"), e),
            })?;
        let not_table = |why: &str| {
            UctError::BadRkey(format!(
                "{path} of process {pid} is not a cma record table ({why}); the peer is broken or hostile"
            ))
        };
        let not_sized = || not_table(&format!("not a regular file of {SIZE} bytes"));
        // From the inode the kernel holds, asking no filesystem: a file a
        // FUSE or NFS server of the peer's serves would block us here, and
        // in the open below. Only a memfd (the kernel's shm mount) passes.
        let (mode, dev, _) = statx_cached(opath.as_fd())
            .map_err(|e| UctError::io(format!("cma: stat {path}"), e))?;
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(not_sized());
        }
        let memfd = memfd_dev().map_err(|e| UctError::Device {
            device: "cma".into(),
            message: e,
            source: None,
        })?;
        if dev != memfd {
            return Err(not_table(&format!(
                "a regular file on device {}:{}, not a memfd",
                libc::major(dev),
                libc::minor(dev)
            )));
        }
        let reopen = CString::new(format!("/proc/self/fd/{}", opath.as_raw_fd()))
            .map_err(|_| os_err("cma: the path of a descriptor"))?;
        // SAFETY: as above; a regular file now, opened without blocking,
        // without taking a terminal.
        let fd = unsafe {
            owned(libc::open(
                reopen.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
            ))
        }
        .map_err(|e| UctError::io(format!("cma: open the record table {path} read-write"), e))?;
        // The seals first: once the file can neither shrink nor grow, the
        // size read next is its size for good (read before, the owner could
        // shrink it in between, then seal it).
        let sealed = seals(&fd, libc::F_GET_SEALS, 0).unwrap_or(0);
        let resize = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if sealed & resize != resize {
            return Err(not_table("not sealed against shrinking and growing"));
        }
        between_checks();
        if !is_table_sized(&fd).map_err(|e| UctError::io(format!("cma: stat {path}"), e))? {
            return Err(not_sized());
        }
        let mem = TableMemory::map(fd, libc::PROT_READ, "cma: map a peer's record table")?;
        // SAFETY: the header is the first page of the mapping; making it
        // writable changes no Rust reference (the claims are atomics).
        mem.protect(
            mem.ptr.as_ptr(),
            HEADER,
            "cma: make a peer's table header writable",
        )?;
        if mem.magic().load(Ordering::Acquire) != MAGIC {
            return Err(not_table("no table magic"));
        }
        Ok(mem)
    }

    /// The first record; [`RECORDS_BYTES`] of them follow.
    pub(crate) fn records_ptr(&self) -> *const u8 {
        // SAFETY: HEADER < SIZE, so the result is inside the mapping.
        unsafe { self.ptr.as_ptr().add(HEADER) }
    }

    /// The claims of the [`PEERS`] counter areas.
    pub(crate) fn claims(&self) -> &[AtomicU32; PEERS] {
        // SAFETY: CLAIMS + 4 * PEERS <= HEADER (checked at compile time),
        // inside the mapping, 4-aligned; atomics only, so other processes
        // writing them is no data race; the borrow is tied to self, which
        // keeps the mapping.
        unsafe { &*(self.ptr.as_ptr().add(CLAIMS) as *const [AtomicU32; PEERS]) }
    }

    /// The first counter of area `area` (< [`PEERS`]); [`AREA_BYTES`] of
    /// them follow.
    pub(crate) fn area_ptr(&self, area: usize) -> *mut u8 {
        assert!(area < PEERS, "counter area {area} of {PEERS}");
        // SAFETY: area < PEERS, so the area lies inside the SIZE-byte
        // mapping.
        unsafe {
            self.ptr
                .as_ptr()
                .add(HEADER + RECORDS_BYTES + area * AREA_BYTES)
        }
    }

    /// Makes `len` bytes at `at`, page-aligned inside the mapping, readable
    /// and writable.
    fn protect(&self, at: *mut u8, len: usize, what: &str) -> Result<(), UctError> {
        // SAFETY: `at..at + len` lies inside the mapping (the callers'
        // offsets are constants inside SIZE); making it writable changes no
        // Rust reference (the table is used through atomics only).
        let rw = unsafe {
            libc::mprotect(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rw != 0 {
            return Err(os_err(what));
        }
        Ok(())
    }

    /// Makes counter area `area` writable in this mapping: the peer's own.
    pub(crate) fn make_area_writable(&self, area: usize) -> Result<(), UctError> {
        self.protect(
            self.area_ptr(area),
            AREA_BYTES,
            "cma: make our counter area in a peer's table writable",
        )
    }

    /// Zeroes counter area `area` (and gives its pages back): punched out
    /// of the file, so every mapping of it reads zeros from then on.
    pub(crate) fn clear_area(&self, area: usize) -> Result<(), UctError> {
        assert!(area < PEERS, "counter area {area} of {PEERS}");
        let offset = HEADER + RECORDS_BYTES + area * AREA_BYTES;
        // SAFETY: fallocate on a descriptor open for the call touches no
        // memory of this process (the kernel unmaps the punched pages from
        // every mapping, ours included; they read as zeros after).
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                AREA_BYTES as libc::off_t,
            )
        };
        if r != 0 {
            return Err(os_err("cma: clear a counter area of a record table"));
        }
        Ok(())
    }

    /// The table file's device and inode.
    pub(crate) fn id(&self) -> (u64, u64) {
        self.id
    }
}

impl Drop for TableMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the SIZE bytes `map` mapped, once; no
        // borrow of the mapping outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, SIZE) };
    }
}

/// Test seam: runs the hook a test set, between the two checks of a peer's
/// table, where its owner may still change it.
#[cfg(test)]
fn between_checks() {
    if let Some(hook) = tests::BETWEEN_CHECKS.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

#[cfg(not(test))]
#[inline(always)]
fn between_checks() {}

#[cfg(test)]
mod tests;
