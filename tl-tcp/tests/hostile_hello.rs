//! Finding 12.1: a stranger that connects to an iface's port must not be
//! able to pass for another peer. A Hello is accepted only as the first
//! frame of a link, only from the address it claims, only with the cookie
//! of the iface it was sent to, and an accepted link is used for traffic
//! to peer P only once it has proved to be P.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{
    closed_by, connect, counter, frame, hello, honest_hello, loopback_ip, open, read_for, send,
    to_iface, FakePeer, Peer,
};
use tl_tcp::wire::Header;
use uct_core::{Completion, Endpoint, EpParams, Iface, Status};

fn progress_for(ifaces: &mut [&mut dyn Iface], d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        for i in ifaces.iter_mut() {
            i.progress();
        }
    }
}

/// Sends "for P only" on each of `eps` and flushes them, progressing
/// `victim` and `peer` until every flush completes (at most 3 s).
fn send_to_p(
    eps: &mut [&mut Box<dyn Endpoint>],
    victim: &mut dyn Iface,
    peer: &mut dyn Iface,
) -> Vec<Completion> {
    let mut flushes = Vec::new();
    for ep in eps.iter_mut() {
        assert_eq!(ep.am_bcopy(7, b"for P only").unwrap(), Status::Done);
        let flush = Completion::new();
        let _ = ep.flush(Some(&flush)).unwrap();
        flushes.push(flush);
    }
    let t0 = Instant::now();
    while !flushes.iter().all(|f| f.is_complete()) && t0.elapsed() < Duration::from_secs(3) {
        victim.progress();
        peer.progress();
    }
    flushes
}

/// A stranger connects to `victim` and sends `bytes`: whether the victim
/// closed the link within 2 s.
fn stranger_closed_after(victim: &mut dyn Iface, bytes: &[u8]) -> bool {
    let mut s = connect(Peer::of_iface(victim).socket_addr());
    assert!(send(&mut s, bytes));
    closed_by(victim, &mut s, Duration::from_secs(2))
}

#[test]
fn a_forged_hello_gets_no_traffic_meant_for_the_peer_it_claims_to_be() {
    let mut victim = open();
    let mut peer = open();
    let got = counter(peer.as_mut(), 7);
    let v = Peer::of_iface(victim.as_ref());
    let p = Peer::of_iface(peer.as_ref());

    // Two forgers, both claiming to be P from P's own IP: one echoes the
    // victim's cookie (it has the victim's address) but cannot know P's,
    // the other knows neither.
    let mut forgers = Vec::new();
    for echo in [v.cookie, v.cookie ^ 0x5a5a] {
        let mut s = connect(v.socket_addr());
        let claim = Peer {
            cookie: p.cookie ^ 0xdead_beef,
            ..p
        };
        assert!(send(&mut s, &hello(claim, echo)));
        forgers.push(s);
    }
    progress_for(&mut [victim.as_mut()], Duration::from_millis(200));

    // The victim's application now talks to P, with P's real address.
    let mut ep = victim.create_ep(to_iface(peer.as_ref())).unwrap();
    let flushes = send_to_p(&mut [&mut ep], victim.as_mut(), peer.as_mut());
    for (i, s) in forgers.iter_mut().enumerate() {
        let r = read_for(s, Duration::from_millis(300), || {
            victim.progress();
        });
        assert!(
            r.bytes == 0,
            "forger {i} received {} bytes meant for P: {:?}",
            r.bytes,
            r.frames
        );
    }
    let flush = &flushes[0];
    assert!(flush.is_complete(), "the flush to P did not complete");
    flush.result().expect("the flush to the real P");
    assert_eq!(got.load(Ordering::SeqCst), 1, "P did not get its message");
}

/// P's cookie is no secret: it is in P's address, which P hands to every
/// peer. A process that has it (and the victim's address) says a Hello that
/// is word for word P's own, from P's IP; the victim may take its requests,
/// but its own traffic for P goes only on a connection it opened to P.
#[test]
fn a_forger_with_the_peers_own_cookie_gets_no_traffic_meant_for_the_peer() {
    let mut victim = open();
    let mut peer = open();
    let got = counter(peer.as_mut(), 7);
    let v = Peer::of_iface(victim.as_ref());
    let p = Peer::of_iface(peer.as_ref());
    let mut forger = connect(v.socket_addr());
    assert!(send(&mut forger, &hello(p, v.cookie)));
    progress_for(&mut [victim.as_mut()], Duration::from_millis(200));

    // Both ways of connecting: to P's iface, and to an endpoint of P.
    let mut to_iface = victim.create_ep(to_iface(peer.as_ref())).unwrap();
    let mut to_ep = victim.create_ep(EpParams::Unconnected).unwrap();
    let p_ep = peer.create_ep(EpParams::Unconnected).unwrap();
    to_ep
        .connect_to_ep(&peer.device_address(), &p_ep.ep_address().unwrap())
        .unwrap();
    let flushes = send_to_p(
        &mut [&mut to_iface, &mut to_ep],
        victim.as_mut(),
        peer.as_mut(),
    );
    let r = read_for(&mut forger, Duration::from_millis(300), || {
        victim.progress();
        peer.progress();
    });
    assert!(
        r.bytes == 0,
        "a forger with P's cookie received {} bytes meant for P: {:?}",
        r.bytes,
        r.frames
    );
    for flush in &flushes {
        assert!(flush.is_complete(), "a flush to P did not complete");
        flush.result().expect("a flush to the real P");
    }
    assert_eq!(got.load(Ordering::SeqCst), 2, "P did not get its messages");
}

