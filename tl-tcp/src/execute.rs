//! The target's side of each request from a peer: active messages are
//! batched for the handlers; puts, gets and atomics are checked against the
//! region table (region, secret, range, rights) and executed; a put with
//! immediate data batches its immediate only once its data is in place;
//! the reply, if the request has one, is returned for the link to send.

use std::sync::Arc;
use uct_core::atomic_ops::{check_aligned, fetch_at};

use uct_core::region_table::{RegionTable, SoftRkey};
use uct_core::{Access, AtomicValue, FetchOp, UctError};

use crate::arrivals::Arrivals;
use crate::iface::MAX_FRAME_DATA;
use crate::outgoing::{Payload, RegionReply};
use crate::wire::{Header, WireAtomic, WireError, WireKey};

type Result<T, E = UctError> = std::result::Result<T, E>;

/// The key the region table checks, from the part of an rkey on the wire.
pub(crate) fn table_key(wire_key: WireKey) -> SoftRkey {
    // Only id and secret matter to the table; range and rights are its own.
    SoftRkey {
        region_id: wire_key.region_id,
        secret: wire_key.secret,
        base: 0,
        len: 0,
        access: Access::empty(),
    }
}

/// Executes an atomic of `width` bytes at `addr`; returns the old value.
fn atomic(
    table: &RegionTable,
    wire_key: WireKey,
    addr: u64,
    width: u8,
    op: WireAtomic,
    value: u64,
) -> Result<u64> {
    let operand = |raw: u64| match width {
        4 => Ok(AtomicValue::U32(raw as u32)),
        8 => Ok(AtomicValue::U64(raw)),
        other => Err(UctError::InvalidParam(format!("atomic width {other}"))),
    };
    let fetch_op = match op {
        WireAtomic::Add | WireAtomic::FetchAdd => FetchOp::Add(operand(value)?),
        WireAtomic::Swap => FetchOp::Swap(operand(value)?),
        WireAtomic::CompareSwap { compare } => FetchOp::CompareSwap {
            compare: operand(compare)?,
            swap: operand(value)?,
        },
    };
    check_aligned(addr, width as usize)?;
    table.access(
        &table_key(wire_key),
        addr,
        width as u64,
        Access::REMOTE_ATOMIC,
        |word| {
            // SAFETY: `access` checked that the `width` bytes at `word` lie
            // in a registered region granting atomic access, and holds the
            // table's read lock (no deregistration) while this closure
            // runs; check_aligned made `word` a multiple of `width`, which
            // is fetch_op's width; a word granted REMOTE_ATOMIC is accessed
            // only atomically.
            unsafe { fetch_at(word, fetch_op) }
        },
    )?
}

/// A refusal of a request without a reply of its own (put, add).
fn nack(req: u64, error: &UctError) -> Option<(Header, Payload)> {
    Some((
        Header::Nack {
            req,
            error: WireError::from(error),
        },
        Payload::None,
    ))
}

/// Writes a whole put's `data` at `addr` once every check passed.
fn put(table: &RegionTable, key: WireKey, addr: u64, data: &[u8]) -> Result<()> {
    table.access(
        &table_key(key),
        addr,
        data.len() as u64,
        Access::REMOTE_WRITE,
        |dst| {
            // SAFETY: `access` checked that [dst, dst + data.len()) lies in
            // a registered region granting remote write and keeps it
            // registered while this closure runs; `data` is the
            // connection's receive buffer, which no region overlaps.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
        },
    )
}

/// What follows a put of `len` bytes that was done or refused (`done`):
/// for a put with immediate data (`imm`), its immediate is batched, after
/// the data and only if it was done, and the reply says which; a plain
/// put is answered only when refused (Nack).
pub(crate) fn put_outcome(
    arrivals: &mut Arrivals,
    req: u64,
    imm: Option<u32>,
    len: usize,
    done: Result<()>,
) -> Option<Header> {
    match (imm, done) {
        (None, Ok(())) => None,
        (None, Err(e)) => Some(Header::Nack {
            req,
            error: WireError::from(&e),
        }),
        (Some(imm), Ok(())) => {
            arrivals.push_imm(imm, len);
            Some(Header::PutImmReply { req, error: None })
        }
        (Some(_), Err(e)) => Some(Header::PutImmReply {
            req,
            error: Some(WireError::from(&e)),
        }),
    }
}

/// Executes one request from the peer and returns its reply, if it has one.
/// The link has checked the peer's Hello before; another Hello is refused.
pub(crate) fn execute(
    table: &Arc<RegionTable>,
    arrivals: &mut Arrivals,
    header: Header,
    data: &[u8],
) -> Result<Option<(Header, Payload)>> {
    Ok(match header {
        Header::Hello { .. } => {
            return Err(UctError::Protocol(
                "a Hello after the first frame of the connection; a link's peer never changes"
                    .into(),
            ))
        }
        Header::Am { id } => {
            arrivals.push_am(id, data);
            None
        }
        Header::Put { req, key, addr } => {
            let done = put(table, key, addr, data);
            put_outcome(arrivals, req, None, data.len(), done).map(|h| (h, Payload::None))
        }
        Header::PutImm {
            req,
            key,
            addr,
            imm,
        } => {
            let done = put(table, key, addr, data);
            put_outcome(arrivals, req, Some(imm), data.len(), done).map(|h| (h, Payload::None))
        }
        Header::Get {
            req,
            key,
            addr,
            len,
        } => {
            if len as usize > MAX_FRAME_DATA {
                let error =
                    WireError::Other(format!("get of {len} bytes exceeds {MAX_FRAME_DATA}"));
                return Ok(Some((
                    Header::GetReply {
                        req,
                        error: Some(error),
                    },
                    Payload::None,
                )));
            }
            // The data is read as the peer takes it, a chunk at a time
            // (len <= MAX_FRAME_DATA fits usize).
            Some(match RegionReply::new(table, key, addr, len as usize) {
                Ok(data) => (Header::GetReply { req, error: None }, Payload::Region(data)),
                Err(e) => (
                    Header::GetReply {
                        req,
                        error: Some(WireError::from(&e)),
                    },
                    Payload::None,
                ),
            })
        }
        Header::Atomic {
            req,
            key,
            addr,
            width,
            op,
            value,
        } => match (op, atomic(table, key, addr, width, op, value)) {
            (WireAtomic::Add, Ok(_)) => None,
            (WireAtomic::Add, Err(e)) => nack(req, &e),
            (_, Ok(old)) => Some((
                Header::AtomicReply {
                    req,
                    old,
                    error: None,
                },
                Payload::None,
            )),
            (_, Err(e)) => Some((
                Header::AtomicReply {
                    req,
                    old: 0,
                    error: Some(WireError::from(&e)),
                },
                Payload::None,
            )),
        },
        Header::Flush { req } => Some((Header::FlushReply { req }, Payload::None)),
        other => {
            return Err(UctError::Protocol(format!(
                "a reply ({other:?}) sent as a request"
            )))
        }
    })
}
