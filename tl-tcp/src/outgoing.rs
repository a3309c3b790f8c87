//! What a connection sends: frames waiting in its queue, each a header and
//! a payload (copied bytes, user memory lent until written, or a get's
//! reply read from its region a chunk at a time as the socket takes it).

use std::sync::Arc;

use uct_core::region_table::RegionTable;
use uct_core::{Access, Completion, MemHandle, UctError};

use crate::execute::table_key;
use crate::wire::WireKey;

/// Bytes of a get's reply read from its region at a time: what a peer that
/// does not read its replies makes us hold for each, however large the get.
pub(crate) const REPLY_CHUNK: usize = 128 * 1024;

/// The data part of an outgoing frame.
pub enum Payload {
    None,
    Bytes(Vec<u8>),
    /// A copied prefix (an AM header, possibly empty) then user memory,
    /// kept alive until written.
    Iov(Vec<u8>, Vec<(MemHandle, usize, usize)>),
    /// A get's reply data, read from the region as the socket takes it.
    Region(RegionReply),
}

impl Payload {
    /// Bytes of data the frame carries.
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Bytes(b) => b.len(),
            Payload::Iov(prefix, pieces) => {
                prefix.len() + pieces.iter().map(|(_, _, len)| len).sum::<usize>()
            }
            Payload::Region(r) => r.len,
        }
    }
}

/// The data of a get's reply: `len` bytes at `addr` of a region, read
/// through the region table a chunk at a time, each read checked again (a
/// region deregistered meanwhile is never read).
pub struct RegionReply {
    table: Arc<RegionTable>,
    key: WireKey,
    addr: u64,
    len: usize,
    /// Data bytes [at, at + chunk.len()) of the reply.
    chunk: Vec<u8>,
    at: usize,
}

impl RegionReply {
    /// Checks the whole range for remote read and reads its first chunk
    /// (all of a reply up to REPLY_CHUNK). Err: the access is refused.
    pub(crate) fn new(
        table: &Arc<RegionTable>,
        key: WireKey,
        addr: u64,
        len: usize,
    ) -> Result<RegionReply, UctError> {
        let first = len.min(REPLY_CHUNK);
        let chunk = table.access(
            &table_key(key),
            addr,
            len as u64,
            Access::REMOTE_READ,
            |src| {
                // SAFETY: `access` checked that [src, src + len) lies in a
                // registered region granting remote read and keeps it
                // registered while this closure runs; first <= len; the
                // bytes are copied out before it returns.
                unsafe { std::slice::from_raw_parts(src as *const u8, first) }.to_vec()
            },
        )?;
        Ok(RegionReply {
            table: table.clone(),
            key,
            addr,
            len,
            chunk,
            at: 0,
        })
    }

    /// Whether data of the reply is still to be read from the region.
    pub(crate) fn unread(&self) -> bool {
        self.at + self.chunk.len() < self.len
    }

    /// Reads the next chunk, once the current one is written.
    fn next_chunk(&mut self) -> Result<(), UctError> {
        let from = self.at + self.chunk.len();
        let n = (self.len - from).min(REPLY_CHUNK);
        let mut chunk = std::mem::take(&mut self.chunk);
        chunk.clear();
        let read = self.table.access(
            &table_key(self.key),
            // In range: `new` checked addr + len.
            self.addr + from as u64,
            n as u64,
            Access::REMOTE_READ,
            |src| {
                // SAFETY: as in `new`, for [src, src + n), checked again now.
                chunk.extend_from_slice(unsafe { std::slice::from_raw_parts(src as *const u8, n) })
            },
        );
        self.chunk = chunk;
        self.at = from;
        read.map_err(|e| {
            UctError::Protocol(format!(
                "the region a peer's get reads became unreadable ({e}) after {from} of its {} bytes were sent; the reply cannot be finished, so the connection is closed (deregister a region only once peers are done with it)",
                self.len
            ))
        })
    }
}

/// Adds the part of a piece (`len` bytes at `ptr`) past `skip` bytes to
/// `out`, and counts the piece off `skip`.
fn push(skip: &mut usize, ptr: *const u8, len: usize, out: &mut Vec<libc::iovec>) {
    if *skip >= len {
        *skip -= len;
        return;
    }
    out.push(libc::iovec {
        // SAFETY: every piece is a live buffer of `len` bytes at `ptr`
        // (owned by the queue, or a range of a memory handle the queue
        // holds, checked by host_ptr); skip < len, so the result stays
        // inside that buffer.
        iov_base: unsafe { ptr.add(*skip) } as *mut libc::c_void,
        iov_len: len - *skip,
    });
    *skip = 0;
}

/// A frame in the send queue.
pub(crate) struct Outgoing {
    pub(crate) head: Vec<u8>,
    pub(crate) payload: Payload,
    pub(crate) written: usize,
    pub(crate) total: usize,
    /// An answer to the peer's request (counted in `replies_queued`).
    pub(crate) reply: bool,
    /// Fired when the frame is on the wire (local completion).
    pub(crate) comp: Option<Completion>,
}

impl Outgoing {
    /// The pieces still to write, as (pointer, length). Returns whether
    /// they reach the end of the frame (false: a region reply's next chunk
    /// is still to be read, and no later frame may follow in this write).
    pub(crate) fn pieces(&self, out: &mut Vec<libc::iovec>) -> bool {
        let mut skip = self.written;
        push(&mut skip, self.head.as_ptr(), self.head.len(), out);
        match &self.payload {
            Payload::None => {}
            Payload::Bytes(b) => push(&mut skip, b.as_ptr(), b.len(), out),
            Payload::Iov(prefix, v) => {
                push(&mut skip, prefix.as_ptr(), prefix.len(), out);
                for (mem, off, len) in v {
                    // Ranges were checked when the operation was posted.
                    if let Ok(p) = mem.host_ptr(*off, *len) {
                        push(&mut skip, p, *len, out);
                    }
                }
            }
            Payload::Region(r) => {
                // The chunks before this one are written (`refill` reads
                // the next only then), or nothing of the data is.
                if skip < r.at {
                    return false;
                }
                skip = skip.saturating_sub(r.at);
                push(&mut skip, r.chunk.as_ptr(), r.chunk.len(), out);
                return !r.unread();
            }
        }
        true
    }

    /// For a region reply whose chunk is all written: reads the next one.
    /// Returns true when that finished reading the reply from its region.
    pub(crate) fn refill(&mut self) -> Result<bool, UctError> {
        let Payload::Region(r) = &mut self.payload else {
            return Ok(false);
        };
        let data_written = self.written.saturating_sub(self.head.len());
        if !r.unread() || data_written < r.at + r.chunk.len() || self.written < self.head.len() {
            return Ok(false);
        }
        r.next_chunk()?;
        Ok(!r.unread())
    }

    /// Whether this is a region reply not yet all read from its region.
    pub(crate) fn unread(&self) -> bool {
        matches!(&self.payload, Payload::Region(r) if r.unread())
    }
}
