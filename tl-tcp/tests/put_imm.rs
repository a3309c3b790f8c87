//! Puts with immediate data over tcp, two ifaces of this process on lo:
//! the immediate reaches the target's handler once all of its put's bytes
//! are in place, in the order sent, in order with active messages; the put
//! completes only once the target has executed it; a refused put delivers
//! no immediate and fails with the error a refused plain put gets; a peer
//! speaking the frames itself gets the same checks. Immediates come only
//! from an iface the target connected to: before that a put with immediate
//! data waits unexecuted and unanswered (and what follows it), from a
//! stranger that claims another's identity without its cookie for good.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    connect, frame, hello, honest_hello, open, own_rkey, read_for, send, to_iface, FakePeer, Peer,
};
use tl_tcp::wire::{Header, WireError, WireKey};
use uct_core::region_table::SoftRkey;
use uct_core::{
    Access, Caps, Completion, Endpoint, Iface, ImmEvent, Iov, MemHandle, MemoryType, RemoteKey,
    Status, UctError,
};

/// A pattern that differs per seed, so that a put's bytes are told apart.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An initiator iface with an endpoint to a target iface, both on lo, and
/// the target's endpoint back (immediates come only from an iface the
/// target connected to).
struct Pair {
    tx: Box<dyn Iface>,
    ep: Box<dyn Endpoint>,
    rx: Box<dyn Iface>,
    back: Option<Box<dyn Endpoint>>,
}

impl Pair {
    fn new() -> Pair {
        let mut p = Pair::one_way();
        p.connect_back();
        p
    }

    /// Without the endpoint back.
    fn one_way() -> Pair {
        let mut tx = open();
        let rx = open();
        let ep = tx.create_ep(to_iface(rx.as_ref())).unwrap();
        Pair {
            tx,
            ep,
            rx,
            back: None,
        }
    }

    fn connect_back(&mut self) {
        self.back = Some(self.rx.create_ep(to_iface(self.tx.as_ref())).unwrap());
    }

    fn progress(&mut self) {
        self.tx.progress();
        self.rx.progress();
    }

    /// Host memory of the target with `access`, and its rkey as a peer has it.
    fn target(&self, len: usize, access: Access) -> (MemHandle, RemoteKey) {
        let mem = self.rx.md().alloc(len, MemoryType::Host, access).unwrap();
        let rkey = own_rkey(self.rx.as_ref(), &mem).unwrap();
        (mem, rkey)
    }

    /// Initiator memory holding `data`.
    fn source(&self, data: &[u8]) -> MemHandle {
        let mem = self
            .tx
            .md()
            .alloc(data.len().max(1), MemoryType::Host, Access::all())
            .unwrap();
        mem.write(0, data).unwrap();
        mem
    }

    /// Posts, progressing both sides while NoResource; then waits for
    /// `comp` when InProgress. The post's refusal or the completion's.
    fn post(
        &mut self,
        comp: &Completion,
        mut op: impl FnMut(&mut dyn Endpoint, &Completion) -> uct_core::Result<Status>,
    ) -> uct_core::Result<()> {
        let t0 = Instant::now();
        loop {
            match op(self.ep.as_mut(), comp)? {
                Status::Done => return Ok(()),
                Status::InProgress => break,
                Status::NoResource => self.progress(),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "NoResource for 20 s"
            );
        }
        self.wait(comp);
        comp.result()
    }

    fn wait(&mut self, comp: &Completion) {
        let t0 = Instant::now();
        while !comp.is_complete() {
            self.progress();
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "not complete in 20 s"
            );
        }
    }

    fn flush(&mut self) -> uct_core::Result<()> {
        let comp = Completion::new();
        self.post(&comp, |ep, c| ep.flush(Some(c)))
    }
}

/// Immediates the target received, in order.
type Seen = Arc<Mutex<Vec<ImmEvent>>>;

fn record_imms(iface: &mut dyn Iface) -> Seen {
    let seen = Seen::default();
    let s = seen.clone();
    iface
        .set_imm_handler(Box::new(move |e| s.lock().unwrap().push(e)))
        .unwrap();
    seen
}

