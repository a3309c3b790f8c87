//! Segments in this process: an owner's mapping and a peer's mapping of the
//! same segment (through `/proc/<our pid>/fd/<fd>`, as a peer opens it)
//! stand in for two processes.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};

use uct_core::{Access, UctError};

use super::*;

const SECRET: u64 = 0x5eed_1234_abcd_0042;
const REGION: u64 = 77;

/// A label unique to this test run, to find a segment in /proc/self/maps.
fn label(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, AtomicOrdering::Relaxed);
    format!("uct-test-{tag}-{n}")
}

/// A fresh segment of `len` bytes granting `access`, sealed for `peers`:
/// the owner's mapping and the descriptor peers open.
fn segment_for(tag: &str, len: usize, access: Access, peers: Peers) -> (Mapping, OwnedFd) {
    Mapping::create(&label(tag), len, (SECRET, REGION), access, peers).expect("create a segment")
}

fn segment(tag: &str, len: usize, access: Access) -> (Mapping, OwnedFd) {
    segment_for(tag, len, access, Peers::for_access(access))
}

/// A peer's mapping of the segment behind `fd`.
fn open(fd: &OwnedFd, peers: Peers) -> Result<Mapping, UctError> {
    Mapping::open(std::process::id(), fd.as_raw_fd() as u32, REGION, peers)
}

/// The owner's address of the segment's data, which rkeys carry.
fn base(owner: &Mapping) -> u64 {
    owner.data_ptr() as u64
}

fn is_bad_rkey<T: std::fmt::Debug>(result: Result<T, UctError>) -> bool {
    matches!(result, Err(UctError::BadRkey(_)))
}

/// A memfd made without this module, `size` bytes, with `seals`.
fn foreign_memfd(size: usize, seals: libc::c_int) -> OwnedFd {
    let name = CString::new("uct-test-foreign").unwrap();
    // SAFETY: a valid name; memfd_create returns a new descriptor or -1.
    let fd = unsafe {
        fd_from_call(libc::memfd_create(
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        ))
    }
    .unwrap();
    set_size(fd.as_fd(), size).unwrap();
    if seals != 0 {
        seal_op(fd.as_fd(), libc::F_ADD_SEALS, seals).unwrap();
    }
    fd
}

/// Copies the first `len` bytes of `from`'s mapping into `to` (a file).
fn copy_header(from: &Mapping, to: &OwnedFd, len: usize) {
    // SAFETY: `from` maps at least HEADER_SPACE >= len bytes.
    let bytes = unsafe { std::slice::from_raw_parts(from.ptr.as_ptr(), len) };
    // SAFETY: writes `len` bytes from a live buffer to an open descriptor.
    let n = unsafe { libc::pwrite(to.as_raw_fd(), bytes.as_ptr().cast(), len, 0) };
    assert_eq!(n, len as isize);
}

#[test]
fn a_peer_maps_the_owners_data() {
    let (owner, fd) = segment("data", 8192, Access::all());
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    assert_eq!(owner.data_len(), 8192);
    assert_eq!(peer.data_len(), 8192);
    assert!(peer.is_writable());
    // SAFETY: both pointers address 8192 bytes of the same segment's data.
    unsafe {
        owner.data_ptr().write(0xa5);
        owner.data_ptr().add(8191).write(0x5a);
        assert_eq!(peer.data_ptr().read(), 0xa5);
        assert_eq!(peer.data_ptr().add(8191).read(), 0x5a);
        peer.data_ptr().add(100).write(7);
        assert_eq!(owner.data_ptr().add(100).read(), 7);
    }
    assert!(!owner.is_dead());
    assert!(!peer.is_dead());
}

