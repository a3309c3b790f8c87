//! The victim's control socket: how an attack asks the victim to act
//! against the attacker (connect to an attacker's iface, read with an rkey
//! the attacker forged), as an application would when handed a hostile
//! address or rkey.
//!
//! One request per connection: the client writes one line and reads one
//! line back, `ok <detail>` or `err <the error the victim got>`. The victim
//! serves one request at a time and answers when it is done, progressing
//! its iface meanwhile: an attacker whose own iface must answer the victim
//! (tcp: a `connect` to it, a `get` from it) progresses that iface while it
//! waits for the answer (send the request from another thread).
//!
//! Requests (hex for byte strings, `-` for an empty one, see [`word`]):
//! - `connect <device_addr> <iface_addr>`: create an endpoint to that iface
//!   and send one AM (id 1, header 0, 8 bytes of payload), flushing it
//!   (cma, which has no active messages, only flushes). It replaces the
//!   endpoint of the previous `connect`.
//! - `get <rkey> <remote_addr> <len>`: unpack the rkey and read `len` bytes
//!   (get_bcopy) from the endpoint made by the last `connect`; answers
//!   `ok read <len> bytes: <the first 64 in hex>`. `remote_addr` is hex,
//!   `len` decimal and at most 1 MiB.
//! - `put <rkey> <remote_addr> <len>`: as `get`, writing `len` bytes of 0xAA.
//! - `ping`: answers `ok pong`.
//!
//! Every request the victim serves has a deadline (10 s for each wait of
//! the transport, 2 s for the request line); an error of the transport is
//! an `err <Variant>: <message>` answer (`common::named`), never a crash.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::{hex, Outcome, Target};

/// How long a client waits for the victim's answer.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// Sends one request line, returns the victim's answer: `Ok(detail)` for
/// `ok`, `Err(error)` for `err`. A victim that is not there, or that answers
/// nothing, is an `Err` prefixed `control:`.
pub fn request(target: &Target, line: &str) -> Result<String, String> {
    let mut s = UnixStream::connect(&target.control)
        .map_err(|e| format!("control: connect {}: {e}", target.control))?;
    s.set_read_timeout(Some(DEADLINE))
        .and_then(|_| s.set_write_timeout(Some(DEADLINE)))
        .map_err(|e| format!("control: {e}"))?;
    s.write_all(format!("{}\n", line.trim()).as_bytes())
        .map_err(|e| format!("control: send: {e}"))?;
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| format!("control: no answer to {line:?}: {e}"))?;
    let answer = answer.trim();
    if let Some(ok) = answer.strip_prefix("ok") {
        Ok(ok.trim().to_string())
    } else if let Some(err) = answer.strip_prefix("err ") {
        Err(err.to_string())
    } else {
        Err(format!("control: malformed answer {answer:?} to {line:?}"))
    }
}

/// A byte string as a request word: hex, or `-` for none (cma's iface
/// address is empty, and an empty word would vanish from the line).
pub fn word(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        "-".into()
    } else {
        hex(bytes)
    }
}

/// Parses [`word`]'s output.
pub fn unword(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        Some(Vec::new())
    } else {
        super::unhex(s)
    }
}

/// `connect` request text.
pub fn connect_line(device_addr: &[u8], iface_addr: &[u8]) -> String {
    format!("connect {} {}", word(device_addr), word(iface_addr))
}

/// `get`/`put` request text (`op` is "get" or "put").
pub fn rma_line(op: &str, rkey: &[u8], remote_addr: u64, len: usize) -> String {
    format!("{op} {} {remote_addr:x} {len}", word(rkey))
}

/// Turns the victim's answer to a request that must be refused into an
/// outcome: an error is Refused with the victim's words; success is a
/// Breach described by `what`.
pub fn must_refuse(answer: Result<String, String>, what: &str) -> Result<Outcome, String> {
    match answer {
        Err(e) if e.starts_with("control:") => Err(e),
        Err(e) => Ok(Outcome::Refused(e)),
        Ok(detail) => Ok(Outcome::Breach(format!("{what} ({detail})"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_empty_is_a_dash() {
        assert_eq!(word(&[]), "-");
        for bytes in [&[][..], &[0u8][..], &[0xde, 0xad, 0xbe, 0xef][..]] {
            assert_eq!(unword(&word(bytes)).as_deref(), Some(bytes));
        }
        assert_eq!(unword("xyz"), None);
        assert_eq!(connect_line(&[1], &[]), "connect 01 -");
        assert_eq!(rma_line("get", &[0xab], 0x1000, 8), "get ab 1000 8");
    }
}
