//! The adversary library: attacks a hostile peer makes on a process running
//! a transport (the victim), speaking the transports' real wire formats and
//! shared-memory layouts. `tests/adversary.rs` runs each attack from a
//! separate attacker process while the test process keeps a well-behaved
//! peer working against the same victim, its data verified, and measures the
//! victim's peak RSS.
//!
//! The three processes:
//! - the victim (`uct-victim --transport T`) opens an iface of T, registers
//!   the regions of a [`Target`], prints the target as one line
//!   (`target <fields>`, see [`Target::to_line`]) on stdout, then serves:
//!   it progresses its iface and answers requests on its control socket
//!   (see [`control`]). It exits 0 when its stdin closes, after printing
//!   `peak_rss_kib=N` (VmHWM).
//! - the attacker (`uct-attacker --attack NAME --target LINE`) runs one
//!   [`Attack`] and prints `outcome: ` and its [`Outcome`], exiting 0 for
//!   Refused or Closed and 1 for a Breach; 2 (and `setup-error: <why>`)
//!   when the attack returned `Err`, which fails the suite too.
//! - [`common`] has what all three share: the library driven with deadlines
//!   ([`common::Session`]), errors named by variant ([`common::named`]),
//!   and the attacks every software transport must refuse through it.
//! - the test process, which drives both and is the well-behaved peer.

pub mod cma;
pub mod common;
pub mod control;
pub mod posix;
pub mod tcp;

use std::fmt;

/// How an attack ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The victim (or the kernel) refused it with this named error.
    Refused(String),
    /// The victim closed the attacker's connection.
    Closed,
    /// The attack worked: what it got that it must not have.
    Breach(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Refused(why) => write!(f, "refused: {why}"),
            Outcome::Closed => f.write_str("closed"),
            Outcome::Breach(what) => write!(f, "BREACH: {what}"),
        }
    }
}

impl Outcome {
    /// Parses the text after `outcome: `.
    pub fn parse(s: &str) -> Option<Outcome> {
        let s = s.trim();
        if s == "closed" {
            Some(Outcome::Closed)
        } else if let Some(why) = s.strip_prefix("refused: ") {
            Some(Outcome::Refused(why.into()))
        } else {
            s.strip_prefix("BREACH: ")
                .map(|w| Outcome::Breach(w.into()))
        }
    }
}

/// One registered region of the victim, as a peer learns it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionInfo {
    /// Its address in the victim (what `remote_addr` starts from).
    pub addr: u64,
    /// Its length.
    pub len: usize,
    /// The packed rkey bundle (`RkeyBundle` bytes, as `pack_rkey` made it).
    pub rkey: Vec<u8>,
}

/// What an attacker (and the well-behaved peer) knows of the victim: what a
/// real peer would have from the address exchange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The transport under attack: tcp, posix or cma.
    pub transport: String,
    /// The victim's pid.
    pub pid: u32,
    /// The victim iface's device address.
    pub device_addr: Vec<u8>,
    /// The victim iface's iface address.
    pub iface_addr: Vec<u8>,
    /// A region registered read-write (the well-behaved peer uses its first
    /// half; attacks aim at the second).
    pub rw: RegionInfo,
    /// A region registered read-only (remote READ only).
    pub ro: RegionInfo,
    /// A region registered, its rkey packed, then deregistered: its rkey is
    /// stale, for replay attacks.
    pub stale: RegionInfo,
    /// Path of the victim's control socket (a unix stream socket).
    pub control: String,
}

