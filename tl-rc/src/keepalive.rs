//! When an rc endpoint probes its peer, and when it gives the peer up: a
//! pure function of the clock and the send tracker's state, with no verbs
//! in it, so that it is unit-tested on any host.
//!
//! RC says nothing about a peer while nothing is posted, and some NICs
//! (rxe) never time out a request whose peer is gone. So:
//! - with operations outstanding and the last one signalled, the peer is
//!   dead when no completion came for the peer timeout;
//! - otherwise (nothing outstanding, or only unsignalled operations, whose
//!   completions a live peer would never make visible) a keepalive goes out
//!   after half the peer timeout without a completion: a signalled
//!   zero-length RDMA write, which needs no remote memory and consumes no
//!   receive buffer. If it has not completed within the other half, the peer
//!   is dead.
//!
//! Send completions that arrive while a keepalive is out count too: its
//! deadline runs from the later of its post and them. Bytes we posted ahead
//! of the completion waited for extend either wait by the time they take at
//! [`FLOOR_BANDWIDTH`], so that our own large transfers do not make a live
//! peer look dead.
//!
//! Only our send queue's completions (the keepalive's among them) are signs
//! of life for these deadlines. Messages received from the peer say nothing
//! about its taking ours (a peer that stops reposting its receive buffers
//! leaves our sends retrying RNR for ever, and may still send to us): they
//! delay the keepalive of an idle endpoint, and never a deadline running.
//!
//! Either way a peer that dies, or stops taking what we send, is found
//! within the peer timeout (plus that extension) of our send queue's last
//! progress, give or take how often the endpoint looks at the clock (once
//! to learn of that progress, once for the verdict) and
//! its resolution (the coarse clock's tick, 1 to 10 ms by the kernel's HZ,
//! more in an emulated guest that takes its ticks late: at the smallest
//! peer timeout, 100 ms, where a keepalive has 50 ms to be answered, a
//! 10 ms tick may bring a verdict a fifth of that window early).

use std::time::Duration;

use uct_core::coarse_clock::CoarseInstant;

/// The slowest link a live peer is assumed to have, in bytes per second
/// (64 MiB/s: below 1 GbE RoCE, any faster RDMA NIC, and rxe in an
/// emulated VM, which moves some 300 MB/s): bytes posted ahead of the
/// completion (or keepalive) waited for extend the wait by the time they
/// take at this rate, so a keepalive queued behind our own large puts is
/// not taken as unanswered. The price: a peer that dies with 1 GiB ahead
/// of the completion waited for is found 16 s later than one with nothing
/// ahead. rc signals zero-copy posts of 1 MiB or more, so only the bytes
/// up to the first of them count. Slower links need a longer
/// UCT_RC_PEER_TIMEOUT.
pub const FLOOR_BANDWIDTH: u64 = 64 << 20;

/// What the tracker says about the send queue, for [`Liveness::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendQueue {
    /// Operations posted and not completed.
    pub outstanding: usize,
    /// Whether the last post was signalled (true when none is outstanding).
    pub tail_signalled: bool,
    /// Posts still allowed.
    pub credits: u32,
    /// Bytes posted ahead of (and with) the first signalled operation
    /// outstanding: what must move before a live peer's next completion
    /// can be seen (all of them when none is signalled).
    pub bytes_ahead: u64,
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing.
    Alive,
    /// Post a keepalive, then call [`Liveness::probe_sent`].
    Probe,
    /// The peer is dead.
    Dead(Death),
}

/// How the peer was found dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// No completion for `waited`, with operations outstanding.
    Silent {
        waited: Duration,
        outstanding: usize,
    },
    /// A keepalive sent `waited` ago never completed.
    KeepaliveUnanswered { waited: Duration },
}

/// The liveness state of one endpoint.
#[derive(Debug)]
pub struct Liveness {
    peer_timeout: Duration,
    /// The last send completion, or the first post after a quiet spell, as
    /// of the first clock read after it: the deadlines count from it.
    last_sign: CoarseInstant,
    /// The last message received: it only delays the keepalive of an idle
    /// endpoint.
    last_heard: CoarseInstant,
    /// When the keepalive still outstanding was posted.
    probe: Option<CoarseInstant>,
}

impl Liveness {
    /// A peer that showed a sign of life at `now`.
    pub fn new(peer_timeout: Duration, now: CoarseInstant) -> Self {
        Liveness {
            peer_timeout,
            last_sign: now,
            last_heard: now,
            probe: None,
        }
    }

