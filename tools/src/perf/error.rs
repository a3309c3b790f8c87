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
    /// What failed while a test was running, and which test and stage.
    #[error("{test} at {size} bytes ({stage}): {source}")]
    During {
        test: &'static str,
        size: usize,
        /// "warm-up" or "measurement".
        stage: &'static str,
        source: Box<PerfError>,
    },
}

impl PerfError {
    /// Process exit status: 2 for usage errors, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            PerfError::Usage(_) => 2,
            PerfError::During { source, .. } => source.exit_code(),
            _ => 1,
        }
    }

    /// Says which test, size and stage were running when this happened;
    /// usage and validation errors say so already.
    pub fn during(self, test: &'static str, size: usize, stage: &'static str) -> PerfError {
        match self {
            PerfError::Usage(_) | PerfError::Validation { .. } | PerfError::During { .. } => self,
            other => PerfError::During {
                test,
                size,
                stage,
                source: Box::new(other),
            },
        }
    }
}

pub type Result<T, E = PerfError> = std::result::Result<T, E>;
