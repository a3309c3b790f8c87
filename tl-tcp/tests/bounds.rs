//! Finding 12.2: what one peer can make a tcp iface spend is bounded. Gets
//! (and puts with immediate data, each answered) are not executed while
//! their replies pile up unread; Nacks are accepted
//! only for requests outstanding; gets in flight are capped; one progress
//! call has a budget; accepted links are capped and closed when they do not
//! say Hello within UCT_BOOTSTRAP_TIMEOUT; junk connections cost a
//! well-behaved peer nothing.
//!
//! The victims that are measured or flooded are this binary started again
//! (`UCT_TCP_TEST_ROLE=victim`), so that their memory is their own.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    closed_by, closed_within, connect, count_closed, frame, honest_hello, open, own_rkey, send,
    write_all, FakePeer, Peer, Rng, Victim, VICTIM_REGION,
};
use libtest_mimic::{Arguments, Failed, Trial};
use tl_tcp::wire::{parse, Header, Parsed, WireError, WireKey};
use uct_core::{
    Access, Completion, Endpoint, Iface, Iov, MemHandle, MemoryType, RemoteKey, Status,
};

fn ensure(ok: bool, msg: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(msg().into())
    }
}

/// A link to `victim` that has said a valid Hello.
fn hello_link(victim: &Victim) -> Result<TcpStream, Failed> {
    let mut s = connect(victim.peer().socket_addr());
    ensure(send(&mut s, &honest_hello(victim.peer())), || {
        "the victim did not take a Hello".into()
    })?;
    Ok(s)
}

/// Request `req`: a get of the second half of the victim's region.
fn half_get(victim: &Victim, key: WireKey, req: u64) -> Vec<u8> {
    let half = (VICTIM_REGION / 2) as u64;
    frame(
        &Header::Get {
            req,
            key,
            addr: victim.addr + half,
            len: half,
        },
        &[],
    )
}

/// How many MiB the victim's peak memory has grown past `rss0` KiB.
fn grew_mib(victim: &Victim, rss0: u64) -> u64 {
    let (_, peak) = common::rss_kib(victim.pid());
    peak.saturating_sub(rss0) / 1024
}

/// A peer floods `Get{512 KiB}` (1 GiB in all) and never reads: the victim
/// must stop executing them once their replies pile up, its memory must
/// stay bounded, and a well-behaved peer must still be served.
fn get_flood_is_bounded() -> Result<(), Failed> {
    let victim = Victim::spawn(&[]);
    let key = common::wire_key(&victim.rkey);
    let (rss0, _) = common::rss_kib(victim.pid());
    let mut s = hello_link(&victim)?;
    let mut sent = 0;
    for req in 0..2048u64 {
        let get = half_get(&victim, key, req);
        // A victim that stops reading stops the flood: that is the bound.
        if !write_all(&mut s, &get, Duration::from_secs(2), || {
            std::thread::sleep(Duration::from_millis(1))
        }) {
            break;
        }
        sent += 1;
    }
    std::thread::sleep(Duration::from_secs(1));
    let grew_mib = grew_mib(&victim, rss0);
    println!("get flood: {sent} gets of 512 KiB sent, victim grew {grew_mib} MiB");
    ensure(grew_mib < 160, || {
        format!("the victim grew {grew_mib} MiB answering {sent} gets nobody reads")
    })?;
    victim
        .legit_transfer(3)
        .map_err(|e| format!("a well-behaved peer during the flood: {e}"))?;
    drop(s);
    Ok(())
}

