//! The idle fast path of `progress`: a call that nothing can need returns
//! after one `epoll_wait` instead of locking and polling every link. With
//! 256 idle endpoints the full scan (lock each link, one poll() over every
//! socket) cost 26 us a call against 0.28 us with one.
//!
//! A call needs the full scan when a socket is readable (the listener, or a
//! link: all are in one epoll set, level-triggered), when something was
//! queued on a link since the last scan (every connection bumps the iface's
//! activity counter when it queues a frame: a request, a reply, a Hello),
//! when the last scan left work (a link reading a large put, over its
//! budget, or with frames waiting for room to write), and every
//! [`SCAN_PERIOD`] (timeouts, checked every 100 ms). The period is one of
//! time, not of calls: a scan every 64 calls still made an idle call grow
//! from 0.11 to 0.59 us between 1 and 256 endpoints.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Idle calls between two reads of the clock.
const CLOCK_EVERY: u32 = 64;

/// Time between two full scans when nothing happens: a tenth of the
/// links' timeout check period (100 ms); a 256-link scan (26 us) every
/// 10 ms is 0.3% of a core.
const SCAN_PERIOD: Duration = Duration::from_millis(10);

/// What decides whether a progress call may skip the scan.
pub(crate) struct Quiet {
    /// The listener and every link's socket; None when epoll could not be
    /// set up: then every call scans, as before.
    epoll: Option<OwnedFd>,
    /// Sockets in the set, with the id of the link that owns each (a
    /// closed socket leaves the set by itself; its number may come back
    /// for another link, which must then be added). The listener is id 0.
    registered: HashMap<RawFd, u64>,
    /// Frames queued on any link of the iface, counted.
    activity: Arc<AtomicU64>,
    /// `activity` when the last full scan began.
    seen: u64,
    /// The last scan left a link with work.
    hot: bool,
    /// Idle calls since the clock was read.
    calls: u32,
    /// When the last periodic scan was let through.
    last_periodic: Instant,
}

impl Quiet {
    /// A set holding the listener.
    pub(crate) fn new(listener: RawFd) -> Quiet {
        // SAFETY: epoll_create1 takes a flag and returns a new fd or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        let epoll = (fd >= 0).then(|| {
            // SAFETY: a fresh fd that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd) }
        });
        let mut quiet = Quiet {
            epoll,
            registered: HashMap::new(),
            activity: Arc::new(AtomicU64::new(0)),
            seen: 0,
            hot: true,
            calls: 0,
            last_periodic: Instant::now(),
        };
        if quiet.add(listener) {
            quiet.registered.insert(listener, 0);
        } else {
            quiet.epoll = None;
        }
        quiet
    }

    /// The counter connections bump when they queue a frame.
    pub(crate) fn activity(&self) -> Arc<AtomicU64> {
        self.activity.clone()
    }

    /// Whether this call may skip the scan: nothing is readable, nothing
    /// was queued and nothing was left since the last scan, and the last
    /// periodic scan is recent.
    pub(crate) fn idle(&mut self) -> bool {
        let Some(epoll) = &self.epoll else {
            return false;
        };
        if self.hot || self.activity.load(Ordering::Acquire) != self.seen {
            return false;
        }
        self.calls += 1;
        if self.calls >= CLOCK_EVERY {
            self.calls = 0;
            let now = Instant::now();
            if now.duration_since(self.last_periodic) >= SCAN_PERIOD {
                self.last_periodic = now;
                return false;
            }
        }
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: room for one event, timeout 0: epoll_wait writes at most
        // one epoll_event into `event`.
        let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), &mut event, 1, 0) };
        n == 0
    }

    /// A full scan begins: what is queued from now on is for the next one.
    pub(crate) fn scan_begins(&mut self) {
        self.seen = self.activity.load(Ordering::Acquire);
    }

    /// A full scan saw these links' sockets (fd, id of the link) and
    /// whether any of them has work left.
    pub(crate) fn scan_ends(&mut self, links: &[(RawFd, u64)], hot: bool) {
        self.hot = hot;
        if self.epoll.is_none() {
            return;
        }
        // Forget sockets of links gone (the listener stays: identity 0).
        if self.registered.len() > links.len() + 1 {
            let live: HashMap<RawFd, u64> = links.iter().copied().collect();
            self.registered
                .retain(|fd, id| *id == 0 || live.get(fd) == Some(id));
        }
        for &(fd, id) in links {
            if fd < 0 || self.registered.get(&fd) == Some(&id) {
                continue;
            }
            if self.add(fd) {
                self.registered.insert(fd, id);
            } else {
                // Not watched: scan every call rather than miss it.
                self.hot = true;
            }
        }
    }

    /// Adds a socket to the set (or updates it, for a reused number).
    fn add(&mut self, fd: RawFd) -> bool {
        let Some(epoll) = &self.epoll else {
            return false;
        };
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: a valid epoll fd, a socket fd the caller's link owns, and
        // an initialised event that epoll_ctl only reads.
        let added =
            unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if added == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
            // SAFETY: as above.
            let modified =
                unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut event) };
            return modified == 0;
        }
        false
    }
}
