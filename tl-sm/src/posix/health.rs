//! Whether a posix endpoint's peer has failed. The endpoint and its iface
//! share one [`Health`] per endpoint: the endpoint probes it from its
//! operations and `check`, and the iface's progress sweeps every
//! endpoint's, so that a waiting loop that only progresses the iface still
//! finds a dead peer. Once failed, an endpoint stays failed with the first
//! error.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use uct_core::{Result, UctError};

use crate::host::PeerWatch;

/// Progress calls between two sweeps of the iface's endpoints: cheap
/// enough for the empty-ring fast path, often enough that a spinning loop
/// sweeps every few microseconds (each peer's pidfd is asked at most every
/// few milliseconds, [`PeerWatch`]).
const SWEEP_EVERY: u32 = 256;

/// Endpoints one sweep probes, taking turns: a progress call costs the
/// same with 256 endpoints as with 1 (sweeping all of them made an idle
/// progress call grow from 1.5 to 44 ns). With N endpoints each is probed
/// every N / SWEEP_BATCH sweeps: 256 endpoints, every 16K progress calls,
/// well under a millisecond of spinning.
const SWEEP_BATCH: usize = 4;

/// One endpoint's peer: its process watch and, once it failed, why.
#[derive(Debug)]
pub(crate) struct Health {
    failed: OnceLock<UctError>,
    watch: Mutex<PeerWatch>,
}

impl Health {
    /// The health of a connection to process `pid`.
    pub(crate) fn new(pid: u32) -> Arc<Health> {
        Arc::new(Health {
            failed: OnceLock::new(),
            watch: Mutex::new(PeerWatch::new("posix", pid)),
        })
    }

    /// `Err` with the first failure, once there is one (one atomic load).
    #[inline]
    pub(crate) fn failed(&self) -> Result<()> {
        match self.failed.get() {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// Records `e` as the failure unless one is recorded already; returns
    /// the recorded one.
    #[cold]
    pub(crate) fn fail(&self, e: UctError) -> UctError {
        let _ = self.failed.set(e.clone());
        self.failed.get().cloned().unwrap_or(e)
    }

    /// Asks whether the peer process is gone (the watch rate-limits the
    /// kernel call), and fails for good if it is.
    pub(crate) fn watch(&self) -> Result<()> {
        self.failed()?;
        // A sweep and the endpoint never need to probe at the same time:
        // whoever holds the watch is probing.
        let Ok(mut watch) = self.watch.try_lock() else {
            return Ok(());
        };
        watch.check().map_err(|e| self.fail(e))
    }
}

/// An iface's endpoints, as weak references: dropping an endpoint drops its
/// entry at the next sweep.
#[derive(Debug, Default)]
pub(crate) struct Watchlist {
    entries: Vec<Weak<Health>>,
    calls: u32,
    /// The entry the next sweep starts at.
    next: usize,
}

impl Watchlist {
    /// Watches one more endpoint's peer.
    pub(crate) fn add(&mut self, health: &Arc<Health>) {
        // Dropped endpoints go at sweeps; here only now and then, so that
        // adding N endpoints is not O(N^2).
        if self.entries.len().is_power_of_two() {
            self.entries.retain(|w| w.strong_count() > 0);
            self.next = 0;
        }
        self.entries.push(Arc::downgrade(health));
    }

    /// Counts one progress call; every [`SWEEP_EVERY`] calls, probes the
    /// next [`SWEEP_BATCH`] endpoints' peers.
    #[inline]
    pub(crate) fn tick(&mut self) {
        self.calls = self.calls.wrapping_add(1);
        if self.calls.is_multiple_of(SWEEP_EVERY) {
            self.sweep();
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep(&mut self) {
        for _ in 0..SWEEP_BATCH {
            if self.entries.is_empty() {
                return;
            }
            if self.next >= self.entries.len() {
                self.next = 0;
            }
            match self.entries[self.next].upgrade() {
                // A failure is recorded in the Health, where the endpoint's
                // next operation finds it.
                Some(health) => {
                    let _ = health.watch();
                    self.next += 1;
                }
                // Dropped: forgotten; the last entry takes its place.
                None => {
                    self.entries.swap_remove(self.next);
                }
            }
        }
    }

    /// Endpoints still watched.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.iter().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_stays() {
        let health = Health::new(std::process::id());
        assert!(health.failed().is_ok());
        assert!(health.watch().is_ok(), "this process is alive");
        let first = health.fail(UctError::Protocol("first".into()));
        let second = health.fail(UctError::Timeout("second".into()));
        assert_eq!(first, UctError::Protocol("first".into()));
        assert_eq!(second, first);
        assert_eq!(health.failed().unwrap_err(), first);
        assert_eq!(health.watch().unwrap_err(), first);
    }

    #[test]
    fn a_sweep_fails_the_endpoints_of_a_dead_peer_and_forgets_dropped_ones() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let dead = Health::new(child.id());
        let alive = Health::new(std::process::id());
        let dropped = Health::new(std::process::id());
        let mut list = Watchlist::default();
        for h in [&dead, &alive, &dropped] {
            list.add(h);
        }
        drop(dropped);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = std::time::Instant::now();
        while dead.failed().is_ok() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(2),
                "no sweep saw the dead peer"
            );
            list.tick();
        }
        let e = dead.failed().unwrap_err().to_string();
        assert!(e.contains(&child.id().to_string()), "{e}");
        assert!(alive.failed().is_ok());
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn a_dead_peer_among_many_is_found_and_dropped_entries_go() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let mut list = Watchlist::default();
        let alive: Vec<_> = (0..300).map(|_| Health::new(std::process::id())).collect();
        for h in &alive[..150] {
            list.add(h);
        }
        let dead = Health::new(child.id());
        list.add(&dead);
        for h in &alive[150..] {
            list.add(h);
        }
        let dropped: Vec<_> = (0..40).map(|_| Health::new(std::process::id())).collect();
        for h in &dropped {
            list.add(h);
        }
        drop(dropped);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = std::time::Instant::now();
        while dead.failed().is_ok() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "no sweep saw the dead peer among 300"
            );
            list.tick();
        }
        // A full turn over every entry forgets the dropped ones.
        for _ in 0..(400 / SWEEP_BATCH + 1) * SWEEP_EVERY as usize {
            list.tick();
        }
        assert_eq!(list.entries.len(), 301);
        assert!(alive.iter().all(|h| h.failed().is_ok()));
    }
}
