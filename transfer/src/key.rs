//! Remote keys as strings, and the remote buffers read back from them.
//!
//! `uctkey:v1:<base hex>:<len>:<rights hex>:<memory type>:<rkey bundle hex>#<check>`
//!
//! The bundle holds one packed rkey per memory domain the memory was
//! registered with; the writer picks the entry of its own transport. A key
//! comes from the peer: parsing checks everything and never panics, and the
//! peer's transport checks every access against the registration anyway
//! (a forged or stale key is refused there).

use std::sync::{Arc, Mutex, OnceLock};

use uct_core::{Access, MemoryType, Registry, RemoteKey, RkeyBundle};

use crate::error::{Result, TransferError};
use crate::text::{check, hex, unhex, verified};

/// The format version of keys this build writes and reads.
pub const KEY_VERSION: u32 = 1;

const PREFIX: &str = "uctkey:";

/// Longest key read: a bundle is at most 64 KiB, twice that in hex.
const MAX_KEY: usize = 2 * uct_core::rkey::RKEY_MAX_BYTES + 256;

/// Writes the key of a registered region.
pub(crate) fn format(
    base: u64,
    len: usize,
    access: Access,
    mem_type: MemoryType,
    bundle: &[u8],
) -> String {
    let body = format!(
        "{PREFIX}v{KEY_VERSION}:{base:x}:{len}:{:x}:{}:{}",
        access.bits(),
        mem_type.name(),
        hex(bundle)
    );
    let sum = check(&body);
    format!("{body}#{sum}")
}

struct Key {
    base: u64,
    access: Access,
    mem_type: MemoryType,
    bundle: RkeyBundle,
    text: String,
    /// The key unpacked for the first memory domain that used it: a
    /// buffer is typically written through one transport, over and over,
    /// and this is read without a lock.
    first: OnceLock<(String, Arc<RemoteKey>)>,
    /// Keys unpacked for other memory domains, by name.
    unpacked: Mutex<Vec<(String, Arc<RemoteKey>)>>,
}

/// A peer's registered memory, or a slice of it, as its remote key
/// describes it: what `write` and `read` take. Cheap to clone.
#[derive(Clone)]
pub struct RemoteBuffer {
    key: Arc<Key>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for RemoteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("access", &self.key.access)
            .field("mem_type", &self.key.mem_type)
            .finish()
    }
}