/// A peer floods puts with immediate data (two million, zero-length, so
/// that answers would outgrow what the kernel buffers) and never reads the
/// answers: the victim executes none of them (the flooder is no iface it
/// connected to: its link stops at the first), so the flood stalls; the
/// victim stays bounded in memory and still serves a well-behaved peer.
fn put_imm_flood_is_bounded() -> Result<(), Failed> {
    let victim = Victim::spawn(&[]);
    let key = common::wire_key(&victim.rkey);
    let (rss0, _) = common::rss_kib(victim.pid());
    let mut s = hello_link(&victim)?;
    const BATCH: u64 = 4096;
    let mut sent = 0u64;
    let mut stalled = false;
    for b in 0..512u64 {
        let batch: Vec<u8> = (b * BATCH..(b + 1) * BATCH)
            .flat_map(|req| {
                let put = Header::PutImm {
                    req,
                    key,
                    addr: victim.addr,
                    imm: req as u32,
                };
                frame(&put, &[])
            })
            .collect();
        if !write_all(&mut s, &batch, Duration::from_secs(2), || {
            std::thread::sleep(Duration::from_millis(1))
        }) {
            stalled = true;
            break;
        }
        sent += BATCH;
    }
    std::thread::sleep(Duration::from_secs(1));
    let grew_mib = grew_mib(&victim, rss0);
    println!("put_imm flood: {sent} puts sent before the victim stopped reading, victim grew {grew_mib} MiB");
    ensure(stalled, || {
        format!(
            "the victim took all {sent} puts with immediate data while their answers were unread"
        )
    })?;
    ensure(grew_mib < 32, || {
        format!("the victim grew {grew_mib} MiB answering {sent} puts nobody reads")
    })?;
    victim
        .legit_transfer(5)
        .map_err(|e| format!("a well-behaved peer during the flood: {e}"))?;
    drop(s);
    Ok(())
}

/// Strangers that know only the victim's address (a Hello with their own,
/// never-dialled identity) each send one put with immediate data and then
/// ~1.1 MiB of active messages, on 32 links: with a key the victim
/// refuses, the put is answered with its refusal and the messages are
/// delivered; with a good key, the link stops at the put (nothing of it or
/// after it is executed) and is closed after the longer of the peer and
/// bootstrap timeouts. The victim
/// holds nothing for either beyond a link's receive buffer (README: about
/// 400 KiB per connection at worst).
fn strangers_puts_with_immediates_cost_a_link_and_time_out() -> Result<(), Failed> {
    let victim = Victim::spawn(&[
        ("UCT_TCP_PEER_TIMEOUT", "1s"),
        ("UCT_BOOTSTRAP_TIMEOUT", "1s"),
    ]);
    let (rss0, _) = common::rss_kib(victim.pid());
    let good = common::wire_key(&victim.rkey);
    let forged = WireKey {
        region_id: good.region_id ^ (1 << 45),
        secret: 1,
    };
    let am = vec![0xabu8; 64 * 1024];
    let mut refused = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..32u64 {
        let key = if i % 2 == 0 { forged } else { good };
        let mut s = connect(victim.peer().socket_addr());
        let mut bytes = honest_hello(victim.peer());
        let put = Header::PutImm {
            req: i,
            key,
            addr: victim.addr,
            imm: 1,
        };
        bytes.extend(frame(&put, &[]));
        for _ in 0..17 {
            bytes.extend(frame(&Header::Am { id: 1 }, &am));
        }
        // A waiting link takes what the kernel buffers, no more.
        let took = write_all(&mut s, &bytes, Duration::from_secs(2), || {
            std::thread::sleep(Duration::from_millis(1))
        });
        if key == forged {
            ensure(took, || {
                format!("link {i}: the victim did not take 1.1 MiB after a refused put")
            })?;
            refused.push(s);
        } else {
            waiting.push(s);
        }
    }
    // Well past UCT_TCP_PEER_TIMEOUT=1s and UCT_BOOTSTRAP_TIMEOUT=1s.
    std::thread::sleep(Duration::from_secs(3));
    let (rss, _) = common::rss_kib(victim.pid());
    let grew = rss.saturating_sub(rss0) / 1024;
    let waiting_open = waiting.len() - count_closed(&mut waiting, Duration::from_millis(10));
    let refused_open = refused.len() - count_closed(&mut refused, Duration::from_millis(10));
    println!(
        "strangers' puts with immediates: victim RSS grew {grew} MiB for 32 links; AMs delivered {}; still open after 3 s: {waiting_open} waiting, {refused_open} refused",
        victim.ams()
    );
    ensure(grew < 32 * 400 / 1024 + 8, || {
        format!(
            "the victim holds {grew} MiB for 32 stranger links ({} KiB per link; README: about 400 KiB per connection at worst)",
            grew * 1024 / 32
        )
    })?;
    ensure(victim.ams() == 16 * 17, || {
        format!(
            "{} active messages delivered, {} expected: those after a refused put only",
            victim.ams(),
            16 * 17
        )
    })?;
    ensure(waiting_open == 0, || {
        format!("{waiting_open} links waiting for the victim to connect back still open after 3 s with UCT_TCP_PEER_TIMEOUT=1s and UCT_BOOTSTRAP_TIMEOUT=1s")
    })
}