    /// The peer timeout.
    pub fn peer_timeout(&self) -> Duration {
        self.peer_timeout
    }

    /// How long without a completion before a keepalive goes out; the rest
    /// of the peer timeout is what the keepalive is given.
    pub fn interval(&self) -> Duration {
        self.peer_timeout / 2
    }

    /// A send completion came (the peer's NIC took what we sent), or the
    /// first post after nothing was outstanding, by `now` (the clock read
    /// that learnt of it, which may be later): the clock starts again.
    pub fn sign_of_life(&mut self, now: CoarseInstant) {
        self.last_sign = now;
    }

    /// A message from the peer arrived at `now`: the peer is there, but
    /// this says nothing about its taking what we send, so it only delays
    /// the keepalive of an endpoint with nothing outstanding.
    pub fn received(&mut self, now: CoarseInstant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// The keepalive was posted at `now`.
    pub fn probe_sent(&mut self, now: CoarseInstant) {
        self.probe = Some(now);
    }

    /// The keepalive completed.
    pub fn probe_answered(&mut self) {
        self.probe = None;
    }

    /// Whether a keepalive is outstanding.
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// How much longer than the peer timeout a completion may take
    /// because of the bytes ahead of it (at [`FLOOR_BANDWIDTH`]).
    pub fn slack(bytes_ahead: u64) -> Duration {
        Duration::from_secs_f64(bytes_ahead as f64 / FLOOR_BANDWIDTH as f64)
    }

    /// What to do at `now`, given the send queue.
    pub fn tick(&self, now: CoarseInstant, queue: SendQueue) -> Verdict {
        let slack = Self::slack(queue.bytes_ahead);
        if let Some(sent) = self.probe {
            // Counted from the later of the probe and the last send
            // completion: the operations ahead of the probe are moving.
            // Messages received do not count: the probe may be stuck
            // behind sends the peer never takes.
            let waited = now.saturating_duration_since(sent.max(self.last_sign));
            if waited > self.peer_timeout - self.interval() + slack {
                return Verdict::Dead(Death::KeepaliveUnanswered { waited });
            }
            return Verdict::Alive;
        }
        let quiet = now.saturating_duration_since(self.last_sign);
        if queue.outstanding > 0 && (queue.tail_signalled || queue.credits == 0) {
            // A completion is due: wait for it, up to the peer timeout and
            // the time the bytes ahead of it take.
            if quiet > self.peer_timeout + slack {
                return Verdict::Dead(Death::Silent {
                    waited: quiet,
                    outstanding: queue.outstanding,
                });
            }
            return Verdict::Alive;
        }
        // With nothing of ours outstanding, a message from the peer is as
        // good as a probe's answer; with unsignalled posts outstanding it
        // says nothing about them.
        let quiet = match queue.outstanding {
            0 => now.saturating_duration_since(self.last_sign.max(self.last_heard)),
            _ => quiet,
        };
        if quiet >= self.interval() && queue.credits > 0 {
            Verdict::Probe
        } else {
            Verdict::Alive
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn queue(outstanding: usize, tail_signalled: bool) -> SendQueue {
        SendQueue {
            outstanding,
            tail_signalled,
            credits: 100,
            bytes_ahead: 0,
        }
    }

    fn idle() -> SendQueue {
        queue(0, true)
    }

    #[test]
    fn an_idle_endpoint_probes_after_half_the_timeout_and_only_once() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        assert_eq!(
            live.tick(t0 + T / 2 - Duration::from_millis(1), idle()),
            Verdict::Alive
        );
        assert_eq!(live.tick(t0 + T / 2, idle()), Verdict::Probe);
        live.probe_sent(t0 + T / 2);
        assert!(live.probing());
        // Outstanding now: the keepalive itself, signalled.
        assert_eq!(
            live.tick(t0 + T / 2 + T / 4, queue(1, true)),
            Verdict::Alive
        );
    }

    #[test]
    fn an_answered_probe_starts_the_clock_again() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        live.probe_sent(t0 + T / 2);
        live.probe_answered();
        live.sign_of_life(t0 + T / 2 + Duration::from_millis(1));
        assert!(!live.probing());
        assert_eq!(live.tick(t0 + T, idle()), Verdict::Alive);
        assert_eq!(
            live.tick(t0 + T + Duration::from_millis(1), idle()),
            Verdict::Probe
        );
    }

    #[test]
    fn an_unanswered_probe_finds_the_peer_dead_within_the_timeout() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        let sent = t0 + T / 2;
        live.probe_sent(sent);
        assert_eq!(live.tick(t0 + T, queue(1, true)), Verdict::Alive);
        let late = t0 + T + Duration::from_millis(1);
        assert_eq!(
            live.tick(late, queue(1, true)),
            Verdict::Dead(Death::KeepaliveUnanswered {
                waited: late - sent
            })
        );
    }