#[test]
fn a_closed_descriptor_is_no_such_region() {
    assert_eq!(
        Mapping::open(
            std::process::id(),
            i32::MAX as u32,
            REGION,
            Peers::ReadWrite
        )
        .unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
    // A process that does not exist (pids stop below 2^22).
    assert_eq!(
        Mapping::open(99_999_999, 3, REGION, Peers::ReadOnly).unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
}

#[test]
fn a_segment_cannot_be_resized_by_its_owner() {
    let (_owner, fd) = segment("resize", 8192, Access::all());
    for size in [HEADER_SPACE, 1 << 20] {
        let e = set_size(fd.as_fd(), size).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{size}: {e}");
    }
}

#[test]
fn an_unsealed_or_short_object_is_refused_whatever_its_header() {
    let (real, _fd) = segment("real", 8192, Access::all());
    // A copy of a real header in a memfd that could shrink or grow.
    for seals in [
        0,
        libc::F_SEAL_SHRINK,
        libc::F_SEAL_GROW,
        libc::F_SEAL_WRITE,
    ] {
        let forged = foreign_memfd(HEADER_SPACE + 8192, 0);
        copy_header(&real, &forged, HEADER_SPACE);
        if seals != 0 {
            seal_op(forged.as_fd(), libc::F_ADD_SEALS, seals).unwrap();
        }
        let got = open(&forged, Peers::ReadOnly);
        assert!(is_bad_rkey(got), "seals {seals:#x}");
    }
    // Sealed, but shorter than a header.
    assert!(is_bad_rkey(open(
        &foreign_memfd(100, SIZE_SEALS),
        Peers::ReadWrite
    )));
    // Sealed and sized, but not a segment.
    assert!(is_bad_rkey(open(
        &foreign_memfd(HEADER_SPACE + 8192, SIZE_SEALS),
        Peers::ReadWrite
    )));
}

#[test]
fn descriptors_that_are_no_memfd_are_refused_without_blocking() {
    // A pipe (opening a FIFO read-only would block without O_NONBLOCK), a
    // character device and a directory.
    let mut ends = [0; 2];
    // SAFETY: pipe writes two descriptors into `ends`.
    assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
    // SAFETY: both were just returned by pipe and are owned here only.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    let dir = OwnedFd::from(std::fs::File::open("/tmp").unwrap());
    for fd in [&r, &w, &null, &dir] {
        for peers in [Peers::ReadOnly, Peers::ReadWrite] {
            let got = open(fd, peers);
            assert!(
                matches!(got, Err(UctError::BadRkey(_)) | Err(UctError::Io { .. })),
                "{got:?}"
            );
        }
    }
}

#[test]
fn a_read_only_segment_is_mapped_read_only_and_cannot_be_made_writable() {
    let (owner, fd) = segment("ro", 8192, Access::remote_read_only());
    // Asked for writes, it is mapped read-only, and a write is refused by
    // the check, after the header said it is the region named.
    let asked_rw = open(&fd, Peers::ReadWrite).unwrap();
    assert!(!asked_rw.is_writable());
    let view = asked_rw.view(REGION, SECRET);
    assert_eq!(
        asked_rw
            .check_view(&view, REGION, SECRET, base(&owner), 8, Access::REMOTE_WRITE)
            .unwrap_err(),
        UctError::AccessDenied {
            needed: Access::REMOTE_WRITE,
            granted: Access::remote_read_only()
        }
    );
    let peer = open(&fd, Peers::ReadOnly).unwrap();
    assert!(!peer.is_writable());
    // The owner still writes its memory through its own mapping.
    // SAFETY: 8192 bytes of data in the owner's mapping.
    unsafe { owner.data_ptr().write(42) };
    // SAFETY: 8192 bytes of data in the peer's mapping, read only.
    assert_eq!(unsafe { peer.data_ptr().read() }, 42);
    // No writable mapping of it can be made, even with a read-write open.
    let rw = std::fs::File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap();
    let got = Mapping::map(rw.as_fd(), HEADER_SPACE + 8192, true, "test");
    assert!(got.is_err(), "a writable mapping of a read-only segment");
}

#[test]
fn a_read_only_mapping_grants_no_write_whatever_the_header_says() {
    // An owner that seals a segment read-only but claims every right in its
    // header: the peer's mapping cannot be written, so the check refuses.
    let (owner, fd) = segment_for("liar", 4096, Access::all(), Peers::ReadOnly);
    let peer = open(&fd, Peers::ReadOnly).unwrap();
    let view = peer.view(REGION, SECRET);
    let b = base(&owner);
    assert!(peer
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
        .is_ok());
    for needed in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC] {
        assert!(
            matches!(
                peer.check_view(&view, REGION, SECRET, b, 8, needed),
                Err(UctError::AccessDenied { .. })
            ),
            "{needed}"
        );
    }
    peer.mark_dead();
    assert!(!owner.is_dead(), "a peer's read-only mapping marks nothing");
}

/// Whether this process maps a file whose path contains `name`.
fn mapped(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|line| line.contains(name))
}

