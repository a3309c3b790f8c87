//! perftest: latency, bandwidth and message rate of a transport, in one
//! process (two threads) or between two processes, agreed over the
//! bootstrap channel.

pub mod clock;
pub mod error;
pub mod layout;
pub mod params;
pub mod pattern;
pub mod report;
pub mod run;
pub mod session;
pub mod stage;
mod transfer;
