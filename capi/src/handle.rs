//! Handles: opaque pointer-typed values that C holds. A handle is never
//! dereferenced; it encodes an id and a kind, and every call looks the id
//! up in the table of its kind. So a NULL, freed, never-issued or
//! wrong-kind handle is an error with a message, never a crash. Ids come
//! from one counter and are never reused: a freed handle stays freed.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use crate::error::CapiError;

/// What a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Transport = 1,
    Memory = 2,
    View = 3,
    Remote = 4,
    Request = 5,
    Listing = 6,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Transport,
        Kind::Memory,
        Kind::View,
        Kind::Remote,
        Kind::Request,
        Kind::Listing,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Transport => "transport",
            Kind::Memory => "memory",
            Kind::View => "view",
            Kind::Remote => "remote buffer",
            Kind::Request => "request",
            Kind::Listing => "listing",
        }
    }

    /// The functions that make and free handles of this kind.
    fn made_by(self) -> (&'static str, &'static str) {
        match self {
            Kind::Transport => ("uct_rs_transport_create", "uct_rs_transport_destroy"),
            Kind::Memory => ("uct_rs_mem_alloc or uct_rs_mem_register", "uct_rs_mem_free"),
            Kind::View => ("uct_rs_mem_view", "uct_rs_view_free"),
            Kind::Remote => (
                "uct_rs_remote_parse or uct_rs_remote_slice",
                "uct_rs_remote_free",
            ),
            Kind::Request => (
                "uct_rs_write, uct_rs_read or uct_rs_flush",
                "uct_rs_request_free",
            ),
            Kind::Listing => ("uct_rs_listing_create", "uct_rs_listing_free"),
        }
    }

    /// The low byte of its handles: never 0, so that no handle is NULL,
    /// and unlikely in a pointer of the application's (those are aligned).
    fn tag(self) -> usize {
        0xa0 | self as usize
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bits of a handle below its id.
const TAG_BITS: u32 = 8;

/// Ids above this do not fit a handle.
const MAX_ID: u64 = (usize::MAX >> TAG_BITS) as u64;

/// The next id, of any kind.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn encode(kind: Kind, id: u64) -> usize {
    ((id as usize) << TAG_BITS) | kind.tag()
}

fn decode(addr: usize) -> Option<(Kind, u64)> {
    let tag = addr & ((1 << TAG_BITS) - 1);
    let kind = Kind::ALL.into_iter().find(|k| k.tag() == tag)?;
    Some((kind, (addr >> TAG_BITS) as u64))
}

/// A table of live handles of one kind, to values of type `T`.
pub(crate) struct Table<T> {
    kind: Kind,
    map: DashMap<u64, Arc<T>>,
}

impl<T> Table<T> {
    pub(crate) fn new(kind: Kind) -> Table<T> {
        Table {
            kind,
            map: DashMap::new(),
        }
    }

    /// Enters `value` and returns its new handle, as C's pointer type `O`.
    pub(crate) fn insert<O>(&self, value: Arc<T>) -> Result<*mut O, CapiError> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if id > MAX_ID {
            return Err(CapiError::Internal(format!(
                "this process has made {MAX_ID} handles, the most a handle can number; restart it"
            )));
        }
        self.map.insert(id, value);
        Ok(std::ptr::without_provenance_mut(encode(self.kind, id)))
    }

    /// The id in `handle` (passed as parameter `param`), checked to be of
    /// this kind.
    fn id_of<O>(&self, handle: *mut O, param: &'static str) -> Result<u64, CapiError> {
        let (made, _) = self.kind.made_by();
        let addr = handle.addr();
        if addr == 0 {
            return Err(CapiError::InvalidHandle(format!(
                "{param} is NULL; pass the {} handle that {made} gave",
                self.kind
            )));
        }
        match decode(addr) {
            None => Err(CapiError::InvalidHandle(format!(
                "{param} ({addr:#x}) is not a uct-rs handle (a pointer of the program's own, or garbage); pass the {} handle that {made} gave",
                self.kind
            ))),
            Some((kind, _)) if kind != self.kind => Err(CapiError::InvalidHandle(format!(
                "{param} is a {kind} handle, not a {} handle; pass the {} handle that {made} gave",
                self.kind, self.kind
            ))),
            Some((_, id)) => Ok(id),
        }
    }

    fn gone(&self, param: &'static str, id: u64) -> CapiError {
        let (made, freed) = self.kind.made_by();
        if id >= NEXT_ID.load(Ordering::Relaxed) {
            CapiError::InvalidHandle(format!(
                "{param} is a {} handle that was never issued (id {id}); pass the handle that {made} gave",
                self.kind
            ))
        } else {
            CapiError::InvalidHandle(format!(
                "{param} is a {} handle that was freed (id {id}, by {freed}); a handle cannot be used after it is freed",
                self.kind
            ))
        }
    }

    /// The value of `handle`.
    pub(crate) fn get<O>(&self, handle: *mut O, param: &'static str) -> Result<Arc<T>, CapiError> {
        let id = self.id_of(handle, param)?;
        self.map
            .get(&id)
            .map(|v| v.value().clone())
            .ok_or_else(|| self.gone(param, id))
    }

    /// Takes `handle` out of the table: later calls with it fail.
    pub(crate) fn remove<O>(
        &self,
        handle: *mut O,
        param: &'static str,
    ) -> Result<Arc<T>, CapiError> {
        let id = self.id_of(handle, param)?;
        self.map
            .remove(&id)
            .map(|(_, v)| v)
            .ok_or_else(|| self.gone(param, id))
    }
}

/// Waits until `value` is the last reference, then drops it: other
/// threads hold a value only for the length of a call (a wait gives it up
/// at least every [`crate::request::SLICE`]), so that what a free or
/// destroy promises holds once it returns.
pub(crate) fn drop_last<T>(mut value: Arc<T>) {
    loop {
        match Arc::try_unwrap(value) {
            Ok(v) => {
                drop(v);
                return;
            }
            Err(back) => {
                value = back;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_by_kind_id_and_life() {
        let t: Table<u32> = Table::new(Kind::Memory);
        let other: Table<u32> = Table::new(Kind::View);
        let h: *mut u8 = t.insert(Arc::new(7)).unwrap();
        assert_eq!(*t.get(h, "mem").unwrap(), 7);
        let wrong = other.get(h, "view").unwrap_err().to_string();
        assert!(
            wrong.contains("is a memory handle, not a view handle"),
            "{wrong}"
        );
        let null = t
            .get(std::ptr::null_mut::<u8>(), "mem")
            .unwrap_err()
            .to_string();
        assert!(null.contains("mem is NULL"), "{null}");
        let junk = t.get(std::ptr::without_provenance_mut::<u8>(0x1000), "mem");
        assert!(junk
            .unwrap_err()
            .to_string()
            .contains("not a uct-rs handle"));
        assert_eq!(*t.remove(h, "mem").unwrap(), 7);
        let freed = t.get(h, "mem").unwrap_err().to_string();
        assert!(freed.contains("was freed"), "{freed}");
        assert!(t.remove(h, "mem").is_err());
        let future: *mut u8 = std::ptr::without_provenance_mut(encode(Kind::Memory, MAX_ID - 1));
        let never = t.get(future, "mem").unwrap_err().to_string();
        assert!(never.contains("never issued"), "{never}");
        // Ids are not reused.
        let h2: *mut u8 = t.insert(Arc::new(8)).unwrap();
        assert_ne!(h, h2);
    }
}
