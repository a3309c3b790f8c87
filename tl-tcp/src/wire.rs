//! The tcp wire format, without I/O. A frame is
//! `[header length u32][data length u32][header][data]`, little-endian;
//! the header is a postcard-encoded [`Header`], the data raw bytes (an
//! active message's payload, a put's bytes, a get's reply). Decoding bytes
//! from a peer returns a frame or an error, never a panic. Kinds added
//! later go at the end of [`Header`], so that the ones before keep their
//! numbers on the wire.

use serde::{Deserialize, Serialize};
use uct_core::{Access, UctError};

/// Largest header accepted.
pub const MAX_HEADER: usize = 4096;
/// Bytes before the header.
pub const PREFIX: usize = 8;

/// The part of an rkey the target checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireKey {
    pub region_id: u64,
    pub secret: u64,
}

/// Atomic operations on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireAtomic {
    Add,
    FetchAdd,
    Swap,
    CompareSwap { compare: u64 },
}

/// An error the target reports for a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    OutOfRange {
        addr: u64,
        len: u64,
        base: u64,
        region_len: u64,
    },
    AccessDenied {
        needed: u8,
        granted: u8,
    },
    BadSecret,
    NoSuchRegion {
        region_id: u64,
    },
    Misaligned {
        addr: u64,
        align: u64,
    },
    Other(String),
}

impl From<&UctError> for WireError {
    fn from(e: &UctError) -> Self {
        match e {
            UctError::OutOfRange {
                addr,
                len,
                base,
                region_len,
            } => WireError::OutOfRange {
                addr: *addr,
                len: *len,
                base: *base,
                region_len: *region_len,
            },
            UctError::AccessDenied { needed, granted } => WireError::AccessDenied {
                needed: needed.bits(),
                granted: granted.bits(),
            },
            UctError::BadSecret => WireError::BadSecret,
            UctError::NoSuchRegion { region_id } => WireError::NoSuchRegion {
                region_id: *region_id,
            },
            UctError::Misaligned { addr, align } => WireError::Misaligned {
                addr: *addr,
                align: *align,
            },
            other => WireError::Other(other.to_string()),
        }
    }
}

impl From<WireError> for UctError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::OutOfRange {
                addr,
                len,
                base,
                region_len,
            } => UctError::OutOfRange {
                addr,
                len,
                base,
                region_len,
            },
            WireError::AccessDenied { needed, granted } => UctError::AccessDenied {
                needed: Access::from_bits_truncate(needed),
                granted: Access::from_bits_truncate(granted),
            },
            WireError::BadSecret => UctError::BadSecret,
            WireError::NoSuchRegion { region_id } => UctError::NoSuchRegion { region_id },
            WireError::Misaligned { addr, align } => UctError::Misaligned { addr, align },
            WireError::Other(m) => UctError::EndpointFailed(format!("the peer reported: {m}")),
        }
    }
}

/// What a frame asks for or answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Header {
    /// Active message; the data is its payload.
    Am {
        id: u8,
    },
    /// Write the data at `addr`. `req` identifies it in a Nack.
    Put {
        req: u64,
        key: WireKey,
        addr: u64,
    },
    /// Read `len` bytes at `addr`; answered by GetReply.
    Get {
        req: u64,
        key: WireKey,
        addr: u64,
        len: u64,
    },
    /// Answer to Get; the data is what was read.
    GetReply {
        req: u64,
        error: Option<WireError>,
    },
    /// Atomic of `width` bytes at `addr`; answered by AtomicReply.
    Atomic {
        req: u64,
        key: WireKey,
        addr: u64,
        width: u8,
        op: WireAtomic,
        value: u64,
    },
    AtomicReply {
        req: u64,
        old: u64,
        error: Option<WireError>,
    },
    /// Answered once everything before it was executed.
    Flush {
        req: u64,
    },
    FlushReply {
        req: u64,
    },
    /// A request without a reply of its own (put, add) failed.
    Nack {
        req: u64,
        error: WireError,
    },
    /// First frame of a connection, from the side that connected, and only
    /// then: who it is (where its iface listens, `addr` and `port`, and
    /// that iface's `cookie`) and `echo`, the cookie of the iface it
    /// connected to, which it can only have from the address exchange.
    Hello {
        addr: [u8; 16],
        port: u16,
        cookie: u64,
        echo: u64,
    },
    /// Write the data at `addr`, then hand `imm` to the target's immediate
    /// handler; answered by PutImmReply, whether it was done or refused.
    PutImm {
        req: u64,
        key: WireKey,
        addr: u64,
        imm: u32,
    },
    /// Answer to PutImm: the data is in place and the immediate delivered
    /// (`error` None), or the put was refused and nothing delivered.
    PutImmReply {
        req: u64,
        error: Option<WireError>,
    },
}

