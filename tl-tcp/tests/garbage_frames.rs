//! A tcp listener fed 10,000 random frames by a hostile peer keeps serving:
//! each nonsense frame closes only that connection, refused requests are
//! answered with errors, and a good peer then completes a transfer.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tl_tcp::wire::{encode, Header, WireAtomic, WireError, WireKey};
use uct_core::{Access, Completion, EpParams, Registry, RkeyBundle, Status};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn random_frame(rng: &mut Rng) -> Vec<u8> {
    let key = WireKey {
        region_id: rng.next(),
        secret: rng.next(),
    };
    let req = rng.next();
    let addr = rng.next();
    let header = match rng.next() % 9 {
        // Pure noise.
        0 => {
            let n = 1 + (rng.next() % 64) as usize;
            return rng.bytes(n);
        }
        // A plausible prefix, then a header that does not decode.
        1 => {
            let mut f = 16u32.to_le_bytes().to_vec();
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend(rng.bytes(16));
            return f;
        }
        // A data length far beyond the limit.
        2 => {
            let mut f = 4u32.to_le_bytes().to_vec();
            f.extend_from_slice(&u32::MAX.to_le_bytes());
            return f;
        }
        // A reply sent as a request.
        3 => Header::FlushReply { req },
        // Well-formed requests with keys that match nothing.
        4 => Header::Put { req, key, addr },
        5 => Header::Get {
            req,
            key,
            addr,
            len: rng.next() % 100_000_000,
        },
        6 => Header::Atomic {
            req,
            key,
            addr,
            width: (rng.next() % 10) as u8,
            op: WireAtomic::FetchAdd,
            value: 1,
        },
        7 => Header::Nack {
            req,
            error: WireError::BadSecret,
        },
        _ => Header::Am {
            id: (rng.next() % 300) as u8,
        },
    };
    let data = if matches!(header, Header::Put { .. } | Header::Am { .. }) {
        let n = (rng.next() % 256) as usize;
        rng.bytes(n)
    } else {
        Vec::new()
    };
    let mut f = encode(&header, data.len()).unwrap();
    f.extend(data);
    f
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to the listener");
    s.set_nonblocking(true).unwrap();
    s
}

#[test]
fn ten_thousand_random_frames_then_a_good_transfer() {
    use tl_tcp as _;
    let reg = Registry::global();
    let mut rx = reg
        .open_iface("tcp", Some("lo"), &Default::default())
        .expect("tcp on lo");
    let mut tx = reg
        .open_iface("tcp", Some("lo"), &Default::default())
        .expect("tcp on lo");
    let delivered = Arc::new(AtomicUsize::new(0));
    let d = delivered.clone();
    rx.set_am_handler(
        4,
        Box::new(move |m| {
            if m.data == b"good" {
                d.fetch_add(1, Ordering::SeqCst);
            }
        }),
    )
    .unwrap();

    let ip: [u8; 16] = rx.device_address().try_into().unwrap();
    let port = u16::from_le_bytes(rx.iface_address().try_into().unwrap());
    let v6 = Ipv6Addr::from(ip);
    let addr = SocketAddr::new(
        v6.to_ipv4_mapped().map(Into::into).unwrap_or(v6.into()),
        port,
    );

    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut conn = connect(addr);
    let mut reconnects = 0;
    let mut sink = vec![0u8; 1 << 16];
    for _ in 0..10_000 {
        let frame = random_frame(&mut rng);
        let mut sent = 0;
        let t0 = Instant::now();
        while sent < frame.len() {
            match conn.write(&frame[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    rx.progress();
                }
                Err(_) => {
                    conn = connect(addr);
                    reconnects += 1;
                    sent = 0;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "listener stopped reading"
            );
        }
        rx.progress();
        // Drain replies so the peer's buffers never fill; a closed
        // connection is replaced.
        loop {
            match conn.read(&mut sink) {
                Ok(0) => {
                    conn = connect(addr);
                    reconnects += 1;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    assert!(
        reconnects > 100,
        "nonsense frames should close their connections ({reconnects})"
    );

    // A good peer still completes a put, a get and an active message.
    let mem = rx
        .md()
        .alloc(4096, uct_core::MemoryType::Host, Access::all())
        .unwrap();
    let entry = rx.md().pack_rkey(&mem).unwrap();
    let rkey = reg
        .unpack_rkey(&RkeyBundle::single(entry).pack().unwrap(), rx.md().name())
        .unwrap();
    let mut ep = tx
        .create_ep(EpParams::ToIface {
            device_addr: rx.device_address(),
            iface_addr: rx.iface_address(),
        })
        .unwrap();
    assert_eq!(
        ep.put_bcopy(b"still works", mem.addr() + 100, &rkey)
            .unwrap(),
        Status::Done
    );
    assert_eq!(ep.am_bcopy(4, b"good").unwrap(), Status::Done);
    let flush = Completion::new();
    let _ = ep.flush(Some(&flush)).unwrap();
    let t0 = Instant::now();
    while !flush.is_complete() || delivered.load(Ordering::SeqCst) == 0 {
        rx.progress();
        tx.progress();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "good transfer did not complete"
        );
    }
    flush.result().expect("flush of a good put");
    let mut got = [0u8; 11];
    mem.read(100, &mut got).unwrap();
    assert_eq!(&got, b"still works");
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
}