#[test]
fn tcp_advertises_put_with_immediate_data() {
    let iface = open();
    assert!(iface.attrs().caps.contains(Caps::PUT_IMM));
}

#[test]
fn each_immediate_comes_after_all_of_its_puts_bytes_at_every_size() {
    let mut p = Pair::new();
    let max = p.tx.attrs().put.max_zcopy;
    // Around the size where the target reads a put straight into its
    // memory (16 KiB), and the largest put: many reads of the socket.
    let sizes = [0, 1, 100, 8192, 16383, 16384, 65537, 1 << 20, max];
    let total: usize = sizes.iter().sum();
    let (target, rkey) = p.target(total, Access::all());
    // Where each put goes, and what it carries (seeded by its immediate).
    let mut at = 0;
    let puts: Vec<(usize, usize, u32)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let put = (at, len, 100 + i as u32);
            at += len;
            put
        })
        .collect();
    // The handler checks the target memory when the immediate arrives.
    let seen = Seen::default();
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let (s, w, t, expect) = (seen.clone(), wrong.clone(), target.clone(), puts.clone());
    p.rx.set_imm_handler(Box::new(move |e| {
        s.lock().unwrap().push(e);
        let Some(&(off, len, _)) = expect.iter().find(|(_, _, imm)| *imm == e.imm) else {
            w.lock()
                .unwrap()
                .push(format!("unknown immediate {}", e.imm));
            return;
        };
        let mut got = vec![0u8; len];
        t.read(off, &mut got).unwrap();
        if got != pattern(len, e.imm) {
            w.lock()
                .unwrap()
                .push(format!("immediate {} came before its {len} bytes", e.imm));
        }
    }))
    .unwrap();
    let sources: Vec<MemHandle> = puts
        .iter()
        .map(|&(_, len, imm)| p.source(&pattern(len, imm)))
        .collect();
    // All posted before any completes: they travel back to back.
    let comps: Vec<Completion> = puts.iter().map(|_| Completion::new()).collect();
    for (i, &(off, len, imm)) in puts.iter().enumerate() {
        let iov = [Iov::new(&sources[i], 0, len)];
        let iov: &[Iov<'_>] = if len == 0 { &[] } else { &iov };
        let t0 = Instant::now();
        loop {
            let st =
                p.ep.put_zcopy_imm(iov, target.addr() + off as u64, &rkey, imm, Some(&comps[i]))
                    .unwrap();
            if st != Status::NoResource {
                break;
            }
            p.progress();
            assert!(t0.elapsed() < Duration::from_secs(20));
        }
    }
    for comp in &comps {
        p.wait(comp);
        assert_eq!(comp.result(), Ok(()));
    }
    // The completions came after the immediates were handed over.
    let seen = seen.lock().unwrap().clone();
    let want: Vec<ImmEvent> = puts
        .iter()
        .map(|&(_, len, imm)| ImmEvent { imm, len })
        .collect();
    assert_eq!(seen, want, "immediates out of order, lost or doubled");
    assert!(
        wrong.lock().unwrap().is_empty(),
        "{:?}",
        wrong.lock().unwrap()
    );
}

#[test]
fn a_put_imm_completes_only_once_the_target_has_executed_it() {
    let mut p = Pair::new();
    let seen = record_imms(p.rx.as_mut());
    let (target, rkey) = p.target(64, Access::all());
    let src = p.source(&pattern(64, 7));
    let comp = Completion::new();
    let st =
        p.ep.put_zcopy_imm(
            &[Iov::new(&src, 0, 64)],
            target.addr(),
            &rkey,
            7,
            Some(&comp),
        )
        .unwrap();
    assert_eq!(
        st,
        Status::InProgress,
        "a put with immediate data waits for its answer"
    );
    // The target does nothing: the put stays pending.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        p.tx.progress();
    }
    assert!(
        !comp.is_complete(),
        "completed before the target executed it"
    );
    p.wait(&comp);
    assert_eq!(comp.result(), Ok(()));
    assert_eq!(*seen.lock().unwrap(), [ImmEvent { imm: 7, len: 64 }]);
    let mut got = vec![0u8; 64];
    target.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(64, 7));
}

