//! What the attacker, the victim and the well-behaved peer share: the real
//! library driven with a deadline on every wait ([`Session`], [`put`],
//! [`get`], [`am`]), errors named by their variant ([`named`]), and the
//! attacks every software transport must refuse through that library:
//! `<t>/stale-rkey-replay` (an rkey used after its region was deregistered)
//! and `<t>/out-of-range` (addresses past a region, wrapping past the end
//! of the address space, and a put through a read-only region's rkey).
//!
//! These attacks are what a buggy or stale peer does with the real
//! library; the transport attacks (`tcp.rs`, `posix.rs`, `cma.rs`) go
//! below it, to the wire and the shared memory.

use std::fmt;
use std::time::{Duration, Instant};

use uct_core::{
    Completion, CompletionData, Endpoint, EpParams, Iface, IfaceParams, Registry, RemoteKey,
    Status, UctError,
};

use super::{Attack, Outcome, Target};

/// How long one operation (a post, its completion, its flush) may take
/// before the caller stops waiting for it.
pub const OP_DEADLINE: Duration = Duration::from_secs(10);

/// The device the suite runs `transport` on: tcp on the loopback only, so
/// that no attack leaves the host; the shared-memory transports have one.
pub fn device(transport: &str) -> Option<&'static str> {
    (transport == "tcp").then_some("lo")
}

/// Opens an iface of `transport` on the suite's device.
pub fn open_iface(transport: &str) -> Result<Box<dyn Iface>, UctError> {
    Registry::global().open_iface(transport, device(transport), &IfaceParams::default())
}

/// `UctError` as `Variant: message`, so that an outcome names the error
/// (`NoSuchRegion: region 3 is not registered ...`).
pub fn named(e: &UctError) -> String {
    let debug = format!("{e:?}");
    let variant: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    format!("{variant}: {e}")
}

/// Why an operation through the library did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpError {
    /// The transport refused it: when posted, in its completion, in the
    /// flush after it, or in the endpoint's liveness check.
    Uct(UctError),
    /// Nothing came back within [`OP_DEADLINE`]: what was waited for.
    Deadline(String),
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::Uct(e) => f.write_str(&named(e)),
            OpError::Deadline(what) => write!(
                f,
                "{what}: no answer within {OP_DEADLINE:?}; the peer is stuck or the transport lost the request"
            ),
        }
    }
}

impl From<UctError> for OpError {
    fn from(e: UctError) -> Self {
        OpError::Uct(e)
    }
}

/// Progresses `iface` once and checks the endpoint's peer: one turn of a
/// waiting loop. Yields the CPU when nothing happened, since the suite's
/// three processes share two cores.
fn turn(iface: &mut dyn Iface, ep: &mut dyn Endpoint) -> Result<(), OpError> {
    if iface.progress() == 0 {
        std::thread::yield_now();
    }
    ep.check().map_err(OpError::Uct)
}

/// Posts with `op` (again while NoResource) and waits for its completion,
/// everything within [`OP_DEADLINE`].
pub fn post(
    iface: &mut dyn Iface,
    ep: &mut dyn Endpoint,
    what: &str,
    mut op: impl FnMut(&mut dyn Endpoint, &Completion) -> Result<Status, UctError>,
) -> Result<Completion, OpError> {
    let comp = Completion::new();
    let t0 = Instant::now();
    loop {
        match op(ep, &comp)? {
            Status::Done => return Ok(comp),
            Status::InProgress => break,
            Status::NoResource => turn(iface, ep)?,
        }
        if t0.elapsed() > OP_DEADLINE {
            return Err(OpError::Deadline(format!("{what}: out of resources")));
        }
    }
    while !comp.is_complete() {
        turn(iface, ep)?;
        if t0.elapsed() > OP_DEADLINE {
            return Err(OpError::Deadline(format!("{what}: completion")));
        }
    }
    comp.result()?;
    Ok(comp)
}

/// Flushes `ep`: every operation posted before it is complete remotely.
pub fn flush(iface: &mut dyn Iface, ep: &mut dyn Endpoint) -> Result<(), OpError> {
    post(iface, ep, "flush", |ep, c| ep.flush(Some(c))).map(drop)
}

