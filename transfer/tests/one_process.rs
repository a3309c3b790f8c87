//! The transfer API in one process, over self, posix and tcp.

mod common;

use common::{fill_of, len_of, pair, within, TRANSPORTS};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer, TransferError};

#[test]
fn ping_pong_over_every_transport() {
    for tl in TRANSPORTS {
        for progress in [Progress::Thread, Progress::Manual] {
            let (server, client) = pair(tl, progress);
            let drive = if progress == Progress::Manual {
                vec![&server, &client]
            } else {
                vec![]
            };
            let len = 8192;
            let smem = Memory::alloc(&server, MemoryType::Host, len).unwrap();
            let cmem = Memory::alloc(&client, MemoryType::Host, len).unwrap();
            let s_remote = RemoteBuffer::parse(&smem.remote_key()).unwrap();
            let c_remote = RemoteBuffer::parse(&cmem.remote_key()).unwrap();
            smem.write_bytes(0, &vec![0xab; len]).unwrap();
            // ping: server -> client
            let w = server.write(&smem.whole(), &c_remote, true);
            let n = within("client's wait", &drive, client.wait_for_write()).unwrap();
            within("server's write", &drive, w).unwrap();
            assert_eq!(n.len, len, "{tl}");
            let mut got = vec![0; len];
            cmem.read_bytes(0, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0xab), "{tl}: ping data");
            // pong: client -> server, tagged
            cmem.write_bytes(0, &vec![0xcd; len]).unwrap();
            let w = client.write_tagged(&cmem.whole(), &s_remote, 42);
            let n = within("server's wait", &drive, server.wait_for_write()).unwrap();
            within("client's write", &drive, w).unwrap();
            assert_eq!((n.len, n.tag), (len, 42), "{tl}");
            smem.read_bytes(0, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0xcd), "{tl}: pong data");
            // read back
            let r = client.read(
                &cmem.view(0, 100).unwrap(),
                &s_remote.slice(0, 100).unwrap(),
            );
            cmem.write_bytes(0, &[0; 100]).unwrap();
            within("client's read", &drive, r).unwrap();
            // self and tcp have immediate data; posix notifies by message.
            let (imm, msg) = (
                client.stats().notifications_received_by_immediate,
                client.stats().notifications_received_by_message,
            );
            let want = if tl == "posix" { (0, 1) } else { (1, 0) };
            assert_eq!((imm, msg), want, "{tl}: how the ping's notification came");
            assert_eq!(server.stats().writes, 1, "{tl}");
        }
    }
}

/// 64 notified writes from 4 threads at once into distinct regions: every
/// notification arrives and every byte lands.
#[test]
fn concurrent_writes_from_four_threads() {
    const THREADS: usize = 4;
    const EACH: usize = 16;
    const LEN: usize = 16 << 10;
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let src = Memory::alloc(&a, MemoryType::Host, THREADS * EACH * LEN).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, THREADS * EACH * LEN).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        for i in 0..THREADS * EACH {
            src.write_bytes(i * LEN, &vec![fill_of(i); LEN]).unwrap();
        }
        let a = std::sync::Arc::new(a);
        let waits: Vec<_> = (0..THREADS * EACH).map(|_| b.wait_for_write()).collect();
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (a, src, remote) = (a.clone(), src.clone(), remote.clone());
                std::thread::spawn(move || {
                    let futs: Vec<_> = (0..EACH)
                        .map(|k| {
                            let i = t * EACH + k;
                            let view = src.view(i * LEN, LEN).unwrap();
                            let to = remote.slice(i * LEN, LEN).unwrap();
                            a.write_tagged(&view, &to, i as u32)
                        })
                        .collect();
                    for f in futs {
                        within("a write", &[], f).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let mut tags: Vec<u32> = waits
            .into_iter()
            .map(|w| {
                let n = within("a notification", &[], w).unwrap();
                assert_eq!(n.len, LEN, "{tl}");
                n.tag
            })
            .collect();
        tags.sort_unstable();
        assert_eq!(
            tags,
            (0..(THREADS * EACH) as u32).collect::<Vec<_>>(),
            "{tl}"
        );
        let mut got = vec![0u8; LEN];
        for i in 0..THREADS * EACH {
            dst.read_bytes(i * LEN, &mut got).unwrap();
            assert!(got.iter().all(|&x| x == fill_of(i)), "{tl}: region {i}");
        }
    }
}

/// 10,000 notified writes of 1 to 64 bytes into their own slots: as each
/// notification arrives, in order, the last byte of its write is there.
#[test]
fn ten_thousand_notified_writes_are_never_stale() {
    const N: usize = 10_000;
    const SLOT: usize = 64;
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let src = Memory::alloc(&a, MemoryType::Host, N * SLOT).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, N * SLOT).unwrap();
        for i in 0..N {
            src.write_bytes(i * SLOT, &[fill_of(i); SLOT]).unwrap();
        }
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let writer = std::thread::spawn(move || {
            let mut futs = Vec::with_capacity(N);
            for i in 0..N {
                let len = len_of(i, SLOT);
                let view = src.view(i * SLOT, len).unwrap();
                futs.push(a.write_tagged(&view, &remote.slice(i * SLOT, len).unwrap(), i as u32));
            }
            for f in futs {
                within("a write", &[], f).unwrap();
            }
            a
        });
        let mut last = [0u8; 1];
        for i in 0..N {
            let n = within("a notification", &[], b.wait_for_write()).unwrap();
            assert_eq!(
                (n.tag, n.len),
                (i as u32, len_of(i, SLOT)),
                "{tl}: notification {i}"
            );
            dst.read_bytes(i * SLOT + n.len - 1, &mut last).unwrap();
            assert_eq!(
                last[0],
                fill_of(i),
                "{tl}: write {i} was stale when its notification came"
            );
        }
        drop(writer.join().unwrap());
    }
}

