//! The ping-pong tests (put_lat, am_lat, add_lat): ping, wait for the
//! pong, half the round trip. Over shared memory a round trip is two
//! hand-offs of a cache line, so what runs between seeing the pong and
//! sending the next ping is part of the figure: the words are located
//! once per phase, the wait reads one aligned word, and the clock is read
//! once per round trip (as ucx_perftest times), not twice.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use uct_core::MemHandle;

use super::super::error::{PerfError, Result};
use super::super::params::{Layout, TestKind};
use super::super::pattern::check_pattern;
use super::super::session::Session;
use super::super::transfer::{fill_send, host_bytes, post_data, spin};
use super::{add_one, note_bad, Samples};

/// The word of the receive buffer that the peer's ping writes (put_lat)
/// or adds to (add_lat), located once. It holds a handle of the buffer,
/// so the memory outlives it.
struct Word {
    at: *const u8,
    aligned: bool,
    _buffer: MemHandle,
}

impl Word {
    fn locate(buffer: &MemHandle, offset: usize) -> Result<Word> {
        let at = buffer.host_ptr(offset, 8)? as *const u8;
        Ok(Word {
            at,
            aligned: at.cast::<AtomicU64>().is_aligned(),
            _buffer: buffer.clone(),
        })
    }

    /// The value last written there.
    #[inline(always)]
    fn get(&self) -> u64 {
        if self.aligned {
            // SAFETY: host_ptr checked that the 8 bytes lie inside the
            // buffer, which `_buffer` keeps alive, and the pointer is
            // aligned. Writers are other processes or threads (or this
            // thread's progress, tcp), through their own copy or atomic;
            // any bit pattern is a valid u64, so a value a multi-store
            // copy tore is only a wrong number, as with the volatile read
            // this replaces (the 8 B pings store the word in one go).
            let word = unsafe { AtomicU64::from_ptr(self.at.cast_mut().cast()) };
            u64::from_le(word.load(Ordering::Acquire))
        } else {
            // SAFETY: as above, without the alignment: a volatile read of
            // bytes, which needs none; the fence orders what follows it
            // (the payload read of --validate) after the read.
            let bytes = unsafe { std::ptr::read_volatile(self.at.cast::<[u8; 8]>()) };
            fence(Ordering::Acquire);
            u64::from_le_bytes(bytes)
        }
    }
}

/// What one phase's pings send and its pongs wait on.
enum Words {
    /// put_lat: the sequence travels in the send buffer's last 8 bytes
    /// and lands in the receive buffer's.
    Put {
        seq_out: *mut u8,
        pong: Word,
        _send: MemHandle,
    },
    /// add_lat: an add of 1 to the peer's counter; ours is at offset 0.
    Add { pong: Word },
    /// am_lat: the handler counts messages; the sequence goes out in the
    /// send buffer's first 8 bytes (written through a pointer checked
    /// once: a checked write per ping was some 30 instructions).
    /// None where the send buffer is not host memory.
    Am {
        seq_out: Option<*mut u8>,
        _send: MemHandle,
    },
}

impl Words {
    fn locate(session: &Session, size: usize) -> Result<Words> {
        let seq_at = || {
            size.checked_sub(8).ok_or_else(|| {
                PerfError::Protocol(format!(
                    "a {size}-byte ping-pong has no room for its sequence"
                ))
            })
        };
        Ok(match session.params.test {
            TestKind::PutLat => Words::Put {
                seq_out: session.send.host_ptr(seq_at()?, 8)?,
                pong: Word::locate(&session.recv, seq_at()?)?,
                _send: session.send.clone(),
            },
            TestKind::AddLat => Words::Add {
                pong: Word::locate(&session.recv, 0)?,
            },
            _ => Words::Am {
                seq_out: session.send.host_ptr(0, 8).ok(),
                _send: session.send.clone(),
            },
        })
    }
}

/// Sends ping-pong message `iter` (sequence `iter + 1`).
#[inline]
fn ping(
    session: &mut Session,
    words: &Words,
    layout: Layout,
    size: usize,
    iter: u64,
) -> Result<()> {
    let seq = iter + 1;
    match words {
        Words::Add { .. } => add_one(session),
        Words::Put { seq_out, .. } => {
            if session.params.validate {
                fill_send(session, size - 8, iter)?;
            }
            // SAFETY: host_ptr checked that these 8 bytes lie inside the
            // send buffer, which `_send` keeps alive and only this thread
            // writes; unaligned writes need no alignment.
            unsafe { seq_out.cast::<[u8; 8]>().write_unaligned(seq.to_le_bytes()) };
            post_data(session, layout, size, None)
        }
        Words::Am { seq_out, .. } => {
            if session.params.validate {
                fill_send(session, size, iter)?;
            } else if let Some(seq_out) = seq_out {
                // SAFETY: host_ptr checked that these 8 bytes lie inside
                // the send buffer, which `_send` keeps alive and only this
                // thread writes; unaligned writes need no alignment.
                unsafe { seq_out.cast::<[u8; 8]>().write_unaligned(seq.to_le_bytes()) };
            } else {
                session.send.write(0, &seq.to_le_bytes())?;
            }
            post_data(session, layout, size, None)
        }
    }
}

/// Waits for ping-pong message `iter` to arrive here.
#[inline]
fn pong_arrived(session: &mut Session, words: &Words, size: usize, iter: u64) -> Result<()> {
    let seq = iter + 1;
    match words {
        Words::Am { .. } => spin(session, "an active message", |session| {
            session.am.count.load(Ordering::Acquire) >= seq
        })?,
        Words::Put { pong, .. } | Words::Add { pong } => {
            spin(session, "the peer's write", |_| pong.get() >= seq)?
        }
    }
    if matches!(words, Words::Put { .. }) && session.params.validate {
        let got = host_bytes(&session.recv, size - 8).to_vec();
        if let Some(why) = check_pattern(&got, size - 8, iter) {
            note_bad(session, (iter, why));
        }
    }
    Ok(())
}

/// The client's ping-pong: one sample per round trip (the loop's whole
/// lap, storing the sample included), half its time.
pub(super) fn client(
    session: &mut Session,
    layout: Layout,
    size: usize,
    iters: u64,
) -> Result<Vec<f64>> {
    let words = Words::locate(session, size)?;
    let mut samples = Samples::new(iters);
    for iter in 0..iters {
        ping(session, &words, layout, size, iter)?;
        pong_arrived(session, &words, size, iter)?;
        samples.lap(2.0);
    }
    Ok(samples.times)
}

/// The server's ping-pong: answers each ping.
pub(super) fn server(session: &mut Session, layout: Layout, size: usize, iters: u64) -> Result<()> {
    let words = Words::locate(session, size)?;
    for iter in 0..iters {
        pong_arrived(session, &words, size, iter)?;
        ping(session, &words, layout, size, iter)?;
    }
    Ok(())
}