#[test]
fn dropping_a_mapping_unmaps_it() {
    let name = label("unmap");
    let (owner, fd) = Mapping::create(
        &name,
        4096,
        (SECRET, REGION),
        Access::all(),
        Peers::ReadWrite,
    )
    .unwrap();
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    drop(fd);
    assert!(mapped(&name));
    drop(owner);
    assert!(mapped(&name));
    drop(peer);
    assert!(!mapped(&name));
}

#[test]
fn an_access_inside_the_range_with_the_rights_is_where_the_peer_maps_it() {
    let (owner, fd) = segment("inside", 8192, Access::remote_read_only());
    let peer = open(&fd, Peers::ReadOnly).unwrap();
    let view = peer.view(REGION, SECRET);
    let b = base(&owner);
    let at = |addr: u64, len: u64, needed: Access| {
        peer.check_view(&view, REGION, SECRET, addr, len, needed)
    };
    assert_eq!(at(b, 8192, Access::REMOTE_READ).unwrap(), peer.data_ptr());
    // SAFETY: the offsets are inside the peer's 8192-byte data area.
    unsafe {
        assert_eq!(
            at(b + 100, 50, Access::REMOTE_READ).unwrap(),
            peer.data_ptr().add(100)
        );
        assert_eq!(
            at(b + 8191, 1, Access::REMOTE_READ | Access::LOCAL_READ).unwrap(),
            peer.data_ptr().add(8191)
        );
        assert_eq!(
            at(b + 8192, 0, Access::REMOTE_READ).unwrap(),
            peer.data_ptr().add(8192)
        );
    }
    assert_eq!(
        at(b + 1, 0, Access::empty()).unwrap() as u64,
        peer.data_ptr() as u64 + 1
    );
}

#[test]
fn an_access_outside_the_range_is_refused() {
    let (owner, fd) = segment("outside", 8192, Access::all());
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    let view = peer.view(REGION, SECRET);
    let b = base(&owner);
    for (addr, len) in [
        (b - 1, 1),
        (b - 1, 2),
        (b + 8191, 2),
        (b + 8192, 1),
        (b, 8193),
        (u64::MAX - 1, 10),
    ] {
        assert_eq!(
            peer.check_view(&view, REGION, SECRET, addr, len, Access::REMOTE_READ)
                .unwrap_err(),
            UctError::OutOfRange {
                addr,
                len,
                base: b,
                region_len: 8192
            },
            "[{addr:#x}, +{len})"
        );
    }
}

#[test]
fn an_access_without_the_right_is_refused() {
    // Sealed read-write, so only the header's rights refuse.
    let (_owner, fd) = segment_for("rights", 4096, Access::remote_read_only(), Peers::ReadWrite);
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    let view = peer.view(REGION, SECRET);
    let b = view.base;
    for needed in [
        Access::REMOTE_WRITE,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
    ] {
        assert_eq!(
            peer.check_view(&view, REGION, SECRET, b, 8, needed)
                .unwrap_err(),
            UctError::AccessDenied {
                needed,
                granted: Access::remote_read_only()
            }
        );
    }
}

#[test]
fn a_wrong_secret_is_refused() {
    let (owner, fd) = segment("secret", 4096, Access::all());
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    let b = base(&owner);
    let forged = SECRET ^ 1;
    let view = peer.view(REGION, forged);
    assert_eq!(
        peer.check_view(&view, REGION, forged, b, 8, Access::REMOTE_READ)
            .unwrap_err(),
        UctError::BadSecret
    );
}

