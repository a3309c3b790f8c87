//! An rc connection's look at the clock: the liveness probe, keepalives,
//! a dead peer or a downed port found, and the end of the wait for flushed
//! completions after a failure.

use uct_core::coarse_clock::CoarseInstant;
use uct_core::{Result, UctError};

use super::{Connection, CHECK_EVERY, DRAIN_LIMIT};
use crate::keepalive::{Death, SendQueue, Verdict};

impl Connection {
    /// The liveness probe, like uct_ep_check: the endpoint's failure, if
    /// any. Every few calls it also reads the clock: it sends a keepalive
    /// when due, and finds the peer dead within the peer timeout.
    pub(crate) fn check(&mut self) -> Result<()> {
        self.checks = self.checks.wrapping_add(1);
        if self.checks.is_multiple_of(CHECK_EVERY) {
            self.tick(CoarseInstant::now());
        }
        match self.tx.failure() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// What the clock says: after a failure, whether to stop waiting for
    /// flushed completions; before, whether to probe the peer or give it
    /// up.
    pub(super) fn tick(&mut self, now: CoarseInstant) {
        if std::mem::take(&mut self.saw_progress) {
            self.live.sign_of_life(now);
        }
        if std::mem::take(&mut self.heard) {
            self.live.received(now);
        }
        if self.failed_at.is_none() {
            if let Some(why) = self.watch.check(self.port, self.port_generation, now) {
                self.port_failed(why);
            }
        }
        if let Some(at) = self.failed_at {
            if self.tx.outstanding() > 0 && now.saturating_duration_since(at) > DRAIN_LIMIT {
                self.give_up();
            }
            return;
        }
        if !self.connected {
            return;
        }
        let queue = SendQueue {
            outstanding: self.tx.outstanding(),
            tail_signalled: self.tx.tail_signalled(),
            credits: self.tx.credits(),
            bytes_ahead: self.tx.bytes_ahead(),
        };
        match self.live.tick(now, queue) {
            Verdict::Alive => {}
            Verdict::Probe => match self.post_keepalive() {
                Ok(()) => self.live.probe_sent(now),
                Err(e) => self.fail(e),
            },
            Verdict::Dead(death) => {
                let error = self.death(death);
                self.fail(error);
            }
        }
    }

    /// The error for a peer found dead.
    fn death(&self, death: Death) -> UctError {
        let timeout = self.live.peer_timeout();
        UctError::EndpointFailed(match death {
            Death::Silent {
                waited,
                outstanding,
            } => format!(
                "rc {}: no work completion for {waited:?} with {outstanding} operations outstanding; the peer is dead or unreachable (UCT_RC_PEER_TIMEOUT={timeout:?})",
                self.label
            ),
            Death::KeepaliveUnanswered { waited } => format!(
                "rc {}: a keepalive got no answer in {waited:?}; the peer is dead or unreachable (UCT_RC_PEER_TIMEOUT={timeout:?})",
                self.label
            ),
        })
    }

    /// Fails the endpoint because its port went down.
    pub(super) fn port_failed(&mut self, why: String) {
        self.fail(UctError::EndpointFailed(format!(
            "rc {}: {why}; its operations failed with it (use another device, or a new endpoint once the port is ACTIVE again)",
            self.label
        )));
    }
}