/// put_bcopy of `data` at `addr`, then a flush, so that a refusal the peer
/// sends back is seen here.
pub fn put(
    iface: &mut dyn Iface,
    ep: &mut dyn Endpoint,
    data: &[u8],
    addr: u64,
    rkey: &RemoteKey,
) -> Result<(), OpError> {
    post(iface, ep, "put_bcopy", |ep, _| {
        ep.put_bcopy(data, addr, rkey)
    })?;
    flush(iface, ep)
}

/// get_bcopy of `len` bytes at `addr`; the bytes, checked to be `len`.
pub fn get(
    iface: &mut dyn Iface,
    ep: &mut dyn Endpoint,
    len: usize,
    addr: u64,
    rkey: &RemoteKey,
) -> Result<Vec<u8>, OpError> {
    let comp = post(iface, ep, "get_bcopy", |ep, c| {
        ep.get_bcopy(len, addr, rkey, c)
    })?;
    match comp.take_data() {
        Some(CompletionData::Bytes(b)) if b.len() == len => Ok(b),
        other => Err(OpError::Uct(UctError::Protocol(format!(
            "get_bcopy of {len} bytes completed with {:?} instead of {len} bytes",
            other.map(|d| match d {
                CompletionData::Bytes(b) => format!("{} bytes", b.len()),
                CompletionData::Value(v) => format!("the value {v}"),
            })
        )))),
    }
}

/// am_short on `id`, then a flush.
pub fn am(
    iface: &mut dyn Iface,
    ep: &mut dyn Endpoint,
    id: u8,
    header: u64,
    payload: &[u8],
) -> Result<(), OpError> {
    post(iface, ep, "am_short", |ep, _| {
        ep.am_short(id, header, payload)
    })?;
    flush(iface, ep)
}

/// An iface of its own and an endpoint to a peer's iface.
pub struct Session {
    pub iface: Box<dyn Iface>,
    pub ep: Box<dyn Endpoint>,
}

impl Session {
    /// Opens an iface of the target's transport and connects to the
    /// victim's iface, as a peer given its address does.
    pub fn to_target(t: &Target) -> Result<Session, UctError> {
        let mut iface = open_iface(&t.transport)?;
        let ep = iface.create_ep(EpParams::ToIface {
            device_addr: t.device_addr.clone(),
            iface_addr: t.iface_addr.clone(),
        })?;
        Ok(Session { iface, ep })
    }

    /// Unpacks rkey bytes for this session's memory domain.
    pub fn rkey(&self, packed: &[u8]) -> Result<RemoteKey, UctError> {
        Registry::global().unpack_rkey(packed, self.iface.md().name())
    }

    pub fn put(&mut self, data: &[u8], addr: u64, rkey: &RemoteKey) -> Result<(), OpError> {
        put(self.iface.as_mut(), self.ep.as_mut(), data, addr, rkey)
    }

    pub fn get(&mut self, len: usize, addr: u64, rkey: &RemoteKey) -> Result<Vec<u8>, OpError> {
        get(self.iface.as_mut(), self.ep.as_mut(), len, addr, rkey)
    }
}

/// The attacks of this file, for tcp and posix (cma's stale rkey is in
/// `cma.rs`).
pub fn attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "tcp/stale-rkey-replay",
            transport: "tcp",
            run: stale_rkey_replay,
        },
        Attack {
            name: "tcp/out-of-range",
            transport: "tcp",
            run: out_of_range,
        },
        Attack {
            name: "posix/stale-rkey-replay",
            transport: "posix",
            run: stale_rkey_replay,
        },
        Attack {
            name: "posix/out-of-range",
            transport: "posix",
            run: out_of_range,
        },
    ]
}

/// One access an attack tries, and the errors that count as its refusal.
struct Probe {
    what: String,
    /// Variant names of the errors that refuse it for the right reason.
    expect: &'static [&'static str],
    /// The packed rkey it uses.
    rkey: Vec<u8>,
    addr: u64,
    len: usize,
    put: bool,
}