/// Dropping a Transport with writes queued past its depth and a wait
/// pending resolves all of them; nothing hangs.
#[test]
fn a_transport_dropped_with_operations_pending_resolves_them() {
    for tl in TRANSPORTS {
        let (a, b) = common::pair_with_depth(tl, 2);
        let len = 1 << 20;
        let src = Memory::alloc(&a, MemoryType::Host, len).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, len).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let writes: Vec<_> = (0..200)
            .map(|_| a.write(&src.whole(), &remote, false))
            .collect();
        let wait = a.wait_for_write();
        drop(a);
        assert_eq!(
            within("the wait", &[], wait),
            Err(TransferError::Closed),
            "{tl}"
        );
        let mut closed = 0;
        for w in writes {
            match within("a write", &[], w) {
                Ok(()) => {}
                Err(TransferError::Closed) => closed += 1,
                Err(e) => panic!("{tl}: {e}"),
            }
        }
        eprintln!("{tl}: {closed} of 200 writes ended Closed");
        if tl != "self" && tl != "posix" {
            assert!(
                closed > 0,
                "{tl}: 200 writes of 1 MiB all completed before the drop"
            );
        }
        drop(b);
    }
}

/// Memory allocated before connect belongs to the candidate that cannot
/// register (posix); the others register its bytes by address. Writes
/// queued behind a full transport keep the whole memory alive after the
/// application dropped it and every future: they are posted later, from
/// memory that still exists, and land.
#[test]
fn queued_writes_keep_their_memory_after_the_application_drops_it() {
    let build = || {
        uct_transfer::Transport::builder()
            .progress(Progress::Manual)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    // Allocated before connect: registered with every candidate.
    let src = Memory::alloc(&a, MemoryType::Host, 64).unwrap();
    let dst = Memory::alloc(&b, MemoryType::Host, 64).unwrap();
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    assert_eq!(a.transport_name().as_deref(), Some("self"));
    src.write_bytes(0, &[0x3c; 64]).unwrap();
    let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
    // More than self's queue of immediates holds: the last ones wait.
    let futs: Vec<_> = (0..1100u32)
        .map(|i| a.write_tagged(&src.whole(), &remote, i))
        .collect();
    assert!(futs.iter().any(|f| !f.is_done()), "nothing was queued");
    drop(futs);
    drop(src);
    let mut seen = 0u32;
    let start = std::time::Instant::now();
    while seen < 1100 {
        a.progress();
        b.progress();
        while let Some(n) = poll_now(b.wait_for_write()) {
            assert_eq!(n.unwrap().tag, seen);
            seen += 1;
        }
        assert!(start.elapsed() < common::LIMIT, "{seen} of 1100 arrived");
    }
    let mut got = [0u8; 64];
    dst.read_bytes(0, &mut got).unwrap();
    assert_eq!(got, [0x3c; 64]);
}

/// The future's result if it is ready now (a wait that is not ready is
/// dropped, which gives its place up).
fn poll_now<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(fut).poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// A notified write split in pieces (message after a flush), then a
/// notified write of one piece (immediate), posted back to back: the
/// receiver sees the notifications in the order the writes were made
/// (README: wait_for_write "returns the next notification, in the order
/// the writes were made").
#[test]
fn split_then_single_notified_writes_notify_in_order() {
    for tl in TRANSPORTS {
        let (a, b) = common::pair_with(tl, |b| b.max_write_piece(8 << 10));
        let len = 64 << 10;
        let src = Memory::alloc(&a, MemoryType::Host, len).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, 2 * len).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let first = a.write_tagged(&src.whole(), &remote.slice(0, len).unwrap(), 5);
        let second = a.write_tagged(
            &src.view(0, 1024).unwrap(),
            &remote.slice(len, 1024).unwrap(),
            6,
        );
        within("first", &[], first).unwrap();
        within("second", &[], second).unwrap();
        let n1 = within("n1", &[], b.wait_for_write()).unwrap();
        let n2 = within("n2", &[], b.wait_for_write()).unwrap();
        assert_eq!(
            (n1.tag, n2.tag),
            (5, 6),
            "{tl}: notifications out of the order of the writes"
        );
    }
}

