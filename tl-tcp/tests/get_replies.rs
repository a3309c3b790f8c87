//! A get's reply is read from its region a chunk at a time, as the peer
//! takes it: a large get still returns every byte, in order; a region
//! deregistered while its reply is on its way is never read again, and the
//! link that carried the reply is closed, since the reply cannot be
//! finished.

mod common;

use std::time::{Duration, Instant};

use common::{connect, frame, honest_hello, open, own_rkey, read_for, send, to_iface, Peer};
use tl_tcp::wire::Header;
use uct_core::{Access, Completion, Iov, MemoryType, RkeyBundle};

const LEN: usize = 16 << 20;

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ (i >> 13) as u8
}

#[test]
fn a_large_get_returns_every_byte_in_order() {
    let mut victim = open();
    let mut me = open();
    let region = victim
        .md()
        .alloc(LEN, MemoryType::Host, Access::all())
        .unwrap();
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    region.write(0, &data).unwrap();
    let rkey = own_rkey(victim.as_ref(), &region).unwrap();
    let mut ep = me.create_ep(to_iface(victim.as_ref())).unwrap();
    let local = me.md().alloc(LEN, MemoryType::Host, Access::all()).unwrap();
    let comp = Completion::new();
    // An odd offset and length: chunks do not fall on the frame's bounds.
    let len = LEN - 3;
    let _ = ep
        .get_zcopy(
            &[Iov::new(&local, 0, len)],
            region.addr() + 3,
            &rkey,
            Some(&comp),
        )
        .unwrap();
    let t0 = Instant::now();
    while !comp.is_complete() && t0.elapsed() < Duration::from_secs(20) {
        victim.progress();
        me.progress();
    }
    assert!(
        comp.is_complete(),
        "the 16 MiB get did not complete in 20 s"
    );
    comp.result().expect("the get");
    let mut got = vec![0u8; len];
    local.read(0, &mut got).unwrap();
    assert!(got == data[3..], "the get returned other bytes");
}

#[test]
fn a_region_deregistered_during_its_reply_is_not_read_and_the_link_closes() {
    let mut victim = open();
    let region = victim
        .md()
        .alloc(LEN, MemoryType::Host, Access::all())
        .unwrap();
    region.write(0, &vec![0xab; LEN]).unwrap();
    let packed = RkeyBundle::single(victim.md().pack_rkey(&region).unwrap())
        .pack()
        .unwrap();
    let key = common::wire_key(&packed);
    let v = Peer::of_iface(victim.as_ref());
    let mut s = connect(v.socket_addr());
    let mut bytes = honest_hello(v);
    let get = Header::Get {
        req: 1,
        key,
        addr: region.addr(),
        len: LEN as u64,
    };
    bytes.extend(frame(&get, &[]));
    assert!(send(&mut s, &bytes));
    // The reply starts; the socket fills, since nothing reads it.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        victim.progress();
    }
    drop(region);
    let got = read_for(&mut s, Duration::from_secs(5), || {
        victim.progress();
    });
    println!("{} bytes of a {LEN}-byte reply before the close", got.bytes);
    assert!(
        got.closed,
        "the link stayed open with a reply it cannot finish"
    );
    assert!(
        got.bytes < LEN,
        "all {} bytes came, from a deregistered region",
        got.bytes
    );
}
