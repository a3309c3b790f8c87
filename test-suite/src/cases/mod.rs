//! The conformance cases. Each runs over a fresh [`Pair`] of whatever
//! transport the registry offers; a case that needs a capability the
//! transport does not advertise is reported as ignored, with the reason.

mod am;
mod atomic;
mod errors;
mod ordering;
mod rma;

use uct_core::Caps;

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
    pub run: fn(&mut Pair) -> TestResult,
}

const fn case(name: &'static str, needs: Caps, run: fn(&mut Pair) -> TestResult) -> Case {
    Case {
        name,
        needs,
        soft_rkey: false,
        two_process_only: false,
        run,
    }
}

/// Every case, in a stable order.
pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(rma::cases());
    cases.extend(am::cases());
    cases.extend(atomic::cases());
    cases.extend(ordering::cases());
    cases.extend(errors::cases());
    cases
}

/// Why `case` does not apply, if it does not.
pub fn not_applicable(case: &Case, caps: Caps, soft_rkey: bool, mode: Mode) -> Option<String> {
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
    None
}