/// Runs `probe` in a session of its own (a refusal may fail an endpoint,
/// and the next probe must meet the check, not the failed endpoint).
/// `Ok(Ok((what: Variant, the full error)))` when refused for the right
/// reason, `Ok(Err(breach))` when it succeeded.
fn run_probe(t: &Target, probe: &Probe) -> Result<Result<(String, String), String>, String> {
    let mut s =
        Session::to_target(t).map_err(|e| format!("connect to the victim: {}", named(&e)))?;
    let result = s.rkey(&probe.rkey).map_err(OpError::Uct).and_then(|rkey| {
        if probe.put {
            s.put(&vec![0xAA; probe.len], probe.addr, &rkey)
                .map(|()| "it wrote".to_string())
        } else {
            s.get(probe.len, probe.addr, &rkey)
                .map(|b| format!("it read {} bytes", b.len()))
        }
    });
    match result {
        Ok(got) => Ok(Err(format!("{} succeeded: {got}", probe.what))),
        Err(OpError::Deadline(d)) => Err(format!("{}: {d}", probe.what)),
        Err(OpError::Uct(e)) => {
            let name = named(&e);
            if let Some(v) = probe
                .expect
                .iter()
                .find(|v| name.starts_with(&format!("{v}:")))
            {
                Ok(Ok((format!("{}: {v}", probe.what), name)))
            } else {
                Err(format!(
                    "{} was refused for the wrong reason: {name} (expected {})",
                    probe.what,
                    probe.expect.join(" or ")
                ))
            }
        }
    }
}

/// Every probe must be refused with one of its errors: Refused listing
/// each probe's error by name, then the first error in full; a Breach
/// naming the first probe that succeeded.
fn judge(t: &Target, probes: &[Probe]) -> Result<Outcome, String> {
    let mut refused = Vec::new();
    let mut first = None;
    for p in probes {
        match run_probe(t, p)? {
            Ok((why, full)) => {
                refused.push(why);
                first.get_or_insert(full);
            }
            Err(breach) => return Ok(Outcome::Breach(breach)),
        }
    }
    Ok(Outcome::Refused(format!(
        "{} (first: {})",
        refused.join("; "),
        first.unwrap_or_default()
    )))
}

/// The victim's stale rkey (its region deregistered) replayed with a get
/// and a put.
fn stale_rkey_replay(t: &Target) -> Result<Outcome, String> {
    const STALE: &[&str] = &["NoSuchRegion", "BadSecret"];
    let probe = |put: bool| Probe {
        what: format!(
            "{} of 64 bytes with the stale rkey",
            if put { "put_bcopy" } else { "get_bcopy" }
        ),
        expect: STALE,
        rkey: t.stale.rkey.clone(),
        addr: t.stale.addr,
        len: 64,
        put,
    };
    judge(t, &[probe(false), probe(true)])
}

/// The rw rkey at addresses past its region (just past, straddling the end,
/// wrapping past the end of the address space) and the ro rkey with a put.
fn out_of_range(t: &Target) -> Result<Outcome, String> {
    const RANGE: &[&str] = &["OutOfRange"];
    let end = t.rw.addr.wrapping_add(t.rw.len as u64);
    let probe = |what: &str, addr: u64, put: bool| Probe {
        what: what.to_string(),
        expect: RANGE,
        rkey: t.rw.rkey.clone(),
        addr,
        len: 64,
        put,
    };
    judge(
        t,
        &[
            probe("get_bcopy just past the rw region", end, false),
            probe("put_bcopy just past the rw region", end, true),
            probe(
                "put_bcopy straddling the rw region's end",
                end.wrapping_sub(32),
                true,
            ),
            probe("get_bcopy wrapping past 2^64", u64::MAX - 31, false),
            probe("put_bcopy wrapping past 2^64", u64::MAX - 31, true),
            Probe {
                what: "put_bcopy through the read-only region's rkey".into(),
                expect: &["AccessDenied"],
                rkey: t.ro.rkey.clone(),
                addr: t.ro.addr,
                len: 64,
                put: true,
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_errors_start_with_their_variant() {
        assert!(
            named(&UctError::NoSuchRegion { region_id: 3 }).starts_with("NoSuchRegion: region 3 ")
        );
        assert!(named(&UctError::BadSecret).starts_with("BadSecret: the rkey's secret"));
        assert!(named(&UctError::Protocol("x".into())).starts_with("Protocol: "));
    }

    #[test]
    fn this_file_attacks_tcp_and_posix_and_all_lists_them() {
        let all: Vec<_> = super::super::all().iter().map(|a| a.name).collect();
        for t in ["tcp", "posix"] {
            for a in ["stale-rkey-replay", "out-of-range"] {
                assert!(all.contains(&format!("{t}/{a}").as_str()), "{t}/{a}");
            }
        }
    }
}
