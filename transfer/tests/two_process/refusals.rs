//! Bad URLs, keys and views across processes, each refused by name; a
//! refused notified write is never notified.
//!
//! On rc the writer's transport first checks the rights its IB entry of
//! the key carries (a key forged in its header only is refused before it
//! is posted, AccessDenied). Past that, the peer's NIC, not software,
//! checks a key that claims rights the memory lacks (its IB entry forged
//! too), or names memory deregistered since: it answers with
//! a remote access error, which (as InfiniBand specifies for RC) moves
//! our QP, and the peer's, to the error state. The write ends with an
//! error that names the remote access error, the connection is failed on
//! both sides (the peer's wait ends with an error within its peer
//! timeout), and nothing was notified. On posix and tcp the peer's
//! transport refuses the write (AccessDenied, NoSuchRegion) and the
//! connection goes on.

use std::time::Instant;

use libtest_mimic::Failed;
use md_ib::IbRkey;
use uct_core::rkey::{decode_payload, encode_payload, RkeyBundle};
use uct_core::UctError;
use uct_transfer::{Access, RemoteBuffer, TransferError};

use crate::child::{RO_FILL, RO_LEN, SERVE_LEN, SPARE_LEN};
use crate::common::{with_check, within};
use crate::peer::{Peer, Served};
use crate::{build, other_of, GRACE, PEER_TIMEOUT};

/// The peer's URL cut short, of another version, of another transport:
/// each refused by name, and the same Transport then connects with the
/// right URL and carries a notified write.
pub fn peer_urls(tl: &str) -> Result<(), Failed> {
    let s = Served::spawn(tl, build(tl))?;
    let url = s.hello.url.clone();
    for cut in [&url[..url.len() - 3], &url[..url.len() / 2]] {
        let e = s.t.connect(cut).unwrap_err();
        assert!(
            matches!(e, TransferError::TruncatedUrl { .. }),
            "{tl}: the peer's URL cut to {} bytes: {e}",
            cut.len()
        );
    }
    let v9 = url.replacen("uct://v1/", "uct://v9/", 1);
    let e = s.t.connect(&v9).unwrap_err();
    assert!(
        matches!(e, TransferError::UrlVersion { .. }),
        "{tl}: a v9 URL: {e}"
    );
    let other = other_of(tl);
    let e = s.t.connect(&s.hello.other_url).unwrap_err();
    assert!(
        matches!(e, TransferError::NoCommonTransport { .. }) && e.to_string().contains(other),
        "{tl} given the peer's {other} URL: {e}"
    );
    assert!(!s.t.connected(), "{tl}: connected after refusals");
    let mut s = s.connect()?;
    s.mem.write_bytes(0, &[0xab; 8192])?;
    let w =
        s.t.write_tagged(&s.mem.view(0, 8192)?, &s.remote.slice(0, 8192)?, 5);
    within("a write after the refusals", &[], w)?;
    assert_eq!(s.peer.ask("wait", "note ")?, "5 8192", "{tl}");
    s.peer.say("quit")?;
    Ok(())
}

/// The URL of a peer process killed with SIGKILL: connect refuses it
/// (PeerUnreachable) at once. rc connects its QP to the dead peer's with
/// no exchange (no handshake to fail): there the first write finds the
/// peer gone within the peer timeout.
pub fn killed_peers_url(tl: &str) -> Result<(), Failed> {
    let mut peer = Peer::spawn(tl, "serve")?;
    let hello = peer.hello()?;
    peer.child.kill()?;
    peer.child.wait()?;
    let t = build(tl);
    t.bind()?;
    let start = Instant::now();
    match t.connect(&hello.url) {
        Err(TransferError::PeerUnreachable { transport, source }) => {
            assert_eq!(transport, tl);
            assert!(
                start.elapsed() < GRACE,
                "{tl}: refused after {:?}",
                start.elapsed()
            );
            eprintln!(
                "{tl}: a killed peer's URL refused after {:?}: {source}",
                start.elapsed()
            );
        }
        Ok(()) if tl == "rc" => {
            let mem = uct_transfer::Memory::alloc(&t, uct_transfer::MemoryType::Host, 8192)?;
            let remote = RemoteBuffer::parse(&hello.key)?.slice(0, 8192)?;
            let wait = t.wait_for_write();
            let e = within(
                "a write to the killed peer",
                &[],
                t.write_tagged(&mem.whole(), &remote, 1),
            )
            .expect_err("rc: a write to a killed peer succeeded");
            assert!(
                matches!(e, TransferError::PeerFailed { .. }),
                "{tl}: a write to a killed peer: {e}"
            );
            within("the wait", &[], wait).expect_err("rc: a wait on a killed peer resolved Ok");
            let took = start.elapsed();
            assert!(
                took < PEER_TIMEOUT + GRACE,
                "rc: the write to a killed peer failed after {took:?}: {e}"
            );
            eprintln!(
                "rc: connected to a killed peer's URL; its first write failed after {took:?}: {e}"
            );
        }
        other => return Err(format!("{tl}: connect to a killed peer's URL: {other:?}").into()),
    }
    Ok(())
}