#[test]
fn a_freed_segment_is_no_such_region() {
    let (owner, fd) = segment("dead", 4096, Access::all());
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    let view = peer.view(REGION, SECRET);
    let b = base(&owner);
    assert!(peer
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
        .is_ok());
    owner.mark_dead();
    assert!(owner.is_dead());
    assert!(peer.is_dead());
    // A new open of the freed segment is refused from the header copy,
    // before anything is mapped.
    assert!(matches!(
        open(&fd, Peers::ReadWrite),
        Err(UctError::NoSuchRegion { region_id }) if region_id == REGION
    ));
    assert_eq!(
        peer.check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
            .unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
    // Still refused as freed first, whatever else is wrong.
    assert_eq!(
        peer.check_view(&view, REGION, SECRET ^ 1, b, 1 << 40, Access::all())
            .unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
}

#[test]
fn a_stale_key_whose_descriptor_names_a_later_segment_is_no_such_region() {
    // The rkey's segment is gone and its descriptor number now holds
    // another one, read-write or sealed read-only: the key's region id
    // tells them apart, so the answer is neither BadSecret nor
    // AccessDenied (what the later segment's secret and rights would say).
    for peers in [Peers::ReadWrite, Peers::ReadOnly] {
        let access = match peers {
            Peers::ReadWrite => Access::all(),
            Peers::ReadOnly => Access::remote_read_only(),
        };
        let (later, fd) = Mapping::create(
            &label("later"),
            4096,
            (SECRET ^ 7, REGION + 1),
            access,
            peers,
        )
        .unwrap();
        // Refused before anything is mapped.
        assert_eq!(
            open(&fd, Peers::ReadWrite).unwrap_err(),
            UctError::NoSuchRegion { region_id: REGION },
            "{peers:?}"
        );
        // And by the mapped header, should a mapping be judged against
        // another region id than the one it was opened for.
        let stale = Mapping::open(
            std::process::id(),
            fd.as_raw_fd() as u32,
            REGION + 1,
            Peers::ReadWrite,
        )
        .unwrap();
        let view = stale.view(REGION, SECRET);
        assert!(!view.is_valid());
        for needed in [Access::REMOTE_READ, Access::REMOTE_WRITE] {
            assert_eq!(
                stale
                    .check_view(&view, REGION, SECRET, base(&later), 8, needed)
                    .unwrap_err(),
                UctError::NoSuchRegion { region_id: REGION },
                "{peers:?} {needed}"
            );
        }
    }
}

#[test]
fn a_writable_view_used_on_a_read_only_mapping_lets_no_store_through() {
    let (owner, fd) = segment("mixed", 4096, Access::all());
    let writable = open(&fd, Peers::ReadWrite).unwrap();
    let read_only = open(&fd, Peers::ReadOnly).unwrap();
    let view = writable.view(REGION, SECRET);
    let b = base(&owner);
    assert!(writable
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_WRITE)
        .is_ok());
    assert!(read_only
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
        .is_ok());
    for needed in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC] {
        assert!(
            matches!(
                read_only.check_view(&view, REGION, SECRET, b, 8, needed),
                Err(UctError::AccessDenied { .. })
            ),
            "{needed}"
        );
    }
}

#[test]
fn a_view_never_reaches_past_the_mapping_it_is_used_on() {
    // A view read from a larger segment, used on a smaller one.
    let (big, _big_fd) = segment("big", 16384, Access::all());
    let (small, _small_fd) = segment("small", 4096, Access::all());
    let view = big.view(REGION, SECRET);
    let b = base(&big);
    let at = |offset: u64, len: u64| {
        small.check_view(&view, REGION, SECRET, b + offset, len, Access::REMOTE_READ)
    };
    assert_eq!(at(0, 4096).unwrap(), small.data_ptr());
    assert!(at(0, 4097).is_err());
    assert!(at(4000, 100).is_err());
    assert!(at(4096, 1).is_err());
}

#[test]
fn a_header_that_claims_more_than_the_segment_holds_is_refused() {
    let (owner, fd) = segment("claims", 4096, Access::all());
    owner.header().len.store(1 << 30, Ordering::Relaxed);
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    assert_eq!(peer.data_len(), 4096);
    let view = peer.view(REGION, SECRET);
    assert!(peer
        .check_view(&view, REGION, SECRET, base(&owner), 8, Access::REMOTE_READ)
        .is_err());
}

