//! The peer segments an iface's endpoints have mapped, shared by its
//! endpoints so that keys of one segment map it once. Bounded: at most
//! [`MAX_ENTRIES`] segments and [`MAX_BYTES`] of address space are kept,
//! the least recently used given up first (rkeys that hold a mapping keep
//! it until they drop; the cache only stops holding it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uct_core::Result;

use crate::segment::Mapping;

/// Most segments one iface keeps mapped for its endpoints.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// Most address space those mappings take together: 16 of the largest
/// segments a peer may have ([`crate::segment::MAX_PEER_DATA`]).
pub(crate) const MAX_BYTES: usize = 16 << 40;

/// A segment by owner pid, descriptor and whether writes were asked for (a
/// file sealed against writes is mapped read-only even then).
pub(crate) type Key = (u32, u32, bool);

#[derive(Default)]
struct Entries {
    map: HashMap<Key, (Arc<Mapping>, u64)>,
    /// Counts lookups: an entry's last use.
    clock: u64,
    bytes: usize,
}

impl Entries {
    fn remove(&mut self, key: &Key) {
        if let Some((old, _)) = self.map.remove(key) {
            self.bytes -= old.mapped_bytes();
        }
    }

    /// Drops least recently used entries until one of `bytes` fits.
    fn make_room(&mut self, bytes: usize) {
        while !self.map.is_empty()
            && (self.map.len() >= MAX_ENTRIES || self.bytes.saturating_add(bytes) > MAX_BYTES)
        {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => self.remove(&key),
                None => break,
            }
        }
    }
}

/// The cache; clones share it.
#[derive(Clone, Default)]
pub(crate) struct SegmentCache(Arc<Mutex<Entries>>);

impl SegmentCache {
    /// The mapping of `key`, from the cache while its owner has not freed
    /// it, or made by `open` (and kept, making room for it). `open` runs
    /// without the cache's lock.
    pub(crate) fn get_or_open(
        &self,
        key: Key,
        open: impl FnOnce() -> Result<Mapping>,
    ) -> Result<Arc<Mapping>> {
        {
            let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
            entries.clock += 1;
            let now = entries.clock;
            if let Some((mapping, used)) = entries.map.get_mut(&key) {
                if !mapping.is_dead() {
                    *used = now;
                    return Ok(mapping.clone());
                }
            }
        }
        // Not mapped yet, or freed by its owner: the descriptor is closed
        // (NoSuchRegion) or now holds another segment (whose region id
        // differs). Opened without the lock: a peer's file may take its
        // time, and the iface's other endpoints must not wait for it.
        let mapping = Arc::new(open()?);
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.clock += 1;
        let now = entries.clock;
        if let Some((other, used)) = entries.map.get_mut(&key) {
            if !other.is_dead() && !mapping.is_dead() {
                // Another endpoint opened it meanwhile: keep that one.
                *used = now;
                return Ok(other.clone());
            }
        }
        entries.remove(&key);
        entries.make_room(mapping.mapped_bytes());
        entries.bytes += mapping.mapped_bytes();
        entries.map.insert(key, (mapping.clone(), now));
        Ok(mapping)
    }

    /// Segments kept, and the bytes they map.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (entries.map.len(), entries.bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use uct_core::Access;

    use super::*;
    use crate::segment::{Peers, HEADER_SPACE};

    fn segment() -> (Mapping, OwnedFd) {
        Mapping::create(
            "uct-test-cache",
            4096,
            (1, 0),
            Access::all(),
            Peers::ReadWrite,
        )
        .unwrap()
    }

    #[test]
    fn the_cache_keeps_at_most_max_entries_the_least_recently_used_go_first() {
        let cache = SegmentCache::default();
        let hot: Key = (1, 0, true);
        let opened = std::cell::Cell::new(0);
        let open = || {
            opened.set(opened.get() + 1);
            Ok(segment().0)
        };
        cache.get_or_open(hot, open).unwrap();
        for fd in 1..(2 * MAX_ENTRIES) as u32 {
            cache.get_or_open((1, fd, true), open).unwrap();
            // The first key stays in use.
            cache.get_or_open(hot, open).unwrap();
        }
        let (n, bytes) = cache.usage();
        assert_eq!(n, MAX_ENTRIES);
        assert_eq!(bytes, MAX_ENTRIES * (HEADER_SPACE + 4096));
        assert_eq!(
            opened.get(),
            2 * MAX_ENTRIES,
            "the hot key was mapped again"
        );
        // An old one was given up: opened again.
        cache.get_or_open((1, 1, true), open).unwrap();
        assert_eq!(opened.get(), 2 * MAX_ENTRIES + 1);
    }

    #[test]
    fn open_runs_without_the_lock() {
        // A slow open (a peer's file) must not hold the other endpoints'
        // lookups: while one open runs, another thread's lookup completes.
        let cache = SegmentCache::default();
        cache
            .get_or_open((3, 1, true), || {
                let other = cache.clone();
                let (done, finished) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let got = other.get_or_open((3, 2, true), || Ok(segment().0));
                    let _ = done.send(got.is_ok());
                });
                let got = finished.recv_timeout(std::time::Duration::from_secs(5));
                assert_eq!(got, Ok(true), "a lookup waited for another key's open");
                Ok(segment().0)
            })
            .unwrap();
        assert_eq!(cache.usage().0, 2);
    }

    #[test]
    fn a_freed_segment_is_opened_again() {
        let cache = SegmentCache::default();
        let (owner, _fd) = segment();
        let first = cache.get_or_open((2, 7, true), || Ok(segment().0)).unwrap();
        first.mark_dead();
        let second = cache.get_or_open((2, 7, true), || Ok(segment().0)).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(cache.usage().0, 1);
        drop(owner);
    }
}
