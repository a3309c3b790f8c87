//! Opening a peer's segment: `/proc/<pid>/fd/<fd>` names whatever the peer
//! keeps open there, so it is first opened with `O_PATH` (which opens
//! nothing: no FIFO wakes, no device acts, no watcher hears of it) and
//! looked at, and reopened for reading or writing only once it is a memfd
//! (a regular file on the kernel's internal shm mount) sealed against
//! shrinking and growing. A file on a filesystem, which its owner may serve
//! (FUSE, NFS) and never answer, is never stat'ed through that filesystem
//! nor opened.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use uct_core::UctError;

use super::{fd_from_call, seal_op, Peers, HEADER_SPACE, SIZE_SEALS};

/// `fstat` of `fd`.
fn stat(fd: BorrowedFd<'_>) -> std::io::Result<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fd is an open descriptor borrowed for the call; fstat writes
    // one struct stat into `stat`, which has room for it.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the whole struct.
    Ok(unsafe { stat.assume_init() })
}

/// Type, device and inode of the object behind the `O_PATH` descriptor
/// `fd`, from the inode the kernel holds: `AT_STATX_DONT_SYNC` asks no
/// filesystem (a FUSE or NFS server) to refresh them.
pub(crate) fn statx_cached(fd: BorrowedFd<'_>) -> std::io::Result<(u32, u64, u64)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: fd is an open descriptor borrowed for the call, the path an
    // empty nul-terminated string (AT_EMPTY_PATH: fd itself); statx writes
    // one struct statx into `stx`, which has room for it.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_INO,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: zeroed, then filled by a successful statx.
    let stx = unsafe { stx.assume_init() };
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    Ok((u32::from(stx.stx_mode), dev, stx.stx_ino))
}

/// The device of every memfd: the kernel's internal shm mount, read once
/// from a memfd of our own.
pub(crate) fn memfd_dev() -> Result<u64, String> {
    // Only a success is kept: a failure (no descriptor left) may pass.
    static DEV: OnceLock<u64> = OnceLock::new();
    if let Some(dev) = DEV.get() {
        return Ok(*dev);
    }
    // SAFETY: a valid nul-terminated name; memfd_create returns a new
    // descriptor or -1 with errno set.
    let fd = unsafe {
        fd_from_call(libc::memfd_create(
            c"uct-dev-probe".as_ptr(),
            libc::MFD_CLOEXEC,
        ))
    }
    .map_err(|e| format!("memfd_create for the memfd device failed: {e}"))?;
    let dev = stat(fd.as_fd())
        .map_err(|e| format!("fstat of a memfd failed: {e}"))?
        .st_dev;
    Ok(*DEV.get_or_init(|| dev))
}

/// The object behind `fd`, as device and inode numbers: what tells one
/// memfd from another whatever descriptor numbers name them.
pub fn file_id(fd: BorrowedFd<'_>) -> std::io::Result<(u64, u64)> {
    let st = stat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// What a file that is not regular is, in words.
fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        _ => "an anonymous inode",
    }
}

/// A peer's segment, opened for reading (and writing, for
/// [`Peers::ReadWrite`] when the file is not sealed against writes: see
/// `writable`) after the checks above.
pub(super) struct PeerFile {
    pub(super) file: OwnedFd,
    /// Its size, read after its seals: fixed for good.
    pub(super) size: usize,
    /// Its [`file_id`].
    pub(super) id: (u64, u64),
    /// Opened for writing: asked for, and the file is not sealed against
    /// writes.
    pub(super) writable: bool,
    path: String,
}

