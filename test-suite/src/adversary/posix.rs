//! Attacks on the posix transport, below the library: on the segments and
//! rings it shares. A hostile owner hands the victim a ring that is too
//! short, or unsealed and claiming a whole ring (`posix/short-ring`);
//! shrinks a segment the victim reads, or hands it an unsealed one
//! (`posix/ftruncate`); corrupts the positions of its own ring, so that the
//! victim's sends meet them, and publishes corrupt slots in the victim's
//! ring (`posix/bad-indices`). A hostile peer opens the victim's read-only
//! region with a writable mapping of its own (`posix/write-ro`), and claims
//! a slot of the victim's ring that it never publishes, as a sender that
//! died mid-message (`posix/dead-sender`).
//!
//! Segments are forged from the attacker's real ones (its iface's ring, a
//! region of its posix MD), copied into memfds of its own, so that only the
//! property under attack differs from what the library makes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tl_sm::posix::fifo::{self, layout, SLOTS};
use tl_sm::posix::{ident, PosixRkey, RingAddress};
use tl_sm::segment::HEADER_SPACE;
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{Access, Iface, MemHandle, MemoryType, RkeyBundle, RkeyEntry};

use super::common::{named, open_iface};
use super::control::{connect_line, must_refuse, request, rma_line};
use super::{Attack, Outcome, Target};

/// The posix attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "posix/short-ring",
            transport: "posix",
            run: short_ring,
        },
        Attack {
            name: "posix/ftruncate",
            transport: "posix",
            run: ftruncate,
        },
        Attack {
            name: "posix/write-ro",
            transport: "posix",
            run: write_ro,
        },
        Attack {
            name: "posix/bad-indices",
            transport: "posix",
            run: bad_indices,
        },
        Attack {
            name: "posix/dead-sender",
            transport: "posix",
            run: dead_sender,
        },
    ]
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// A shared mapping of a whole file, read-write, made by the attacker
/// itself: what a hostile process of the same user can always make of a
/// descriptor it can open.
struct RawMap {
    ptr: NonNull<u8>,
    len: usize,
}

