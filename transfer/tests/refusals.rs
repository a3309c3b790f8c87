//! Bad URLs, keys and views, each refused by name, over self, posix and
//! tcp.

mod common;

use common::{pair, transport, with_check, within, TRANSPORTS};
use uct_transfer::{Access, Memory, MemoryType, Progress, RemoteBuffer, TransferError};

#[test]
fn bad_urls_are_refused_by_name() {
    for tl in TRANSPORTS {
        let a = transport(tl, Progress::Thread);
        let b = transport(tl, Progress::Thread);
        let url = b.bind().unwrap();
        assert!(
            matches!(a.connect(&url), Err(TransferError::NotBound)),
            "{tl}"
        );
        assert_eq!(
            b.bind().unwrap(),
            url,
            "{tl}: bind twice gives the same URL"
        );
        a.bind().unwrap();
        let err = |s: &str| a.connect(s).unwrap_err();
        assert!(
            matches!(err("garbage"), TransferError::BadUrl { .. }),
            "{tl}"
        );
        assert!(
            matches!(
                err(&url[..url.len() - 3]),
                TransferError::TruncatedUrl { .. }
            ),
            "{tl}"
        );
        assert!(
            matches!(
                err(&url[..url.len() / 2]),
                TransferError::TruncatedUrl { .. }
            ),
            "{tl}"
        );
        let v9 = url.replacen("uct://v1/", "uct://v9/", 1);
        assert!(
            matches!(err(&v9), TransferError::UrlVersion { .. }),
            "{tl}: {}",
            err(&v9)
        );
        // A URL of another transport.
        let other = if tl == "tcp" { "posix" } else { "tcp" };
        let c = transport(other, Progress::Thread);
        let e = err(&c.bind().unwrap());
        assert!(
            matches!(e, TransferError::NoCommonTransport { .. }),
            "{tl} given a {other} URL: {e}"
        );
        assert!(e.to_string().contains(other), "{e}");
        assert!(!a.connected());
        // A peer that is gone.
        drop(b);
        let e = err(&url);
        assert!(
            matches!(e, TransferError::PeerUnreachable { .. }),
            "{tl}: a gone peer: {e}"
        );
        // Connecting twice.
        let (p, q) = pair(tl, Progress::Thread);
        let e = p.connect(&q.bind().unwrap()).unwrap_err();
        assert!(
            matches!(e, TransferError::AlreadyConnected { .. }),
            "{tl}: {e}"
        );
    }
}

#[test]
fn operations_before_connect_are_refused() {
    for tl in TRANSPORTS {
        let a = transport(tl, Progress::Thread);
        let m = Memory::alloc(&a, MemoryType::Host, 64).unwrap();
        let r = RemoteBuffer::parse(&m.remote_key()).unwrap();
        let e = within("write", &[], a.write(&m.whole(), &r, true));
        assert_eq!(e, Err(TransferError::NotConnected), "{tl}");
    }
}

#[test]
fn bad_keys_and_views_are_refused_by_name() {
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let src = Memory::alloc(&a, MemoryType::Host, 4096).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, 4096).unwrap();
        let key = dst.remote_key();
        let remote = RemoteBuffer::parse(&key).unwrap();
        // Views and slices out of range.
        assert!(matches!(
            src.view(4000, 97),
            Err(TransferError::OutOfRange { what: "view", .. })
        ));
        assert!(matches!(
            remote.slice(1, 4096),
            Err(TransferError::OutOfRange {
                what: "remote slice",
                ..
            })
        ));
        assert!(src.contains(src.addr() + 4095, 1) && !src.contains(src.addr() + 4095, 2));
        let e = within("w", &[], a.write(&src.view(0, 10).unwrap(), &remote, false));
        assert!(matches!(
            e,
            Err(TransferError::LengthMismatch {
                local: 10,
                remote: 4096
            })
        ));
        // Garbage and truncated keys.
        assert!(matches!(
            RemoteBuffer::parse("garbage"),
            Err(TransferError::BadKey { .. })
        ));
        let e = RemoteBuffer::parse(&key[..key.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        // A write to a buffer its owner made read-only: refused here by the
        // key's rights, and by the owner's transport when the key is forged
        // to claim write rights.
        let ro =
            Memory::alloc_with(&b, MemoryType::Host, 4096, Access::remote_read_only()).unwrap();
        let ro_remote = RemoteBuffer::parse(&ro.remote_key()).unwrap();
        let e = within("w", &[], a.write(&src.whole(), &ro_remote, false));
        assert!(
            matches!(e, Err(TransferError::RemoteAccess { op: "write", .. })),
            "{tl}: {e:?}"
        );
        within("read of read-only", &[], a.read(&src.whole(), &ro_remote)).unwrap();
        let forged = forge_rights(&ro.remote_key(), Access::all());
        let forged = RemoteBuffer::parse(&forged).unwrap();
        let e = within("w", &[], a.write(&src.whole(), &forged, true)).unwrap_err();
        assert!(
            matches!(
                e,
                TransferError::Uct(uct_core::UctError::AccessDenied { .. })
            ),
            "{tl}: a write through a key forged to claim write rights: {e}"
        );
        // A key of memory registered for another transport.
        let other = if tl == "tcp" { "posix" } else { "tcp" };
        let c = transport(other, Progress::Thread);
        let foreign = Memory::alloc(&c, MemoryType::Host, 4096).unwrap();
        let e = within(
            "w",
            &[],
            a.write(
                &src.whole(),
                &RemoteBuffer::parse(&foreign.remote_key()).unwrap(),
                false,
            ),
        );
        assert!(
            matches!(e, Err(TransferError::KeyTransport { .. })),
            "{tl}: {e:?}"
        );
        // Local memory registered for another transport.
        let e = within("w", &[], a.write(&foreign.whole(), &remote, false));
        assert!(
            matches!(e, Err(TransferError::ForeignMemory { .. })),
            "{tl}: {e:?}"
        );
        // A stale key: its memory was deregistered.
        let gone = Memory::alloc(&b, MemoryType::Host, 4096).unwrap();
        let stale = RemoteBuffer::parse(&gone.remote_key()).unwrap();
        drop(gone);
        let e = within("w", &[], a.write_tagged(&src.whole(), &stale, 7));
        assert!(
            stale_key_refused(tl, &e),
            "{tl}: a write through a stale key: {e:?}"
        );
        // The connection still works after every refusal, and the refused
        // notified writes notified nothing: the next notification is the
        // good write's.
        within("good write", &[], a.write_tagged(&src.whole(), &remote, 8)).unwrap();
        let n = within("the good write's notification", &[], b.wait_for_write()).unwrap();
        assert_eq!(n.tag, 8, "{tl}: a refused write was notified");
    }
}

