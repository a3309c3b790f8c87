//! The printable encodings URLs and remote keys share: lower-case hex for
//! bytes, a 64-bit FNV-1a check that catches truncation and edits, and
//! escaping for names.

/// Bytes as lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Hex back to bytes; `None` for an odd length or a non-hex digit.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// FNV-1a, 64 bits: not a defence against forgery (the peer's transport
/// checks that), only against strings cut short or mangled in transit.
pub(crate) fn check(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Splits `body#check` and verifies the check; the body, or why not.
pub(crate) fn verified(s: &str) -> Result<&str, String> {
    let (body, sum) = s
        .rsplit_once('#')
        .ok_or_else(|| "its check (#...) at the end is missing".to_string())?;
    if sum.len() != 16 {
        return Err(format!("its check has {} digits, not 16", sum.len()));
    }
    if check(body) != sum.to_ascii_lowercase() {
        return Err("its check does not match its contents".into());
    }
    Ok(body)
}

/// Whether a name may go into a URL or key as it is.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// A name with every other byte escaped as %XX.
pub(crate) fn escape(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        if plain(c) {
            s.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                s.push_str(&format!("%{b:02x}"));
            }
        }
    }
    s
}

/// [`escape`] undone; `None` for a malformed escape or bytes that are not
/// UTF-8.
pub(crate) fn unescape(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let pair = s.get(i + 1..i + 3)?;
            out.push(*unhex(pair)?.first()?);
            i += 3;
        } else if plain(b[i] as char) {
            out.push(b[i]);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_odd_or_foreign_digits() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(unhex("0001abff").unwrap(), bytes);
        assert_eq!(unhex("0001ABFF").unwrap(), bytes);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
        assert_eq!(unhex("").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn the_check_catches_truncation_and_edits() {
        let body = "uct://v1/tcp:lo:0a:0b:";
        let s = format!("{body}#{}", check(body));
        assert_eq!(verified(&s).unwrap(), body);
        assert!(verified(&s[..s.len() - 1]).is_err());
        assert!(verified(&s.replace("lo", "lp")).is_err());
        assert!(verified(body).is_err());
    }

    #[test]
    fn names_escape_and_come_back() {
        for name in ["lo", "eth0.100", "a:b/c#d", "é"] {
            assert_eq!(unescape(&escape(name)).unwrap(), name);
            assert!(!escape(name).contains([':', '/', '#']));
        }
        assert!(unescape("%zz").is_none());
        assert!(unescape("%4").is_none());
        assert!(unescape("a:b").is_none());
    }
}
