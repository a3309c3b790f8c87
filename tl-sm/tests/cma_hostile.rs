//! cma against a hostile or broken peer (issue 12, finding 4): an rkey whose
//! record table is another process's, and a record table its owner shrinks
//! under the peers that map it. Tests that may die of a signal run in a
//! child process (this test binary, re-run with one test and
//! `CMA_HOSTILE_CHILD` set), so that a crash is a clean test failure.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use tl_sm::cma::CmaRkey;
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{
    Access, Endpoint, EpParams, Iface, IfaceParams, MemHandle, MemoryType, Registry, RemoteKey,
    Result, RkeyEntry, UctError,
};

/// The environment variable that makes a test run its child part.
const CHILD: &str = "CMA_HOSTILE_CHILD";

/// A cma iface, an endpoint to this very process, and a registered page.
fn self_pair() -> (Box<dyn Iface>, Box<dyn Endpoint>, MemHandle, RkeyEntry) {
    let reg = Registry::global();
    let mut iface = reg
        .open_iface("cma", None, &IfaceParams::default())
        .expect("a cma iface");
    let ep = iface
        .create_ep(EpParams::ToIface {
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
        })
        .expect("an endpoint to this process");
    let mem = iface
        .md()
        .alloc(4096, MemoryType::Host, Access::all())
        .expect("a registered page");
    let entry = iface.md().pack_rkey(&mem).expect("its rkey");
    (iface, ep, mem, entry)
}

fn unpack(entry: &RkeyEntry) -> Result<RemoteKey> {
    Registry::global()
        .component("sm")
        .expect("the sm component")
        .unpack_rkey(entry)
}

/// A child process that only waits to be killed; killed and reaped when
/// dropped. Forked, so it holds every descriptor this process has.
struct Idle(libc::pid_t);

impl Idle {
    fn fork() -> Idle {
        // SAFETY: the child calls only async-signal-safe functions (pause)
        // and never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        }
        Idle(pid)
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        // SAFETY: signalling and reaping our own child; waitpid writes
        // nothing (null status).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// An rkey of this process whose table path names another process (a
/// forked child, which holds the very same table descriptor) must be
/// refused, at unpacking or at the access: an endpoint may only read the
/// records of the process it is connected to.
#[test]
fn a_table_of_another_process_is_refused() {
    let (_iface, mut ep, mem, entry) = self_pair();
    let mut key: CmaRkey = decode_payload(&entry.payload).expect("a cma rkey");
    let child = Idle::fork();
    let own = format!("/proc/{}/", std::process::id());
    assert!(key.table.starts_with(&own), "{}", key.table);
    key.table = key.table.replacen(&own, &format!("/proc/{}/", child.0), 1);
    let forged = RkeyEntry {
        payload: encode_payload(&key).expect("encode"),
        ..entry
    };
    let mut buf = [0u8; 8];
    let result = unpack(&forged).and_then(|rkey| ep.get_short(&mut buf, mem.addr(), &rkey));
    match result {
        Err(UctError::BadRkey(why)) if why.contains(&child.0.to_string()) => {}
        other => panic!(
            "an rkey of process {} with the table {} of process {} was not refused as a bad rkey naming it: {other:?}",
            key.pid, key.table, child.0
        ),
    }
}

/// The child part of [`a_table_shrunk_by_its_owner_does_not_crash_a_peer`]:
/// map the table through a get, shrink it as a hostile owner would, get
/// again. Either step may fail with an error; neither may crash.
fn shrink_then_get() {
    let (_iface, mut ep, mem, entry) = self_pair();
    let rkey = unpack(&entry).expect("unpack our own rkey");
    let mut buf = [0u8; 8];
    let _done = ep
        .get_short(&mut buf, mem.addr(), &rkey)
        .expect("a get from our own page");
    let key: CmaRkey = decode_payload(&entry.payload).expect("a cma rkey");
    match std::fs::OpenOptions::new().write(true).open(&key.table) {
        Ok(table) => match table.set_len(0) {
            Ok(()) => eprintln!("the owner shrank its table to 0 bytes"),
            Err(e) => eprintln!("the table refused to shrink: {e}"),
        },
        Err(e) => eprintln!("the table could not be opened for writing: {e}"),
    }
    let again = ep.get_short(&mut buf, mem.addr(), &rkey);
    eprintln!("the get after the shrink: {again:?}");
}

/// A record table shrunk by its owner after a peer mapped it must not kill
/// the peer (SIGBUS on its next record check).
#[test]
fn a_table_shrunk_by_its_owner_does_not_crash_a_peer() {
    if std::env::var_os(CHILD).is_some() {
        return shrink_then_get();
    }
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "a_table_shrunk_by_its_owner_does_not_crash_a_peer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the peer died ({:?}, signal {:?}) after its owner shrank the record table:\n{stderr}",
        out.status,
        out.status.signal()
    );
}
