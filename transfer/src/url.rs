//! The URL bind() returns: a format version, the token the peer's
//! notifications must carry, and one offer per transport this side bound
//! (its name, device, device address, iface address and, for transports
//! that connect endpoint to endpoint, the endpoint's address), closed by a
//! check that catches strings cut short.
//!
//! `uct://v1/<token hex>/tcp:lo:<dev hex>:<iface hex>:<ep hex>/posix:memory:...#<check>`
//!
//! Parsing never panics: the peer's URL comes from outside.

use crate::error::{Result, TransferError};
use crate::text::{check, escape, hex, unescape, unhex, verified};

/// The format version this build writes and reads.
pub const URL_VERSION: u32 = 1;

const SCHEME: &str = "uct://";

/// The longest URL read: addresses are tens of bytes, and a handful of
/// transports are offered.
const MAX_URL: usize = 16 * 1024;

/// What one side offers for one transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    pub transport: String,
    pub device: String,
    pub device_addr: Vec<u8>,
    pub iface_addr: Vec<u8>,
    /// The endpoint's address, for transports that connect to endpoints.
    pub ep_addr: Option<Vec<u8>>,
}

/// Writes a URL of `offers`.
pub(crate) fn format(token: u64, offers: &[Offer]) -> String {
    let mut body = format!("{SCHEME}v{URL_VERSION}/{token:016x}");
    for o in offers {
        body.push('/');
        body.push_str(&format!(
            "{}:{}:{}:{}:{}",
            escape(&o.transport),
            escape(&o.device),
            hex(&o.device_addr),
            hex(&o.iface_addr),
            o.ep_addr.as_deref().map(hex).unwrap_or_default()
        ));
    }
    let sum = check(&body);
    format!("{body}#{sum}")
}

/// Reads a URL: the peer's token and offers; each kind of wrong string
/// gets its own error.
pub(crate) fn parse(url: &str) -> Result<(u64, Vec<Offer>)> {
    let bad = |why: &str| TransferError::BadUrl { why: why.into() };
    let url = url.trim();
    if url.len() > MAX_URL {
        return Err(bad(&format!(
            "{} bytes, more than the {MAX_URL} a URL may have",
            url.len()
        )));
    }
    let rest = url.strip_prefix(SCHEME).ok_or_else(|| {
        bad(&format!(
            "it does not start with {SCHEME}: {:?}",
            url.chars().take(24).collect::<String>()
        ))
    })?;
    // The version first, so that a newer format is named as such even if
    // its check or layout differs.
    let version = rest.split(['/', '#']).next().unwrap_or_default();
    match version.strip_prefix('v').map(str::parse::<u32>) {
        Some(Ok(URL_VERSION)) => {}
        Some(Ok(_)) => {
            return Err(TransferError::UrlVersion {
                found: version.into(),
                expected: URL_VERSION,
            })
        }
        _ if version.is_empty() || version == "v" => {
            return Err(TransferError::TruncatedUrl {
                why: "it ends before its version".into(),
            })
        }
        _ => return Err(bad(&format!("its version {version:?} is not v<number>"))),
    }
    let body = verified(url).map_err(|why| TransferError::TruncatedUrl { why })?;
    let body = &body[SCHEME.len()..];
    let mut parts = body.split('/');
    parts.next(); // the version, read above
    let token = parts
        .next()
        .filter(|t| t.len() == 16)
        .and_then(|t| u64::from_str_radix(t, 16).ok())
        .ok_or_else(|| bad("its token is not 16 hex digits"))?;
    let mut offers = Vec::new();
    for part in parts {
        offers.push(parse_offer(part).map_err(|why| bad(&format!("offer {part:?}: {why}")))?);
    }
    if offers.is_empty() {
        return Err(bad("it offers no transport"));
    }
    Ok((token, offers))
}