/// Bytes as lower-case hex, as the target line and control requests carry them.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`hex`]'s output; `None` for anything else.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Target {
    /// One line, `target key=value ...`, byte strings in hex.
    pub fn to_line(&self) -> String {
        let region = |name: &str, r: &RegionInfo| {
            format!(
                "{name}_addr={:x} {name}_len={} {name}_rkey={}",
                r.addr,
                r.len,
                hex(&r.rkey)
            )
        };
        format!(
            "target transport={} pid={} device_addr={} iface_addr={} {} {} {} control={}",
            self.transport,
            self.pid,
            hex(&self.device_addr),
            hex(&self.iface_addr),
            region("rw", &self.rw),
            region("ro", &self.ro),
            region("stale", &self.stale),
            self.control
        )
    }

    /// Parses [`to_line`](Self::to_line)'s output.
    pub fn from_line(line: &str) -> Result<Target, String> {
        let rest = line
            .trim()
            .strip_prefix("target ")
            .ok_or_else(|| format!("not a target line: {line:?}"))?;
        let mut t = Target::default();
        for field in rest.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("target field without '=': {field:?}"))?;
            let bad = || format!("bad target field {field:?}");
            let num = |v: &str| v.parse::<usize>().map_err(|_| bad());
            let addr = |v: &str| u64::from_str_radix(v, 16).map_err(|_| bad());
            let bytes = |v: &str| unhex(v).ok_or_else(bad);
            match k {
                "transport" => t.transport = v.into(),
                "pid" => t.pid = v.parse().map_err(|_| bad())?,
                "device_addr" => t.device_addr = bytes(v)?,
                "iface_addr" => t.iface_addr = bytes(v)?,
                "rw_addr" => t.rw.addr = addr(v)?,
                "rw_len" => t.rw.len = num(v)?,
                "rw_rkey" => t.rw.rkey = bytes(v)?,
                "ro_addr" => t.ro.addr = addr(v)?,
                "ro_len" => t.ro.len = num(v)?,
                "ro_rkey" => t.ro.rkey = bytes(v)?,
                "stale_addr" => t.stale.addr = addr(v)?,
                "stale_len" => t.stale.len = num(v)?,
                "stale_rkey" => t.stale.rkey = bytes(v)?,
                "control" => t.control = v.into(),
                _ => return Err(format!("unknown target field {k:?}")),
            }
        }
        if t.transport.is_empty() || t.control.is_empty() {
            return Err(format!("target line lacks transport or control: {line:?}"));
        }
        Ok(t)
    }
}

/// One attack: a name (`tcp/forged-hello`), the transport it targets, and
/// the code that runs it from the attacker process. It returns how the
/// attack ended; an `Err` is a failure of the attack's own set-up (the test
/// fails with it), never an outcome.
#[derive(Clone, Copy)]
pub struct Attack {
    /// `transport/what`, unique.
    pub name: &'static str,
    /// The transport the victim must run.
    pub transport: &'static str,
    /// Runs the attack against the victim.
    pub run: fn(&Target) -> Result<Outcome, String>,
}

impl fmt::Debug for Attack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Every attack in the library, in the order the suite runs them.
pub fn all() -> Vec<Attack> {
    let mut v = common::attacks();
    v.extend(tcp::attacks());
    v.extend(posix::attacks());
    v.extend(cma::attacks());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_line_round_trips() {
        let t = Target {
            transport: "tcp".into(),
            pid: 42,
            device_addr: vec![1, 2, 3],
            iface_addr: vec![0xff],
            rw: RegionInfo {
                addr: 0x7f00_0000_1000,
                len: 8192,
                rkey: vec![9, 8],
            },
            ro: RegionInfo::default(),
            stale: RegionInfo {
                addr: 1,
                len: 2,
                rkey: vec![],
            },
            control: "/tmp/x.sock".into(),
        };
        assert_eq!(Target::from_line(&t.to_line()).unwrap(), t);
        assert!(Target::from_line("target transport=tcp bogus=1").is_err());
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            Outcome::Closed,
            Outcome::Refused("tcp: bad secret".into()),
            Outcome::Breach("read the ro region".into()),
        ] {
            assert_eq!(Outcome::parse(&o.to_string()), Some(o));
        }
    }

    #[test]
    fn attack_names_are_unique_and_name_their_transport() {
        let all = all();
        let mut names: Vec<_> = all.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for a in &all {
            assert!(
                a.name.starts_with(&format!("{}/", a.transport)),
                "{}",
                a.name
            );
        }
    }
}
