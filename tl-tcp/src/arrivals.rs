//! What a link received for the handlers: active messages and the
//! immediates of puts with immediate data, in the order their frames came.
//! They are gathered under the link's lock and delivered after it is
//! released (a handler may send on the same link), one queue for both, so
//! that a peer's messages and immediates reach the handlers in the order it
//! sent them, as on rc (one receive queue) and self (one event queue).
//! Nothing is kept here between progress calls: a put with immediate data
//! that may not be delivered yet waits unread in its link (`link.rs`).

use std::time::{Duration, Instant};

use uct_core::{AmHandlers, ImmEvent, ImmHandlerSlot};

/// Arrivals whose room the batch keeps for good.
const KEEP_ARRIVALS: usize = 256;
/// Bytes of active messages whose room the batch keeps for good.
const KEEP_BYTES: usize = 256 * 1024;
/// How long no batch may have needed more than KEEP_* before the room above
/// it is given back. Giving it back after every large batch made each batch
/// of a 64 KiB am_bw fault its buffer in afresh (a shrink is an mremap, the
/// next growth new zeroed pages): 0.3 of ucx's figure. Counting deliveries
/// instead of time did not help: a spinning receiver delivers nothing
/// thousands of times between two bursts.
///
/// What a peer can make an iface keep is one batch: a link's budget of one
/// progress call (`FRAME_BUDGET` frames, `BYTE_BUDGET` bytes, plus the
/// active message that crosses it), per iface, not per link, since the
/// batch is emptied after each link. Before, it held that much only for a
/// moment; now for up to SHRINK_AFTER after the last such batch.
const SHRINK_AFTER: Duration = Duration::from_secs(1);
/// Progress calls between two looks at the clock while there is room to
/// give back.
const LOOK_EVERY: u32 = 1024;

/// One arrival: an active message (its id, and where its bytes are in
/// [`Arrivals::bytes`]), or an immediate whose data is already in place.
enum Arrival {
    Am { id: u8, at: usize, len: usize },
    Imm(ImmEvent),
}

/// The arrivals of one link's progress, in order.
#[derive(Default)]
pub(crate) struct Arrivals {
    list: Vec<Arrival>,
    bytes: Vec<u8>,
    /// Progress calls since the clock was last looked at ([`tidy`](Self::tidy)).
    calls: u32,
    /// When a batch last needed more than KEEP_* (None: not since the room
    /// was last given back).
    large_at: Option<Instant>,
}

impl Arrivals {
    /// Adds a received active message.
    pub(crate) fn push_am(&mut self, id: u8, data: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.list.push(Arrival::Am {
            id,
            at,
            len: data.len(),
        });
    }

    /// Adds the immediate of a put whose `len` bytes are in place.
    pub(crate) fn push_imm(&mut self, imm: u32, len: usize) {
        self.list.push(Arrival::Imm(ImmEvent { imm, len }));
    }

    /// Hands every arrival to its handler, in order, and empties the batch.
    pub(crate) fn deliver(&mut self, handlers: &mut AmHandlers, imm: &mut ImmHandlerSlot) {
        for arrival in &self.list {
            match *arrival {
                Arrival::Am { id, at, len } => {
                    handlers.deliver(id, &self.bytes[at..at + len]);
                }
                Arrival::Imm(event) => {
                    imm.deliver(event);
                }
            }
        }
        let large = self.list.len() > KEEP_ARRIVALS || self.bytes.len() > KEEP_BYTES;
        self.list.clear();
        self.bytes.clear();
        // A large batch (a progress call's budget of messages) does not keep
        // its memory for good, but a steady stream of them keeps it.
        if large {
            self.large_at = Some(Instant::now());
        }
    }

    /// Gives the room above KEEP_* back once no batch has needed it for
    /// SHRINK_AFTER. The iface calls it on every progress call, idle ones
    /// included: a link that went away leaves no delivery to do it. Without
    /// room to give back it is one branch.
    pub(crate) fn tidy(&mut self) {
        self.tidy_at(Instant::now);
    }

