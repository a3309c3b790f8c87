//! The ping-pong tests (put_lat, am_lat, add_lat): ping, wait for the
//! pong, half the round trip. Over shared memory a round trip is two
//! hand-offs of a cache line, so what runs between seeing the pong and
//! sending the next ping is part of the figure: the words are located
//! once per phase, the wait reads one aligned word, and the clock is read
//! once per round trip (as ucx_perftest times), not twice.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::error::Result;
use super::super::params::{Layout, TestKind};
use super::super::pattern::check_pattern;
use super::super::session::Session;
use super::super::transfer::{fill_send, host_bytes, post_data, spin};
use super::{add_one, note_bad, Samples};

/// Where the ping-pong sequence number lives in the receive buffer.
fn seq_offset(test: TestKind, size: usize) -> usize {
    if test == TestKind::AddLat {
        0
    } else {
        size - 8
    }
}

/// The word of the receive buffer that the peer's ping writes (put_lat)
/// or adds to (add_lat), located once.
#[derive(Clone, Copy)]
enum Word {
    /// 8-byte aligned: one load.
    Aligned(*const AtomicU64),
    /// Anywhere else (put_lat of a size that is no multiple of 8): bytes.
    Unaligned(*const [u8; 8]),
}

impl Word {
    /// The value the peer last wrote there.
    #[inline(always)]
    fn get(self) -> u64 {
        match self {
            // SAFETY: `locate` checked that the 8 bytes lie inside the
            // receive buffer, which the session keeps for the whole phase,
            // and that the pointer is aligned; the peer writes the word
            // through its own mapping, so it is read atomically.
            Word::Aligned(word) => u64::from_le(unsafe { &*word }.load(Ordering::Acquire)),
            // SAFETY: as above, without the alignment: a volatile read of
            // bytes, which needs none.
            Word::Unaligned(bytes) => u64::from_le_bytes(unsafe { std::ptr::read_volatile(bytes) }),
        }
    }
}

/// The places one phase's pings and pongs use.
#[derive(Clone, Copy)]
struct Words {
    /// Where the pong lands (None for am_lat, which counts messages).
    pong: Option<Word>,
    /// put_lat: the send buffer's last 8 bytes, which carry the sequence.
    seq_out: Option<*mut u8>,
}

impl Words {
    fn locate(session: &Session, size: usize) -> Result<Words> {
        let test = session.params.test;
        let pong = match test {
            TestKind::AmLat => None,
            _ => {
                let at = session.recv.host_ptr(seq_offset(test, size), 8)?;
                Some(if (at as usize).is_multiple_of(8) {
                    Word::Aligned(at as *const AtomicU64)
                } else {
                    Word::Unaligned(at as *const [u8; 8])
                })
            }
        };
        let seq_out = match test {
            TestKind::PutLat => Some(session.send.host_ptr(size - 8, 8)?),
            _ => None,
        };
        Ok(Words { pong, seq_out })
    }
}

/// Sends ping-pong message `iter` (sequence `iter + 1`).
#[inline]
fn ping(session: &mut Session, words: Words, layout: Layout, size: usize, iter: u64) -> Result<()> {
    let seq = iter + 1;
    match (session.params.test, words.seq_out) {
        (TestKind::AddLat, _) => add_one(session),
        (TestKind::PutLat, Some(out)) => {
            if session.params.validate {
                fill_send(session, size - 8, iter)?;
            }
            // SAFETY: `locate` checked that these 8 bytes lie inside the
            // live send buffer, which only this thread writes; unaligned
            // writes need no alignment.
            unsafe { out.cast::<[u8; 8]>().write_unaligned(seq.to_le_bytes()) };
            post_data(session, layout, size, None)
        }
        _ => {
            if session.params.validate {
                fill_send(session, size, iter)?;
            } else {
                session.send.write(0, &seq.to_le_bytes())?;
            }
            post_data(session, layout, size, None)
        }
    }
}

/// Waits for ping-pong message `iter` to arrive here.
#[inline]
fn pong_arrived(session: &mut Session, words: Words, size: usize, iter: u64) -> Result<()> {
    let seq = iter + 1;
    match words.pong {
        None => spin(session, "an active message", |session| {
            session.am.count.load(Ordering::Acquire) >= seq
        })?,
        Some(word) => spin(session, "the peer's write", |_| word.get() >= seq)?,
    }
    if session.params.test == TestKind::PutLat && session.params.validate {
        let got = host_bytes(&session.recv, size - 8).to_vec();
        if let Some(why) = check_pattern(&got, size - 8, iter) {
            note_bad(session, (iter, why));
        }
    }
    Ok(())
}

/// The client's ping-pong: one sample per round trip, half its time.
pub(super) fn client(
    session: &mut Session,
    layout: Layout,
    size: usize,
    iters: u64,
) -> Result<Vec<f64>> {
    let words = Words::locate(session, size)?;
    let mut samples = Samples::new(iters);
    for iter in 0..iters {
        ping(session, words, layout, size, iter)?;
        pong_arrived(session, words, size, iter)?;
        samples.lap(2.0);
    }
    Ok(samples.times)
}

/// The server's ping-pong: answers each ping.
pub(super) fn server(session: &mut Session, layout: Layout, size: usize, iters: u64) -> Result<()> {
    let words = Words::locate(session, size)?;
    for iter in 0..iters {
        pong_arrived(session, words, size, iter)?;
        ping(session, words, layout, size, iter)?;
    }
    Ok(())
}