impl PeerFile {
    /// Opens `/proc/<pid>/fd/<fd>` as described above.
    pub(super) fn open(
        pid: u32,
        fd: u32,
        region_id: u64,
        peers: Peers,
    ) -> Result<PeerFile, UctError> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let cpath = CString::new(path.as_str()).map_err(|_| UctError::BadRkey(path.clone()))?;
        // SAFETY: a valid nul-terminated path; open returns a new descriptor
        // or -1 with errno set. O_PATH opens no file: it only names it.
        let handle =
            unsafe { fd_from_call(libc::open(cpath.as_ptr(), libc::O_PATH | libc::O_CLOEXEC)) }
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ESRCH) => UctError::NoSuchRegion { region_id },
                    Some(libc::EACCES) | Some(libc::EPERM) => UctError::EndpointFailed(format!(
                        "not permitted to open {path} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 1)"
                    )),
                    _ => UctError::io(format!("posix: open {path}"), e),
                })?;
        let (named_mode, named_dev, named_ino) = statx_cached(handle.as_fd())
            .map_err(|e| UctError::io(format!("posix: statx {path}"), e))?;
        let peer = |file: OwnedFd| PeerFile {
            file,
            size: 0,
            id: (named_dev, named_ino),
            writable: false,
            path: path.clone(),
        };
        match named_mode as libc::mode_t & libc::S_IFMT {
            libc::S_IFREG => {}
            // The region's descriptor was closed and its number now names
            // a socket (a stale rkey).
            libc::S_IFSOCK => return Err(UctError::NoSuchRegion { region_id }),
            mode => {
                return Err(
                    peer(handle).not_a_segment(format!("not a regular file but {}", kind(mode)))
                )
            }
        }
        let memfds = memfd_dev().map_err(|why| {
            UctError::EndpointFailed(format!(
                "posix: cannot tell a peer's memfd from a file ({why}); posix needs memfd_create \
                 (Linux 3.17) and a free descriptor"
            ))
        })?;
        if named_dev != memfds {
            return Err(peer(handle).not_a_segment(format!(
                "a regular file on device {}:{}, not a memfd (device {}:{}); a filesystem its \
                 owner serves could block every access, so it is not opened",
                libc::major(named_dev),
                libc::minor(named_dev),
                libc::major(memfds),
                libc::minor(memfds)
            )));
        }
        // The same file, opened for real: /proc/self/fd of an O_PATH
        // descriptor names the object it holds.
        let reopen = CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .map_err(|_| UctError::BadRkey(path.clone()))?;
        let open_as = |write: bool| {
            let mode = if write { libc::O_RDWR } else { libc::O_RDONLY };
            // SAFETY: a valid nul-terminated path; open returns a new
            // descriptor or -1 with errno set.
            unsafe {
                fd_from_call(libc::open(
                    reopen.as_ptr(),
                    mode | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
                ))
            }
            .map_err(|e| UctError::io(format!("posix: open {path}"), e))
        };
        let mut peer = peer(open_as(peers == Peers::ReadWrite)?);
        // Sealed first, then sized: seals cannot be removed, so the size
        // read after them is the size for good.
        let seals = seal_op(peer.file.as_fd(), libc::F_GET_SEALS, 0)
            .map_err(|e| peer.not_a_segment(format!("no seals ({e})")))?;
        if seals & SIZE_SEALS != SIZE_SEALS {
            return Err(peer.not_a_segment(format!(
                "seals {seals:#x} lack F_SEAL_SHRINK|F_SEAL_GROW, so its owner could shrink it under our mapping"
            )));
        }
        let st =
            stat(peer.file.as_fd()).map_err(|e| UctError::io(format!("posix: stat {path}"), e))?;
        peer.size = usize::try_from(st.st_size).unwrap_or(0);
        if peer.size < HEADER_SPACE {
            return Err(peer.not_a_segment(format!("{} bytes, less than its header", peer.size)));
        }
        let write_sealed = seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0;
        peer.writable = peers == Peers::ReadWrite && !write_sealed;
        if peers == Peers::ReadWrite && write_sealed {
            // Not refused here: the descriptor number may name a later
            // segment than the rkey's (then the answer is NoSuchRegion), so
            // the header decides. Reopened read-only, since kernels before
            // 6.7 refuse even a read-only shared mapping of a write-sealed
            // file opened for writing.
            peer.file = open_as(false)?;
        }
        Ok(peer)
    }

    /// The error for a file that is no segment of ours.
    pub(super) fn not_a_segment(&self, why: String) -> UctError {
        UctError::BadRkey(format!(
            "{} is not a sealed uct segment: {why}; the region was freed and its descriptor \
             number reused (ask the peer for a fresh rkey), or its owner is broken or hostile",
            self.path
        ))
    }

    /// The u64 at byte `offset` of the file (inside its first
    /// [`HEADER_SPACE`] bytes), read as a copy.
    pub(super) fn read_u64(&self, offset: usize) -> Result<u64, UctError> {
        let mut word = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer.
        let n = unsafe {
            libc::pread(
                self.file.as_raw_fd(),
                word.as_mut_ptr().cast(),
                word.len(),
                offset as libc::off_t,
            )
        };
        if n != word.len() as isize {
            return Err(self.not_a_segment(format!(
                "its header cannot be read ({})",
                std::io::Error::last_os_error()
            )));
        }
        Ok(u64::from_ne_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, OwnedFd};

    use super::*;

    /// A regular file of ours on a filesystem (the test's temp dir) and an
    /// inotify watch of its opens.
    fn watched_file(name: &str) -> (std::path::PathBuf, OwnedFd, OwnedFd) {
        let path = std::env::temp_dir().join(format!("uct-peer-{name}-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 2 * HEADER_SPACE]).unwrap();
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid path; open returns a new descriptor or -1.
        let file =
            unsafe { fd_from_call(libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC)) }
                .unwrap();
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let watch =
            unsafe { fd_from_call(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC)) }
                .unwrap();
        // SAFETY: a valid descriptor and path.
        let wd =
            unsafe { libc::inotify_add_watch(watch.as_raw_fd(), cpath.as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0, "{}", std::io::Error::last_os_error());
        (path, file, watch)
    }

    #[test]
    fn a_regular_file_that_is_no_memfd_is_refused_before_it_is_opened() {
        // A file on a filesystem its owner serves (FUSE, NFS) can block any
        // open or stat that asks that filesystem: only memfds (the kernel's
        // internal shm mount) are looked at further, and nothing else is
        // opened.
        let (path, file, watch) = watched_file("regular");
        let got = [Peers::ReadOnly, Peers::ReadWrite].map(|peers| {
            PeerFile::open(std::process::id(), file.as_raw_fd() as u32, 1, peers).map(|_| ())
        });
        let mut events = [0u8; 256];
        // SAFETY: reads into a live buffer of that size.
        let n = unsafe { libc::read(watch.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
        let _ = std::fs::remove_file(&path);
        assert!(n < 0, "the file was opened ({n} bytes of inotify events)");
        for got in got {
            assert!(
                matches!(got, Err(UctError::BadRkey(ref why)) if why.contains("not a memfd")),
                "{got:?}"
            );
        }
    }

    #[test]
    fn this_executable_is_refused_as_no_memfd() {
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let got = PeerFile::open(
            std::process::id(),
            exe.as_raw_fd() as u32,
            1,
            Peers::ReadOnly,
        )
        .map(|_| ());
        assert!(
            matches!(got, Err(UctError::BadRkey(ref why)) if why.contains("not a memfd")),
            "{got:?}"
        );
    }
}
