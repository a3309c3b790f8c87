//! A link that fails is reset, not closed in order: once this side gives
//! up on a link, the kernel must not go on sending what it still held for
//! the peer. transfer's rails post a failed rail's stripes again on
//! another rail; a stale put the old socket still delivered afterwards
//! would land over data written since.
//!
//! The peer is a raw socket that reads nothing until the link has failed,
//! so that the writer's kernel holds megabytes of puts for it; it then
//! reads what comes: the rest of the puts and an orderly close (the old
//! behaviour), or a reset.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use common::{frame, open, own_rkey, FakePeer};
use tl_tcp::wire::Header;
use uct_core::{Access, Iov, MemoryType, Status};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn a_failed_link_is_reset_and_what_it_held_is_not_sent() {
    let fake = FakePeer::new(0x00c0_ffee);
    let mut me = open();
    let mut ep = me.create_ep(fake.peer.ep_params()).expect("an endpoint");
    let mut peer = fake.accept();
    const LEN: usize = 1 << 20;
    let local = me
        .md()
        .alloc(LEN, MemoryType::Host, Access::all())
        .expect("memory");
    let rkey = own_rkey(me.as_ref(), &local).expect("a key");
    // Puts nobody reads: the kernel's buffers fill, then the link's queue.
    let t0 = Instant::now();
    let mut posted = 0;
    loop {
        let iov = [Iov::new(&local, 0, LEN)];
        match ep.put_zcopy(&iov, local.addr(), &rkey, None) {
            Ok(Status::NoResource) => break,
            Ok(_) => posted += LEN,
            Err(e) => panic!("a put failed before the link did: {e}"),
        }
        me.progress();
        assert!(t0.elapsed() < LIMIT, "the link never filled up");
    }
    // A request on a link this side dialled: a protocol error that fails
    // the link, as a timeout or a broken socket would.
    peer.write_all(&frame(&Header::Flush { req: 1 }, &[]))
        .expect("the request goes out");
    while ep.check().is_ok() {
        me.progress();
        assert!(t0.elapsed() < 2 * LIMIT, "the link did not fail");
    }
    // The peer reads what comes now. The endpoint and iface stay: a link
    // that failed must not deliver anything more however long they live.
    let mut read = 0;
    let mut chunk = vec![0u8; 1 << 16];
    let t1 = Instant::now();
    let end = loop {
        match peer.read(&mut chunk) {
            Ok(0) => break None,
            Ok(n) => read += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => break Some(e),
        }
        assert!(
            t1.elapsed() < LIMIT,
            "the link neither ended nor reset ({read} bytes read)"
        );
    };
    println!("{posted} bytes of puts posted, {read} read by the peer after the failure");
    match end {
        Some(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Some(e) => panic!("the peer's read failed with {e}, not a reset"),
        None => panic!(
            "the failed link closed in order after sending the peer {read} more bytes: the kernel went on sending what it held (SO_LINGER 0 not set)"
        ),
    }
    drop(ep);
}
