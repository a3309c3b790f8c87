//! Attacks on the cma transport. cma's checks run in the initiator, so each
//! attack makes the victim the initiator (control `connect`, then `get` or
//! `put`) and hands it what a hostile owner would: a record table that is
//! too short, one that could be shrunk under the victim's mapping, a table
//! of another process than the rkey's, and a stale rkey.
//!
//! The forged rkeys start from a real one (the attacker's own, or the
//! victim's from the target) decoded as [`CmaRkey`], so that only the field
//! under attack differs from what the real library packs.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tl_sm::cma::records::{self, Slot};
use tl_sm::cma::{CmaRkey, TABLE_SIZE};
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{Access, RkeyBundle, RkeyEntry};

use super::common::{named, open_iface};
use super::control::{connect_line, must_refuse, request, rma_line};
use super::{Attack, Outcome, Target};

/// The cma attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "cma/short-table",
            transport: "cma",
            run: short_table,
        },
        Attack {
            name: "cma/unsealed-table",
            transport: "cma",
            run: unsealed_table,
        },
        Attack {
            name: "cma/foreign-pid",
            transport: "cma",
            run: foreign_pid,
        },
        Attack {
            name: "cma/stale-rkey",
            transport: "cma",
            run: stale_rkey,
        },
    ]
}

/// Bytes each access asks for.
const LEN: usize = 64;

/// The cma entry of a packed rkey bundle, and its payload decoded.
fn decode(packed: &[u8]) -> Result<(RkeyEntry, CmaRkey), String> {
    let bundle = RkeyBundle::unpack(packed).map_err(|e| named(&e))?;
    let entry = bundle.find("cma").map_err(|e| named(&e))?.clone();
    let key = decode_payload(&entry.payload).map_err(|e| named(&e))?;
    Ok((entry, key))
}

/// `key` packed in `entry`'s place, as a bundle.
fn pack(entry: RkeyEntry, key: &CmaRkey) -> Result<Vec<u8>, String> {
    let entry = RkeyEntry {
        payload: encode_payload(key).map_err(|e| named(&e))?,
        ..entry
    };
    RkeyBundle::single(entry).pack().map_err(|e| named(&e))
}

/// The attacker's own registration (a real one, with a real table of the
/// attacker's) and its packed rkey: what a peer forging a table starts
/// from. The region stays registered while the value lives.
struct Own {
    _mem: uct_core::MemHandle,
    entry: RkeyEntry,
    key: CmaRkey,
    device_addr: Vec<u8>,
    iface_addr: Vec<u8>,
}

fn own_region() -> Result<Own, String> {
    let iface = open_iface("cma").map_err(|e| format!("open cma: {}", named(&e)))?;
    let md = iface.md().clone();
    let mem = md
        .alloc(4096, uct_core::MemoryType::Host, Access::all())
        .map_err(|e| named(&e))?;
    let packed = RkeyBundle::single(md.pack_rkey(&mem).map_err(|e| named(&e))?)
        .pack()
        .map_err(|e| named(&e))?;
    let (entry, key) = decode(&packed)?;
    Ok(Own {
        _mem: mem,
        entry,
        key,
        device_addr: iface.device_address(),
        iface_addr: iface.iface_address(),
    })
}

