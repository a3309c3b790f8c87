//! A tcp listener fed 10,000 random frames by a hostile peer keeps serving:
//! each nonsense frame closes only that connection, every request with a
//! key that matches nothing is answered (decoded with tl-tcp's codec) with
//! the error it deserves (a put with immediate data delivers no immediate),
//! and a good peer then completes a transfer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tl_tcp::wire::{encode, parse, Header, Parsed, WireAtomic, WireError, WireKey};
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

/// A random frame, and the request in it when it is one that must be
/// answered (a put, a put with immediate data, a get or a fetching atomic).
fn random_frame(rng: &mut Rng) -> (Vec<u8>, Option<Header>) {
    let key = WireKey {
        region_id: rng.next(),
        secret: rng.next(),
    };
    let req = rng.next();
    let addr = rng.next();
    let header = match rng.next() % 10 {
        // Pure noise.
        0 => {
            let n = 1 + (rng.next() % 64) as usize;
            return (rng.bytes(n), None);
        }
        // A plausible prefix, then a header that does not decode.
        1 => {
            let mut f = 16u32.to_le_bytes().to_vec();
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend(rng.bytes(16));
            return (f, None);
        }
        // A data length far beyond the limit.
        2 => {
            let mut f = 4u32.to_le_bytes().to_vec();
            f.extend_from_slice(&u32::MAX.to_le_bytes());
            return (f, None);
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
        8 => Header::PutImm {
            req,
            key,
            addr,
            imm: rng.next() as u32,
        },
        _ => Header::Am {
            id: (rng.next() % 300) as u8,
        },
    };
    let data = if matches!(
        header,
        Header::Put { .. } | Header::PutImm { .. } | Header::Am { .. }
    ) {
        let n = (rng.next() % 256) as usize;
        rng.bytes(n)
    } else {
        Vec::new()
    };
    let mut f = encode(&header, data.len()).unwrap();
    f.extend(data);
    let request = matches!(
        header,
        Header::Put { .. } | Header::PutImm { .. } | Header::Get { .. } | Header::Atomic { .. }
    );
    (f, request.then_some(header))
}

/// Reads the next whole frame from `conn` into `buf` (progressing the
/// listener meanwhile) and decodes it.
fn read_reply(
    conn: &mut TcpStream,
    rx: &mut Box<dyn uct_core::Iface>,
    buf: &mut Vec<u8>,
    request: &Header,
) -> Header {
    let t0 = Instant::now();
    let mut chunk = [0u8; 4096];
    loop {
        match parse(buf, usize::MAX).expect("the listener's reply decodes") {
            Parsed::Frame { header, total, .. } => {
                buf.drain(..total);
                return header;
            }
            Parsed::Incomplete | Parsed::HeaderOnly { .. } => {}
        }
        rx.progress();
        match conn.read(&mut chunk) {
            Ok(0) => panic!("the listener closed the connection without answering {request:?}"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading the answer to {request:?}: {e}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no answer to {request:?} in 10 s"
        );
    }
}

/// The answer a request whose key matches no region must get: the error
/// the target finds first (the size of a get, the width and alignment of
/// an atomic, then the region), for the same request id.
fn check_reply(request: &Header, reply: &Header, max_data: usize) {
    let no_region = |key: &WireKey| WireError::NoSuchRegion {
        region_id: key.region_id,
    };
    let ok = match (request, reply) {
        (Header::Put { req, key, .. }, Header::Nack { req: r, error }) => {
            r == req && *error == no_region(key)
        }
        (
            Header::PutImm { req, key, .. },
            Header::PutImmReply {
                req: r,
                error: Some(error),
            },
        ) => r == req && *error == no_region(key),
        (
            Header::Get { req, key, len, .. },
            Header::GetReply {
                req: r,
                error: Some(error),
            },
        ) => {
            r == req
                && if *len as usize > max_data {
                    matches!(error, WireError::Other(m) if m.contains("exceeds"))
                } else {
                    *error == no_region(key)
                }
        }
        (
            Header::Atomic {
                req,
                key,
                addr,
                width,
                ..
            },
            Header::AtomicReply {
                req: r,
                error: Some(error),
                ..
            },
        ) => {
            r == req
                && if *width != 4 && *width != 8 {
                    matches!(error, WireError::Other(m) if m.contains("atomic width"))
                } else if addr % *width as u64 != 0 {
                    *error
                        == WireError::Misaligned {
                            addr: *addr,
                            align: *width as u64,
                        }
                } else {
                    *error == no_region(key)
                }
        }
        _ => false,
    };
    assert!(ok, "{request:?} was answered {reply:?}");
}

/// A connection that has said Hello (echoing the listener's cookie), as
/// every link must first.
fn connect(addr: SocketAddr, hello: &[u8]) -> TcpStream {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to the listener");
    s.write_all(hello).expect("say Hello");
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
    // No immediate of a put with a key that matches nothing may arrive.
    let imms = Arc::new(AtomicUsize::new(0));
    let i = imms.clone();
    rx.set_imm_handler(Box::new(move |_| {
        i.fetch_add(1, Ordering::SeqCst);
    }))
    .unwrap();

    let listener = tl_tcp::address::parse_addr(&rx.device_address(), &rx.iface_address())
        .expect("the listener's address");
    let addr = listener.sock;
    let hello = encode(
        &Header::Hello {
            addr: std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets(),
            port: 9,
            cookie: 1,
            echo: listener.cookie,
        },
        0,
    )
    .unwrap();

    let max_data = rx.attrs().get.max_zcopy;
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut conn = connect(addr, &hello);
    let mut reconnects = 0;
    let mut answered = 0;
    let mut sink = vec![0u8; 1 << 16];
    // Whether a frame that may close the connection went on it: a request
    // then goes on a fresh one, so that its answer cannot be lost.
    let mut tainted = false;
    for _ in 0..10_000 {
        let (frame, request) = random_frame(&mut rng);
        if request.is_some() && tainted {
            conn = connect(addr, &hello);
            reconnects += 1;
        }
        tainted = request.is_none();
        let mut sent = 0;
        let t0 = Instant::now();
        while sent < frame.len() {
            match conn.write(&frame[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    rx.progress();
                }
                Err(_) => {
                    conn = connect(addr, &hello);
                    reconnects += 1;
                    sent = 0;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "listener stopped reading"
            );
        }
        if let Some(request) = request {
            let mut buf = Vec::new();
            let reply = read_reply(&mut conn, &mut rx, &mut buf, &request);
            check_reply(&request, &reply, max_data);
            assert!(buf.is_empty(), "more than one answer to {request:?}");
            answered += 1;
            continue;
        }
        rx.progress();
        // Drain what else comes so the peer's buffers never fill; a closed
        // connection is replaced.
        loop {
            match conn.read(&mut sink) {
                Ok(0) => {
                    conn = connect(addr, &hello);
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
    assert!(
        answered > 2000,
        "only {answered} requests were sent and answered"
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
    assert_eq!(
        imms.load(Ordering::SeqCst),
        0,
        "an immediate of a refused put"
    );
}