    #[test]
    fn a_signalled_tail_is_waited_for_up_to_the_timeout_without_probes() {
        let t0 = CoarseInstant::now();
        let live = Liveness::new(T, t0);
        assert_eq!(live.tick(t0 + T, queue(3, true)), Verdict::Alive);
        let late = t0 + T + Duration::from_millis(1);
        assert_eq!(
            live.tick(late, queue(3, true)),
            Verdict::Dead(Death::Silent {
                waited: T + Duration::from_millis(1),
                outstanding: 3
            })
        );
    }

    #[test]
    fn an_unsignalled_tail_is_probed_not_taken_for_dead() {
        // A live peer never makes unsignalled completions visible: without
        // a probe, one put and a quiet spell would look like a dead peer.
        let t0 = CoarseInstant::now();
        let live = Liveness::new(T, t0);
        assert_eq!(live.tick(t0 + T / 2, queue(1, false)), Verdict::Probe);
        assert_eq!(live.tick(t0 + 3 * T, queue(1, false)), Verdict::Probe);
    }

    #[test]
    fn no_credit_no_probe() {
        let t0 = CoarseInstant::now();
        let live = Liveness::new(T, t0);
        let full = SendQueue {
            outstanding: 0,
            tail_signalled: true,
            credits: 0,
            bytes_ahead: 0,
        };
        assert_eq!(live.tick(t0 + T, full), Verdict::Alive);
        let stuck = SendQueue {
            outstanding: 8,
            tail_signalled: false,
            credits: 0,
            bytes_ahead: 0,
        };
        assert!(matches!(
            live.tick(t0 + 2 * T, stuck),
            Verdict::Dead(Death::Silent { outstanding: 8, .. })
        ));
    }

