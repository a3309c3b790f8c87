//! The error type of the transport layer. Every message says what failed and
//! what to do about it.

use std::fmt;
use std::sync::Arc;

use crate::memory::{Access, MemoryType};

/// The underlying error of a [`UctError`] (an `io::Error`, a driver's or a
/// verbs error), kept as its `source()` so that callers can walk the chain
/// and downcast. Shared, so that `UctError` stays `Clone`; two sources are
/// equal when their messages are.
#[derive(Clone)]
pub struct ErrorSource(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl ErrorSource {
    /// Wraps an error.
    pub fn new(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        ErrorSource(Arc::new(err))
    }

    /// The wrapped error.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The wrapped error as `E`, if it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl From<std::io::Error> for ErrorSource {
    fn from(err: std::io::Error) -> Self {
        ErrorSource::new(err)
    }
}

impl fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

// Transparent: the chain continues with the wrapped error's own source.
impl std::error::Error for ErrorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ErrorSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ErrorSource {}

/// Result of a uct-core operation.
pub type Result<T, E = UctError> = std::result::Result<T, E>;

/// Errors of memory domains, transports and endpoints.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum UctError {
    #[error("invalid parameter: {0}")]
    InvalidParam(String),

    #[error("{transport} does not support {operation}; check `transport-info -d -t {transport}` for its capabilities")]
    Unsupported {
        transport: String,
        operation: String,
    },

    #[error("{owner} cannot use {mem_type} memory: {hint}")]
    MemoryTypeUnsupported {
        mem_type: MemoryType,
        owner: String,
        hint: String,
    },

    #[error("remote access [{addr:#x}, +{len}) is outside the registered region [{base:#x}, +{region_len}); use an address and length inside the range the peer registered")]
    OutOfRange {
        addr: u64,
        len: u64,
        base: u64,
        region_len: u64,
    },

    #[error("local buffer access at offset {offset} length {len} is outside the memory handle of {handle_len} bytes")]
    LocalOutOfRange {
        offset: usize,
        len: usize,
        handle_len: usize,
    },

    #[error("access denied: the region grants {granted}, the operation needs {needed}; register the region with the rights the peer needs")]
    AccessDenied { needed: Access, granted: Access },

    #[error("the rkey's secret does not match the registered region; the rkey is forged, stale or from another registration")]
    BadSecret,

    #[error("region {region_id} is not registered (it was deregistered or never existed); ask the peer for a fresh rkey")]
    NoSuchRegion { region_id: u64 },

    #[error("malformed rkey: {0}; pass the exact bytes produced by pack_rkey")]
    BadRkey(String),

    #[error("the rkey belongs to {found}, not {expected}; unpack it with the component of the transport that uses it")]
    RkeyMismatch { expected: String, found: String },

    #[error(
        "atomic access at {addr:#x} is not aligned to {align} bytes; align the remote address"
    )]
    Misaligned { addr: u64, align: u64 },

    #[error("no such device: {0}; `transport-info -d` lists the devices present")]
    NoDevice(String),

    #[error("no such transport: {0}; `transport-info -d` lists the transports present")]
    NoTransport(String),

    #[error("cannot reach the peer: {0}")]
    Unreachable(String),

    #[error("timed out: {0}")]
    Timeout(String),

    #[error("endpoint failed: {0}; create a new endpoint to the peer")]
    EndpointFailed(String),

    #[error("operation canceled: {0}")]
    Canceled(String),

    #[error("protocol error from the peer: {0}; the connection was closed")]
    Protocol(String),

    #[error("{device}: {message}")]
    Device {
        device: String,
        message: String,
        /// The driver's or library's own error, where there is one.
        #[source]
        source: Option<ErrorSource>,
    },

    #[error("out of memory: {0}")]
    NoMemory(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: ErrorSource,
    },

    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),

    #[error(transparent)]
    Bootstrap(#[from] crate::bootstrap::BootstrapError),
}

impl UctError {
    /// An I/O error with the action that failed.
    pub fn io(context: impl Into<String>, err: std::io::Error) -> Self {
        UctError::Io {
            context: context.into(),
            source: ErrorSource::new(err),
        }
    }

    /// An error of a library or driver below uct-rs (verbs, hl-thunk,
    /// CUDA), kept as the source; `context` says what was being done.
    pub fn lower(
        context: impl Into<String>,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        UctError::Io {
            context: context.into(),
            source: ErrorSource::new(err),
        }
    }

    /// A capability the transport does not have.
    pub fn unsupported(transport: &str, operation: &str) -> Self {
        UctError::Unsupported {
            transport: transport.to_string(),
            operation: operation.to_string(),
        }
    }
}
