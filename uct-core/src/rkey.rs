//! Remote keys: a versioned, self-describing blob (magic, version, then one
//! entry per memory domain that registered the region). Unpacking untrusted
//! bytes returns a value or an error, never a panic.

use std::any::{Any, TypeId};
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Result, UctError};

/// First bytes of every packed rkey.
pub const RKEY_MAGIC: [u8; 4] = *b"UCTK";
/// Format version written by this build; older or newer versions are refused.
pub const RKEY_VERSION: u16 = 1;
/// Largest packed rkey accepted.
pub const RKEY_MAX_BYTES: usize = 64 * 1024;
/// Most MD entries in one bundle.
pub const RKEY_MAX_ENTRIES: usize = 16;
const NAME_MAX: usize = 64;

/// What one memory domain packed for one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RkeyEntry {
    /// Component that can unpack `payload`.
    pub component: String,
    /// Memory domain that registered the region.
    pub md: String,
    /// The MD's own payload, opaque to everyone else.
    pub payload: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Blob {
    magic: [u8; 4],
    version: u16,
    entries: Vec<RkeyEntry>,
}

/// The keys of one region for every MD that registered it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RkeyBundle {
    entries: Vec<RkeyEntry>,
}

impl RkeyBundle {
    /// An empty bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// A bundle with one entry.
    pub fn single(entry: RkeyEntry) -> Self {
        RkeyBundle {
            entries: vec![entry],
        }
    }

    /// Adds an MD's entry; an entry for the same MD is replaced.
    pub fn push(&mut self, entry: RkeyEntry) -> Result<()> {
        validate_entry(&entry)?;
        self.entries
            .retain(|e| !(e.component == entry.component && e.md == entry.md));
        if self.entries.len() >= RKEY_MAX_ENTRIES {
            return Err(UctError::BadRkey(format!(
                "a bundle holds at most {RKEY_MAX_ENTRIES} entries"
            )));
        }
        self.entries.push(entry);
        Ok(())
    }

    /// Its entries, one per memory domain.
    pub fn entries(&self) -> &[RkeyEntry] {
        &self.entries
    }

    /// The entry packed by memory domain `md`.
    pub fn find(&self, md: &str) -> Result<&RkeyEntry> {
        self.entries.iter().find(|e| e.md == md).ok_or_else(|| {
            let found: Vec<&str> = self.entries.iter().map(|e| e.md.as_str()).collect();
            UctError::RkeyMismatch {
                expected: format!("memory domain {md}"),
                found: if found.is_empty() {
                    "no memory domain".into()
                } else {
                    format!("memory domains {}", found.join(", "))
                },
            }
        })
    }

