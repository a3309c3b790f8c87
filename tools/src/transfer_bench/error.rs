//! Errors of transfer-bench; each says what failed and what would work.

use std::time::Duration;

use uct_core::bootstrap::BootstrapError;
use uct_transfer::TransferError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad command line, or a combination this host cannot run.
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Transfer(#[from] TransferError),
    #[error("{0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("the peer refused the run: {0}")]
    Refused(String),
    #[error("validation FAILED at size {size}, iteration {iter}: {detail}")]
    Validation {
        size: usize,
        iter: u64,
        detail: String,
    },
    #[error("protocol error with the peer transfer-bench: {0}")]
    Protocol(String),
    /// A wait that ran past its deadline while the peer looked alive.
    #[error("no result within {} s waiting for {what}; the peer is stuck, overloaded or gone (raise --timeout for very slow transports)", .limit.as_secs())]
    Timeout { what: String, limit: Duration },
    /// What failed while a size was being measured.
    #[error("{size} bytes ({stage}): {source}")]
    During {
        size: usize,
        /// "warm-up" or "measurement".
        stage: &'static str,
        source: Box<BenchError>,
    },
}

impl BenchError {
    /// Process exit status: 2 for what the command line asked and this host
    /// cannot run (perftest's convention), 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Usage(_) | BenchError::Transfer(TransferError::MemoryType(_)) => 2,
            BenchError::During { source, .. } => source.exit_code(),
            _ => 1,
        }
    }

    /// Says which size and stage were running; usage and validation errors
    /// say so already.
    pub fn during(self, size: usize, stage: &'static str) -> BenchError {
        match self {
            BenchError::Usage(_) | BenchError::Validation { .. } | BenchError::During { .. } => {
                self
            }
            other => BenchError::During {
                size,
                stage,
                source: Box::new(other),
            },
        }
    }
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;
