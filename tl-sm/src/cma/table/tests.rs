//! What a peer accepts as a record table: only a `/proc/<pid>/fd/<fd>` path
//! of the process it is connected to, naming a regular file of exactly
//! [`SIZE`] bytes, sealed against shrinking and growing, with the table
//! magic.

use std::os::fd::AsRawFd;

use super::*;

const REGION: u64 = 77;

fn me() -> u32 {
    std::process::id()
}

/// A memfd of `size` bytes (sealed against resizing if `sealed`, with the
/// table magic if `magic`) and its `/proc/self`-style path.
fn memfd(size: usize, sealed: bool, magic: bool) -> (OwnedFd, String) {
    let label = CString::new("uct-test-table").unwrap();
    // SAFETY: a valid label; a new descriptor or -1.
    let fd = unsafe {
        owned(libc::memfd_create(
            label.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        ))
    }
    .unwrap();
    // SAFETY: resizing our own memfd touches no memory of this process.
    let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) };
    assert_eq!(sized, 0);
    if magic && size >= 8 {
        let bytes = MAGIC.to_le_bytes();
        // SAFETY: writing 8 bytes from a live array into our own memfd.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), 8, 0) };
        assert_eq!(n, 8);
    }
    if sealed {
        seals(
            &fd,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
        .unwrap();
    }
    let path = format!("/proc/{}/fd/{}", me(), fd.as_raw_fd());
    (fd, path)
}

fn refused(path: &str) -> String {
    match TableMemory::open(path, me(), REGION) {
        Err(UctError::BadRkey(why)) => why,
        other => panic!("{path} was not refused as a bad rkey: {other:?}"),
    }
}

#[test]
fn the_owners_table_opens_and_cannot_be_resized() {
    let (mem, path) = TableMemory::create().unwrap();
    let fd = &mem.fd;
    assert!(TableMemory::open(&path, me(), REGION).is_ok());
    for size in [0, SIZE - PAGE, SIZE + PAGE] {
        // SAFETY: resizing our own memfd, which the seals forbid.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) };
        assert_eq!(r, -1, "the table was resized to {size}");
    }
}

#[test]
fn a_table_of_the_wrong_size_is_refused() {
    for size in [0, 4096, SIZE - PAGE, SIZE - 1, SIZE + 1, SIZE + PAGE] {
        let (_fd, path) = memfd(size, true, true);
        let why = refused(&path);
        assert!(why.contains("not a regular file of"), "{size}: {why}");
    }
}

#[test]
fn a_table_that_may_shrink_is_refused() {
    let (_fd, path) = memfd(SIZE, false, true);
    let why = refused(&path);
    assert!(why.contains("not sealed against shrinking"), "{why}");
}

#[test]
fn a_table_without_the_magic_is_refused() {
    let (_fd, path) = memfd(SIZE, true, false);
    let why = refused(&path);
    assert!(why.contains("no table magic"), "{why}");
}