/// Whether `e` is the refusal of a key whose memory was deregistered: no
/// such region, or (the region id reused) a wrong secret. On posix the
/// freed region's descriptor number may already name another file of the
/// owner (a progress thread's eventfd, another test's memfd not yet
/// sealed): then the refusal says the descriptor is no sealed segment. Not
/// a header too short or unreadable: a number reused by a later segment is
/// answered from its header (NoSuchRegion).
fn stale_key_refused<T>(tl: &str, e: &Result<T, TransferError>) -> bool {
    let reused = |m: &str| {
        m.contains("is not a sealed uct segment")
            && !m.contains("less than its header")
            && !m.contains("header cannot be read")
    };
    matches!(
        e,
        Err(TransferError::Uct(
            uct_core::UctError::NoSuchRegion { .. } | uct_core::UctError::BadSecret
        ))
    ) || matches!(e, Err(TransferError::Uct(uct_core::UctError::BadRkey(m))) if tl == "posix" && reused(m))
}

/// `key` with its rights field replaced and a valid check.
fn forge_rights(key: &str, rights: Access) -> String {
    let body = key.rsplit_once('#').unwrap().0;
    let mut fields: Vec<String> = body.split(':').map(String::from).collect();
    fields[4] = format!("{:x}", rights.bits());
    with_check(&fields.join(":"))
}

/// A process that reaches the receiver's iface but does not have its URL
/// (so not its token) cannot notify it; zero-byte registrations are
/// refused.
#[test]
fn notifications_without_the_receivers_token_are_dropped() {
    for tl in ["posix", "tcp"] {
        let (a, b) = pair(tl, Progress::Thread);
        let url = b.bind().unwrap();
        // The URL with another token (and a valid check): what a third
        // party that knows the address but not the URL would send.
        let body = url.rsplit_once('#').unwrap().0;
        let mut parts: Vec<&str> = body.split('/').collect();
        parts[3] = "00000000deadbeef";
        let forged = with_check(&parts.join("/"));
        let c = transport(tl, Progress::Thread);
        c.bind().unwrap();
        c.connect(&forged).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, 64).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let from_c = Memory::alloc(&c, MemoryType::Host, 64).unwrap();
        let mut c_write = c.write_tagged(&from_c.whole(), &remote, 666);
        if tl == "tcp" {
            // tcp takes a put with immediate data only from an iface the
            // receiver connected to: c's waits unexecuted (its future
            // fails after the peer timeout).
            let r = c.wait_within(&mut c_write, std::time::Duration::from_secs(1));
            assert!(
                r.is_err(),
                "tcp: a notified write to a receiver that never connected to the writer resolved: {r:?}"
            );
        } else {
            within("c's write", &[], c_write).unwrap();
        }
        let from_a = Memory::alloc(&a, MemoryType::Host, 64).unwrap();
        within(
            "a's write",
            &[],
            a.write_tagged(&from_a.whole(), &remote, 1),
        )
        .unwrap();
        let n = within("a notification", &[], b.wait_for_write()).unwrap();
        assert_eq!(n.tag, 1, "{tl}: a notification without the token was taken");
        // SAFETY: zero bytes at a dangling, aligned pointer: nothing is
        // read or written, and the registration is refused.
        let e = unsafe {
            Memory::register_raw(
                &a,
                std::ptr::NonNull::<u8>::dangling().as_ptr(),
                0,
                Access::all(),
            )
        };
        assert!(matches!(e, Err(TransferError::Config(_))), "{tl}");
    }
}

/// In a batch, a write the peer refuses does not silence the notification
/// of a good write after it (tcp flushes each write of a batch), and the
/// batch ends with the refusal (see [`stale_key_refused`]).
#[test]
fn a_refused_write_in_a_batch_leaves_the_next_notification() {
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let src = Memory::alloc(&a, MemoryType::Host, 64).unwrap();
        let good = Memory::alloc(&b, MemoryType::Host, 64).unwrap();
        let gone = Memory::alloc(&b, MemoryType::Host, 64).unwrap();
        let stale = RemoteBuffer::parse(&gone.remote_key()).unwrap();
        drop(gone);
        let batch = [
            uct_transfer::BatchWrite {
                local: src.whole(),
                remote: stale,
                notify: None,
            },
            uct_transfer::BatchWrite {
                local: src.whole(),
                remote: RemoteBuffer::parse(&good.remote_key()).unwrap(),
                notify: Some(9),
            },
        ];
        let e = within("the batch", &[], a.write_batch(&batch));
        assert!(stale_key_refused(tl, &e), "{tl}: {e:?}");
        let n = within("the good write's notification", &[], b.wait_for_write()).unwrap();
        assert_eq!(n.tag, 9, "{tl}");
    }
}