/// Links of the many-links flood.
const FLOOD_LINKS: usize = 32;

/// One peer opens many links, each with a valid Hello, and floods gets of
/// half the region on each without ever reading: what the victim holds for
/// them is bounded in all, not per link, and a well-behaved peer that comes
/// later is still served.
fn many_links_flooding_gets_are_bounded_in_all() -> Result<(), Failed> {
    let victim = Victim::spawn(&[]);
    let key = common::wire_key(&victim.rkey);
    let (rss0, _) = common::rss_kib(victim.pid());
    let gets: Vec<u8> = (0..64u64)
        .flat_map(|req| half_get(&victim, key, req))
        .collect();
    let mut links = Vec::new();
    for _ in 0..FLOOD_LINKS {
        let mut s = connect(victim.peer().socket_addr());
        let mut bytes = honest_hello(victim.peer());
        bytes.extend_from_slice(&gets);
        // The victim may stop reading part-way: that is its bound.
        let _ = write_all(&mut s, &bytes, Duration::from_millis(300), || {
            std::thread::sleep(Duration::from_millis(1))
        });
        links.push(s);
    }
    std::thread::sleep(Duration::from_secs(1));
    let grew_mib = grew_mib(&victim, rss0);
    println!("{FLOOD_LINKS} links of 64 unread gets of 512 KiB: the victim grew {grew_mib} MiB");
    let t = Instant::now();
    let served = victim.legit_transfer(9);
    println!(
        "a well-behaved peer after the flood: {served:?} in {:?}",
        t.elapsed()
    );
    ensure(grew_mib < 64, || {
        format!("the victim grew {grew_mib} MiB for {FLOOD_LINKS} links of gets nobody reads")
    })?;
    served.map_err(|e| format!("a well-behaved peer after the flood: {e}"))?;
    drop(links);
    Ok(())
}

/// Waits up to `limit` for the victim's open descriptors to fall to `fds`.
fn fds_fall_to(victim: &Victim, fds: usize, limit: Duration) -> usize {
    let t0 = Instant::now();
    while victim.fds() > fds && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    victim.fds()
}

/// A peer that asks for replies and never reads them keeps its link only
/// for UCT_TCP_PEER_TIMEOUT: then the victim closes it (and frees what it
/// held for it). The link's own check does it; on Linux since 5.x the
/// kernel's TCP_USER_TIMEOUT also ends zero-window probing, so this passes
/// without the link's check there too: a guard, not a proof.
fn a_link_whose_peer_reads_nothing_is_closed_after_the_peer_timeout() -> Result<(), Failed> {
    let victim = Victim::spawn(&[("UCT_TCP_PEER_TIMEOUT", "1s")]);
    let key = common::wire_key(&victim.rkey);
    let fds0 = victim.fds();
    let mut s = connect(victim.peer().socket_addr());
    let mut bytes = honest_hello(victim.peer());
    for req in 0..64u64 {
        bytes.extend(half_get(&victim, key, req));
    }
    let _ = write_all(&mut s, &bytes, Duration::from_secs(1), || {});
    let t0 = Instant::now();
    while victim.fds() <= fds0 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure(victim.fds() > fds0, || {
        "the victim did not take the link in".into()
    })?;
    // Never read: the victim's replies stall in the socket.
    let fds = fds_fall_to(&victim, fds0, Duration::from_secs(5));
    println!("the victim holds {fds} fds, {fds0} before the link");
    ensure(fds <= fds0, || {
        "a link whose peer read none of 32 MiB of replies outlived UCT_TCP_PEER_TIMEOUT=1s by 4 s"
            .into()
    })
}

