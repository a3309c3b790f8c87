//! Remote keys as strings, and the remote buffers read back from them.
//!
//! `uctkey:v2:<base hex>:<len>:<rights hex>:<memory type>:<rail 0 bundle hex>,<rail 1 bundle hex>,...#<check>`
//!
//! One rkey bundle per rail of the Transport that registered the memory
//! (version 2; version 1 had one bundle and no rails, and is refused by
//! name). Each bundle holds one packed rkey per memory domain that rail's
//! memory was registered with (before connect, one per candidate
//! transport); the writer picks, on each of its rails, the entry of that
//! rail's transport. A key of another rail count than the writer's
//! connection is refused by name: the two sides connect only with the same
//! rails, so such a key is another Transport's. A key
//! comes from the peer: parsing checks everything and never panics, and the
//! peer's transport checks every access against the registration anyway
//! (a forged or stale key is refused there).

use std::sync::{Arc, Mutex, OnceLock};

use uct_core::{Access, MemoryType, Registry, RemoteKey, RkeyBundle};

use crate::error::{Result, TransferError};
use crate::text::{check, hex, unhex, verified};

/// The format version of keys this build writes and reads.
pub const KEY_VERSION: u32 = 2;

const PREFIX: &str = "uctkey:";

/// The most rails a key (and a Transport) has.
pub const MAX_RAILS: usize = 16;

/// Longest key read: the bundles of every rail together are at most
/// 64 KiB, twice that in hex.
const MAX_KEY: usize = 2 * uct_core::rkey::RKEY_MAX_BYTES + 256 + MAX_RAILS;

/// Writes the key of a registered region.
pub(crate) fn format(
    base: u64,
    len: usize,
    access: Access,
    mem_type: MemoryType,
    rails: &[Vec<u8>],
) -> String {
    let bundles: Vec<String> = rails.iter().map(|b| hex(b)).collect();
    let body = format!(
        "{PREFIX}v{KEY_VERSION}:{base:x}:{len}:{:x}:{}:{}",
        access.bits(),
        mem_type.name(),
        bundles.join(",")
    );
    let sum = check(&body);
    format!("{body}#{sum}")
}

/// A key unpacked for (rail, memory domain).
type Unpacked = ((usize, String), Arc<RemoteKey>);