/// Refusals decided here against the peer's real keys: its read-only
/// memory (a plain and a notified write; a read works), slices and views
/// out of range, lengths that differ, a key cut short, a key of the
/// other transport. None of them notified: the peer's next notification
/// is the next good write's.
pub fn keys_views_and_slices(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    let ro = RemoteBuffer::parse(&s.hello.rokey)?;
    let src = s.mem.view(0, RO_LEN)?;
    for notify in [false, true] {
        let e = within(
            "a write to read-only memory",
            &[],
            s.t.write(&src, &ro, notify),
        );
        assert!(
            matches!(e, Err(TransferError::RemoteAccess { op: "write", .. })),
            "{tl}: a write (notify {notify}) to the peer's read-only memory: {e:?}"
        );
    }
    within("a read of read-only memory", &[], s.t.read(&src, &ro))?;
    let mut got = vec![0u8; RO_LEN];
    s.mem.read_bytes(0, &mut got)?;
    assert!(
        got.iter().all(|&b| b == RO_FILL),
        "{tl}: read-only memory read back"
    );
    let e = s.remote.slice(1, SERVE_LEN).unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::OutOfRange {
                what: "remote slice",
                ..
            }
        ),
        "{tl}: {e}"
    );
    let e = ro.slice(RO_LEN, 1).unwrap_err();
    assert!(
        matches!(e, TransferError::OutOfRange { size: RO_LEN, .. }),
        "{tl}: {e}"
    );
    let e = s.mem.view(SERVE_LEN - 96, 97).unwrap_err();
    assert!(
        matches!(e, TransferError::OutOfRange { what: "view", .. }),
        "{tl}: {e}"
    );
    let e = within("a write", &[], s.t.write_tagged(&src, &s.remote, 1));
    assert_eq!(
        e,
        Err(TransferError::LengthMismatch {
            local: RO_LEN,
            remote: SERVE_LEN
        }),
        "{tl}"
    );
    let key = &s.hello.key;
    let e = RemoteBuffer::parse(&key[..key.len() - 1]).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{tl}: {e}");
    let e = RemoteBuffer::parse(&key[..key.len() / 2]).unwrap_err();
    assert!(matches!(e, TransferError::BadKey { .. }), "{tl}: {e}");
    let foreign = RemoteBuffer::parse(&s.hello.other_key)?;
    let e = within(
        "a write",
        &[],
        s.t.write_tagged(&s.mem.view(0, SPARE_LEN)?, &foreign, 1),
    );
    assert!(
        matches!(e, Err(TransferError::KeyTransport { .. })),
        "{tl}: a key of the peer's {} memory: {e:?}",
        other_of(tl)
    );
    let w = s.t.write_tagged(&src, &s.remote.slice(0, RO_LEN)?, 2);
    within("a good write", &[], w)?;
    assert_eq!(
        s.peer.ask("wait", "note ")?,
        format!("2 {RO_LEN}"),
        "{tl}: a refused write was notified"
    );
    s.peer.ask("check-ro", "ok")?;
    s.peer.say("quit")?;
    Ok(())
}

