//! Errors of perftest; each says what failed and what would work.

use uct_core::bootstrap::BootstrapError;
use uct_core::UctError;

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Bad command line or a combination the transport cannot run.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Uct(#[from] UctError),
    #[error("{0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("the peer refused the run: {0}")]
    Refused(String),
    #[error("validation FAILED for {test} at size {size}, iteration {iter}: {detail}")]
    Validation {
        test: &'static str,
        size: usize,
        iter: u64,
        detail: String,
    },
    #[error("protocol error with the peer perftest: {0}")]
    Protocol(String),
}

impl PerfError {
    /// Process exit status: 2 for usage errors, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            PerfError::Usage(_) => 2,
            _ => 1,
        }
    }
}

pub type Result<T, E = PerfError> = std::result::Result<T, E>;
