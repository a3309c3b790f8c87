//! Counters of what a Transport did, for users and for tests that must
//! tell how a notification travelled.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a Transport has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Writes posted (each write of a batch counts).
    pub writes: u64,
    /// Bytes those writes carried.
    pub bytes_written: u64,
    /// Reads posted.
    pub reads: u64,
    /// Notifications sent as the immediate data of the write (rc's RDMA
    /// WRITE WITH IMMEDIATE).
    pub notifications_sent_by_immediate: u64,
    /// Notifications sent as an active message after the write.
    pub notifications_sent_by_message: u64,
    /// Notifications received as immediate data.
    pub notifications_received_by_immediate: u64,
    /// Notifications received as an active message.
    pub notifications_received_by_message: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub writes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub reads: AtomicU64,
    pub sent_imm: AtomicU64,
    pub sent_msg: AtomicU64,
    pub recv_imm: AtomicU64,
    pub recv_msg: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            writes: g(&self.writes),
            bytes_written: g(&self.bytes_written),
            reads: g(&self.reads),
            notifications_sent_by_immediate: g(&self.sent_imm),
            notifications_sent_by_message: g(&self.sent_msg),
            notifications_received_by_immediate: g(&self.recv_imm),
            notifications_received_by_message: g(&self.recv_msg),
        }
    }
}

/// What one rail of a Transport did ([`Transport::rails`](crate::Transport::rails)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailStats {
    /// Its index (0 is the first device).
    pub rail: usize,
    /// The transport.
    pub transport: String,
    /// Its device.
    pub device: String,
    /// Whether it carries operations now.
    pub in_service: bool,
    /// Why it was last taken out of service, if it was.
    pub failure: Option<String>,
    /// Writes (stripes of writes, with several rails) that landed on it.
    pub writes: u64,
    /// Bytes those carried.
    pub bytes_written: u64,
    /// Reads (stripes of reads) it completed.
    pub reads: u64,
    /// Bytes those carried (counted with several rails only).
    pub bytes_read: u64,
    /// Stripes posted on it again after another rail failed.
    pub reissued: u64,
}