impl RawMap {
    /// Maps `/proc/<pid>/fd/<fd>` read-write, its first `len` bytes.
    fn open(pid: u32, fd: u32, len: usize) -> Result<RawMap, String> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("open {path}: {e}"))?;
        // SAFETY: a fresh shared mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err(&format!("mmap {path}")));
        }
        Ok(RawMap {
            ptr: NonNull::new(p as *mut u8).ok_or("mmap returned null")?,
            len,
        })
    }

    /// The u64 at byte `offset` (8-aligned, inside the mapping).
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "{offset}"
        );
        // SAFETY: inside the mapping (asserted), 8-aligned (the mapping is
        // page-aligned), live as long as the borrow of self; other
        // processes write it too, hence an atomic.
        unsafe { &*(self.ptr.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The first `len` bytes.
    fn bytes(&self, len: usize) -> Vec<u8> {
        let len = len.min(self.len);
        // SAFETY: `len` bytes inside the mapping, copied out at once.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) }.to_vec()
    }
}

impl Drop for RawMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open` mapped, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A memfd of the attacker's holding `bytes` then zeros up to `size`,
/// sealed with `seals` (0: none, so its size can change under a peer).
fn forged_memfd(bytes: &[u8], size: usize, seals: libc::c_int) -> Result<OwnedFd, String> {
    // SAFETY: a valid label; memfd_create returns a new descriptor or -1.
    let raw = unsafe {
        libc::memfd_create(
            c"uct-attacker-segment".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    resize(&fd, size)?;
    let n = bytes.len().min(size);
    // SAFETY: writes n bytes of a live buffer to our own descriptor.
    if unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), n, 0) } != n as isize {
        return Err(os_err("pwrite into the forged segment"));
    }
    // SAFETY: F_ADD_SEALS takes an int; no memory of ours is touched.
    if seals != 0 && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_err("seal the forged segment"));
    }
    Ok(fd)
}

/// ftruncate on a descriptor; the kernel's refusal as an `Err` with errno.
fn resize(fd: &OwnedFd, size: usize) -> Result<(), String> {
    // SAFETY: resizing a descriptor touches no memory of this process.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(os_err("ftruncate"));
    }
    Ok(())
}

/// The attacker's own posix iface and what a forger starts from: a raw
/// mapping of its ring's segment.
struct Own {
    iface: Box<dyn Iface>,
    addr: RingAddress,
    ring: RawMap,
}

fn own_iface() -> Result<Own, String> {
    let iface = open_iface("posix").map_err(|e| format!("open posix: {}", named(&e)))?;
    let addr = RingAddress::decode(&iface.iface_address()).ok_or("own iface address")?;
    let ring = RawMap::open(
        std::process::id(),
        addr.fd,
        HEADER_SPACE + fifo::ring_bytes(),
    )?;
    Ok(Own { iface, addr, ring })
}

/// Asks the victim to connect to an iface of this process at `iface_addr`.
fn connect_to_me(t: &Target, own: &Own, iface_addr: &[u8]) -> Result<String, String> {
    request(t, &connect_line(&own.iface.device_address(), iface_addr))
}

/// The victim's refusal must name one of `variants`; another error means
/// the attack missed the check it aims at (the test fails with it).
fn refused_as(outcome: Outcome, variants: &[&str], what: &str) -> Result<String, String> {
    match outcome {
        Outcome::Refused(e) if variants.iter().any(|v| e.starts_with(&format!("{v}:"))) => Ok(e),
        Outcome::Refused(e) => Err(format!(
            "{what}: refused with {e:?}, not one of {variants:?}: the attack missed its check"
        )),
        breach => Err(format!("{what}: {breach}")),
    }
}

/// The victim is to send to a ring of the attacker's whose segment is too
/// short for a ring (its header copied from a real one, claiming a whole
/// ring), then to one of the right size that is not sealed.
fn short_ring(t: &Target) -> Result<Outcome, String> {
    let own = own_iface()?;
    // The segment header page and the ring header, as the library wrote
    // them: magic, secret, the length of a whole ring, the owner's pid.
    let header = own.ring.bytes(HEADER_SPACE + layout::SLOT_STRIDE);
    let mut refusals = Vec::new();
    let forged = [
        (
            "a sealed segment one page short of a ring",
            HEADER_SPACE + 4096,
            SEALS,
        ),
        (
            "an unsealed segment of a whole ring",
            HEADER_SPACE + fifo::ring_bytes(),
            0,
        ),
    ];
    for (what, size, seals) in forged {
        let fd = forged_memfd(&header, size, seals)?;
        // An identity page of the attacker's that names the forged ring, so
        // that only the ring's size and seals are wrong.
        let id = forged_identity(&own, &fd)?;
        let addr = RingAddress {
            fd: fd.as_raw_fd() as u32,
            id_fd: id.as_raw_fd() as u32,
            secret: own.addr.secret,
        };
        let outcome = must_refuse(
            connect_to_me(t, &own, &addr.encode()),
            &format!("the victim sent to {what}"),
        )?;
        refusals.push(format!(
            "{what}: {}",
            refused_as(outcome, &["Unreachable"], what)?
        ));
    }
    Ok(Outcome::Refused(refusals.join("; ")))
}

/// A copy of the attacker's own identity page that names `ring` as its
/// ring, sealed as the library seals it.
fn forged_identity(own: &Own, ring: &OwnedFd) -> Result<OwnedFd, String> {
    let path = format!("/proc/self/fd/{}", own.addr.id_fd);
    let mut page = std::fs::read(&path).map_err(|e| format!("read {path}: {e}"))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one struct stat into `st`.
    if unsafe { libc::fstat(ring.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(os_err("fstat the forged ring"));
    }
    // SAFETY: fstat succeeded and initialised it.
    let st = unsafe { st.assume_init() };
    for (offset, value) in [
        (ident::layout::RING_DEV, st.st_dev),
        (ident::layout::RING_INO, st.st_ino),
    ] {
        let at = HEADER_SPACE + offset;
        page.get_mut(at..at + 8)
            .ok_or("the identity page is short")?
            .copy_from_slice(&value.to_ne_bytes());
    }
    let len = page.len();
    forged_memfd(&page, len, SEALS | libc::F_SEAL_FUTURE_WRITE)
}

/// The seals the library puts on every segment.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// The posix entry of a packed bundle, and its payload decoded.
fn decode(packed: &[u8]) -> Result<(RkeyEntry, PosixRkey), String> {
    let bundle = RkeyBundle::unpack(packed).map_err(|e| named(&e))?;
    let entry = bundle.find("posix").map_err(|e| named(&e))?.clone();
    let key = decode_payload(&entry.payload).map_err(|e| named(&e))?;
    Ok((entry, key))
}

/// `key` packed in `entry`'s place, as a bundle.
fn pack(entry: RkeyEntry, key: &PosixRkey) -> Result<Vec<u8>, String> {
    let entry = RkeyEntry {
        payload: encode_payload(key).map_err(|e| named(&e))?,
        ..entry
    };
    RkeyBundle::single(entry).pack().map_err(|e| named(&e))
}

/// The attacker's real region of `len` bytes and its packed rkey.
fn own_region(iface: &dyn Iface, len: usize) -> Result<(MemHandle, Vec<u8>), String> {
    let md = iface.md().clone();
    let mem = md
        .alloc(len, MemoryType::Host, Access::all())
        .map_err(|e| named(&e))?;
    let packed = RkeyBundle::single(md.pack_rkey(&mem).map_err(|e| named(&e))?)
        .pack()
        .map_err(|e| named(&e))?;
    Ok((mem, packed))
}

/// The victim reads a region of the attacker's; the attacker shrinks its
/// segment (the kernel must refuse: it is sealed), then hands the victim
/// an unsealed copy of it, which it shrinks under the victim: the victim
/// must refuse to map that one at all, never die of SIGBUS.
fn ftruncate(t: &Target) -> Result<Outcome, String> {
    let own = own_iface()?;
    connect_to_me(t, &own, &own.iface.iface_address())
        .map_err(|e| format!("the victim could not connect to the attacker: {e}"))?;
    const LEN: usize = 64 << 10;
    let (mem, packed) = own_region(own.iface.as_ref(), LEN)?;
    let read_end =
        |rkey: &[u8]| request(t, &rma_line("get", rkey, mem.addr() + LEN as u64 - 64, 64));
    read_end(&packed).map_err(|e| format!("the victim could not read a real region: {e}"))?;
    let (entry, key) = decode(&packed)?;
    let mut refusals = Vec::new();
    // The real segment: sealed, so the kernel refuses the shrink.
    let path = format!("/proc/self/fd/{}", key.fd);
    let real = std::fs::File::options()
        .write(true)
        .open(&path)
        .map_err(|e| format!("open {path}: {e}"))?;
    match real.set_len(HEADER_SPACE as u64) {
        Err(e) => refusals.push(format!("kernel: ftruncate of a sealed segment: {e}")),
        Ok(()) => {
            // The victim's mapping now reaches past the end of the file.
            return match read_end(&packed) {
                Err(e) if e.starts_with("control:") => Ok(Outcome::Breach(format!(
                    "the attacker shrank a segment the victim maps, and the victim died on its next read ({e})"
                ))),
                Err(e) => Ok(Outcome::Breach(format!(
                    "the kernel let the attacker shrink a segment the victim maps (the victim then said {e})"
                ))),
                Ok(_) => Ok(Outcome::Breach(
                    "the kernel let the attacker shrink a segment the victim maps".into(),
                )),
            };
        }
    }
    // An unsealed copy of it, header and all, under a forged rkey.
    // SAFETY: the region's HEADER_SPACE bytes before its data are the
    // segment header, mapped by the attacker's own MD for as long as `mem`.
    let header = unsafe {
        std::slice::from_raw_parts(
            (mem.addr() as usize - HEADER_SPACE) as *const u8,
            HEADER_SPACE,
        )
    }
    .to_vec();
    let unsealed = forged_memfd(&header, HEADER_SPACE + LEN, 0)?;
    let mut forged = key.clone();
    forged.fd = unsealed.as_raw_fd() as u32;
    let forged = pack(entry, &forged)?;
    let first = must_refuse(read_end(&forged), "the victim read an unsealed segment")?;
    resize(&unsealed, HEADER_SPACE)?;
    let after = must_refuse(
        read_end(&forged),
        "the victim read an unsealed segment after its owner shrank it",
    )?;
    for (what, outcome) in [("unsealed", first), ("unsealed, then shrunk", after)] {
        refusals.push(format!(
            "{what}: {}",
            refused_as(outcome, &["BadRkey"], what)?
        ));
    }
    drop(mem);
    Ok(Outcome::Refused(refusals.join("; ")))
}

/// Opens the victim's read-only region (from the target's rkey: its pid and
/// descriptor) and tries to write it: a writable shared mapping, write(2),
/// and a read-only mapping made writable. The kernel must refuse all three.
fn write_ro(t: &Target) -> Result<Outcome, String> {
    let (_, key) = decode(&t.ro.rkey)?;
    if key
        .soft
        .access
        .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
    {
        return Err(format!("the target's ro region grants {}", key.soft.access));
    }
    let path = format!("/proc/{}/fd/{}", key.pid, key.fd);
    let file = match std::fs::File::options().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(e) => {
            return Ok(Outcome::Refused(format!(
                "kernel: open {path} read-write: {e}"
            )))
        }
    };
    let fd = file.as_raw_fd();
    let len = HEADER_SPACE + t.ro.len;
    let mut refusals = Vec::new();
    let mut breaches = Vec::new();
    // SAFETY: a fresh mapping at an address the kernel picks, unmapped at
    // once.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        refusals.push(os_err("mmap PROT_WRITE MAP_SHARED"));
    } else {
        // SAFETY: unmaps the mapping made just above.
        unsafe { libc::munmap(p, len) };
        breaches.push("a writable shared mapping");
    }
    let data = [0xEEu8; 8];
    // SAFETY: writes 8 bytes of a live buffer to an open descriptor, at the
    // region's first byte.
    let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), 8, HEADER_SPACE as libc::off_t) };
    if n < 0 {
        refusals.push(os_err("pwrite"));
    } else {
        breaches.push("pwrite");
    }
    // SAFETY: a fresh read-only mapping, made writable, then unmapped.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        refusals.push(os_err("mmap PROT_READ"));
    } else {
        // SAFETY: changes the protection of the mapping made just above.
        let r = unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_WRITE) };
        if r != 0 {
            refusals.push(os_err("mprotect PROT_WRITE"));
        } else {
            breaches.push("mprotect to writable");
        }
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p, len) };
    }
    if !breaches.is_empty() {
        return Ok(Outcome::Breach(format!(
            "the kernel let a peer write the victim's read-only region through {}",
            breaches.join(", ")
        )));
    }
    Ok(Outcome::Refused(format!("kernel: {}", refusals.join("; "))))
}

/// How long the attacker waits for the victim to consume its slots.
const CONSUME_DEADLINE: Duration = Duration::from_secs(10);

/// Sends: the attacker corrupts the head and tail of its own ring, and the
/// victim connects (and sends) to it again: its send must fail with a
/// Protocol error. Receives: the attacker publishes slots with a corrupt
/// length and a corrupt id in the victim's ring: the victim must consume
/// them without delivering them or dying.
fn bad_indices(t: &Target) -> Result<Outcome, String> {
    let own = own_iface()?;
    let me = own.iface.iface_address();
    connect_to_me(t, &own, &me)
        .map_err(|e| format!("the victim could not connect to the attacker: {e}"))?;
    let mut refusals = Vec::new();
    let head = own.ring.word(HEADER_SPACE + layout::HEAD);
    let tail = own.ring.word(HEADER_SPACE + layout::TAIL);
    for (what, h, tl) in [
        ("head more than a ring ahead of tail", 10 * SLOTS + 7, 3),
        ("tail ahead of head", 5, 5 + 3 * SLOTS),
    ] {
        head.store(h, Ordering::SeqCst);
        tail.store(tl, Ordering::SeqCst);
        let outcome = must_refuse(
            connect_to_me(t, &own, &me),
            &format!("the victim sent into a ring with {what}"),
        )?;
        refusals.push(format!(
            "{what}: {}",
            refused_as(outcome, &["Protocol"], what)?
        ));
    }
    refusals.push(corrupt_slots_in_victim(t)?);
    Ok(Outcome::Refused(refusals.join("; ")))
}

/// The victim's ring, mapped read-write as any sender maps it.
fn victim_ring(t: &Target) -> Result<RawMap, String> {
    let addr = RingAddress::decode(&t.iface_addr).ok_or("the victim's iface address")?;
    RawMap::open(t.pid, addr.fd, HEADER_SPACE + fifo::ring_bytes())
}

/// Claims the next position of `ring` as a producer would.
fn claim(ring: &RawMap) -> Result<u64, String> {
    let at = |off: usize| ring.word(HEADER_SPACE + off);
    loop {
        let head = at(layout::HEAD).load(Ordering::Acquire);
        if head.wrapping_sub(at(layout::TAIL).load(Ordering::Acquire)) >= SLOTS {
            return Err("the victim's ring is full".into());
        }
        if at(layout::HEAD)
            .compare_exchange(
                head,
                head.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return Ok(head);
        }
    }
}

/// Publishes position `pos` of `ring` with `len` and `id`.
fn publish(ring: &RawMap, pos: u64, len: u64, id: u64) {
    let at = |off: usize| ring.word(HEADER_SPACE + off);
    let slot = (pos % SLOTS) as usize;
    at(layout::slot_len(slot)).store(len, Ordering::Relaxed);
    at(layout::slot_id(slot)).store(id, Ordering::Relaxed);
    at(layout::slot_seq(slot)).store(pos.wrapping_add(1), Ordering::Release);
}

/// Waits for the victim's published tail to pass `last`.
fn consumed(ring: &RawMap, last: u64, deadline: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    while ring
        .word(HEADER_SPACE + layout::TAIL)
        .load(Ordering::Acquire)
        .wrapping_sub(last) as i64
        <= 0
    {
        if start.elapsed() > deadline {
            return Err(format!(
                "the victim did not consume the attacker's slots within {deadline:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(start.elapsed())
}

/// Claims a position in the victim's ring and never publishes it, as a
/// sender that died mid-message leaves it, then publishes a message after
/// it: the victim must consume both (skipping the dead one, within its
/// bound of at most 1 s), and still answer.
fn dead_sender(t: &Target) -> Result<Outcome, String> {
    let ring = victim_ring(t)?;
    let dead = claim(&ring)?;
    let after = claim(&ring)?;
    publish(&ring, after, 8, 1);
    let took = consumed(&ring, after, CONSUME_DEADLINE)
        .map_err(|e| format!("a slot claimed and never published: {e}"))?;
    request(t, "ping").map_err(|e| {
        format!("the victim stopped answering after skipping a dead sender's slot: {e}")
    })?;
    Ok(Outcome::Refused(format!(
        "a slot claimed and never published (position {dead}): skipped after {took:?}, the message after it consumed, the victim answers"
    )))
}

/// Claims two positions in the victim's ring as a producer would, publishes
/// one with a length past the slot and one with an id past a byte, and
/// waits for the victim to consume both; then the victim must still answer.
fn corrupt_slots_in_victim(t: &Target) -> Result<String, String> {
    let ring = victim_ring(t)?;
    let mut last = 0;
    for (len, id) in [(u64::MAX, 1u64), (8, 0x101)] {
        last = claim(&ring)?;
        publish(&ring, last, len, id);
    }
    consumed(&ring, last, CONSUME_DEADLINE)?;
    match request(t, "ping") {
        Ok(_) => Ok(format!(
            "slots of length {} and id {:#x} in the victim's ring: consumed, the victim answers",
            u64::MAX,
            0x101
        )),
        Err(e) => Err(format!(
            "the victim stopped answering after consuming corrupt slots: {e}"
        )),
    }
}
