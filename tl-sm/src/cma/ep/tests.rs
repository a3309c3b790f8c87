//! The endpoint against its owner deregistering a region in the middle of
//! an access (issue 12, finding 5): the access passed its check, then the
//! owner deregistered the region and reused the memory before the transfer.

use std::cell::RefCell;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use uct_core::{Access, EpParams, Iface, MemoryDomain};

use crate::cma::{component, CmaIface, CmaMd};

thread_local! {
    /// The hook [`between_check_and_transfer`](super::between_check_and_transfer)
    /// runs once, on this thread.
    pub(super) static BETWEEN: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
}

const LEN: usize = 4096;
/// What the owner writes into its memory once deregistration returned.
const REUSED: u8 = 0x55;
/// What the put writes.
const PUT: u8 = 0xAA;

#[test]
fn a_put_never_lands_after_deregistration_returned() {
    let _serial = crate::cma::records::tests::serial();
    let md: Arc<dyn MemoryDomain> = Arc::new(CmaMd::new("sm"));
    let mut iface = CmaIface::open(md.clone());
    let mut ep = iface
        .create_ep(EpParams::ToIface {
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
        })
        .expect("an endpoint to this process");
    let mut memory = vec![0u8; LEN];
    let addr = memory.as_mut_ptr() as usize;
    // SAFETY: `memory` outlives the handle: the owner thread drops the
    // handle and is joined before `memory` is dropped.
    let mem = unsafe { md.register(memory.as_mut_ptr(), LEN, Access::all()) }.expect("register");
    let rkey = component::unpack_rkey("sm", &md.pack_rkey(&mem).expect("pack")).expect("unpack");

    let (owner_tx, owner_rx) = mpsc::channel();
    BETWEEN.with(|hook| {
        *hook.borrow_mut() = Some(Box::new(move || {
            let owner = std::thread::spawn(move || {
                drop(mem);
                // The owner reuses its memory once deregistration returned.
                // SAFETY: `memory` is alive until this thread is joined, and
                // the test thread does not touch it meanwhile.
                unsafe { std::ptr::write_bytes(addr as *mut u8, REUSED, LEN) };
            });
            // Time for the owner to deregister and reuse the memory, unless
            // deregistration waits for this access.
            std::thread::sleep(Duration::from_millis(300));
            let _ = owner_tx.send(owner);
        }))
    });
    let put = ep.put_short(&[PUT; 64], addr as u64, &rkey);
    owner_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the hook ran")
        .join()
        .expect("the owner thread");
    let landed = memory.iter().filter(|&&b| b == PUT).count();
    assert_eq!(
        landed, 0,
        "the put ({put:?}) wrote {landed} bytes into memory its owner had deregistered and reused"
    );
    assert!(memory.iter().all(|&b| b == REUSED));
}

/// A forked child that only waits to be killed, reaped at most once.
struct Child {
    pid: libc::pid_t,
    reaped: Arc<std::sync::atomic::AtomicBool>,
}

impl Child {
    fn fork() -> Child {
        Self::fork_unmapping(0, 0)
    }

    /// A child that first unmaps `len` bytes at `addr` in itself (none when
    /// `len` is 0); returns once it did.
    fn fork_unmapping(addr: usize, len: usize) -> Child {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two fds into the array it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        // SAFETY: the child calls only async-signal-safe functions (munmap,
        // write, pause) and never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: the child unmaps memory of its own copy, which no
            // code of its runs on again, and writes one byte from a local.
            unsafe {
                if len > 0 {
                    libc::munmap(addr as *mut libc::c_void, len);
                }
                libc::write(fds[1], [1u8].as_ptr().cast(), 1);
            }
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        }
        let mut ready = libc::pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, 5 s at most; then both pipe ends are
        // ours to close.
        let n = unsafe {
            let n = libc::poll(&mut ready, 1, 5000);
            libc::close(fds[0]);
            libc::close(fds[1]);
            n
        };
        let child = Child {
            pid,
            reaped: Arc::default(),
        };
        assert_eq!(n, 1, "child {pid} not ready within 5 s");
        child
    }

    /// Kills and reaps the child, once: after that its pid is free for
    /// the next process.
    fn kill(pid: libc::pid_t, reaped: &std::sync::atomic::AtomicBool) {
        if !reaped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: signalling and reaping our own child, not reaped yet;
            // waitpid writes nothing (null status).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        Child::kill(self.pid, &self.reaped);
    }
}