/// Opens the segment behind `fd` in a child process that runs as another
/// user, which may not open this process's descriptors; its exit status
/// says whether the refusal was the permission error.
fn open_as_another_user(fd: &OwnedFd) -> bool {
    let (pid, fd) = (std::process::id(), fd.as_raw_fd() as u32);
    // SAFETY: the child only switches user, makes the call and exits with
    // _exit; glibc keeps malloc usable in the child of a threaded fork.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        // SAFETY: in the child, which ends with _exit below.
        let code = if unsafe { libc::setgid(65534) != 0 || libc::setuid(65534) != 0 } {
            2
        } else if matches!(
            Mapping::open(pid, fd, REGION, Peers::ReadOnly),
            Err(UctError::EndpointFailed(_))
        ) {
            0
        } else {
            1
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
    match libc::WEXITSTATUS(status) {
        0 => true,
        2 => {
            // A user namespace without uid 65534: nothing to check here.
            eprintln!("skipped: this root cannot become another user");
            true
        }
        _ => false,
    }
}

#[test]
fn a_descriptor_the_kernel_does_not_let_us_open_is_a_permission_error() {
    let (_owner, fd) = segment("perm", 64, Access::all());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(open_as_another_user(&fd));
    } else {
        // pid 1 belongs to another user (root) where tests run unprivileged.
        assert!(matches!(
            Mapping::open(1, 0, REGION, Peers::ReadOnly),
            Err(UctError::EndpointFailed(_))
        ));
    }
}

#[test]
fn a_header_with_a_misaligned_base_is_refused() {
    // The owner (or any peer of a read-write segment) moves the header's
    // base off its page: an owner's address aligned for an atomic would
    // then land misaligned in the peer's mapping.
    let (owner, fd) = segment("misaligned", 8192, Access::all());
    let b = base(&owner);
    owner.header().base.store(b + 1, Ordering::Relaxed);
    let peer = open(&fd, Peers::ReadWrite).unwrap();
    let view = peer.view(REGION, SECRET);
    let got = peer.check_view(&view, REGION, SECRET, b + 8, 8, Access::REMOTE_ATOMIC);
    assert!(
        matches!(got, Err(UctError::BadRkey(ref why)) if why.contains("aligned")),
        "{got:?}"
    );
}

#[test]
fn a_peer_maps_what_the_header_claims_not_the_whole_file() {
    // A sealed, sparse memfd of 2 TiB whose header claims 8 KiB: mapping
    // all of it would cost 2 TiB of our address space per rkey.
    let (real, _fd) = segment("sparse", 8192, Access::all());
    let huge = foreign_memfd(1 << 41, 0);
    copy_header(&real, &huge, HEADER_SPACE);
    seal_op(huge.as_fd(), libc::F_ADD_SEALS, SIZE_SEALS).unwrap();
    let peer = open(&huge, Peers::ReadWrite).unwrap();
    assert_eq!(peer.data_len(), 8192);
}

#[test]
fn a_header_claiming_more_than_a_peer_maps_is_refused() {
    // 16 TiB, sparse, and its header claims all of it.
    let size: usize = 1 << 44;
    let (real, _fd) = segment("claims-16t", 8192, Access::all());
    let huge = foreign_memfd(HEADER_SPACE + size, 0);
    copy_header(&real, &huge, HEADER_SPACE);
    let len = (size as u64).to_ne_bytes();
    let at = std::mem::offset_of!(SegHeader, len) as libc::off_t;
    // SAFETY: writes 8 bytes of a live buffer to an open descriptor.
    let n = unsafe { libc::pwrite(huge.as_raw_fd(), len.as_ptr().cast(), 8, at) };
    assert_eq!(n, 8);
    seal_op(huge.as_fd(), libc::F_ADD_SEALS, SIZE_SEALS).unwrap();
    let got = open(&huge, Peers::ReadWrite);
    assert!(
        matches!(got, Err(UctError::BadRkey(ref why)) if why.contains("more than")),
        "{got:?}"
    );
}

