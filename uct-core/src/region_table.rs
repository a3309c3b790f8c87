//! Registered regions of a software memory domain, and the checks every
//! remote access goes through: the region exists, the rkey's secret matches,
//! the range is inside it, and the region grants the rights needed.
//! Software transports (self, sm, tcp) execute remote accesses only through
//! [`RegionTable::access`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use serde::{Deserialize, Serialize};

use crate::error::{Result, UctError};
use crate::memory::Access;

/// What a software MD packs into an rkey. `base`, `len` and `access` let
/// the sender refuse a bad access early; the target's table is what decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftRkey {
    /// Id of the region in the owner's table.
    pub region_id: u64,
    /// Unguessable secret drawn at registration; must match the table's.
    pub secret: u64,
    /// First address of the region.
    pub base: u64,
    /// Length of the region in bytes.
    pub len: u64,
    /// Rights granted to peers.
    pub access: Access,
}

impl SoftRkey {
    /// The sender-side check, before anything goes on the wire.
    pub fn precheck(&self, addr: u64, len: u64, needed: Access) -> Result<()> {
        check_range(self.base, self.len, addr, len)?;
        check_rights(self.access, needed)
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    base: u64,
    len: u64,
    access: Access,
    secret: u64,
}

/// The registered regions of one memory domain.
#[derive(Debug)]
pub struct RegionTable {
    regions: RwLock<HashMap<u64, Entry>>,
    next_id: AtomicU64,
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // getrandom only fails where the OS has no entropy source at all; a
    // counter-derived value would make secrets guessable, so fall back to
    // the address-space layout and time mixed, which is still per-run.
    if getrandom::fill(&mut bytes).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return mix_fallback(t, &bytes as *const _ as u64);
    }
    u64::from_ne_bytes(bytes)
}

/// The fallback secret from a time and an address: for either input fixed,
/// distinct values of the other give distinct secrets, so neither alone
/// makes the secret guessable.
fn mix_fallback(time: u64, address: u64) -> u64 {
    time ^ address.rotate_left(32)
}

fn check_range(base: u64, region_len: u64, addr: u64, len: u64) -> Result<()> {
    let ok = addr >= base
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= base.saturating_add(region_len));
    if ok {
        Ok(())
    } else {
        Err(UctError::OutOfRange {
            addr,
            len,
            base,
            region_len,
        })
    }
}

fn check_rights(granted: Access, needed: Access) -> Result<()> {
    if granted.contains(needed) {
        Ok(())
    } else {
        Err(UctError::AccessDenied { needed, granted })
    }
}

impl RegionTable {
    /// An empty table.
    pub fn new() -> Arc<RegionTable> {
        Arc::new(RegionTable {
            regions: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(random_u64() >> 16),
        })
    }