/// A notified write that resolves Ok is notified, even when the writer
/// goes away at once: where it resolves before the receiver connects
/// (posix: the notification is in the receiver's memory), the receiver
/// gets it after the writer left; over tcp the receiver takes immediates
/// only from a peer it connected to, so the write waits, unresolved,
/// until the receiver connects back, then resolves Ok and is notified.
#[test]
fn a_notified_write_that_resolved_ok_is_notified_when_the_writer_leaves() {
    use std::time::Duration;
    for tl in ["posix", "tcp"] {
        let a = common::transport(tl, Progress::Thread);
        let b = common::transport(tl, Progress::Thread);
        let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
        let dst = Memory::alloc(&b, MemoryType::Host, 4096).unwrap();
        a.connect(&ub).unwrap();
        let src = Memory::alloc(&a, MemoryType::Host, 4096).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let mut write = a.write_tagged(&src.whole(), &remote, 9);
        let early = a.wait_within(&mut write, Duration::from_secs(1));
        match (tl, early) {
            ("tcp", Err(_)) => {
                // Not resolved: it resolves once the receiver connects back.
                b.connect(&ua).unwrap();
                let r = a.wait_within(&mut write, Duration::from_secs(10));
                assert!(matches!(r, Ok(Ok(_))), "{tl}: after connecting back: {r:?}");
            }
            ("tcp", r) => panic!("tcp: resolved before the receiver connected back: {r:?}"),
            (_, r) => assert!(matches!(r, Ok(Ok(_))), "{tl}: {r:?}"),
        }
        drop(write);
        drop(a);
        let n = b.wait_within(b.wait_for_write(), Duration::from_secs(3));
        assert!(
            matches!(n, Ok(Ok(ref n)) if n.tag == 9 && n.len == 4096),
            "{tl}: the write resolved Ok at the writer, the receiver got no notification: {n:?}"
        );
    }
}

/// A write larger than a piece is split; its notification comes once, by
/// message, after all of it, with its whole length, also on transports
/// whose single-piece writes notify by immediate (self, tcp); a write of
/// one piece there still goes by immediate.
#[test]
fn a_write_split_in_pieces_notifies_once_after_all_of_it() {
    for tl in TRANSPORTS {
        let (a, b) = common::pair_with(tl, |b| b.max_write_piece(8 << 10));
        let len = 64 << 10;
        let src = Memory::alloc(&a, MemoryType::Host, len).unwrap();
        let dst = Memory::alloc(&b, MemoryType::Host, len).unwrap();
        let pattern: Vec<u8> = (0..len).map(|i| (i / 8192) as u8 + 1).collect();
        src.write_bytes(0, &pattern).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        within("split", &[], a.write_tagged(&src.whole(), &remote, 5)).unwrap();
        within(
            "one piece",
            &[],
            a.write_tagged(
                &src.view(0, 8 << 10).unwrap(),
                &remote.slice(0, 8 << 10).unwrap(),
                6,
            ),
        )
        .unwrap();
        let n = within("split's notification", &[], b.wait_for_write()).unwrap();
        assert_eq!((n.tag, n.len), (5, len), "{tl}");
        let n = within("one piece's notification", &[], b.wait_for_write()).unwrap();
        assert_eq!((n.tag, n.len), (6, 8 << 10), "{tl}");
        let mut got = vec![0u8; len];
        dst.read_bytes(0, &mut got).unwrap();
        assert_eq!(got, pattern, "{tl}");
        let s = b.stats();
        let want = if tl == "posix" { (0, 2) } else { (1, 1) };
        assert_eq!(
            (
                s.notifications_received_by_immediate,
                s.notifications_received_by_message
            ),
            want,
            "{tl}"
        );
    }
}
