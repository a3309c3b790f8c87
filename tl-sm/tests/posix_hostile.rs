//! A posix segment owner that turns hostile (finding 12.5): it shrinks a
//! segment a peer has mapped, and a peer opens a read-only region with a
//! writable mapping of its own. The kernel must refuse both; a case that
//! could kill its process (SIGBUS) runs in a child with a deadline.

mod posix_support;

use std::os::fd::AsRawFd;
use std::time::Duration;

use posix_support::{connect_to_self, exported, object_at, open_posix, role, run_child};
use uct_core::{Access, MemoryType, Registry};

/// The tests of this file run one at a time: a freed region's descriptor
/// number is free for any thread of the process to take, and the freed-rkey
/// test expects only its own segments there.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn a_segment_shrunk_under_a_peer_does_not_kill_it() {
    let _serial = serial();
    let run = run_child("shrink_child", "shrink", &[], Duration::from_secs(60));
    assert!(
        run.succeeded(),
        "the peer that read a shrunk segment: {}\n{}",
        run.describe(),
        run.output
    );
}

/// The owner (this process) shrinks a segment this process's own endpoint
/// has mapped and read through the rkey, then reads through it again.
#[test]
#[ignore = "run in a child process by a_segment_shrunk_under_a_peer_does_not_kill_it"]
fn shrink_child() {
    if role().as_deref() != Some("shrink") {
        return;
    }
    let (md, mut iface) = open_posix();
    let mut ep = connect_to_self(iface.as_mut()).expect("endpoint");
    let (mem, packed) = exported(md.as_ref(), 64 << 10);
    let rkey = Registry::global().unpack_rkey(&packed, md.name()).unwrap();
    let mut buf = [0u8; 8];
    let status = ep
        .get_short(&mut buf, mem.addr() + 32768, &rkey)
        .expect("a get before the shrink");
    assert_eq!(status, uct_core::Status::Done);
    let (file, _) = object_at(mem.addr()).expect("the segment's object");
    if let Err(e) = file.set_len(4096) {
        println!("the kernel refused the shrink: {e}");
        return;
    }
    let got = ep.get_short(&mut buf, mem.addr() + 32768, &rkey);
    println!("a get after the shrink: {got:?}");
    assert!(got.is_err(), "a get past the shrunk end succeeded");
}

#[test]
fn a_peer_cannot_write_a_read_only_region_through_a_mapping_of_its_own() {
    let _serial = serial();
    let (md, _iface) = open_posix();
    let mem = md
        .alloc(8192, MemoryType::Host, Access::remote_read_only())
        .expect("alloc");
    mem.write(0, &[0x11; 64]).unwrap();
    let mut breaches = Vec::new();
    match object_at(mem.addr()) {
        Err(e) => println!("the kernel refused a read-write open: {e}"),
        Ok((file, at)) => {
            // A writable shared mapping of its own.
            // SAFETY: a fresh mapping of the object at an address the kernel
            // picks; unmapped below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    at as usize + 64,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                println!("mmap refused: {}", std::io::Error::last_os_error());
            } else {
                // SAFETY: `at` + 64 bytes were mapped above.
                unsafe {
                    (p as *mut u8).add(at as usize).write_bytes(0xee, 8);
                    libc::munmap(p, at as usize + 64);
                }
                breaches.push("a writable shared mapping");
            }
            // write(2) at the region's offset.
            // SAFETY: 8 bytes from a live buffer.
            let n = unsafe {
                libc::pwrite(
                    file.as_raw_fd(),
                    [0xddu8; 8].as_ptr() as *const libc::c_void,
                    8,
                    at as libc::off_t + 8,
                )
            };
            if n < 0 {
                println!("pwrite refused: {}", std::io::Error::last_os_error());
            } else {
                breaches.push("pwrite");
            }
        }
    }
    let mut now = [0u8; 64];
    mem.read(0, &mut now).unwrap();
    assert!(
        breaches.is_empty() && now == [0x11; 64],
        "a peer wrote a read-only region through {breaches:?}; its first bytes are now {:02x?}",
        &now[..16]
    );
}

#[test]
fn memory_without_remote_rights_is_no_segment_and_has_no_rkey() {
    let _serial = serial();
    // Nothing a peer may reach is put where a process of the same user
    // could open it (/proc/<pid>/fd/<n>).
    let (md, _iface) = open_posix();
    let mem = md
        .alloc(
            8192,
            MemoryType::Host,
            Access::LOCAL_READ | Access::LOCAL_WRITE,
        )
        .expect("alloc");
    mem.write(0, &[7; 64]).unwrap();
    let mut back = [0u8; 64];
    mem.read(0, &mut back).unwrap();
    assert_eq!(back, [7; 64]);
    assert!(
        object_at(mem.addr()).is_err(),
        "local-only memory is held by a descriptor peers can open"
    );
    let e = md
        .pack_rkey(&mem)
        .expect_err("an rkey of local-only memory");
    assert!(e.to_string().contains("no remote right"), "{e}");
}

#[test]
fn a_freed_regions_rkey_is_no_such_region_every_time() {
    let _serial = serial();
    // The first use finds the region gone, and a later use, after another
    // segment was made and freed, fails the same way. (It does not tell the
    // key's memo from a reopen: both refuse.)
    let (md, mut iface) = open_posix();
    let mut ep = connect_to_self(iface.as_mut()).expect("endpoint");
    let (mem, packed) = exported(md.as_ref(), 8192);
    let addr = mem.addr();
    let rkey = Registry::global().unpack_rkey(&packed, md.name()).unwrap();
    drop(mem);
    let mut buf = [0u8; 8];
    for round in 0..2 {
        let got = ep.get_short(&mut buf, addr, &rkey);
        assert!(
            matches!(got, Err(uct_core::UctError::NoSuchRegion { .. })),
            "use {round} of a freed region's rkey: {got:?}"
        );
        let _later = exported(md.as_ref(), 8192);
    }
}