    /// The bytes to send to a peer.
    pub fn pack(&self) -> Result<Vec<u8>> {
        let blob = Blob {
            magic: RKEY_MAGIC,
            version: RKEY_VERSION,
            entries: self.entries.clone(),
        };
        let bytes = postcard::to_stdvec(&blob)
            .map_err(|e| UctError::BadRkey(format!("cannot encode: {e}")))?;
        if bytes.len() > RKEY_MAX_BYTES {
            return Err(UctError::BadRkey(format!(
                "packed rkey of {} bytes exceeds {RKEY_MAX_BYTES}",
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    /// Parses bytes from a peer. Never panics; every malformed input is an
    /// error that says what was wrong.
    pub fn unpack(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > RKEY_MAX_BYTES {
            return Err(UctError::BadRkey(format!(
                "{} bytes is more than the {RKEY_MAX_BYTES} an rkey may have",
                bytes.len()
            )));
        }
        if bytes.len() < RKEY_MAGIC.len() + 1 {
            return Err(UctError::BadRkey(format!("only {} bytes", bytes.len())));
        }
        if bytes[..4] != RKEY_MAGIC {
            return Err(UctError::BadRkey("wrong magic: not an rkey".into()));
        }
        let (blob, rest): (Blob, &[u8]) = postcard::take_from_bytes(bytes)
            .map_err(|e| UctError::BadRkey(format!("truncated or corrupt: {e}")))?;
        if blob.version != RKEY_VERSION {
            return Err(UctError::BadRkey(format!(
                "format version {} is not {RKEY_VERSION}; both sides must run the same uct-rs version",
                blob.version
            )));
        }
        if !rest.is_empty() {
            return Err(UctError::BadRkey(format!(
                "{} unexpected trailing bytes",
                rest.len()
            )));
        }
        if blob.entries.is_empty() {
            return Err(UctError::BadRkey("no memory domain entries".into()));
        }
        if blob.entries.len() > RKEY_MAX_ENTRIES {
            return Err(UctError::BadRkey(format!(
                "{} entries, at most {RKEY_MAX_ENTRIES} allowed",
                blob.entries.len()
            )));
        }
        for e in &blob.entries {
            validate_entry(e)?;
        }
        Ok(RkeyBundle {
            entries: blob.entries,
        })
    }
}

fn validate_entry(e: &RkeyEntry) -> Result<()> {
    let ok_name = |s: &str| {
        !s.is_empty()
            && s.len() <= NAME_MAX
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
    };
    if !ok_name(&e.component) || !ok_name(&e.md) {
        return Err(UctError::BadRkey(
            "component or memory domain name is empty, too long or not printable".into(),
        ));
    }
    Ok(())
}

/// Encodes an MD's payload.
pub fn encode_payload<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(|e| UctError::BadRkey(format!("cannot encode payload: {e}")))
}

/// Decodes an MD's payload, refusing trailing bytes.
pub fn decode_payload<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (v, rest) = postcard::take_from_bytes::<T>(bytes)
        .map_err(|e| UctError::BadRkey(format!("payload truncated or corrupt: {e}")))?;
    if !rest.is_empty() {
        return Err(UctError::BadRkey(format!(
            "payload has {} unexpected trailing bytes",
            rest.len()
        )));
    }
    Ok(v)
}

/// An unpacked rkey, ready for the transports of the component that
/// unpacked it.
pub struct RemoteKey {
    component: String,
    md: String,
    inner: Box<dyn Any + Send + Sync>,
    /// `inner`'s concrete type, read once: [`downcast`](Self::downcast)
    /// runs on every remote access, and `Any::type_id` is a call through
    /// the vtable (with the compare, 8% of a posix 8 B get).
    inner_type: TypeId,
}

impl RemoteKey {
    /// A key of `component`'s MD `md`; `inner` is the component's own key type.
    pub fn new(
        component: impl Into<String>,
        md: impl Into<String>,
        inner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        // The boxed value's type, not the Box's: deref first.
        let inner_type = (*inner).type_id();
        RemoteKey {
            component: component.into(),
            md: md.into(),
            inner,
            inner_type,
        }
    }

    /// The component that unpacked it.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// The memory domain whose memory it reaches.
    pub fn md(&self) -> &str {
        &self.md
    }

    /// The component's own key type, or an error naming both sides.
    #[inline]
    pub fn downcast<T: 'static>(&self, expected_md: &str) -> Result<&T> {
        if self.inner_type == TypeId::of::<T>() {
            let ptr = &*self.inner as *const (dyn Any + Send + Sync) as *const T;
            // SAFETY: inner_type is the TypeId of the value `inner` holds
            // (read in `new`, and `inner` is never replaced), so that value
            // is a T; the reference borrows `self`, which owns the box.
            return Ok(unsafe { &*ptr });
        }
        Err(self.mismatch(expected_md))
    }

    #[cold]
    fn mismatch(&self, expected_md: &str) -> UctError {
        UctError::RkeyMismatch {
            expected: format!("memory domain {expected_md}"),
            found: format!("memory domain {} of component {}", self.md, self.component),
        }
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteKey")
            .field("component", &self.component)
            .field("md", &self.md)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RkeyBundle {
        let mut b = RkeyBundle::new();
        b.push(RkeyEntry {
            component: "self".into(),
            md: "self".into(),
            payload: vec![1, 2, 3, 4, 5, 6, 7, 8],
        })
        .unwrap();
        b.push(RkeyEntry {
            component: "ib".into(),
            md: "mlx5_0".into(),
            payload: vec![9; 40],
        })
        .unwrap();
        b
    }

    #[test]
    fn bundle_round_trips() {
        let b = sample();
        let bytes = b.pack().unwrap();
        assert_eq!(RkeyBundle::unpack(&bytes).unwrap(), b);
        assert_eq!(b.find("mlx5_0").unwrap().payload, vec![9; 40]);
        assert!(matches!(
            b.find("gaudi0"),
            Err(UctError::RkeyMismatch { .. })
        ));
    }

    #[test]
    fn wrong_version_and_trailing_bytes_are_refused() {
        let mut bytes = sample().pack().unwrap();
        bytes.push(0);
        assert!(
            matches!(RkeyBundle::unpack(&bytes), Err(UctError::BadRkey(m)) if m.contains("trailing"))
        );
        let mut bytes = sample().pack().unwrap();
        bytes[4] = 7; // version varint
        assert!(
            matches!(RkeyBundle::unpack(&bytes), Err(UctError::BadRkey(m)) if m.contains("version"))
        );
    }

    /// Simple xorshift so the test needs no extra crate and is reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// What one fuzz category did: keys refused, and keys accepted.
    #[derive(Debug, Default)]
    struct Tally {
        refused: usize,
        accepted: usize,
    }

    #[test]
    fn every_truncation_of_a_good_key_is_refused() {
        let good = sample().pack().unwrap();
        for len in 0..good.len() {
            assert!(
                matches!(RkeyBundle::unpack(&good[..len]), Err(UctError::BadRkey(_))),
                "the first {len} of {} bytes were accepted",
                good.len()
            );
        }
    }

    #[test]
    fn hundred_thousand_random_and_truncated_rkeys_never_panic() {
        const NAMES: [&str; 4] = ["truncated", "flipped", "magic+noise", "noise"];
        let good = sample().pack().unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut tally: [Tally; 4] = Default::default();
        for i in 0..100_000u32 {
            let category = (i % 4) as usize;
            let bytes: Vec<u8> = match category {
                // Truncations of a good key.
                0 => good[..(rng.next() as usize % good.len())].to_vec(),
                // A good key with random bytes flipped.
                1 => {
                    let mut b = good.clone();
                    for _ in 0..1 + rng.next() % 4 {
                        let at = rng.next() as usize % b.len();
                        b[at] = rng.next() as u8;
                    }
                    b
                }
                // Magic and version, then random bytes.
                2 => {
                    let mut b = good[..5].to_vec();
                    let n = rng.next() as usize % 200;
                    b.extend((0..n).map(|_| rng.next() as u8));
                    b
                }
                // Pure noise.
                _ => {
                    let n = rng.next() as usize % 300;
                    (0..n).map(|_| rng.next() as u8).collect()
                }
            };
            match RkeyBundle::unpack(&bytes) {
                Ok(b) => {
                    tally[category].accepted += 1;
                    assert!(!b.entries().is_empty());
                    // What is accepted is a well-formed key: it packs back
                    // to exactly the bytes it came from.
                    assert_eq!(
                        b.pack().unwrap(),
                        bytes,
                        "{} key accepted but not canonical",
                        NAMES[category]
                    );
                }
                Err(UctError::BadRkey(_)) => tally[category].refused += 1,
                Err(other) => panic!("unexpected error kind: {other}"),
            }
        }
        for (name, t) in NAMES.iter().zip(&tally) {
            assert_eq!(t.refused + t.accepted, 25_000, "{name}: {t:?}");
        }
        // Every truncation is refused, counted in its own category.
        assert_eq!(
            tally[0].accepted, 0,
            "truncated keys accepted: {:?}",
            tally[0]
        );
        assert_eq!(tally[0].refused, 25_000);
        // Noise never carries the magic, so none of it can be a key.
        assert_eq!(tally[3].accepted, 0, "noise accepted: {:?}", tally[3]);
    }

    fn entry(component: &str, md: &str, payload: Vec<u8>) -> RkeyEntry {
        RkeyEntry {
            component: component.into(),
            md: md.into(),
            payload,
        }
    }

    /// Bytes a peer could send: the rkey format with entries this side's
    /// `push` and `pack` would never produce (too many, too large, bad names).
    fn forged(entries: Vec<RkeyEntry>) -> Vec<u8> {
        postcard::to_stdvec(&Blob {
            magic: RKEY_MAGIC,
            version: RKEY_VERSION,
            entries,
        })
        .unwrap()
    }

    fn bad_rkey<T: fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(UctError::BadRkey(m)) => m,
            other => panic!("expected BadRkey, got {other:?}"),
        }
    }

    #[test]
    fn push_keeps_other_mds_and_replaces_the_same_md() {
        let mut b = RkeyBundle::new();
        b.push(entry("ib", "mlx5_0", vec![1])).unwrap();
        b.push(entry("ib", "mlx5_1", vec![2])).unwrap();
        b.push(entry("tcp", "tcp", vec![3])).unwrap();
        assert_eq!(
            b.entries(),
            [
                entry("ib", "mlx5_0", vec![1]),
                entry("ib", "mlx5_1", vec![2]),
                entry("tcp", "tcp", vec![3]),
            ]
        );
        // The same component and MD again: the old entry goes, the new one
        // is the only one for that MD.
        b.push(entry("ib", "mlx5_0", vec![4])).unwrap();
        assert_eq!(
            b.entries(),
            [
                entry("ib", "mlx5_1", vec![2]),
                entry("tcp", "tcp", vec![3]),
                entry("ib", "mlx5_0", vec![4]),
            ]
        );
        assert_eq!(b.find("mlx5_0").unwrap().payload, [4]);
    }

    #[test]
    fn push_holds_at_most_sixteen_mds_but_replacing_one_of_them_is_fine() {
        let mut b = RkeyBundle::new();
        for i in 0..16 {
            b.push(entry("ib", &format!("mlx5_{i}"), vec![i])).unwrap();
        }
        assert!(bad_rkey(b.push(entry("ib", "mlx5_16", vec![]))).contains("at most 16"));
        b.push(entry("ib", "mlx5_3", vec![33])).unwrap();
        assert_eq!(b.entries().len(), 16);
        assert_eq!(b.find("mlx5_3").unwrap().payload, [33]);
    }

    #[test]
    fn names_must_be_one_to_64_printable_name_bytes() {
        let long = "m".repeat(64);
        let too_long = "m".repeat(65);
        let good = ["a", "Z9", "_-.:", long.as_str()];
        let bad = ["", too_long.as_str(), "a b", "md/0", "é", "a\n", "a\0"];
        for name in good {
            let mut b = RkeyBundle::new();
            b.push(entry(name, name, vec![1])).unwrap();
            let bytes = b.pack().unwrap();
            assert_eq!(RkeyBundle::unpack(&bytes).unwrap(), b, "{name:?}");
        }
        for name in bad {
            // A bad component, a bad MD, or both: each is refused by push
            // and, forged by a peer, by unpack.
            for (component, md) in [("ib", name), (name, "mlx5_0"), (name, name)] {
                let e = entry(component, md, vec![1]);
                let mut b = RkeyBundle::new();
                bad_rkey(b.push(e.clone()));
                assert!(b.entries().is_empty(), "{component:?}/{md:?} was kept");
                let m = bad_rkey(RkeyBundle::unpack(&forged(vec![e])));
                assert!(m.contains("name"), "{component:?}/{md:?}: {m}");
            }
        }
        // One bad entry among good ones spoils the key.
        let bytes = forged(vec![
            entry("ib", "mlx5_0", vec![1]),
            entry("ib", "", vec![]),
        ]);
        bad_rkey(RkeyBundle::unpack(&bytes));
    }

    #[test]
    fn unpack_takes_sixteen_entries_and_refuses_seventeen() {
        let entries: Vec<RkeyEntry> = (0..17)
            .map(|i| entry("ib", &format!("mlx5_{i}"), vec![i]))
            .collect();
        let sixteen = RkeyBundle::unpack(&forged(entries[..16].to_vec())).unwrap();
        assert_eq!(sixteen.entries(), &entries[..16]);
        let m = bad_rkey(RkeyBundle::unpack(&forged(entries)));
        assert!(m.contains("17 entries"), "{m}");
        // And none at all is no key either.
        let m = bad_rkey(RkeyBundle::unpack(&forged(vec![])));
        assert!(m.contains("no memory domain"), "{m}");
    }

    /// A one-entry key whose packed form is exactly `total` bytes (for
    /// totals whose payload length takes three varint bytes).
    fn entry_packing_to(total: usize) -> RkeyEntry {
        let probe = RkeyBundle::single(entry("ib", "mlx5_0", vec![7; 20_000]));
        let overhead = probe.pack().unwrap().len() - 20_000;
        entry("ib", "mlx5_0", vec![7; total - overhead])
    }

    #[test]
    fn a_key_of_exactly_64_kib_packs_and_unpacks_one_byte_more_does_not() {
        assert_eq!(RKEY_MAX_BYTES, 65_536);
        let at_limit = RkeyBundle::single(entry_packing_to(65_536));
        let bytes = at_limit.pack().unwrap();
        assert_eq!(bytes.len(), 65_536);
        assert_eq!(RkeyBundle::unpack(&bytes).unwrap(), at_limit);

        let over = RkeyBundle::single(entry_packing_to(65_537));
        assert!(bad_rkey(over.pack()).contains("65537 bytes exceeds 65536"));
        // A peer that sends it anyway: well-formed, but too large.
        let bytes = forged(over.entries().to_vec());
        assert_eq!(bytes.len(), 65_537);
        let m = bad_rkey(RkeyBundle::unpack(&bytes));
        assert!(m.contains("65537 bytes is more than"), "{m}");
    }

    #[test]
    fn a_key_shorter_than_its_magic_and_version_says_how_short() {
        for len in 0..=4 {
            let m = bad_rkey(RkeyBundle::unpack(&b"UCTK"[..len]));
            assert_eq!(m, format!("only {len} bytes"));
        }
        let m = bad_rkey(RkeyBundle::unpack(b"UCTJ\x01\x01"));
        assert!(m.contains("magic"), "{m}");
    }

    #[test]
    fn remote_key_names_its_component_and_md_and_downcasts_to_its_type() {
        let key = RemoteKey::new("tcp", "tcp_lo", Box::new(42u64));
        assert_eq!(key.component(), "tcp");
        assert_eq!(key.md(), "tcp_lo");
        assert_eq!(key.downcast::<u64>("tcp_lo").unwrap(), &42);
        match key.downcast::<u32>("mlx5_0") {
            Err(UctError::RkeyMismatch { expected, found }) => {
                assert_eq!(expected, "memory domain mlx5_0");
                assert_eq!(found, "memory domain tcp_lo of component tcp");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            format!("{key:?}"),
            r#"RemoteKey { component: "tcp", md: "tcp_lo", .. }"#
        );
    }
}