    /// Review finding 3a: send completions that arrive while a keepalive
    /// is out are signs of life: the keepalive's deadline counts from the
    /// later of its post and the last of them.
    #[test]
    fn signs_of_life_while_a_probe_is_out_keep_the_peer_alive() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        live.probe_sent(t0 + T / 2);
        live.sign_of_life(t0 + T);
        let ms = Duration::from_millis(1);
        assert_eq!(
            live.tick(t0 + T + ms, queue(1, true)),
            Verdict::Alive,
            "a peer that answered 1 ms ago was taken for dead"
        );
        let late = t0 + T + T / 2 + ms;
        assert!(matches!(
            live.tick(late, queue(1, true)),
            Verdict::Dead(Death::KeepaliveUnanswered { .. })
        ));
    }

    /// Review finding 3b: a keepalive queued behind our own large posts
    /// completes only after they moved: 16 unsignalled 1 GiB puts, then a
    /// probe at T/2, must not make the peer dead at T. Each byte ahead
    /// gets the time it takes at FLOOR_BANDWIDTH; a dead peer is still
    /// found, that much later.
    #[test]
    fn a_probe_behind_large_posts_gets_the_time_they_need() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        let unsignalled = SendQueue {
            outstanding: 16,
            tail_signalled: false,
            credits: 100,
            bytes_ahead: 16 << 30,
        };
        assert_eq!(live.tick(t0 + T / 2, unsignalled), Verdict::Probe);
        live.probe_sent(t0 + T / 2);
        let behind = SendQueue {
            outstanding: 17,
            tail_signalled: true,
            ..unsignalled
        };
        let ms = Duration::from_millis(1);
        assert_eq!(
            live.tick(t0 + T + ms, behind),
            Verdict::Alive,
            "a keepalive behind 16 GiB of our own puts was taken as unanswered"
        );
        let need = Liveness::slack(16 << 30);
        assert_eq!(live.tick(t0 + T + need - ms, behind), Verdict::Alive);
        assert!(matches!(
            live.tick(t0 + T + need + ms, behind),
            Verdict::Dead(Death::KeepaliveUnanswered { .. })
        ));
        // A signalled large post: its completion is waited for as long.
        let live = Liveness::new(T, t0);
        let one = SendQueue {
            outstanding: 1,
            tail_signalled: true,
            credits: 100,
            bytes_ahead: 1 << 30,
        };
        let need = Liveness::slack(1 << 30);
        assert_eq!(live.tick(t0 + T + need - ms, one), Verdict::Alive);
        assert!(matches!(
            live.tick(t0 + T + need + ms, one),
            Verdict::Dead(Death::Silent { outstanding: 1, .. })
        ));
    }

    /// Review 2, finding 1: a hostile peer stops reposting its receive
    /// buffers, so that our sends (and the keepalive behind them) retry
    /// RNR for ever, and sends us a message every T/4. Messages received
    /// say nothing about our send queue: they never extend a deadline
    /// already running. A keepalive out, messages every T/4 and no send
    /// completion: dead within T of the probe plus the bytes-ahead
    /// extension.
    #[test]
    fn messages_received_do_not_extend_a_probes_deadline() {
        let ms = Duration::from_millis(1);
        for bytes_ahead in [0, 1 << 30] {
            let t0 = CoarseInstant::now();
            let mut live = Liveness::new(T, t0);
            assert_eq!(live.tick(t0 + T / 2, idle()), Verdict::Probe);
            let sent = t0 + T / 2;
            live.probe_sent(sent);
            let behind = SendQueue {
                bytes_ahead,
                ..queue(1, true)
            };
            let need = T / 2 + Liveness::slack(bytes_ahead);
            let mut at = sent;
            while at + T / 4 < sent + need {
                at += T / 4;
                live.received(at);
                assert_eq!(live.tick(at, behind), Verdict::Alive);
            }
            let late = sent + need + ms;
            assert_eq!(
                live.tick(late, behind),
                Verdict::Dead(Death::KeepaliveUnanswered {
                    waited: need + ms
                }),
                "messages received every T/4 kept a peer alive whose keepalive never completed ({bytes_ahead} bytes ahead)"
            );
        }
    }

    /// Review 2, finding 1: the same for operations outstanding with a
    /// signalled tail (sends stuck in RNR retries).
    #[test]
    fn messages_received_do_not_extend_the_outstanding_deadline() {
        let ms = Duration::from_millis(1);
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        for k in 1..=4 {
            live.received(t0 + k * T / 4);
            assert_eq!(live.tick(t0 + k * T / 4, queue(3, true)), Verdict::Alive);
        }
        assert_eq!(
            live.tick(t0 + T + ms, queue(3, true)),
            Verdict::Dead(Death::Silent {
                waited: T + ms,
                outstanding: 3
            }),
            "messages received every T/4 kept a peer alive that completed none of 3 operations in T"
        );
    }

    /// Review 2, finding 1: unsignalled operations outstanding are probed
    /// at T/2 whatever arrives meanwhile, and the probe is given the other
    /// half.
    #[test]
    fn messages_received_do_not_hold_back_the_probe_of_unsignalled_posts() {
        let ms = Duration::from_millis(1);
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        live.received(t0 + T / 4);
        live.received(t0 + T / 2);
        assert_eq!(
            live.tick(t0 + T / 2, queue(1, false)),
            Verdict::Probe,
            "a message received held back the keepalive of an unsignalled put"
        );
        live.probe_sent(t0 + T / 2);
        live.received(t0 + 3 * T / 4);
        live.received(t0 + T);
        assert!(matches!(
            live.tick(t0 + T + ms, queue(2, true)),
            Verdict::Dead(Death::KeepaliveUnanswered { .. })
        ));
    }

    /// Messages received do delay the keepalive of an idle endpoint: the
    /// peer that sends them is there, and there is nothing of ours to wait
    /// for.
    #[test]
    fn messages_received_delay_the_probe_of_an_idle_endpoint() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0);
        live.received(t0 + T / 4);
        assert_eq!(live.tick(t0 + T / 2, idle()), Verdict::Alive);
        assert_eq!(live.tick(t0 + T / 4 + T / 2, idle()), Verdict::Probe);
    }

    #[test]
    fn a_clock_read_before_the_last_sign_is_not_an_overflow() {
        let t0 = CoarseInstant::now();
        let mut live = Liveness::new(T, t0 + T);
        live.probe_sent(t0 + T);
        assert_eq!(live.tick(t0, idle()), Verdict::Alive);
    }
}
