//! Segments in this process: an owner's mapping and a peer's mapping of the
//! same segment (by name, or by `/proc/self/fd` path) stand in for two
//! processes. Every name is unique to this process and test, and unlinked
//! when the test ends.

use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};

use uct_core::{Access, UctError};

use super::*;

const SECRET: u64 = 0x5eed_1234_abcd_0042;
const REGION: u64 = 77;

/// A segment name of this process, unlinked when dropped.
struct Name(String);

impl Name {
    fn new(tag: &str) -> Name {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, AtomicOrdering::Relaxed);
        Name(format!("/uct-test-{}-{tag}-{n}", std::process::id()))
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        unlink(&self.0);
    }
}

/// A fresh segment of `len` bytes granting `access`: its name and the
/// owner's mapping.
fn segment(tag: &str, len: usize, access: Access) -> (Name, Mapping) {
    let name = Name::new(tag);
    let map = Mapping::create(&name.0, len, SECRET, access).expect("create a segment");
    (name, map)
}

/// The owner's address of the segment's data, which rkeys carry.
fn base(owner: &Mapping) -> u64 {
    owner.data_ptr() as u64
}

/// A shared-memory object of `size` bytes made without this module: not a
/// uct segment.
fn foreign_object(name: &Name, size: usize) {
    let cname = CString::new(name.0.as_str()).unwrap();
    // SAFETY: a valid nul-terminated name; the descriptor is closed below.
    let fd = unsafe {
        libc::shm_open(
            cname.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            0o600,
        )
    };
    assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just opened above and is closed once.
    unsafe {
        assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
        libc::close(fd);
    }
}

/// Resizes the object behind segment `name`, as a careless or hostile
/// process with access to /dev/shm could.
fn resize(name: &Name, size: usize) {
    let cname = CString::new(name.0.as_str()).unwrap();
    // SAFETY: a valid nul-terminated name; the descriptor is closed below.
    let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
    assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just opened above and is closed once.
    unsafe {
        assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
        libc::close(fd);
    }
}

fn is_bad_rkey<T: std::fmt::Debug>(result: Result<T, UctError>) -> bool {
    matches!(result, Err(UctError::BadRkey(_)))
}