    fn tidy_at(&mut self, now: impl FnOnce() -> Instant) {
        let Some(large_at) = self.large_at else {
            return;
        };
        self.calls += 1;
        if self.calls < LOOK_EVERY {
            return;
        }
        self.calls = 0;
        if now().saturating_duration_since(large_at) >= SHRINK_AFTER {
            self.large_at = None;
            self.list.shrink_to(KEEP_ARRIVALS);
            self.bytes.shrink_to(KEEP_BYTES);
        }
    }

    /// The room kept between deliveries (for tests).
    #[cfg(test)]
    fn room(&self) -> usize {
        self.bytes.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn messages_and_immediates_are_delivered_in_the_order_they_came() {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut handlers = AmHandlers::new("tcp");
        let s = seen.clone();
        handlers
            .set(
                3,
                Box::new(move |m| {
                    s.lock()
                        .unwrap()
                        .push(format!("am{}", String::from_utf8_lossy(m.data)))
                }),
            )
            .unwrap();
        let mut imm = ImmHandlerSlot::new("tcp");
        let s = seen.clone();
        imm.set(Box::new(move |e| {
            s.lock().unwrap().push(format!("imm{}/{}", e.imm, e.len))
        }));
        let mut batch = Arrivals::default();
        batch.push_am(3, b"a");
        batch.push_imm(1, 10);
        batch.push_imm(2, 0);
        batch.push_am(3, b"b");
        batch.deliver(&mut handlers, &mut imm);
        assert_eq!(*seen.lock().unwrap(), ["ama", "imm1/10", "imm2/0", "amb"]);
        // Emptied: nothing is delivered twice.
        batch.deliver(&mut handlers, &mut imm);
        assert_eq!(seen.lock().unwrap().len(), 4);
    }

    #[test]
    fn large_batches_keep_their_room_until_none_came_for_a_while() {
        let mut handlers = AmHandlers::new("tcp");
        handlers.set(1, Box::new(|_| {})).unwrap();
        let mut imm = ImmHandlerSlot::new("tcp");
        let mut batch = Arrivals::default();
        let big = vec![7u8; 64 * 1024];
        let large = |batch: &mut Arrivals, handlers: &mut AmHandlers, imm: &mut ImmHandlerSlot| {
            for _ in 0..16 {
                batch.push_am(1, &big);
            }
            batch.deliver(handlers, imm);
        };
        large(&mut batch, &mut handlers, &mut imm);
        let t0 = batch.large_at.expect("a 1 MiB batch is large");
        assert!(
            batch.room() >= 16 * big.len(),
            "a 1 MiB batch's room is kept"
        );
        // Small batches and idle calls before SHRINK_AFTER: kept.
        for _ in 0..2 * LOOK_EVERY {
            batch.push_am(1, b"x");
            batch.deliver(&mut handlers, &mut imm);
            batch.tidy_at(|| t0 + SHRINK_AFTER / 2);
        }
        assert!(batch.room() >= 16 * big.len(), "kept for SHRINK_AFTER");
        // Another large batch restarts the wait.
        large(&mut batch, &mut handlers, &mut imm);
        let t1 = batch.large_at.unwrap();
        for _ in 0..2 * LOOK_EVERY {
            batch.tidy_at(|| t1 + SHRINK_AFTER / 2);
        }
        assert!(
            batch.room() >= 16 * big.len(),
            "a new large batch restarts the wait"
        );
        // Idle calls alone (no link left to deliver) give it back.
        for _ in 0..LOOK_EVERY {
            batch.tidy_at(|| t1 + SHRINK_AFTER);
        }
        assert!(batch.room() <= KEEP_BYTES, "given back: {}", batch.room());
        // Nothing left to give back: no clock read.
        for _ in 0..2 * LOOK_EVERY {
            batch.tidy_at(|| panic!("the clock is read with nothing to give back"));
        }
    }
}