#[test]
fn a_fifo_is_refused_without_being_opened() {
    // Opening a FIFO has effects (it may block, it wakes its other end, it
    // is reported to watchers): a descriptor that is no regular file must
    // be refused before it is opened for reading or writing.
    let dir = std::env::temp_dir().join(format!("{}-{}", label("fifo"), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fifo");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; mkfifo creates a node and touches no memory.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    // O_RDWR opens a FIFO without waiting for another end.
    // SAFETY: a valid path; open returns a new descriptor or -1.
    let fifo = unsafe { fd_from_call(libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC)) }
        .unwrap();
    // SAFETY: inotify_init1 returns a new descriptor or -1.
    let watch =
        unsafe { fd_from_call(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC)) }.unwrap();
    // SAFETY: a valid descriptor and path.
    let wd = unsafe { libc::inotify_add_watch(watch.as_raw_fd(), cpath.as_ptr(), libc::IN_OPEN) };
    assert!(wd >= 0, "{}", std::io::Error::last_os_error());
    let got = [Peers::ReadOnly, Peers::ReadWrite].map(|peers| open(&fifo, peers));
    let mut events = [0u8; 256];
    // SAFETY: reads into a live buffer of that size.
    let n = unsafe { libc::read(watch.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(n < 0, "the FIFO was opened ({n} bytes of inotify events)");
    for got in got {
        assert!(
            matches!(got, Err(UctError::BadRkey(ref why)) if why.contains("not a regular file")),
            "{got:?}"
        );
    }
}

#[test]
fn a_ring_sealed_against_writes_is_refused() {
    // A peer that names a write-sealed segment as its ring: the ring must
    // be writable, so it is refused before anything in it is read.
    let (_owner, fd) = segment("ring-ro", 8192, Access::remote_read_only());
    let id = file_id(fd.as_fd()).unwrap();
    let pid = std::process::id();
    let got = Mapping::open_shared(pid, fd.as_raw_fd() as u32, 4096, id);
    match got {
        Err(UctError::BadRkey(why)) => assert!(why.contains("sealed against writes"), "{why}"),
        other => panic!(
            "a write-sealed ring was not refused as such: {:?}",
            other.err()
        ),
    }
    // The same call on a read-write segment maps it.
    let (_owner, fd) = segment("ring-rw", 8192, Access::all());
    let id = file_id(fd.as_fd()).unwrap();
    let ring = Mapping::open_shared(pid, fd.as_raw_fd() as u32, 4096, id).unwrap();
    assert!(ring.is_writable());
}

#[test]
fn an_f_seal_write_ring_is_refused_and_such_a_segment_maps_read_only() {
    // F_SEAL_WRITE (not the owner's F_SEAL_FUTURE_WRITE): before Linux 6.7
    // the kernel refuses a shared mapping of such a file opened for
    // writing, so it is reopened read-only and the header decides.
    let pid = std::process::id();
    let ring = foreign_memfd(HEADER_SPACE + 8192, SIZE_SEALS | libc::F_SEAL_WRITE);
    let id = file_id(ring.as_fd()).unwrap();
    match Mapping::open_shared(pid, ring.as_raw_fd() as u32, 4096, id) {
        Err(UctError::BadRkey(why)) => assert!(why.contains("sealed against writes"), "{why}"),
        other => panic!("an F_SEAL_WRITE ring was not refused: {:?}", other.err()),
    }
    // A real header, written before the seal: asked for writes, the
    // segment maps read-only and is the region named; a write is refused
    // by the rights, after the header matched.
    let (real, _fd) = segment("sealwrite", 8192, Access::all());
    let sealed = foreign_memfd(HEADER_SPACE + 8192, 0);
    copy_header(&real, &sealed, HEADER_SPACE);
    seal_op(
        sealed.as_fd(),
        libc::F_ADD_SEALS,
        SIZE_SEALS | libc::F_SEAL_WRITE,
    )
    .unwrap();
    let peer = open(&sealed, Peers::ReadWrite).unwrap();
    assert!(!peer.is_writable());
    let view = peer.view(REGION, SECRET);
    assert!(view.is_valid());
    let b = base(&real);
    assert!(peer
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
        .is_ok());
    assert!(matches!(
        peer.check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_WRITE),
        Err(UctError::AccessDenied { .. })
    ));
    // Another region id behind the same descriptor costs no mapping.
    assert!(matches!(
        Mapping::open(pid, sealed.as_raw_fd() as u32, REGION + 1, Peers::ReadOnly),
        Err(UctError::NoSuchRegion { region_id }) if region_id == REGION + 1
    ));
}