/// A memfd of `size` bytes, not sealed (it may be sealed later), and its
/// `/proc/<pid>/fd/<fd>` path.
fn memfd(size: usize) -> Result<(OwnedFd, String), String> {
    let label = c"uct-attacker-table";
    // SAFETY: a valid nul-terminated label; memfd_create returns a new
    // descriptor or -1.
    let raw =
        unsafe { libc::memfd_create(label.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    resize(&fd, size)?;
    let path = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
    Ok((fd, path))
}

/// Seals `fd` against shrinking and growing, as a real table is.
fn seal(fd: &OwnedFd) -> Result<(), String> {
    // SAFETY: F_ADD_SEALS on our own memfd takes an int and touches no
    // memory of this process.
    let r = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    if r != 0 {
        return Err(format!("F_ADD_SEALS: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn resize(fd: &OwnedFd, size: usize) -> Result<(), String> {
    // SAFETY: resizing our own memfd touches no memory of this process.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Asks the victim to connect to the iface at these addresses.
fn connect(t: &Target, device_addr: &[u8], iface_addr: &[u8]) -> Result<(), String> {
    request(t, &connect_line(device_addr, iface_addr))
        .map(drop)
        .map_err(|e| format!("the victim could not connect: {e}"))
}

/// The victim's refusal must be one of `expect` (error variant names), and
/// its text must contain `why` when given: another error means the attack
/// did not reach the check it is aimed at, which fails the test.
fn refused_for(outcome: Outcome, expect: &[&str], why: Option<&str>) -> Result<Outcome, String> {
    match &outcome {
        Outcome::Refused(e)
            if expect.iter().any(|v| e.starts_with(&format!("{v}:")))
                && why.is_none_or(|w| e.contains(w)) =>
        {
            Ok(outcome)
        }
        Outcome::Refused(e) => Err(format!(
            "refused for another reason than expected ({} {}): {e}",
            expect.join(" or "),
            why.unwrap_or("")
        )),
        _ => Ok(outcome),
    }
}

/// A record table of one page, sealed (so that only its size is wrong),
/// and an rkey whose index (65535) lies about 2.6 MB past it: the victim
/// must refuse the table, never read past it.
fn short_table(t: &Target) -> Result<Outcome, String> {
    let own = own_region()?;
    let (table, path) = memfd(4096)?;
    seal(&table)?;
    let mut key = own.key.clone();
    key.table = path;
    key.index = u16::MAX as u32;
    let rkey = pack(own.entry.clone(), &key)?;
    connect(t, &own.device_addr, &own.iface_addr)?;
    let outcome = must_refuse(
        request(t, &rma_line("get", &rkey, key.soft.base, LEN)),
        "a get through a one-page record table at index 65535",
    )?;
    refused_for(outcome, &["BadRkey"], Some("not a regular file of"))
}

/// A table of the right size that is not sealed: its owner could shrink it
/// under the victim's mapping (SIGBUS at the victim's next check). The
/// victim must refuse it; if it does not, the attacker shrinks it and the
/// victim must still be alive.
fn unsealed_table(t: &Target) -> Result<Outcome, String> {
    let own = own_region()?;
    let (table, path) = memfd(TABLE_SIZE)?;
    let mut key = own.key.clone();
    key.table = path;
    key.index = 0;
    let rkey = pack(own.entry.clone(), &key)?;
    connect(t, &own.device_addr, &own.iface_addr)?;
    let get = rma_line("get", &rkey, key.soft.base, LEN);
    let first = request(t, &get);
    if let Err(e) = &first {
        if !e.starts_with("control:") {
            return refused_for(
                Outcome::Refused(e.clone()),
                &["BadRkey"],
                Some("not sealed against shrinking"),
            );
        }
    }
    resize(&table, 0)?;
    let _ = request(t, &get);
    Ok(match request(t, "ping") {
        Ok(_) => Outcome::Breach(format!(
            "the victim mapped a record table that was not sealed ({first:?}); it survived the shrink"
        )),
        Err(e) => Outcome::Breach(format!(
            "the victim mapped a record table that was not sealed, and died when it shrank: {e}"
        )),
    })
}

/// The victim's own read-only region, with an rkey whose table is the
/// attacker's: a record there grants every right over that region. The
/// victim, connected to itself (the rkey's pid), must refuse a table of
/// another process, never take its rights and write the region.
fn foreign_pid(t: &Target) -> Result<Outcome, String> {
    let secret = 0x5eed_f00d_u64;
    let slot: Slot = records::publish(secret, t.ro.addr, t.ro.len as u64, Access::all())
        .map_err(|e| format!("publish the forged record: {}", named(&e)))?;
    let (entry, mut key) = decode(&t.ro.rkey)?;
    key.table = slot.table.clone();
    key.index = slot.index;
    key.soft.secret = secret;
    key.soft.access = Access::all();
    let rkey = pack(entry, &key)?;
    connect(t, &t.device_addr, &t.iface_addr)?;
    let outcome = must_refuse(
        request(t, &rma_line("put", &rkey, t.ro.addr, LEN)),
        "a put into the victim's read-only region, through a record in the attacker's table",
    )?;
    drop(slot);
    refused_for(
        outcome,
        &["BadRkey"],
        Some(&format!("of process {}", std::process::id())),
    )
}

/// The target's stale rkey (its region deregistered), used by the victim
/// itself, connected to itself: its own check must refuse a get and a put.
fn stale_rkey(t: &Target) -> Result<Outcome, String> {
    connect(t, &t.device_addr, &t.iface_addr)?;
    let mut refusals = Vec::new();
    for op in ["get", "put"] {
        let outcome = must_refuse(
            request(t, &rma_line(op, &t.stale.rkey, t.stale.addr, LEN)),
            &format!("a {op} with the stale rkey"),
        )?;
        match refused_for(outcome, &["NoSuchRegion", "BadSecret"], None)? {
            Outcome::Refused(e) => refusals.push(format!("{op}: {e}")),
            other => return Ok(other),
        }
    }
    Ok(Outcome::Refused(refusals.join("; ")))
}