    /// Registers `[base, base+len)` with `access`. The region stays
    /// registered until the returned value is dropped.
    pub fn insert(self: &Arc<Self>, base: u64, len: u64, access: Access) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let secret = random_u64();
        self.regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Entry {
                    base,
                    len,
                    access,
                    secret,
                },
            );
        Registration {
            key: SoftRkey {
                region_id: id,
                secret,
                base,
                len,
                access,
            },
            table: Arc::downgrade(self),
        }
    }

    /// Runs `f` with a pointer to `addr` after every check passes. The
    /// region cannot be deregistered while `f` runs.
    pub fn access<R>(
        &self,
        key: &SoftRkey,
        addr: u64,
        len: u64,
        needed: Access,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let e = regions.get(&key.region_id).ok_or(UctError::NoSuchRegion {
            region_id: key.region_id,
        })?;
        if e.secret != key.secret {
            return Err(UctError::BadSecret);
        }
        check_range(e.base, e.len, addr, len)?;
        check_rights(e.access, needed)?;
        Ok(f(addr as *mut u8))
    }

    /// The registered region containing `addr`, as (base, len).
    pub fn find_containing(&self, addr: u64) -> Option<(u64, u64)> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        regions
            .values()
            .find(|e| addr >= e.base && addr < e.base.saturating_add(e.len))
            .map(|e| (e.base, e.len))
    }

    /// Number of regions registered.
    pub fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn remove(&self, id: u64) {
        // Waits for accesses in flight: after this no peer touches the memory.
        self.regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// A live registration; dropping it deregisters the region.
#[derive(Debug)]
pub struct Registration {
    key: SoftRkey,
    table: Weak<RegionTable>,
}

impl Registration {
    /// The key a peer needs.
    pub fn key(&self) -> &SoftRkey {
        &self.key
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(t) = self.table.upgrade() {
            t.remove(self.key.region_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_has_its_error() {
        let t = RegionTable::new();
        let r = t.insert(0x1000, 0x100, Access::REMOTE_READ);
        let k = *r.key();
        assert!(t
            .access(&k, 0x1000, 0x100, Access::REMOTE_READ, |_| ())
            .is_ok());
        assert!(matches!(
            t.access(&k, 0x10f0, 0x20, Access::REMOTE_READ, |_| ()),
            Err(UctError::OutOfRange { .. })
        ));
        assert!(matches!(
            t.access(&k, 0x1000, 8, Access::REMOTE_WRITE, |_| ()),
            Err(UctError::AccessDenied { .. })
        ));
        let forged = SoftRkey {
            secret: k.secret ^ 1,
            ..k
        };
        assert!(matches!(
            t.access(&forged, 0x1000, 8, Access::REMOTE_READ, |_| ()),
            Err(UctError::BadSecret)
        ));
        drop(r);
        assert!(matches!(
            t.access(&k, 0x1000, 8, Access::REMOTE_READ, |_| ()),
            Err(UctError::NoSuchRegion { .. })
        ));
    }

    #[test]
    fn overflowing_ranges_are_refused() {
        let t = RegionTable::new();
        let r = t.insert(u64::MAX - 16, 16, Access::all());
        assert!(t
            .access(r.key(), u64::MAX - 8, u64::MAX, Access::REMOTE_READ, |_| ())
            .is_err());
    }

    #[test]
    fn the_sender_precheck_refuses_what_the_target_would() {
        let key = SoftRkey {
            region_id: 1,
            secret: 2,
            base: 0x1000,
            len: 0x100,
            access: Access::REMOTE_READ,
        };
        assert!(key.precheck(0x1000, 0x100, Access::REMOTE_READ).is_ok());
        assert!(matches!(
            key.precheck(0x10f8, 0x10, Access::REMOTE_READ),
            Err(UctError::OutOfRange { .. })
        ));
        assert!(matches!(
            key.precheck(0xff8, 8, Access::REMOTE_READ),
            Err(UctError::OutOfRange { .. })
        ));
        assert!(matches!(
            key.precheck(0x1000, 8, Access::REMOTE_WRITE),
            Err(UctError::AccessDenied { .. })
        ));
    }

    #[test]
    fn secrets_differ_between_registrations() {
        let table = RegionTable::new();
        let regs: Vec<Registration> = (0..32)
            .map(|i| table.insert(0x1000 * (i + 1), 0x100, Access::all()))
            .collect();
        let mut secrets: Vec<u64> = regs.iter().map(|r| r.key().secret).collect();
        secrets.sort_unstable();
        secrets.dedup();
        assert_eq!(
            secrets.len(),
            regs.len(),
            "two registrations share a secret"
        );
        assert!(secrets.iter().all(|&s| s > 1), "a guessable secret");
    }

    #[test]
    fn find_containing_covers_exactly_the_region() {
        let table = RegionTable::new();
        assert!(table.is_empty());
        assert_eq!(table.find_containing(0x2000), None);
        let reg = table.insert(0x2000, 0x100, Access::all());
        assert_eq!((table.len(), table.is_empty()), (1, false));
        for inside in [0x2000, 0x2080, 0x20ff] {
            assert_eq!(table.find_containing(inside), Some((0x2000, 0x100)));
        }
        for outside in [0x1fff, 0x2100, 0] {
            assert_eq!(table.find_containing(outside), None, "{outside:#x}");
        }
        drop(reg);
        assert!(table.is_empty());
    }

    #[test]
    fn the_fallback_secret_depends_on_both_inputs() {
        for fixed in [0, u64::MAX, 0x1234_5678_9abc_def0] {
            let mut by_address: Vec<u64> = (0..64).map(|a| mix_fallback(fixed, a << 3)).collect();
            let mut by_time: Vec<u64> = (0..64).map(|t| mix_fallback(t * 977, fixed)).collect();
            for secrets in [&mut by_address, &mut by_time] {
                secrets.sort_unstable();
                secrets.dedup();
                assert_eq!(secrets.len(), 64, "inputs collide with {fixed:#x} fixed");
            }
        }
    }
}