fn parse_offer(s: &str) -> std::result::Result<Offer, String> {
    let fields: Vec<&str> = s.split(':').collect();
    let [transport, device, dev, iface, ep] = fields[..] else {
        return Err(format!("{} fields, not 5", fields.len()));
    };
    // Names reach messages and logs: no control characters (a newline or
    // a terminal escape from the peer would forge or hide log lines).
    let name = |what: &str, v: &str| {
        unescape(v)
            .filter(|n| !n.is_empty() && !n.chars().any(char::is_control))
            .ok_or_else(|| format!("its {what} {v:?} is not a name"))
    };
    let bytes = |what: &str, v: &str| unhex(v).ok_or_else(|| format!("its {what} is not hex"));
    Ok(Offer {
        transport: name("transport", transport)?,
        device: name("device", device)?,
        device_addr: bytes("device address", dev)?,
        iface_addr: bytes("iface address", iface)?,
        ep_addr: if ep.is_empty() {
            None
        } else {
            Some(bytes("endpoint address", ep)?)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offers() -> Vec<Offer> {
        vec![
            Offer {
                transport: "tcp".into(),
                device: "lo".into(),
                device_addr: vec![127, 0, 0, 1],
                iface_addr: vec![1, 2, 3],
                ep_addr: None,
            },
            Offer {
                transport: "rc".into(),
                device: "rxe0:1".into(),
                device_addr: vec![9; 20],
                iface_addr: vec![],
                ep_addr: Some(vec![4, 5]),
            },
        ]
    }

    #[test]
    fn a_url_round_trips() {
        let url = format(0xfeed, &offers());
        assert!(
            url.starts_with("uct://v1/000000000000feed/tcp:lo:7f000001:010203:/rc:"),
            "{url}"
        );
        assert_eq!(parse(&url).unwrap(), (0xfeed, offers()));
        assert_eq!(parse(&format!("  {url}\n")).unwrap(), (0xfeed, offers()));
    }

    #[test]
    fn each_wrong_url_is_named() {
        let url = format(7, &offers());
        let err = |s: &str| parse(s).unwrap_err();
        assert!(matches!(err("hello"), TransferError::BadUrl { .. }));
        assert!(matches!(err(""), TransferError::BadUrl { .. }));
        assert!(matches!(err("http://x"), TransferError::BadUrl { .. }));
        assert!(matches!(err("uct://vx/tcp"), TransferError::BadUrl { .. }));
        let v2 = url.replacen("v1", "v2", 1);
        assert!(
            matches!(err(&v2), TransferError::UrlVersion { ref found, .. } if found == "v2"),
            "{}",
            err(&v2)
        );
        // Every cut of the string is refused, none panics.
        for cut in 0..url.len() {
            let e = err(&url[..cut]);
            assert!(
                matches!(
                    e,
                    TransferError::TruncatedUrl { .. } | TransferError::BadUrl { .. }
                ),
                "cut at {cut}: {e}"
            );
            if cut > "uct://v1".len() {
                assert!(
                    matches!(e, TransferError::TruncatedUrl { .. }),
                    "cut at {cut}: {e}"
                );
            }
        }
        // An edited address fails the check.
        let edited = url.replacen("7f000001", "7f000002", 1);
        assert!(matches!(err(&edited), TransferError::TruncatedUrl { .. }));
        // Garbage with a valid check is still garbage.
        let body = "uct://v1/0000000000000007/tcp:lo:zz:00:";
        let forged = format!("{body}#{}", check(body));
        assert!(
            matches!(err(&forged), TransferError::BadUrl { .. }),
            "{}",
            err(&forged)
        );
        // A name with a newline or a terminal escape in it is no name.
        for name in ["lo%0aWARN%20forged", "%1b%5b2J", "%7f"] {
            let body = format!("uct://v1/0000000000000007/tcp:{name}:00:00:");
            let forged = format!("{body}#{}", check(&body));
            assert!(
                matches!(err(&forged), TransferError::BadUrl { .. }),
                "{name}: {}",
                err(&forged)
            );
        }
        let body = "uct://v1/0000000000000007";
        let empty = format!("{body}#{}", check(body));
        assert!(matches!(err(&empty), TransferError::BadUrl { .. }));
        assert!(matches!(
            err(&"x".repeat(MAX_URL + 1)),
            TransferError::BadUrl { .. }
        ));
    }
}
