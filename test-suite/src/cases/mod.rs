//! The conformance cases. Each runs over a fresh [`Pair`] of whatever
//! transport the registry offers; a case that needs a capability the
//! transport does not advertise is reported as ignored, with the reason.

mod am;
mod atomic;
mod errors;
mod imm;
mod ordering;
mod passive;
mod rma;

use uct_core::{Caps, IfaceAttrs};

use crate::pair::{Mode, Pair, TestResult};

/// One conformance test.
pub struct Case {
    pub name: &'static str,
    /// Capabilities the transport must advertise for the case to apply.
    pub needs: Caps,
    /// Applies only to software transports, whose rkeys carry a secret and
    /// whose targets check every access themselves.
    pub soft_rkey: bool,
    /// Needs a target in another process (it kills it).
    pub two_process_only: bool,
    /// Applies only where the iface's attributes allow it (beyond its
    /// capabilities): returns why not, where it does not.
    pub applies: Option<fn(&IfaceAttrs) -> Option<String>>,
    pub run: fn(&mut Pair) -> TestResult,
}

const fn case(name: &'static str, needs: Caps, run: fn(&mut Pair) -> TestResult) -> Case {
    Case {
        name,
        needs,
        soft_rkey: false,
        two_process_only: false,
        applies: None,
        run,
    }
}

/// What the harness knows of an iface when it asks whether a case applies:
/// its capabilities only, or all its attributes.
#[derive(Clone, Copy)]
pub enum IfaceInfo<'a> {
    Caps(Caps),
    Attrs(&'a IfaceAttrs),
}

impl From<Caps> for IfaceInfo<'_> {
    fn from(caps: Caps) -> Self {
        IfaceInfo::Caps(caps)
    }
}

impl<'a> From<&'a IfaceAttrs> for IfaceInfo<'a> {
    fn from(attrs: &'a IfaceAttrs) -> Self {
        IfaceInfo::Attrs(attrs)
    }
}

/// Fails a case that runs where it does not apply: a harness that passes
/// only the capabilities to [`not_applicable`] cannot see every reason, and
/// a case that cannot check anything must not pass.
pub(crate) fn check_applies(
    case_applies: fn(&IfaceAttrs) -> Option<String>,
    pair: &Pair,
) -> TestResult {
    match case_applies(pair.tx.attrs()) {
        None => Ok(()),
        Some(why) => Err(format!(
            "not applicable ({why}), yet run: pass the iface attributes to not_applicable"
        )),
    }
}

/// Whether a transport's puts and flushes need the target's own progress
/// to reach target memory, so that a stopped target (`Target::hold`, a
/// SIGSTOPped process) leaves them pending. Decided from what each
/// transport documents of its data path:
/// - tcp: yes. "put, get and atomics carried as messages that the target
///   executes in its `progress`" (tl-tcp/src/lib.rs): until the target
///   reads its socket, a put is in a socket buffer or the send queue, and a
///   flush's reply never comes.
/// - self and loop (the example module's self endpoint): no, the initiator
///   copies into memory of its own process.
/// - posix: no, "put and get are copies into the mapped segment"
///   (tl-sm/src/posix/mod.rs), done by the initiator.
/// - cma: no, process_vm_writev writes the target's memory from the
///   initiator's side; the kernel does it, not the target.
/// - rc: no, RDMA writes: the target's NIC writes its memory and
///   acknowledges, without the target's CPU.
///
/// A transport not named here is treated as not needing it: the cases then
/// check only what holds either way.
pub(crate) fn delivery_needs_target(transport: &str) -> bool {
    matches!(transport, "tcp")
}

/// Every case, in a stable order.
pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(rma::cases());
    cases.extend(am::cases());
    cases.extend(atomic::cases());
    cases.extend(imm::cases());
    cases.extend(ordering::cases());
    cases.extend(passive::cases());
    cases.extend(errors::cases());
    cases
}

/// Why `case` does not apply, if it does not. Given the iface's attributes
/// (not only its capabilities), it also asks the case's own
/// [`Case::applies`]; a case that runs where that says no fails, never
/// passes.
pub fn not_applicable<'a>(
    case: &Case,
    iface: impl Into<IfaceInfo<'a>>,
    soft_rkey: bool,
    mode: Mode,
) -> Option<String> {
    let iface = iface.into();
    let caps = match iface {
        IfaceInfo::Caps(caps) => caps,
        IfaceInfo::Attrs(attrs) => attrs.caps,
    };
    let missing = case.needs - caps;
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter_names().map(|(n, _)| n).collect();
        return Some(format!("transport lacks {}", names.join(", ")));
    }
    if case.soft_rkey && !soft_rkey {
        return Some("checks software rkey secrets; the NIC checks this transport's keys".into());
    }
    if case.two_process_only && mode != Mode::TwoProcesses {
        return Some("kills the target process; runs in the two-process mode".into());
    }
    match (iface, case.applies) {
        (IfaceInfo::Attrs(attrs), Some(applies)) => applies(attrs),
        _ => None,
    }
}