/// Encodes a frame's prefix and header; the data follows separately.
pub fn encode(header: &Header, data_len: usize) -> Result<Vec<u8>, UctError> {
    let encoded = postcard::to_stdvec(header)
        .map_err(|e| UctError::InvalidParam(format!("cannot encode a tcp frame header: {e}")))?;
    let data_len32 = u32::try_from(data_len).map_err(|_| {
        UctError::InvalidParam(format!("{data_len} bytes do not fit one tcp frame"))
    })?;
    let mut out = Vec::with_capacity(PREFIX + encoded.len());
    out.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    out.extend_from_slice(&data_len32.to_le_bytes());
    out.extend_from_slice(&encoded);
    Ok(out)
}

/// Encodes a frame's prefix and header into `buf` without allocating;
/// returns the length used.
pub fn encode_into(header: &Header, data_len: usize, buf: &mut [u8]) -> Result<usize, UctError> {
    let data_len32 = u32::try_from(data_len).map_err(|_| {
        UctError::InvalidParam(format!("{data_len} bytes do not fit one tcp frame"))
    })?;
    let (prefix, rest) = buf.split_at_mut(PREFIX);
    let header_len = postcard::to_slice(header, rest)
        .map_err(|e| UctError::InvalidParam(format!("cannot encode a tcp frame header: {e}")))?
        .len();
    prefix[..4].copy_from_slice(&(header_len as u32).to_le_bytes());
    prefix[4..].copy_from_slice(&data_len32.to_le_bytes());
    Ok(PREFIX + header_len)
}

/// Result of looking at received bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// A whole frame: its header, where its data starts and its length, and
    /// the total frame length.
    Frame {
        header: Header,
        data_at: usize,
        data_len: usize,
        total: usize,
    },
    /// The header is complete, `have` bytes of its data are here: a large
    /// put can go on straight into its target.
    HeaderOnly {
        header: Header,
        data_at: usize,
        data_len: usize,
        have: usize,
    },
}

/// Parses the frame at the start of `buf`. `max_data` bounds the data a
/// peer may send in one frame.
pub fn parse(buf: &[u8], max_data: usize) -> Result<Parsed, String> {
    if buf.len() < PREFIX {
        return Ok(Parsed::Incomplete);
    }
    let header_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let data_len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if header_len == 0 || header_len > MAX_HEADER {
        return Err(format!(
            "frame header length {header_len} is outside 1..={MAX_HEADER}"
        ));
    }
    if data_len > max_data {
        return Err(format!("frame data length {data_len} exceeds {max_data}"));
    }
    if buf.len() < PREFIX + header_len {
        return Ok(Parsed::Incomplete);
    }
    let (header, rest) = postcard::take_from_bytes::<Header>(&buf[PREFIX..PREFIX + header_len])
        .map_err(|e| format!("frame header does not decode: {e}"))?;
    if !rest.is_empty() {
        return Err("frame header has trailing bytes".into());
    }
    check_data_len(&header, data_len)?;
    let total = PREFIX + header_len + data_len;
    if buf.len() < total {
        return Ok(Parsed::HeaderOnly {
            header,
            data_at: PREFIX + header_len,
            data_len,
            have: buf.len() - PREFIX - header_len,
        });
    }
    Ok(Parsed::Frame {
        header,
        data_at: PREFIX + header_len,
        data_len,
        total,
    })
}

