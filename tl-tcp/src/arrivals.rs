//! What a link received for the handlers: active messages and the
//! immediates of puts with immediate data, in the order their frames came.
//! They are gathered under the link's lock and delivered after it is
//! released (a handler may send on the same link), one queue for both, so
//! that a peer's messages and immediates reach the handlers in the order it
//! sent them, as on rc (one receive queue) and self (one event queue).
//!
//! An immediate reaches the handler only from a peer this iface has
//! connected to itself, as on rc, whose immediates come only over a
//! connection both sides made: the peer's Hello claims an iface (address
//! and cookie), and this iface must have dialled that very iface, whose
//! cookie it has from the address the application gave it. A process that
//! knows only our address (an application's URL without the peer's) does
//! not know the cookie of the peer it would claim to be, so its immediates
//! never reach the handler even with a key to our memory. From a peer not
//! connected to yet (it may write before we connect back), what arrives
//! from the first immediate on is [`Hold`]: kept in order, a bounded
//! amount, and handed over once this iface connects to it.

use uct_core::{AmHandlers, ImmEvent, ImmHandlerSlot};

use crate::address::PeerAddr;

/// Arrivals a link holds at most (then it stops executing the peer's
/// requests until they can go).
const MAX_HELD: usize = 4096;
/// Bytes of active messages a link holds at most.
const MAX_HELD_BYTES: usize = 1 << 20;

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

    /// Moves every arrival to the end of `out`, in order.
    fn move_into(&mut self, out: &mut Arrivals) {
        let base = out.bytes.len();
        out.bytes.append(&mut self.bytes);
        out.list
            .extend(self.list.drain(..).map(|arrival| match arrival {
                Arrival::Am { id, at, len } => Arrival::Am {
                    id,
                    at: base + at,
                    len,
                },
                imm => imm,
            }));
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
        self.list.clear();
        self.bytes.clear();
    }
}

/// The arrivals a link holds back while its peer may not deliver
/// immediates yet (see the module's documentation).
#[derive(Default)]
pub(crate) struct Hold {
    on: bool,
    held: Arrivals,
}

impl Hold {
    /// An immediate came from `peer`, which this iface has not connected
    /// to: from now on the link's arrivals are held.
    pub(crate) fn start(&mut self, peer: &str) {
        if !self.on {
            self.on = true;
            log::debug!(
                "tcp: holding the immediates of {peer} (and what follows them) until this iface connects to it: immediates are delivered only from ifaces it connected to"
            );
        }
    }

    /// Whether the link holds as much as it may: it must stop executing
    /// the peer's requests.
    pub(crate) fn is_full(&self) -> bool {
        self.on && (self.held.list.len() >= MAX_HELD || self.held.bytes.len() >= MAX_HELD_BYTES)
    }

    /// Where the link's arrivals go now: held, or `out`.
    pub(crate) fn target<'a>(&'a mut self, out: &'a mut Arrivals) -> &'a mut Arrivals {
        if self.on {
            &mut self.held
        } else {
            out
        }
    }

    /// Hands what is held to `out`, in order, once this iface has
    /// connected to the link's `peer` (one of `connected`); true if it did.
    pub(crate) fn release(
        &mut self,
        peer: Option<PeerAddr>,
        connected: &[PeerAddr],
        out: &mut Arrivals,
    ) -> bool {
        if !self.on || !peer.is_some_and(|p| connected.contains(&p)) {
            return false;
        }
        self.held.move_into(out);
        self.on = false;
        true
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

    fn peer(port: u16, cookie: u64) -> PeerAddr {
        PeerAddr {
            sock: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            cookie,
        }
    }

    #[test]
    fn held_arrivals_follow_earlier_ones_once_their_peer_is_connected_to() {
        let mut hold = Hold::default();
        let mut out = Arrivals::default();
        out.push_am(1, b"before");
        hold.start("p");
        hold.target(&mut out).push_imm(7, 3);
        hold.target(&mut out).push_am(1, b"after");
        assert_eq!(out.list.len(), 1, "held arrivals went out");
        let p = peer(5, 9);
        // Not connected to it, or only to its address with another cookie:
        // still held.
        assert!(!hold.release(Some(p), &[], &mut out));
        assert!(!hold.release(Some(p), &[peer(5, 10)], &mut out));
        assert!(!hold.release(None, &[p], &mut out));
        assert!(hold.release(Some(p), &[peer(6, 1), p], &mut out));
        assert!(!hold.on);
        let mut handlers = AmHandlers::new("tcp");
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let s = seen.clone();
        handlers
            .set(
                1,
                Box::new(move |m| {
                    s.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(m.data).into())
                }),
            )
            .unwrap();
        let mut imm = ImmHandlerSlot::new("tcp");
        let s = seen.clone();
        imm.set(Box::new(move |e| {
            s.lock().unwrap().push(format!("imm{}", e.imm))
        }));
        out.deliver(&mut handlers, &mut imm);
        assert_eq!(*seen.lock().unwrap(), ["before", "imm7", "after"]);
    }

    #[test]
    fn a_hold_is_bounded_in_arrivals_and_bytes() {
        let mut out = Arrivals::default();
        let mut hold = Hold::default();
        assert!(!hold.is_full());
        hold.start("p");
        for i in 0..MAX_HELD {
            assert!(!hold.is_full(), "full after {i}");
            hold.target(&mut out).push_imm(i as u32, 0);
        }
        assert!(hold.is_full());
        let mut hold = Hold::default();
        hold.start("p");
        hold.target(&mut out)
            .push_am(1, &vec![0; MAX_HELD_BYTES - 1]);
        assert!(!hold.is_full());
        hold.target(&mut out).push_am(1, &[0]);
        assert!(hold.is_full());
        assert!(out.list.is_empty());
    }
}