/// `key` with its rights field replaced and a valid check; with `ib` also
/// the rights of its IB entry (md-ib's `IbRkey`, which rc checks before it
/// posts), so that an rc write reaches the peer's NIC.
fn forge_rights(key: &str, rights: Access, ib: bool) -> Result<String, Failed> {
    let body = key.rsplit_once('#').ok_or("a key with no check")?.0;
    let mut fields: Vec<String> = body.split(':').map(String::from).collect();
    fields[4] = format!("{:x}", rights.bits());
    if ib {
        let bytes = unhex(&fields[6]).ok_or("a bundle that is not hex")?;
        let old = RkeyBundle::unpack(&bytes)?;
        let mut bundle = RkeyBundle::new();
        for entry in old.entries() {
            let mut entry = entry.clone();
            if entry.component == "ib" {
                let mut ib: IbRkey = decode_payload(&entry.payload)?;
                ib.access = rights;
                entry.payload = encode_payload(&ib)?;
            }
            bundle.push(entry)?;
        }
        fields[6] = bundle.pack()?.iter().map(|b| format!("{b:02x}")).collect();
    }
    Ok(with_check(&fields.join(":")))
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Checks what a notified write the peer's side refused ended with
/// (`want` on posix and tcp; on rc the NIC's remote access error), then
/// that the peer was not notified: its next notification is the next good
/// write's, or on rc its wait fails within the peer timeout.
fn refused_by_the_peer(
    tl: &str,
    s: &mut Served,
    what: &str,
    got: Result<(), TransferError>,
    want: impl Fn(&UctError) -> bool,
) -> Result<(), Failed> {
    let refused = Instant::now();
    let e = got.expect_err("a write the peer must refuse succeeded");
    if tl == "rc" {
        assert!(
            e.to_string().contains("remote access error"),
            "rc: {what}: {e}"
        );
        let answer = s.peer.ask("wait", "")?;
        let took = refused.elapsed();
        assert!(
            answer.starts_with("err "),
            "rc: after {what}, the peer's wait gave {answer:?}"
        );
        assert!(
            took < PEER_TIMEOUT + GRACE,
            "rc: the peer's wait ended {took:?} after {what}"
        );
        eprintln!("rc: {what}: {e}; the peer's wait ended {took:?} later: {answer}");
        return Ok(());
    }
    assert!(
        matches!(&e, TransferError::Uct(u) if want(u)),
        "{tl}: {what}: {e}"
    );
    let w =
        s.t.write_tagged(&s.mem.view(0, 64)?, &s.remote.slice(0, 64)?, 8);
    within("a good write", &[], w)?;
    assert_eq!(
        s.peer.ask("wait", "note ")?,
        "8 64",
        "{tl}: {what} was notified"
    );
    eprintln!("{tl}: {what}: {e}");
    Ok(())
}

/// The peer's read-only memory through its key forged to claim write
/// rights: refused by the peer's transport (on rc its NIC), the bytes
/// unchanged. On rc a key forged in its header only is refused before
/// the write is posted: its IB entry carries the rights too.
pub fn forged_key(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    s.mem.write_bytes(0, &[0x77; RO_LEN])?;
    let src = s.mem.view(0, RO_LEN)?;
    if tl == "rc" {
        let forged = RemoteBuffer::parse(&forge_rights(&s.hello.rokey, Access::all(), false)?)?;
        let e = within(
            "a write through a forged key",
            &[],
            s.t.write_tagged(&src, &forged, 3),
        );
        assert!(
            matches!(e, Err(TransferError::Uct(UctError::AccessDenied { .. }))),
            "rc: a write through a key forged in its header only: {e:?}"
        );
        assert!(s.t.connected());
    }
    let forged = RemoteBuffer::parse(&forge_rights(&s.hello.rokey, Access::all(), true)?)?;
    assert!(forged.access().contains(Access::REMOTE_WRITE));
    let got = within(
        "a write through a forged key",
        &[],
        s.t.write_tagged(&src, &forged, 3),
    );
    s.peer.ask("check-ro", "ok")?;
    refused_by_the_peer(
        tl,
        &mut s,
        "a notified write through a key forged to claim write rights",
        got,
        |u| matches!(u, UctError::AccessDenied { .. }),
    )?;
    s.peer.ask("check-ro", "ok")?;
    s.peer.say("quit")?;
    Ok(())
}

/// A key of memory the peer dropped (it says so first): refused.
pub fn stale_key(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    let stale = RemoteBuffer::parse(&s.hello.sparekey)?;
    s.peer.ask("drop-spare", "dropped")?;
    let w = s.t.write_tagged(&s.mem.view(0, SPARE_LEN)?, &stale, 7);
    let got = within("a write through a stale key", &[], w);
    refused_by_the_peer(
        tl,
        &mut s,
        "a notified write through a stale key",
        got,
        |u| match u {
            UctError::NoSuchRegion { .. } | UctError::BadSecret => true,
            // posix: the freed region's descriptor number already names
            // another file of the peer's (not a segment: one would be
            // answered from its header), and the refusal says so.
            UctError::BadRkey(m) => {
                tl == "posix"
                    && m.contains("is not a sealed uct segment")
                    && !m.contains("less than its header")
                    && !m.contains("header cannot be read")
            }
            _ => false,
        },
    )?;
    s.peer.say("quit")?;
    Ok(())
}
