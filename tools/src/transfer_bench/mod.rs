//! transfer-bench: the transfer API (uct-transfer) measured as seed 004's
//! BM_RdmaTransport_Write is: for each size, the real time of one notified
//! write (from its post to the receiver's `wait_for_write`), the CPU time
//! per write and the bytes per second, in one process or between two
//! processes agreed over the bootstrap channel.

pub mod drive;
pub mod error;
pub mod params;
pub mod report;
pub mod run;
pub mod session;
pub mod window;