/// `rkey` with its secret changed.
fn forged(rkey: &RemoteKey) -> RemoteKey {
    let mut soft: SoftRkey = *rkey.downcast::<SoftRkey>(rkey.md()).unwrap();
    soft.secret ^= 0x5a5a;
    RemoteKey::new(rkey.component(), rkey.md(), Box::new(soft))
}

#[test]
fn a_refused_put_imm_delivers_nothing_and_fails_as_a_refused_put_does() {
    let mut p = Pair::new();
    let seen = record_imms(p.rx.as_mut());
    let region = 128 * 1024;
    let (open_mem, open_key) = p.target(region, Access::all());
    let (ro_mem, ro_key) = p.target(
        region,
        Access::LOCAL_READ | Access::LOCAL_WRITE | Access::REMOTE_READ,
    );
    let (stale_mem, stale_key) = p.target(region, Access::all());
    let stale_addr = stale_mem.addr();
    drop(stale_mem);
    let bad_secret = forged(&open_key);
    let before = |mem: &MemHandle| {
        let mut b = vec![0u8; region];
        mem.read(0, &mut b).unwrap();
        b
    };
    let (open_before, ro_before) = (before(&open_mem), before(&ro_mem));
    // Small (buffered) and large (read straight into the region).
    for len in [64, 64 * 1024] {
        let src = p.source(&pattern(len, 1));
        let cases: [(&str, u64, &RemoteKey); 4] = [
            ("read-only", ro_mem.addr(), &ro_key),
            (
                "past the end",
                open_mem.addr() + (region - len / 2) as u64,
                &open_key,
            ),
            ("deregistered", stale_addr, &stale_key),
            ("forged secret", open_mem.addr(), &bad_secret),
        ];
        for (what, addr, rkey) in cases {
            // A plain put of the same: refused, its error at the flush.
            let comp = Completion::new();
            let iov = [Iov::new(&src, 0, len)];
            p.post(&comp, |ep, c| ep.put_zcopy(&iov, addr, rkey, Some(c)))
                .unwrap();
            let plain = p.flush().expect_err(what);
            // With immediate data: its own completion fails alike.
            let comp = Completion::new();
            let with_imm = p
                .post(&comp, |ep, c| {
                    ep.put_zcopy_imm(&iov, addr, rkey, 9, Some(c))
                })
                .expect_err(what);
            assert_eq!(
                std::mem::discriminant(&with_imm),
                std::mem::discriminant(&plain),
                "{what}, {len} bytes: put_zcopy_imm failed with {with_imm}, a put with {plain}"
            );
            assert!(
                matches!(
                    with_imm,
                    UctError::AccessDenied { .. }
                        | UctError::OutOfRange { .. }
                        | UctError::NoSuchRegion { .. }
                        | UctError::BadSecret
                ),
                "{what}: {with_imm}"
            );
            // Nothing owed to the next flush: the completion took it.
            p.flush().unwrap();
            // Without a completion, the next flush has the refusal.
            while p.ep.put_zcopy_imm(&iov, addr, rkey, 9, None).unwrap() == Status::NoResource {
                p.progress();
            }
            let later = p.flush().expect_err(what);
            assert_eq!(
                std::mem::discriminant(&later),
                std::mem::discriminant(&plain),
                "{what}: flush after an unwatched refused put_zcopy_imm: {later}"
            );
        }
    }
    // A good one afterwards is the only immediate.
    let src = p.source(&pattern(8, 2));
    let comp = Completion::new();
    p.post(&comp, |ep, c| {
        ep.put_zcopy_imm(
            &[Iov::new(&src, 0, 8)],
            open_mem.addr(),
            &open_key,
            2,
            Some(c),
        )
    })
    .unwrap();
    assert_eq!(*seen.lock().unwrap(), [ImmEvent { imm: 2, len: 8 }]);
    let mut open_after = before(&open_mem);
    open_after[..8].copy_from_slice(&open_before[..8]);
    assert!(
        open_after == open_before,
        "a refused put wrote the open region"
    );
    assert!(
        before(&ro_mem) == ro_before,
        "a refused put wrote the read-only region"
    );
}

