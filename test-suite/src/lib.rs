//! The conformance suite of uct-rs: the same cases for every transport the
//! registry finds at run time. Absent transports are reported as skipped,
//! by name, with the reason.

pub mod adversary;
pub mod cases;
pub mod delay;
pub mod modules;
pub mod pair;
pub mod target;

pub use cases::{all as all_cases, not_applicable, Case, IfaceInfo};
pub use pair::{Outcome, Pair, TestResult};