struct Key {
    base: u64,
    access: Access,
    mem_type: MemoryType,
    /// One bundle per rail.
    rails: Vec<RkeyBundle>,
    text: String,
    /// The key unpacked for the first (rail, memory domain) that used it:
    /// a buffer is typically written through one transport, over and over,
    /// and this is read without a lock.
    first: OnceLock<Unpacked>,
    /// Keys unpacked for other rails and memory domains.
    unpacked: Mutex<Vec<Unpacked>>,
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
            return Err(bad(format!(
                "{} bytes, more than the {MAX_KEY} a key may have: pass the key alone, as the peer's Memory::remote_key wrote it",
                key.len()
            )));
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
        let [_, base, len, access, mem_type, bundles] = fields[..] else {
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
        let bundles: Vec<&str> = bundles.split(',').collect();
        if bundles.len() > MAX_RAILS {
            return Err(bad(format!(
                "it carries {} rails, more than the {MAX_RAILS} a Transport may have",
                bundles.len()
            )));
        }
        let mut rails = Vec::with_capacity(bundles.len());
        for (i, b) in bundles.iter().enumerate() {
            let bytes =
                unhex(b).ok_or_else(|| bad(format!("its rail {i} rkey bundle is not hex")))?;
            let bundle = RkeyBundle::unpack(&bytes)
                .map_err(|e| bad(format!("its rail {i} rkey bundle: {e}")))?;
            rails.push(bundle);
        }
        Ok(RemoteBuffer {
            key: Arc::new(Key {
                base,
                access,
                mem_type,
                rails,
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

    /// The rails the key carries (the Transport that registered the
    /// memory had that many).
    pub fn rails(&self) -> usize {
        self.key.rails.len()
    }

    /// The rkey for memory domain `md` of `component` on `rail` of a
    /// connection of `rails` rails: the entry that MD packed, or, across
    /// hosts whose NICs have other names, the entry of the same component.
    /// A key of another rail count is refused by name.
    pub(crate) fn rkey_for(
        &self,
        rail: usize,
        rails: usize,
        component: &str,
        md: &str,
    ) -> Result<Arc<RemoteKey>> {
        if self.key.rails.len() != rails {
            return Err(TransferError::BadKey {
                why: format!(
                    "it carries {} rail(s), and this connection has {rails}: the peer registered that memory with another of its Transports; the peer must register it with the Transport this one connected to (and send that key)",
                    self.key.rails.len()
                ),
            });
        }
        if let Some(((r, m), k)) = self.key.first.get() {
            if *r == rail && m == md {
                return Ok(k.clone());
            }
        }
        let mut cache = self.key.unpacked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = cache.iter().find(|((r, m), _)| *r == rail && m == md) {
            return Ok(k.clone());
        }
        let entries = self
            .key
            .rails
            .get(rail)
            .ok_or_else(|| TransferError::BadKey {
                why: format!("it has no rail {rail}"),
            })?
            .entries();
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
        if self
            .key
            .first
            .set(((rail, md.to_string()), rkey.clone()))
            .is_err()
        {
            cache.push(((rail, md.to_string()), rkey.clone()));
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
        let key = format(0x1000, 4096, Access::all(), MemoryType::Host, &[bundle()]);
        assert_eq!(RemoteBuffer::parse(&key).unwrap().rails(), 1);
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
        let key = format(0x1000, 4096, Access::all(), MemoryType::Host, &[bundle()]);
        let why = |s: &str| match RemoteBuffer::parse(s) {
            Err(TransferError::BadKey { why }) => why,
            other => panic!("{s:?}: {other:?}"),
        };
        assert!(why("garbage").contains("does not start"));
        assert!(why(&key.replacen("v2", "v7", 1)).contains("version 7"));
        // A version 1 key (one bundle, no rails) is named as such.
        let body = format!("{PREFIX}v1:1000:4096:1f:host:{}", hex(&bundle()));
        assert!(why(&format!("{body}#{}", check(&body))).contains("format version 1"));
        for cut in PREFIX.len()..key.len() {
            let w = why(&key[..cut]);
            assert!(w.contains("truncated"), "cut at {cut}: {w}");
        }
        assert!(why(&key.replacen(":1000:", ":1001:", 1)).contains("altered"));
        let body = format!("{PREFIX}v2:ffffffffffffffff:2:1f:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("overflows"));
        let body = format!("{PREFIX}v2:0:2:ff:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("rights"));
        let body = format!("{PREFIX}v2:0:2:1f:host:00");
        assert!(why(&format!("{body}#{}", check(&body))).contains("rail 0 rkey"));
    }

    #[test]
    fn rails_of_a_key_are_bounded_and_each_is_checked() {
        let b = hex(&bundle());
        let why = |body: String| match RemoteBuffer::parse(&format!("{body}#{}", check(&body))) {
            Err(TransferError::BadKey { why }) => why,
            other => panic!("{body:?}: {other:?}"),
        };
        let two = format!("{PREFIX}v2:1000:64:1f:host:{b},{b}");
        let remote = RemoteBuffer::parse(&format!("{two}#{}", check(&two))).unwrap();
        assert_eq!(remote.rails(), 2);
        // Another rail count than the connection's is refused by name.
        let w = match remote.rkey_for(0, 1, "self", "self") {
            Err(TransferError::BadKey { why }) => why,
            other => panic!("{other:?}"),
        };
        assert!(w.contains("2 rail(s)") && w.contains("has 1"), "{w}");
        // It is the peer's memory: the peer has to act, not this side.
        assert!(w.contains("the peer must register it"), "{w}");
        let long = "x".repeat(MAX_KEY + 1);
        assert!(why(long.clone()).contains("pass the key alone"));
        // With the same rail count, rail 1's entry is unpacked (this
        // payload is not a real self rkey: its refusal is the component's).
        if let Err(e) = remote.rkey_for(1, 2, "self", "self") {
            assert!(!e.to_string().contains("rail(s)"), "{e}");
        }
        let many = vec![b.clone(); MAX_RAILS + 1].join(",");
        assert!(why(format!("{PREFIX}v2:1000:64:1f:host:{many}")).contains("17 rails"));
        assert!(why(format!("{PREFIX}v2:1000:64:1f:host:{b},zz"))
            .contains("rail 1 rkey bundle is not hex"));
        assert!(why(format!("{PREFIX}v2:1000:64:1f:host:{b},")).contains("rail 1 rkey"));
        assert!(why(format!("{PREFIX}v2:1000:64:1f:host:{b},0102")).contains("rail 1 rkey"));
    }
}