#[test]
fn immediates_and_active_messages_arrive_in_the_order_sent() {
    let mut p = Pair::new();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let o = order.clone();
    p.rx.set_imm_handler(Box::new(move |e| {
        o.lock().unwrap().push(format!("imm{}", e.imm))
    }))
    .unwrap();
    let o = order.clone();
    p.rx.set_am_handler(
        5,
        Box::new(move |m| {
            let n = u64::from_le_bytes(m.data[..8].try_into().unwrap());
            o.lock().unwrap().push(format!("am{n}"))
        }),
    )
    .unwrap();
    let (target, rkey) = p.target(4096, Access::all());
    let src = p.source(&pattern(4096, 3));
    let n = 500;
    let mut comps = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        while p.ep.am_short(5, i, &[]).unwrap() == Status::NoResource {
            p.progress();
            assert!(t0.elapsed() < Duration::from_secs(20));
        }
        let len = (i as usize * 8) % 4096;
        let iov = [Iov::new(&src, 0, len)];
        let iov: &[Iov<'_>] = if len == 0 { &[] } else { &iov };
        let comp = Completion::new();
        while p
            .ep
            .put_zcopy_imm(iov, target.addr(), &rkey, i as u32, Some(&comp))
            .unwrap()
            == Status::NoResource
        {
            p.progress();
            assert!(t0.elapsed() < Duration::from_secs(20));
        }
        comps.push(comp);
    }
    for comp in &comps {
        p.wait(comp);
    }
    p.flush().unwrap();
    let want: Vec<String> = (0..n)
        .flat_map(|i| [format!("am{i}"), format!("imm{i}")])
        .collect();
    assert_eq!(*order.lock().unwrap(), want);
}

#[test]
fn immediates_with_no_handler_are_dropped_and_the_puts_still_complete() {
    let mut p = Pair::new();
    let (target, rkey) = p.target(64, Access::all());
    let src = p.source(&pattern(64, 4));
    for i in 0..3 {
        let comp = Completion::new();
        p.post(&comp, |ep, c| {
            ep.put_zcopy_imm(&[Iov::new(&src, 0, 64)], target.addr(), &rkey, i, Some(c))
        })
        .unwrap();
    }
    let seen = record_imms(p.rx.as_mut());
    let comp = Completion::new();
    p.post(&comp, |ep, c| {
        ep.put_zcopy_imm(&[], target.addr(), &rkey, 77, Some(c))
    })
    .unwrap();
    assert_eq!(*seen.lock().unwrap(), [ImmEvent { imm: 77, len: 0 }]);
}