/// At UCT_TCP_MAX_ACCEPTED, a link that said Hello and then nothing for
/// UCT_TCP_PEER_TIMEOUT gives way to a new peer: links that said Hello do
/// not keep the others out for good.
fn at_the_cap_an_idle_link_gives_way_to_a_new_peer() -> Result<(), Failed> {
    let victim = Victim::spawn(&[
        ("UCT_TCP_MAX_ACCEPTED", "4"),
        ("UCT_TCP_PEER_TIMEOUT", "1s"),
    ]);
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(hello_link(&victim)?);
    }
    std::thread::sleep(Duration::from_millis(1500));
    victim
        .legit_transfer(11)
        .map_err(|e| format!("a new peer at the cap of 4 idle links: {e}"))?;
    let closed = count_closed(&mut idle, Duration::from_millis(10));
    println!("idle links closed to make room: {closed}");
    ensure(closed >= 1, || "no idle link was closed".into())
}

/// At UCT_TCP_MAX_ACCEPTED, a link that carried requests is never closed
/// to make room, however long it has been idle: a peer that talks now and
/// then keeps its link while anyone with our address (the cookie is in
/// it) fills the cap with links that said Hello and keeps connecting.
fn at_the_cap_a_link_that_carried_requests_is_not_closed_for_a_new_one() -> Result<(), Failed> {
    let victim = Victim::spawn(&[
        ("UCT_TCP_MAX_ACCEPTED", "4"),
        ("UCT_TCP_PEER_TIMEOUT", "1s"),
    ]);
    let mut good = victim.legit_peer()?;
    good.transfer(13, Duration::from_secs(5))
        .map_err(|e| format!("the good peer before the attack: {e}"))?;
    // The good peer idles past the peer timeout, as apps that talk
    // occasionally do.
    std::thread::sleep(Duration::from_millis(1500));
    let mut attack = Vec::new();
    for _ in 0..3 {
        attack.push(hello_link(&victim)?);
    }
    std::thread::sleep(Duration::from_millis(200));
    // The cap is full of fresh links: each newcomer now asks for room.
    for _ in 0..8 {
        let mut s = connect(victim.peer().socket_addr());
        let _ = send(&mut s, &honest_hello(victim.peer()));
        attack.push(s);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let open = attack.len() - count_closed(&mut attack, Duration::from_millis(10));
    println!("attacker's links still open: {open} of {}", attack.len());
    good.transfer(14, Duration::from_secs(5))
        .map_err(|e| format!("the good peer after 1.5 s idle and 8 connections at the cap: {e}"))?;
    Ok(())
}

/// The cookie of the fake peers here.
const FAKE_COOKIE: u64 = 0x0c00_c1e5;

/// An iface of this process, its endpoint to a fake peer, and memory of
/// its own with its rkey.
type ToFake = (Box<dyn Iface>, Box<dyn Endpoint>, MemHandle, RemoteKey);

/// An iface of this process with an endpoint to `fake`, and `len` bytes
/// of its own memory with their rkey.
fn ep_to_fake(fake: &FakePeer, len: usize) -> Result<ToFake, Failed> {
    let mut me = open();
    let ep = me.create_ep(fake.peer.ep_params())?;
    let local = me.md().alloc(len, MemoryType::Host, Access::all())?;
    let rkey = own_rkey(me.as_ref(), &local)?;
    Ok((me, ep, local, rkey))
}

/// Reads frames from `s` until one satisfies `want` (progressing `iface`).
fn wait_frame(
    s: &mut TcpStream,
    iface: &mut dyn Iface,
    mut want: impl FnMut(&Header) -> bool,
) -> Result<Header, Failed> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let t0 = Instant::now();
    loop {
        while let Ok(Parsed::Frame { header, total, .. }) = parse(&buf, usize::MAX) {
            buf.drain(..total);
            if want(&header) {
                return Ok(header);
            }
        }
        iface.progress();
        match s.read(&mut chunk) {
            Ok(0) => return Err("the iface closed the fake peer's link".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        ensure(t0.elapsed() < Duration::from_secs(5), || {
            "no such frame in 5 s".into()
        })?;
    }
}

/// A Nack for a request the iface never sent must not be taken as the
/// refusal of one of its requests: the link is closed instead.
fn a_nack_for_no_request_is_refused() -> Result<(), Failed> {
    let fake = FakePeer::new(FAKE_COOKIE);
    let mut me = open();
    let mut ep = me.create_ep(fake.peer.ep_params())?;
    let flush = Completion::new();
    let _ = ep.flush(Some(&flush))?;
    let mut s = fake.accept();
    let Header::Flush { req } =
        wait_frame(&mut s, me.as_mut(), |h| matches!(h, Header::Flush { .. }))?
    else {
        unreachable!()
    };
    // Request 999999 of the endpoint's id was never sent.
    let forged = (req & !((1 << 40) - 1)) | 999_999;
    let mut bytes = frame(
        &Header::Nack {
            req: forged,
            error: WireError::BadSecret,
        },
        &[],
    );
    bytes.extend(frame(&Header::FlushReply { req }, &[]));
    ensure(send(&mut s, &bytes), || "could not send the nack".into())?;
    let t0 = Instant::now();
    while !flush.is_complete() && t0.elapsed() < Duration::from_secs(5) {
        me.progress();
    }
    let result = flush.is_complete().then(|| flush.result());
    println!("flush after a forged nack: {result:?}");
    ensure(
        !matches!(result, Some(Err(uct_core::UctError::BadSecret))),
        || {
            "a Nack for a request never sent failed the endpoint's flush with the peer's error"
                .into()
        },
    )?;
    let closed = closed_by(me.as_mut(), &mut s, Duration::from_secs(2));
    ensure(closed, || {
        "the link that sent a forged Nack stayed open".into()
    })
}

/// Gets to a peer that does not answer are capped: the iface says
/// NoResource before 64 MiB of gets are in flight.
fn gets_in_flight_are_capped() -> Result<(), Failed> {
    let fake = FakePeer::new(FAKE_COOKIE);
    let (_me, mut ep, local, rkey) = ep_to_fake(&fake, 1 << 20)?;
    let _held = fake.accept();
    let mut in_flight = 0;
    for _ in 0..64 {
        let comp = Completion::new();
        match ep.get_zcopy(&[Iov::whole(&local)], 0x1000, &rkey, Some(&comp))? {
            Status::NoResource => break,
            _ => in_flight += 1,
        }
    }
    println!("gets of 1 MiB in flight before NoResource: {in_flight}");
    ensure(in_flight < 64, || {
        format!("{in_flight} MiB of gets in flight to a peer that answers nothing")
    })
}

/// One progress call handles a bounded number of frames of one link.
fn one_progress_call_has_a_budget() -> Result<(), Failed> {
    let mut victim = open();
    let got = common::counter(victim.as_mut(), 3);
    let v = Peer::of_iface(victim.as_ref());
    let mut s = connect(v.socket_addr());
    let mut bytes = honest_hello(v);
    let n = 20_000;
    for _ in 0..n {
        bytes.extend(frame(&Header::Am { id: 3 }, &[]));
    }
    // Written before the victim reads any: its socket holds them all.
    ensure(send(&mut s, &bytes), || {
        "the victim's socket did not take 20,000 empty messages".into()
    })?;
    let mut most = 0;
    let t0 = Instant::now();
    while got.load(Ordering::Relaxed) < n && t0.elapsed() < Duration::from_secs(10) {
        let before = got.load(Ordering::Relaxed);
        victim.progress();
        most = most.max(got.load(Ordering::Relaxed) - before);
    }
    println!("most messages delivered by one progress call: {most}");
    ensure(got.load(Ordering::Relaxed) == n, || {
        format!(
            "only {} of {n} messages delivered",
            got.load(Ordering::Relaxed)
        )
    })?;
    ensure(most <= 4096, || {
        format!("one progress call delivered {most} messages of one link")
    })
}

/// A connection that says nothing, or half a Hello, is closed after
/// UCT_BOOTSTRAP_TIMEOUT.
fn a_silent_link_is_closed_after_the_bootstrap_timeout() -> Result<(), Failed> {
    let victim = Victim::spawn(&[("UCT_BOOTSTRAP_TIMEOUT", "1s")]);
    let addr = victim.peer().socket_addr();
    let mut silent = connect(addr);
    let mut half = connect(addr);
    let hello = honest_hello(victim.peer());
    ensure(send(&mut half, &hello[..hello.len() / 2]), || {
        "could not send half a Hello".into()
    })?;
    let t0 = Instant::now();
    let a = closed_within(&mut silent, Duration::from_secs(5), || {});
    let b = closed_within(&mut half, Duration::from_secs(1), || {});
    println!("silent links closed: {a} {b} after {:?}", t0.elapsed());
    ensure(a && b, || {
        "a link without a Hello outlived UCT_BOOTSTRAP_TIMEOUT=1s by 4 s".into()
    })
}

/// Accepted links are capped (UCT_TCP_MAX_ACCEPTED), and links that have
/// not said Hello give way, so a well-behaved peer still gets in.
fn accepted_links_are_capped() -> Result<(), Failed> {
    let victim = Victim::spawn(&[("UCT_TCP_MAX_ACCEPTED", "8")]);
    let addr = victim.peer().socket_addr();
    let mut conns: Vec<TcpStream> = (0..40).map(|_| connect(addr)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let open = conns.len() - count_closed(&mut conns, Duration::from_millis(10));
    println!("links of 40 still open with a cap of 8: {open}");
    ensure(open <= 8, || {
        format!("{open} silent links open with UCT_TCP_MAX_ACCEPTED=8")
    })?;
    victim
        .legit_transfer(5)
        .map_err(|e| format!("a well-behaved peer at the cap: {e}"))?;
    Ok(())
}

/// Thousands of junk connections (a few KiB of random bytes each) cost a
/// well-behaved peer nothing, and the links they made are all gone after.
fn junk_connections_cost_a_peer_nothing() -> Result<(), Failed> {
    let victim = Victim::spawn(&[("UCT_TCP_PEER_TIMEOUT", "3s")]);
    let fds0 = victim.fds();
    let addr = victim.peer().socket_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let mut junkers = Vec::new();
    for t in 0..3u64 {
        let stop = stop.clone();
        let made = made.clone();
        junkers.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9 ^ (t + 1));
            let mut open = std::collections::VecDeque::new();
            while !stop.load(Ordering::SeqCst) {
                let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
                    continue;
                };
                s.set_nonblocking(true).unwrap();
                let n = 1024 + (rng.next() % 4096) as usize;
                let junk = rng.bytes(n);
                let _ = write_all(&mut s, &junk, Duration::from_millis(100), || {});
                open.push_back(s);
                if open.len() > 100 {
                    open.pop_front();
                }
                made.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let mut peer = victim.legit_peer()?;
    let t0 = Instant::now();
    let mut transfers = 0u32;
    let mut result = Ok(());
    while t0.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        if let Err(e) = peer.transfer(transfers as u8, Duration::from_secs(5)) {
            result = Err(format!(
                "transfer {transfers} failed after {:?}: {e}",
                t.elapsed()
            ));
            break;
        }
        transfers += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for j in junkers {
        let _ = j.join();
    }
    let junk = made.load(Ordering::SeqCst);
    println!("junk connections: {junk}, transfers meanwhile: {transfers}");
    result?;
    ensure(junk > 1000, || {
        format!("only {junk} junk connections were made")
    })?;
    // Every junk link is gone once its connection closed.
    let fds = fds_fall_to(&victim, fds0 + 4, Duration::from_secs(3));
    ensure(fds <= fds0 + 4, || {
        format!("the victim holds {fds} fds after the junk, {fds0} before")
    })
}

/// A frame that claims more data than its kind may carry (an active
/// message of 8 MiB; a get reply larger than the get) closes the link as
/// soon as its header is in, before its data is buffered.
fn an_oversized_frame_closes_the_link_before_its_data() -> Result<(), Failed> {
    let mut victim = open();
    let v = Peer::of_iface(victim.as_ref());
    let mut s = connect(v.socket_addr());
    let mut bytes = honest_hello(v);
    bytes.extend(tl_tcp::wire::encode(&Header::Am { id: 3 }, 8 << 20).unwrap());
    bytes.extend(vec![0u8; 4096]);
    ensure(send(&mut s, &bytes), || "could not send the frame".into())?;
    let closed = closed_by(victim.as_mut(), &mut s, Duration::from_secs(2));
    ensure(closed, || {
        "a link announcing an 8 MiB active message stayed open, waiting for its data".into()
    })?;

    // A get reply larger than the get.
    let fake = FakePeer::new(FAKE_COOKIE);
    let (mut me, mut ep, _local, rkey) = ep_to_fake(&fake, 4096)?;
    let comp = Completion::new();
    let _ = ep.get_bcopy(64, 0x1000, &rkey, &comp)?;
    let mut s = fake.accept();
    let Header::Get { req, .. } =
        wait_frame(&mut s, me.as_mut(), |h| matches!(h, Header::Get { .. }))?
    else {
        unreachable!()
    };
    let mut bytes = tl_tcp::wire::encode(&Header::GetReply { req, error: None }, 8 << 20).unwrap();
    bytes.extend(vec![0u8; 4096]);
    ensure(send(&mut s, &bytes), || "could not send the reply".into())?;
    let closed = closed_by(me.as_mut(), &mut s, Duration::from_secs(2));
    ensure(closed, || {
        "a link announcing an 8 MiB reply to a 64-byte get stayed open, waiting for its data".into()
    })
}

fn main() {
    if std::env::var(common::ROLE).as_deref() == Ok("victim") {
        common::victim_main();
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("get_flood_is_bounded", get_flood_is_bounded),
        Trial::test("put_imm_flood_is_bounded", put_imm_flood_is_bounded),
        Trial::test(
            "strangers_puts_with_immediates_cost_a_link_and_time_out",
            strangers_puts_with_immediates_cost_a_link_and_time_out,
        ),
        Trial::test(
            "many_links_flooding_gets_are_bounded_in_all",
            many_links_flooding_gets_are_bounded_in_all,
        ),
        Trial::test(
            "a_nack_for_no_request_is_refused",
            a_nack_for_no_request_is_refused,
        ),
        Trial::test("gets_in_flight_are_capped", gets_in_flight_are_capped),
        Trial::test(
            "an_oversized_frame_closes_the_link_before_its_data",
            an_oversized_frame_closes_the_link_before_its_data,
        ),
        Trial::test(
            "one_progress_call_has_a_budget",
            one_progress_call_has_a_budget,
        ),
        Trial::test(
            "a_silent_link_is_closed_after_the_bootstrap_timeout",
            a_silent_link_is_closed_after_the_bootstrap_timeout,
        ),
        Trial::test("accepted_links_are_capped", accepted_links_are_capped),
        Trial::test(
            "a_link_whose_peer_reads_nothing_is_closed_after_the_peer_timeout",
            a_link_whose_peer_reads_nothing_is_closed_after_the_peer_timeout,
        ),
        Trial::test(
            "at_the_cap_an_idle_link_gives_way_to_a_new_peer",
            at_the_cap_an_idle_link_gives_way_to_a_new_peer,
        ),
        Trial::test(
            "at_the_cap_a_link_that_carried_requests_is_not_closed_for_a_new_one",
            at_the_cap_a_link_that_carried_requests_is_not_closed_for_a_new_one,
        ),
        Trial::test(
            "junk_connections_cost_a_peer_nothing",
            junk_connections_cost_a_peer_nothing,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