impl RemoteBuffer {
    /// Reads a key written by the peer's [`Memory::remote_key`](crate::Memory::remote_key).
    /// A key of another version, a truncated or altered one, and garbage are
    /// each refused by name.
    pub fn parse(key: &str) -> Result<RemoteBuffer> {
        let bad = |why: String| TransferError::BadKey { why };
        let key = key.trim();
        if key.len() > MAX_KEY {
            return Err(bad(format!("{} bytes, more than {MAX_KEY}", key.len())));
        }
        let rest = key
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad(format!("it does not start with {PREFIX}")))?;
        let version = rest.split([':', '#']).next().unwrap_or_default();
        match version.strip_prefix('v').map(str::parse::<u32>) {
            Some(Ok(KEY_VERSION)) => {}
            Some(Ok(v)) => {
                return Err(bad(format!(
                    "it is format version {v}, this build reads version {KEY_VERSION}; run the same uct-rs version on both sides"
                )))
            }
            _ => {
                return Err(bad(format!(
                    "its version {version:?} is not v<number> (truncated?)"
                )))
            }
        }
        let body = verified(key).map_err(|why| bad(format!("truncated or altered: {why}")))?;
        let fields: Vec<&str> = body[PREFIX.len()..].split(':').collect();
        let [_, base, len, access, mem_type, bundle] = fields[..] else {
            return Err(bad(format!("{} fields, not 6", fields.len())));
        };
        let base = u64::from_str_radix(base, 16).map_err(|_| bad("its base is not hex".into()))?;
        let len: usize = len
            .parse()
            .map_err(|_| bad("its length is not a number".into()))?;
        if base.checked_add(len as u64).is_none() {
            return Err(bad("its base plus length overflows".into()));
        }
        let access = u8::from_str_radix(access, 16)
            .ok()
            .and_then(Access::from_bits)
            .ok_or_else(|| bad("its rights are not known rights".into()))?;
        let mem_type = MemoryType::parse(mem_type).map_err(|e| bad(e.to_string()))?;
        let bytes = unhex(bundle).ok_or_else(|| bad("its rkey bundle is not hex".into()))?;
        let bundle = RkeyBundle::unpack(&bytes).map_err(|e| bad(e.to_string()))?;
        Ok(RemoteBuffer {
            key: Arc::new(Key {
                base,
                access,
                mem_type,
                bundle,
                text: key.to_string(),
                first: OnceLock::new(),
                unpacked: Mutex::new(Vec::new()),
            }),
            offset: 0,
            len,
        })
    }

    /// `len` bytes from `offset` of this buffer; out of range is refused.
    pub fn slice(&self, offset: usize, len: usize) -> Result<RemoteBuffer> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteBuffer {
                key: self.key.clone(),
                offset: self.offset + offset,
                len,
            }),
            _ => Err(TransferError::OutOfRange {
                what: "remote slice",
                offset,
                len,
                of: "remote buffer",
                size: self.len,
            }),
        }
    }

    /// The remote address this buffer starts at.
    pub fn addr(&self) -> u64 {
        self.key.base + self.offset as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rights the peer granted.
    pub fn access(&self) -> Access {
        self.key.access
    }

    /// The memory type of the peer's memory.
    pub fn mem_type(&self) -> MemoryType {
        self.key.mem_type
    }

    /// The key this buffer was read from (of the whole region).
    pub fn key(&self) -> &str {
        &self.key.text
    }

    /// The rkey for memory domain `md` of `component`: the entry that MD
    /// packed, or, across hosts whose NICs have other names, the entry of
    /// the same component.
    pub(crate) fn rkey_for(&self, component: &str, md: &str) -> Result<Arc<RemoteKey>> {
        if let Some((m, k)) = self.key.first.get() {
            if m == md {
                return Ok(k.clone());
            }
        }
        let mut cache = self.key.unpacked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = cache.iter().find(|(m, _)| m == md) {
            return Ok(k.clone());
        }
        let entries = self.key.bundle.entries();
        let entry = entries
            .iter()
            .find(|e| e.md == md && e.component == component)
            .or_else(|| entries.iter().find(|e| e.component == component))
            .ok_or_else(|| TransferError::KeyTransport {
                registered: entries
                    .iter()
                    .map(|e| format!("{} ({})", e.md, e.component))
                    .collect::<Vec<_>>()
                    .join(", "),
                ours: format!("{md} ({component})"),
            })?;
        let comp = Registry::global()
            .component(&entry.component)
            .ok_or_else(|| TransferError::BadKey {
                why: format!("component {} is not in this process", entry.component),
            })?;
        let rkey = Arc::new(
            comp.unpack_rkey(entry)
                .map_err(|e| TransferError::BadKey { why: e.to_string() })?,
        );
        if self.key.first.set((md.to_string(), rkey.clone())).is_err() {
            cache.push((md.to_string(), rkey.clone()));
        }
        Ok(rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_core::RkeyEntry;

    fn bundle() -> Vec<u8> {
        RkeyBundle::single(RkeyEntry {
            component: "self".into(),
            md: "self".into(),
            payload: vec![1, 2, 3],
        })
        .pack()
        .unwrap()
    }

    #[test]
    fn a_key_round_trips_and_slices_are_bounded() {
        let key = format(0x1000, 4096, Access::all(), MemoryType::Host, &bundle());
        let remote = RemoteBuffer::parse(&key).unwrap();
        assert_eq!((remote.addr(), remote.len()), (0x1000, 4096));
        assert_eq!(remote.access(), Access::all());
        assert_eq!(remote.key(), key);
        let s = remote.slice(100, 200).unwrap();
        assert_eq!((s.addr(), s.len()), (0x1000 + 100, 200));
        let s2 = s.slice(50, 150).unwrap();
        assert_eq!((s2.addr(), s2.len()), (0x1000 + 150, 150));
        assert!(matches!(
            s.slice(50, 151),
            Err(TransferError::OutOfRange {
                what: "remote slice",
                ..
            })
        ));
        assert!(remote.slice(usize::MAX, 2).is_err());
        assert!(remote.slice(4096, 0).is_ok());
    }

    #[test]
    fn wrong_keys_are_refused_by_name() {
        let key = format(0x1000, 4096, Access::all(), MemoryType::Host, &bundle());
        let why = |s: &str| match RemoteBuffer::parse(s) {
            Err(TransferError::BadKey { why }) => why,
            other => panic!("{s:?}: {other:?}"),
        };
        assert!(why("garbage").contains("does not start"));
        assert!(why(&key.replacen("v1", "v7", 1)).contains("version 7"));
        for cut in PREFIX.len()..key.len() {
            let w = why(&key[..cut]);
            assert!(w.contains("truncated"), "cut at {cut}: {w}");
        }
        assert!(why(&key.replacen(":1000:", ":1001:", 1)).contains("altered"));
        let body = format!("{PREFIX}v1:ffffffffffffffff:2:1f:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("overflows"));
        let body = format!("{PREFIX}v1:0:2:ff:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("rights"));
        let body = format!("{PREFIX}v1:0:2:1f:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("rkey"));
    }
}