/// Bytes of data a frame of this header must carry, where fixed.
pub fn check_data_len(header: &Header, data_len: usize) -> Result<(), String> {
    let ok = match header {
        Header::Get { .. } | Header::Atomic { .. } | Header::AtomicReply { .. } => data_len == 0,
        Header::Flush { .. } | Header::FlushReply { .. } | Header::Nack { .. } => data_len == 0,
        Header::Hello { .. } | Header::PutImmReply { .. } => data_len == 0,
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{header:?} carries {data_len} unexpected data bytes"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Header::Put {
            req: 9,
            key: WireKey {
                region_id: 1,
                secret: 2,
            },
            addr: 0x1000,
        };
        let mut f = encode(&h, 3).unwrap();
        f.extend_from_slice(b"abc");
        match parse(&f, 1 << 20).unwrap() {
            Parsed::Frame {
                header,
                data_at,
                data_len,
                total,
            } => {
                assert_eq!(header, h);
                assert_eq!(&f[data_at..data_at + data_len], b"abc");
                assert_eq!(total, f.len());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&f[..f.len() - 1], 1 << 20).unwrap(),
            Parsed::HeaderOnly {
                have: 2,
                data_len: 3,
                ..
            }
        ));
        assert_eq!(parse(&f[..5], 1 << 20).unwrap(), Parsed::Incomplete);
    }

    #[test]
    fn kinds_keep_their_numbers_on_the_wire() {
        // The first byte of an encoded header is its kind's number: the
        // kinds added last must not renumber the ones a peer already speaks.
        let first = |h: &Header| postcard::to_stdvec(h).unwrap()[0];
        assert_eq!(first(&Header::Am { id: 1 }), 0);
        let hello = Header::Hello {
            addr: [0; 16],
            port: 0,
            cookie: 0,
            echo: 0,
        };
        assert_eq!(first(&hello), 9);
        let put_imm = Header::PutImm {
            req: 1,
            key: KEY,
            addr: 2,
            imm: 3,
        };
        assert_eq!(first(&put_imm), 10);
        let reply = Header::PutImmReply {
            req: 1,
            error: None,
        };
        assert_eq!(first(&reply), 11);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 77u64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 64) as usize;
            let b: Vec<u8> = (0..n).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = parse(&b, 1 << 20);
        }
    }

    const KEY: WireKey = WireKey {
        region_id: 3,
        secret: 0x5ec2e7,
    };

    /// A frame prefix claiming `header_len` header and `data_len` data bytes.
    fn prefix(header_len: u32, data_len: u32) -> Vec<u8> {
        let mut p = header_len.to_le_bytes().to_vec();
        p.extend_from_slice(&data_len.to_le_bytes());
        p
    }

    /// The encoded frame of `header` with `data_len` data bytes (all 0xab).
    fn frame(header: &Header, data_len: usize) -> Vec<u8> {
        let mut f = encode(header, data_len).unwrap();
        f.resize(f.len() + data_len, 0xab);
        f
    }

    #[test]
    fn fewer_than_eight_bytes_are_incomplete_whatever_they_hold() {
        for len in 0..PREFIX {
            for fill in [0u8, 0xff] {
                assert_eq!(parse(&vec![fill; len], 1 << 20), Ok(Parsed::Incomplete));
            }
        }
    }

    #[test]
    fn a_bad_header_length_is_refused_as_soon_as_the_prefix_is_here() {
        for header_len in [0, MAX_HEADER as u32 + 1, u32::MAX] {
            let p = prefix(header_len, 0);
            let e = parse(&p, 1 << 20).unwrap_err();
            assert!(e.contains("header length"), "{header_len}: {e}");
            // More bytes change nothing.
            let mut more = p.clone();
            more.resize(PREFIX + MAX_HEADER + 8, 0);
            assert_eq!(parse(&more, 1 << 20), Err(e));
        }
    }

    #[test]
    fn a_header_of_max_header_bytes_is_waited_for_and_then_decoded() {
        let p = prefix(MAX_HEADER as u32, 0);
        assert_eq!(parse(&p, 1 << 20), Ok(Parsed::Incomplete));
        // A real header padded to MAX_HEADER bytes: the length is taken, the
        // padding is refused as what it is.
        let mut f = p;
        f.extend_from_slice(&postcard::to_stdvec(&Header::Flush { req: 1 }).unwrap());
        assert_eq!(parse(&f, 1 << 20), Ok(Parsed::Incomplete));
        f.resize(PREFIX + MAX_HEADER, 0);
        let e = parse(&f, 1 << 20).unwrap_err();
        assert!(e.contains("trailing"), "{e}");
    }

    #[test]
    fn data_up_to_max_data_is_taken_one_byte_more_is_refused_at_the_prefix() {
        let put = Header::Put {
            req: 1,
            key: KEY,
            addr: 0x1000,
        };
        for max_data in [0, 1, 100, 1 << 20] {
            let f = frame(&put, max_data);
            let head = f.len() - max_data;
            assert_eq!(
                parse(&f, max_data),
                Ok(Parsed::Frame {
                    header: put.clone(),
                    data_at: head,
                    data_len: max_data,
                    total: f.len(),
                })
            );
            let over = encode(&put, max_data + 1).unwrap();
            let e = parse(&over[..PREFIX], max_data).unwrap_err();
            assert_eq!(
                e,
                format!("frame data length {} exceeds {max_data}", max_data + 1)
            );
        }
    }

    #[test]
    fn requests_and_replies_of_fixed_size_refuse_data_the_others_carry_it() {
        let error = WireError::BadSecret;
        let fixed = [
            Header::Get {
                req: 1,
                key: KEY,
                addr: 8,
                len: 8,
            },
            Header::Atomic {
                req: 2,
                key: KEY,
                addr: 8,
                width: 8,
                op: WireAtomic::CompareSwap { compare: 5 },
                value: 6,
            },
            Header::AtomicReply {
                req: 3,
                old: 4,
                error: None,
            },
            Header::Flush { req: 4 },
            Header::FlushReply { req: 5 },
            Header::Nack {
                req: 6,
                error: error.clone(),
            },
            Header::Hello {
                addr: [7; 16],
                port: 8,
                cookie: 9,
                echo: 10,
            },
            Header::PutImmReply {
                req: 7,
                error: None,
            },
            Header::PutImmReply {
                req: 8,
                error: Some(error.clone()),
            },
        ];
        for h in &fixed {
            assert_eq!(check_data_len(h, 0), Ok(()));
            let f = frame(h, 0);
            assert!(
                matches!(parse(&f, 1 << 20), Ok(Parsed::Frame { ref header, total, .. })
                    if header == h && total == f.len()),
                "{h:?}"
            );
            for n in [1, 8, 4096] {
                let e = check_data_len(h, n).unwrap_err();
                assert!(e.contains(&format!("carries {n} unexpected")), "{e}");
                // parse refuses it from the header on, before the data came.
                let f = frame(h, n);
                assert_eq!(parse(&f[..f.len() - n], 1 << 20), Err(e.clone()));
                assert_eq!(parse(&f, 1 << 20), Err(e));
            }
        }
        let carrying = [
            Header::Am { id: 7 },
            Header::Put {
                req: 1,
                key: KEY,
                addr: 8,
            },
            Header::PutImm {
                req: 1,
                key: KEY,
                addr: 8,
                imm: u32::MAX,
            },
            Header::GetReply {
                req: 1,
                error: None,
            },
            Header::GetReply {
                req: 1,
                error: Some(error),
            },
        ];
        for h in &carrying {
            for n in [0, 1, 4096] {
                assert_eq!(check_data_len(h, n), Ok(()), "{h:?}");
                let f = frame(h, n);
                assert!(
                    matches!(parse(&f, 1 << 20), Ok(Parsed::Frame { ref header, data_len, total, .. })
                        if header == h && data_len == n && total == f.len()),
                    "{h:?} with {n}"
                );
            }
        }
    }
}