#[test]
fn what_is_not_a_regular_file_is_refused() {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are new descriptors that nothing else owns.
    let (_r, _w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let why = refused(&format!("/proc/{}/fd/{}", me(), fds[0]));
    assert!(why.contains("not a regular file"), "{why}");
}

#[test]
fn a_closed_descriptor_is_no_such_region() {
    // A descriptor number no process has (tests run in parallel, so one
    // just closed may be reused at once).
    let path = format!("/proc/{}/fd/4000000000", me());
    assert!(matches!(
        TableMemory::open(&path, me(), REGION),
        Err(UctError::NoSuchRegion { region_id: REGION })
    ));
}

#[test]
fn only_a_proc_fd_path_of_the_peer_is_opened() {
    assert_eq!(path_pid("/proc/12/fd/3"), Some(12));
    for bad in [
        "/proc//fd/3",
        "/proc/12/fd/",
        "/proc/12/fd/x",
        "/proc/1x/fd/3",
        "/proc/12/fd/3/../../1/fd/3",
        "/proc/99999999999/fd/3",
        "/proc/12/fd/99999999999",
        "/dev/shm/uct-x",
        "proc/12/fd/3",
        "",
    ] {
        assert_eq!(path_pid(bad), None, "{bad}");
        assert!(check_path(bad, 12).is_err(), "{bad}");
    }
    assert_eq!(check_path("/proc/12/fd/3", 12), Ok(()));
    match check_path("/proc/13/fd/3", 12) {
        Err(UctError::BadRkey(why)) => {
            assert!(
                why.contains("process 12") && why.contains("process 13"),
                "{why}"
            )
        }
        other => panic!("another process's table: {other:?}"),
    }
    // The path is checked before anything is opened.
    let (_fd, path) = memfd(SIZE, true, true);
    let other = me() + 1;
    match TableMemory::open(&path, other, REGION) {
        Err(UctError::BadRkey(why)) => assert!(why.contains(&other.to_string()), "{why}"),
        other => panic!("our table as process {}'s: {other:?}", me() + 1),
    }
}

thread_local! {
    /// The hook [`between_checks`](super::between_checks) runs once, on
    /// this thread.
    pub(super) static BETWEEN_CHECKS: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Issue 12 review, finding 1: an owner that hands an unsealed table of the
/// right size, then shrinks and seals it between the peer's two checks,
/// must not get it mapped (the peer's next record check would be SIGBUS).
#[test]
fn a_table_shrunk_and_sealed_between_the_checks_is_refused() {
    let (fd, path) = memfd(SIZE, false, true);
    let raw = fd.as_raw_fd();
    BETWEEN_CHECKS.with(|hook| {
        *hook.borrow_mut() = Some(Box::new(move || {
            // SAFETY: resizing and sealing our own memfd, open for the
            // test's whole length, touches no memory of this process.
            unsafe {
                libc::ftruncate(raw, PAGE as libc::off_t);
                libc::fcntl(
                    raw,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
                );
            }
        }))
    });
    let opened = TableMemory::open(&path, me(), REGION);
    BETWEEN_CHECKS.with(|hook| hook.borrow_mut().take());
    match opened {
        Err(UctError::BadRkey(_)) => {}
        other => panic!("a table shrunk to a page between the checks was mapped: {other:?}"),
    }
}

/// Issue 12 review, finding 4: a peer's descriptor that is a FIFO must be
/// refused without being opened (an open would release a writer blocked on
/// it, or block on it ourselves).
#[test]
fn a_fifo_is_refused_without_being_opened() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::mpsc;
    use std::time::Duration;

    let dir = std::env::temp_dir().join(format!(
        "uct-cma-fifo-{}-{:x}",
        me(),
        crate::host::random_u64()
    ));
    std::fs::create_dir(&dir).unwrap();
    let fifo = dir.join("fifo");
    let cfifo = CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid nul-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cfifo.as_ptr(), 0o600) }, 0);
    // SAFETY: a valid path; O_PATH opens nothing; a new descriptor or -1.
    let opath =
        unsafe { owned(libc::open(cfifo.as_ptr(), libc::O_PATH | libc::O_CLOEXEC)) }.unwrap();
    // A writer blocks in open until some reader opens the FIFO.
    let (opened_tx, opened_rx) = mpsc::channel();
    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let file = std::fs::OpenOptions::new().write(true).open(&writer_path);
        let _ = opened_tx.send(());
        file.map(drop)
    });
    std::thread::sleep(Duration::from_millis(100));
    let why = refused(&format!("/proc/{}/fd/{}", me(), opath.as_raw_fd()));
    let released = opened_rx.recv_timeout(Duration::from_millis(300)).is_ok();
    // Release the writer ourselves, then clean up.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo);
    writer.join().unwrap().unwrap();
    drop(reader);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !released,
        "opening the peer's table opened its FIFO (a writer blocked on it went on)"
    );
    assert!(why.contains("not a regular file"), "{why}");
}

/// A table on a filesystem a peer could serve (FUSE, NFS) would block the
/// stat and the open: a regular file that is no memfd is refused from the
/// kernel's cached inode, before it is opened (review 2, finding 4).
#[test]
fn a_regular_file_that_is_no_memfd_is_refused_before_it_is_opened() {
    let exe = std::fs::File::open("/proc/self/exe").expect("open our own executable");
    let why = refused(&format!("/proc/{}/fd/{}", me(), exe.as_raw_fd()));
    assert!(why.contains("not a memfd"), "{why}");
}