#[test]
fn a_peer_maps_the_owners_data() {
    let (name, owner) = segment("data", 8192, Access::all());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    assert_eq!(owner.data_len(), 8192);
    assert_eq!(peer.data_len(), 8192);
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
fn a_name_is_never_created_twice() {
    let (name, _owner) = segment("twice", 64, Access::all());
    assert!(Mapping::create(&name.0, 64, SECRET, Access::all()).is_err());
}

#[test]
fn only_slash_names_of_at_most_200_bytes_are_segment_names() {
    for bad in ["", "no-slash", "/a/b", "/nul\0byte"] {
        let name = Name(bad.to_string());
        assert!(
            is_bad_rkey(Mapping::create(&name.0, 64, SECRET, Access::all())),
            "{bad:?}"
        );
        assert!(is_bad_rkey(Mapping::open(&name.0, REGION)), "{bad:?}");
    }
    let prefix = Name::new("long").0.clone();
    let long = |len: usize| Name(format!("{prefix}{}", "x".repeat(len - prefix.len())));
    let at_limit = long(200);
    assert!(Mapping::create(&at_limit.0, 64, SECRET, Access::all()).is_ok());
    assert!(Mapping::open(&at_limit.0, REGION).is_ok());
    let too_long = long(201);
    assert!(is_bad_rkey(Mapping::create(
        &too_long.0,
        64,
        SECRET,
        Access::all()
    )));
    assert!(is_bad_rkey(Mapping::open(&too_long.0, REGION)));
}

#[test]
fn a_missing_segment_is_no_such_region() {
    let name = Name::new("missing");
    assert_eq!(
        Mapping::open(&name.0, REGION).unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
}

#[test]
fn unlink_removes_the_name_and_keeps_the_mapping() {
    let (name, owner) = segment("unlink", 4096, Access::all());
    unlink(&name.0);
    assert_eq!(
        Mapping::open(&name.0, REGION).unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
    // SAFETY: the owner's mapping still holds 4096 bytes of data.
    unsafe {
        owner.data_ptr().add(4095).write(3);
        assert_eq!(owner.data_ptr().add(4095).read(), 3);
    }
}

#[test]
fn objects_that_are_not_segments_are_refused() {
    for size in [0, 100, HEADER_SPACE - 1, 8192] {
        let name = Name::new("foreign");
        foreign_object(&name, size);
        assert!(is_bad_rkey(Mapping::open(&name.0, REGION)), "size {size}");
    }
}

#[test]
fn a_segment_cut_to_its_header_opens_with_no_data() {
    let (name, _owner) = segment("cut", 64, Access::all());
    resize(&name, HEADER_SPACE);
    let peer = Mapping::open(&name.0, REGION).unwrap();
    assert_eq!(peer.data_len(), 0);
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
    let (name, owner) = segment("unmap", 4096, Access::all());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    assert!(mapped(&name.0));
    drop(owner);
    assert!(mapped(&name.0));
    drop(peer);
    assert!(!mapped(&name.0));
}

#[test]
fn an_access_inside_the_range_with_the_rights_is_where_the_peer_maps_it() {
    let (name, owner) = segment("inside", 8192, Access::remote_read_only());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    let view = peer.view(SECRET);
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
    let (name, owner) = segment("outside", 8192, Access::all());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    let view = peer.view(SECRET);
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
    let (name, _owner) = segment("rights", 4096, Access::remote_read_only());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    let view = peer.view(SECRET);
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
    let (name, owner) = segment("secret", 4096, Access::all());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    let b = base(&owner);
    let forged = SECRET ^ 1;
    let view = peer.view(forged);
    assert_eq!(
        peer.check_view(&view, REGION, forged, b, 8, Access::REMOTE_READ)
            .unwrap_err(),
        UctError::BadSecret
    );
}

#[test]
fn a_freed_segment_is_no_such_region() {
    let (name, owner) = segment("dead", 4096, Access::all());
    let peer = Mapping::open(&name.0, REGION).unwrap();
    let view = peer.view(SECRET);
    let b = base(&owner);
    assert!(peer
        .check_view(&view, REGION, SECRET, b, 8, Access::REMOTE_READ)
        .is_ok());
    owner.mark_dead();
    assert!(owner.is_dead());
    assert!(peer.is_dead());
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
fn a_view_never_reaches_past_the_mapping_it_is_used_on() {
    // A view read from a larger segment, used on a smaller one.
    let (_big_name, big) = segment("big", 16384, Access::all());
    let (_small_name, small) = segment("small", 4096, Access::all());
    let view = big.view(SECRET);
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
    let (name, owner) = segment("claims", 8192, Access::all());
    resize(&name, HEADER_SPACE + 4096);
    let peer = Mapping::open(&name.0, REGION).unwrap();
    assert_eq!(peer.data_len(), 4096);
    let view = peer.view(SECRET);
    assert!(peer
        .check_view(&view, REGION, SECRET, base(&owner), 8, Access::REMOTE_READ)
        .is_err());
}

#[test]
fn an_anonymous_segment_is_mapped_through_its_proc_path() {
    let (owner, _fd, path) = Mapping::create_anonymous("uct-test-anon", 8192).unwrap();
    assert_eq!(
        path,
        format!("/proc/{}/fd/{}", std::process::id(), _fd.as_raw_fd())
    );
    let peer = Mapping::open_path(&path, REGION).unwrap();
    assert_eq!(owner.data_len(), 8192);
    assert_eq!(peer.data_len(), 8192);
    assert!(!peer.is_dead());
    // SAFETY: both pointers address 8192 bytes of the same memfd's data.
    unsafe {
        owner.data_ptr().add(8191).write(9);
        assert_eq!(peer.data_ptr().add(8191).read(), 9);
    }
    owner.mark_dead();
    assert!(peer.is_dead());
}

#[test]
fn only_proc_fd_paths_are_opened() {
    let pid = std::process::id();
    for bad in [
        "/dev/shm/x".to_string(),
        "/proc/self/fd/0".to_string(),
        format!("/proc/{pid}/fd/"),
        "/proc//fd/0".to_string(),
        format!("/proc/{pid}a/fd/0"),
        "/proc/1a/fd/0".to_string(),
        format!("/proc/{pid}/fd/0x"),
        format!("/proc/{pid}/fd/../fd/0"),
        format!("/proc/{pid}/fd/0\0"),
    ] {
        assert!(is_bad_rkey(Mapping::open_path(&bad, REGION)), "{bad:?}");
    }
}

#[test]
fn a_closed_descriptor_is_no_such_region() {
    let path = format!("/proc/{}/fd/{}", std::process::id(), i32::MAX);
    assert_eq!(
        Mapping::open_path(&path, REGION).unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
}

/// Opens `path` in a child process that runs as another user, which may
/// not open this process's descriptors; its exit status says whether the
/// refusal was the permission error.
fn open_as_another_user(path: &str) -> bool {
    // SAFETY: the child only switches user, makes the call and exits with
    // _exit; glibc keeps malloc usable in the child of a threaded fork.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        // SAFETY: in the child, which ends with _exit below.
        let code = if unsafe { libc::setgid(65534) != 0 || libc::setuid(65534) != 0 } {
            2
        } else if matches!(
            Mapping::open_path(path, REGION),
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
fn a_path_the_kernel_does_not_let_us_open_is_a_permission_error() {
    let (_owner, _fd, path) = Mapping::create_anonymous("uct-test-perm", 64).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(open_as_another_user(&path));
    } else {
        // pid 1 belongs to another user (root) where tests run unprivileged.
        assert!(matches!(
            Mapping::open_path("/proc/1/fd/0", REGION),
            Err(UctError::EndpointFailed(_))
        ));
    }
}

#[test]
fn remove_stale_removes_only_segments_of_dead_processes() {
    // No pid reaches 99999999 (the kernel's limit is 2^22).
    let dead = Name(format!(
        "/uct-test-99999999-{}-{}",
        std::process::id(),
        Name::new("stale").0.rsplit('-').next().unwrap()
    ));
    let _dead_map = Mapping::create(&dead.0, 64, SECRET, Access::all()).unwrap();
    let (live, _live_map) = segment("live", 64, Access::all());
    remove_stale();
    assert_eq!(
        Mapping::open(&dead.0, REGION).unwrap_err(),
        UctError::NoSuchRegion { region_id: REGION }
    );
    assert!(Mapping::open(&live.0, REGION).is_ok());
}
