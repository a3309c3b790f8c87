//! Large puts (and puts with immediate data), read from the socket straight
//! into their target region rather than through the receive buffer: the
//! whole range is checked once, then each read lands in place under the
//! region table's read lock; a refused put's data is read and dropped.

use uct_core::region_table::RegionTable;
use uct_core::{Access, UctError};

use crate::conn::Conn;
use crate::execute::table_key;
use crate::wire::{Header, WireKey};

type Result<T, E = UctError> = std::result::Result<T, E>;

/// Puts of at least this much data are read straight into their target.
pub(crate) const DIRECT_MIN: usize = 16 * 1024;

/// The rest of a large put, read from the socket into the target region.
pub(crate) struct Direct {
    pub(crate) req: u64,
    pub(crate) key: WireKey,
    pub(crate) addr: u64,
    /// The immediate of a PutImm, delivered once all of the data is in.
    pub(crate) imm: Option<u32>,
    /// The put's whole length, for its immediate.
    pub(crate) len: usize,
    pub(crate) remaining: usize,
    /// Set when the access was refused: the data is read and dropped, and
    /// the refusal is reported when it ends.
    pub(crate) error: Option<UctError>,
}

impl Direct {
    /// Starts a large put: what is here goes in now, the rest straight from
    /// the socket. The whole range is checked first, so that a refusal
    /// names the put, not a piece of it.
    pub(crate) fn start(
        self,
        conn: &mut Conn,
        table: &RegionTable,
        data_at: usize,
        have: usize,
    ) -> Direct {
        let put = self;
        let first = conn.data(data_at, have);
        let checked = table.access(
            &table_key(put.key),
            put.addr,
            put.len as u64,
            Access::REMOTE_WRITE,
            |dst| {
                // SAFETY: `access` checked [dst, dst + put.len) for remote
                // write and keeps it registered while this closure runs;
                // have <= put.len (parse returns HeaderOnly only for a
                // frame not yet complete); `first` is the receive buffer,
                // which no region overlaps.
                unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), dst, have) }
            },
        );
        conn.consume(data_at + have);
        Direct {
            // A peer-chosen address: wrap, never overflow (a range that
            // wraps was refused by `access` above).
            addr: put.addr.wrapping_add(have as u64),
            remaining: put.len - have,
            error: checked.err(),
            ..put
        }
    }

    /// Reads the rest of a large put into its target, adding the bytes
    /// read to `bytes`. None: the socket has nothing more now;
    /// Some(refusal): the put is complete.
    pub(crate) fn step(
        &mut self,
        conn: &mut Conn,
        table: &RegionTable,
        bytes: &mut usize,
    ) -> Result<Option<Option<UctError>>> {
        let put = self;
        let mut scratch = Vec::new();
        while put.remaining > 0 {
            let received = if put.error.is_none() {
                let want = put.remaining;
                match table.access(
                    &table_key(put.key),
                    put.addr,
                    want as u64,
                    Access::REMOTE_WRITE,
                    |dst| {
                        // SAFETY: `access` checked that [dst, dst + want) lies
                        // in a registered region granting remote write, and
                        // holds the table's read lock around the receive, so
                        // the region cannot be deregistered while the bytes
                        // land.
                        unsafe { conn.recv_into(dst, want) }
                    },
                ) {
                    Ok(received) => received?,
                    Err(e) => {
                        put.error = Some(e);
                        continue;
                    }
                }
            } else {
                // Refused: read the rest and drop it.
                scratch.resize(put.remaining.min(64 * 1024), 0);
                conn.recv(&mut scratch)?
            };
            if received == 0 {
                return Ok(None);
            }
            put.addr = put.addr.wrapping_add(received as u64);
            put.remaining -= received;
            *bytes += received;
        }
        Ok(Some(put.error.take()))
    }
}

/// Whether the region table would take a put of `len` bytes at `addr` with
/// `key` now; a put it refuses delivers nothing, so it need not wait.
pub(crate) fn accepts(table: &RegionTable, key: WireKey, addr: u64, len: usize) -> bool {
    table
        .access(
            &table_key(key),
            addr,
            len as u64,
            Access::REMOTE_WRITE,
            |_| (),
        )
        .is_ok()
}

/// A put's request id, key, address and immediate (PutImm), for a frame
/// that writes.
pub(crate) fn put_target(header: &Header) -> Option<(u64, WireKey, u64, Option<u32>)> {
    match *header {
        Header::Put { req, key, addr } => Some((req, key, addr, None)),
        Header::PutImm {
            req,
            key,
            addr,
            imm,
        } => Some((req, key, addr, Some(imm))),
        _ => None,
    }
}