/// Issue 12 review, finding 3: a peer that dies (and is reaped, so its pid
/// may be another process's at once) after an access's check must see no
/// process_vm_* call on its pid: the peer's pidfd is asked right before
/// the transfer, not answered from a cache.
#[test]
fn no_transfer_reaches_a_peer_that_died_after_its_check() {
    use uct_core::{MemoryType, UctError};

    let _serial = crate::cma::records::tests::serial();
    let md: Arc<dyn MemoryDomain> = Arc::new(CmaMd::new("sm"));
    let mut iface = CmaIface::open(md.clone());
    let mem = md
        .alloc(LEN, MemoryType::Host, Access::all())
        .expect("alloc");
    let entry = md.pack_rkey(&mem).expect("pack");
    // The child holds our table (the same memfd, the same record) and our
    // memory at the same addresses: a peer whose rkey passes every check.
    let child = Child::fork();
    let (rkey, mut ep) = to_child(&mut iface, entry, child.pid);
    let mut buf = [0u8; 8];
    let got = ep.get_short(&mut buf, mem.addr(), &rkey);
    assert!(got.is_ok(), "a get from the live child: {got:?}");
    let (pid, reaped) = (child.pid, child.reaped.clone());
    BETWEEN.with(|hook| *hook.borrow_mut() = Some(Box::new(move || Child::kill(pid, &reaped))));
    let before = crate::cma::vm::TRANSFERS.with(|n| n.get());
    let put = ep.put_short(&[PUT; 8], mem.addr(), &rkey);
    let after = crate::cma::vm::TRANSFERS.with(|n| n.get());
    assert_eq!(
        after - before,
        0,
        "the put ({put:?}) called process_vm_writev on pid {pid} after that process had died and been reaped"
    );
    match put {
        Err(UctError::EndpointFailed(why)) if why.contains(&pid.to_string()) => {}
        other => panic!("a put to the dead child {pid}: {other:?}"),
    }
}

/// Review 2 of issue 12, finding 2: a transfer the peer's dying cut short
/// (a partial result) is not retried on its pid without asking its pidfd
/// again: the pid may be another process's by then.
#[test]
fn no_retry_reaches_a_peer_that_died_after_a_partial_transfer() {
    use uct_core::{MemoryType, UctError};

    let _serial = crate::cma::records::tests::serial();
    let md: Arc<dyn MemoryDomain> = Arc::new(CmaMd::new("sm"));
    let mut iface = CmaIface::open(md.clone());
    let mem = md
        .alloc(2 * LEN, MemoryType::Host, Access::all())
        .expect("alloc");
    let entry = md.pack_rkey(&mem).expect("pack");
    // The child holds our table and memory, its second page unmapped: a
    // put of both pages moves the first, then stops short.
    let child = Child::fork_unmapping(mem.addr() as usize + LEN, LEN);
    let (rkey, mut ep) = to_child(&mut iface, entry, child.pid);
    let (pid, reaped) = (child.pid, child.reaped.clone());
    crate::cma::vm::AFTER_PARTIAL
        .with(|hook| *hook.borrow_mut() = Some(Box::new(move || Child::kill(pid, &reaped))));
    let before = crate::cma::vm::TRANSFERS.with(|n| n.get());
    let put = ep.put_bcopy(&[PUT; 2 * LEN], mem.addr(), &rkey);
    let after = crate::cma::vm::TRANSFERS.with(|n| n.get());
    let hook_ran = crate::cma::vm::AFTER_PARTIAL.with(|hook| hook.borrow().is_none());
    assert!(
        hook_ran,
        "the put ({put:?}) to a half-unmapped range was not partial"
    );
    assert_eq!(
        after - before,
        1,
        "the put ({put:?}) called process_vm_writev again on pid {pid} after that process had died and been reaped mid-transfer"
    );
    match put {
        Err(UctError::EndpointFailed(why)) if why.contains(&pid.to_string()) => {}
        other => panic!("a put to the dead child {pid}: {other:?}"),
    }
}

/// Our own rkey `entry`, as forked child `pid` (which holds our table and
/// memory) would pack it, and an endpoint of `iface` to that child: a peer
/// whose rkey passes every check.
fn to_child(
    iface: &mut CmaIface,
    entry: uct_core::RkeyEntry,
    pid: libc::pid_t,
) -> (uct_core::RemoteKey, Box<dyn uct_core::Endpoint>) {
    use uct_core::rkey::{decode_payload, encode_payload};

    let mut key: crate::cma::CmaRkey = decode_payload(&entry.payload).expect("a cma rkey");
    key.pid = pid as u32;
    key.table = key.table.replacen(
        &format!("/proc/{}/", std::process::id()),
        &format!("/proc/{pid}/"),
        1,
    );
    let forged = uct_core::RkeyEntry {
        payload: encode_payload(&key).expect("encode"),
        ..entry
    };
    let rkey = component::unpack_rkey("sm", &forged).expect("unpack");
    let mut device_addr = crate::host::boot_id().to_vec();
    device_addr.extend_from_slice(&(pid as u32).to_le_bytes());
    let ep = iface
        .create_ep(EpParams::ToIface {
            device_addr,
            iface_addr: Vec::new(),
        })
        .expect("an endpoint to the child");
    (rkey, ep)
}