/// A peer that speaks the frames itself, as an iface the target connected
/// to: a PutImm with a good key is done and answered; with a bad key, or
/// data past the region, answered with the refusal and no immediate; an
/// answer sent as a request closes its link.
#[test]
fn a_peer_speaking_the_frames_gets_the_same_checks() {
    let mut rx = open();
    let seen = record_imms(rx.as_mut());
    let mem = rx
        .md()
        .alloc(4096, MemoryType::Host, Access::all())
        .unwrap();
    let packed = uct_core::RkeyBundle::single(rx.md().pack_rkey(&mem).unwrap())
        .pack()
        .unwrap();
    let key = common::wire_key(&packed);
    // The iface the raw peer claims to be, which the target connects to.
    let fake = FakePeer::new(0xfa4e);
    let _back = rx.create_ep(fake.peer.ep_params()).unwrap();
    let peer = Peer::of_iface(rx.as_ref());
    let mut s = connect(peer.socket_addr());
    let mut bytes = hello(fake.peer, peer.cookie);
    let put = |req, key, addr, imm| Header::PutImm {
        req,
        key,
        addr,
        imm,
    };
    bytes.extend(frame(&put(1, key, mem.addr(), 11), b"hello"));
    let stranger = WireKey {
        // Far from the ids this process hands out (one counter).
        region_id: key.region_id ^ (1 << 45),
        secret: key.secret,
    };
    bytes.extend(frame(&put(2, stranger, mem.addr(), 12), b"nope"));
    bytes.extend(frame(&put(3, key, mem.addr() + 4094, 13), b"past"));
    bytes.extend(frame(&put(4, key, mem.addr() + 8, 14), &[]));
    assert!(send(&mut s, &bytes));
    let got = read_for(&mut s, Duration::from_millis(500), || {
        rx.progress();
    });
    let replies: Vec<(u64, Option<WireError>)> = got
        .frames
        .iter()
        .filter_map(|h| match h {
            Header::PutImmReply { req, error } => Some((*req, error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 4, "{:?}", got.frames);
    assert_eq!(replies[0], (1, None));
    assert!(matches!(
        replies[1],
        (2, Some(WireError::NoSuchRegion { .. }))
    ));
    assert!(matches!(
        replies[2],
        (3, Some(WireError::OutOfRange { .. }))
    ));
    assert_eq!(replies[3], (4, None));
    assert_eq!(
        *seen.lock().unwrap(),
        [ImmEvent { imm: 11, len: 5 }, ImmEvent { imm: 14, len: 0 }]
    );
    let mut got = [0u8; 5];
    mem.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    // An answer sent as a request: the link is closed.
    let answer = frame(
        &Header::PutImmReply {
            req: 5,
            error: None,
        },
        &[],
    );
    assert!(send(&mut s, &answer));
    assert!(common::closed_by(
        rx.as_mut(),
        &mut s,
        Duration::from_secs(2)
    ));
    // Data on an answer is refused by the codec before its bytes.
    let mut s = connect(peer.socket_addr());
    let mut bytes = honest_hello(peer);
    let lying = tl_tcp::wire::encode(
        &Header::PutImmReply {
            req: 1,
            error: None,
        },
        1 << 20,
    )
    .unwrap();
    bytes.extend(lying);
    assert!(send(&mut s, &bytes));
    assert!(common::closed_by(
        rx.as_mut(),
        &mut s,
        Duration::from_secs(2)
    ));
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// Before the target connects back, the initiator's puts with immediate
/// data wait unexecuted and unanswered (and the active messages after
/// them): their completions do not fire, their bytes are not written, no
/// immediate comes. Once it connects back, all come, in order, and the
/// puts complete.
#[test]
fn puts_with_immediates_wait_for_the_target_to_connect_back_then_come_in_order() {
    let mut p = Pair::one_way();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let o = order.clone();
    p.rx.set_imm_handler(Box::new(move |e| {
        o.lock().unwrap().push(format!("imm{}", e.imm))
    }))
    .unwrap();
    let o = order.clone();
    p.rx.set_am_handler(
        5,
        Box::new(move |m| o.lock().unwrap().push(format!("am{}", m.data[0]))),
    )
    .unwrap();
    let (target, rkey) = p.target(64, Access::all());
    let src = p.source(&pattern(64, 5));
    assert_eq!(p.ep.am_bcopy(5, &[0]).unwrap(), Status::Done);
    let mut comps = Vec::new();
    for i in 1..=3u8 {
        let comp = Completion::new();
        let t0 = Instant::now();
        loop {
            let iov = [Iov::new(&src, 0, 64)];
            match p
                .ep
                .put_zcopy_imm(&iov, target.addr(), &rkey, i as u32, Some(&comp))
                .unwrap()
            {
                Status::InProgress => break,
                Status::NoResource => p.progress(),
                Status::Done => panic!("a put with immediate data done in the call"),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "NoResource for 20 s"
            );
        }
        comps.push(comp);
        assert_eq!(p.ep.am_bcopy(5, &[10 + i]).unwrap(), Status::Done);
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        p.progress();
    }
    let mut got = vec![0u8; 64];
    target.read(0, &mut got).unwrap();
    assert_eq!(
        got,
        vec![0u8; 64],
        "a put was done before the target connected back"
    );
    assert!(
        comps.iter().all(|c| !c.is_complete()),
        "a put with immediate data completed before the target connected back"
    );
    assert_eq!(
        *order.lock().unwrap(),
        ["am0"],
        "what came after the first put with immediate data was delivered"
    );
    p.connect_back();
    for c in &comps {
        p.wait(c);
        c.result().unwrap();
    }
    p.flush().unwrap();
    let t0 = Instant::now();
    while order.lock().unwrap().len() < 7 && t0.elapsed() < Duration::from_secs(5) {
        p.progress();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["am0", "imm1", "am11", "imm2", "am12", "imm3", "am13"]
    );
    target.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(64, 5), "the puts were not done");
}

/// A stranger that knows the target's address claims to be an iface the
/// target connected to, without that iface's cookie: its puts (with a good
/// key) are neither done nor answered, its immediates never delivered; one
/// with a key the target refuses is answered with the refusal at once.
#[test]
fn a_stranger_without_the_peers_cookie_never_delivers_an_immediate() {
    let mut rx = open();
    let seen = record_imms(rx.as_mut());
    let mem = rx.md().alloc(64, MemoryType::Host, Access::all()).unwrap();
    let packed = uct_core::RkeyBundle::single(rx.md().pack_rkey(&mem).unwrap())
        .pack()
        .unwrap();
    let key = common::wire_key(&packed);
    let fake = FakePeer::new(0xfa4e);
    let _back = rx.create_ep(fake.peer.ep_params()).unwrap();
    let peer = Peer::of_iface(rx.as_ref());
    for claim in [
        Peer {
            cookie: fake.peer.cookie ^ 1,
            ..fake.peer
        },
        Peer {
            port: fake.peer.port.wrapping_add(1),
            ..fake.peer
        },
    ] {
        let mut s = connect(peer.socket_addr());
        let mut bytes = hello(claim, peer.cookie);
        let put = Header::PutImm {
            req: 1,
            key,
            addr: mem.addr(),
            imm: 66,
        };
        bytes.extend(frame(&put, b"x"));
        assert!(send(&mut s, &bytes));
        let got = read_for(&mut s, Duration::from_millis(300), || {
            rx.progress();
        });
        assert!(got.frames.is_empty(), "answered: {:?}", got.frames);
        assert!(seen.lock().unwrap().is_empty(), "a stranger's immediate");
        let mut x = [0u8; 1];
        mem.read(0, &mut x).unwrap();
        assert_eq!(x, [0], "a stranger's put with immediate data was done");
    }
    // A stranger that says nothing of who it is cannot either.
    let mut s = connect(peer.socket_addr());
    let mut bytes = honest_hello(peer);
    let put = Header::PutImm {
        req: 1,
        key,
        addr: mem.addr(),
        imm: 67,
    };
    bytes.extend(frame(&put, b"y"));
    assert!(send(&mut s, &bytes));
    let got = read_for(&mut s, Duration::from_millis(300), || {
        rx.progress();
    });
    assert!(got.frames.is_empty(), "answered: {:?}", got.frames);
    assert!(seen.lock().unwrap().is_empty(), "a stranger's immediate");
    // A key the target refuses: answered with the refusal, nothing waits.
    let mut s = connect(peer.socket_addr());
    let mut bytes = honest_hello(peer);
    let forged = WireKey {
        region_id: key.region_id ^ (1 << 45),
        secret: key.secret,
    };
    let put = Header::PutImm {
        req: 1,
        key: forged,
        addr: mem.addr(),
        imm: 68,
    };
    bytes.extend(frame(&put, b"z"));
    assert!(send(&mut s, &bytes));
    let got = read_for(&mut s, Duration::from_millis(300), || {
        rx.progress();
    });
    assert!(
        matches!(
            got.frames.as_slice(),
            [Header::PutImmReply {
                req: 1,
                error: Some(WireError::NoSuchRegion { .. })
            }]
        ),
        "{:?}",
        got.frames
    );
    assert!(seen.lock().unwrap().is_empty(), "a stranger's immediate");
    let mut x = [0u8; 1];
    mem.read(0, &mut x).unwrap();
    assert_eq!(x, [0], "a stranger's put with immediate data was done");
}