#[test]
fn frames_before_a_hello_are_refused_and_the_link_closed() {
    let mut victim = open();
    let got = counter(victim.as_mut(), 5);
    let am = frame(&Header::Am { id: 5 }, b"no hello first");
    let closed = stranger_closed_after(victim.as_mut(), &am);
    assert_eq!(
        got.load(Ordering::SeqCst),
        0,
        "an active message without a Hello was delivered"
    );
    assert!(closed, "a link that did not start with a Hello stayed open");
}

#[test]
fn a_second_hello_closes_the_link() {
    let mut victim = open();
    let peer = open();
    let v = Peer::of_iface(victim.as_ref());
    let mut bytes = honest_hello(v);
    bytes.extend(hello(Peer::of_iface(peer.as_ref()), v.cookie));
    let closed = stranger_closed_after(victim.as_mut(), &bytes);
    assert!(closed, "a link that said Hello twice stayed open");
}

#[test]
fn a_hello_from_another_ip_than_it_claims_closes_the_link() {
    let mut victim = open();
    let got = counter(victim.as_mut(), 5);
    let v = Peer::of_iface(victim.as_ref());
    let liar = Peer {
        ip: std::net::Ipv4Addr::new(10, 9, 8, 7)
            .to_ipv6_mapped()
            .octets(),
        port: 4242,
        cookie: 1,
    };
    let mut bytes = hello(liar, v.cookie);
    bytes.extend(frame(&Header::Am { id: 5 }, b"from 10.9.8.7"));
    let closed = stranger_closed_after(victim.as_mut(), &bytes);
    assert_eq!(
        got.load(Ordering::SeqCst),
        0,
        "the liar's message was delivered"
    );
    assert!(
        closed,
        "a Hello claiming 10.9.8.7 from 127.0.0.1 was accepted"
    );
}

#[test]
fn a_hello_without_the_cookie_of_the_iface_it_reached_closes_the_link() {
    let mut victim = open();
    let got = counter(victim.as_mut(), 5);
    let v = Peer::of_iface(victim.as_ref());
    let me = Peer {
        ip: loopback_ip(),
        port: 4242,
        cookie: 1,
    };
    // The stranger knows the port (it scanned for it), not the cookie.
    let mut bytes = hello(me, v.cookie.wrapping_add(1));
    bytes.extend(frame(&Header::Am { id: 5 }, b"guessed"));
    let closed = stranger_closed_after(victim.as_mut(), &bytes);
    assert_eq!(
        got.load(Ordering::SeqCst),
        0,
        "the guesser's message was delivered"
    );
    assert!(closed, "a Hello with the wrong cookie was accepted");
}

/// Each link carries requests one way only: the side that opened it asks,
/// the other answers. A request on a link the iface opened, or an answer on
/// one a peer opened, closes the link.
#[test]
fn a_frame_the_wrong_way_closes_the_link() {
    let mut victim = open();
    let got = counter(victim.as_mut(), 5);
    let v = Peer::of_iface(victim.as_ref());
    // An answer on a link the stranger opened: the victim asked nothing.
    let mut bytes = honest_hello(v);
    bytes.extend(frame(&Header::FlushReply { req: 1 }, &[]));
    assert!(
        stranger_closed_after(victim.as_mut(), &bytes),
        "a reply on a link the peer opened was taken"
    );

    // A request on a link the victim opened to a (fake) peer.
    let fake = FakePeer::new(0xfa4e);
    let _ep = victim.create_ep(fake.peer.ep_params()).unwrap();
    let mut s = fake.accept();
    assert!(send(
        &mut s,
        &frame(&Header::Am { id: 5 }, b"on the victim's own link")
    ));
    assert!(
        closed_by(victim.as_mut(), &mut s, Duration::from_secs(2)),
        "a request on a link the victim opened was taken"
    );
    assert_eq!(got.load(Ordering::SeqCst), 0, "the message was delivered");
}
