//! The error type of the transport layer. Every message says what failed and
//! what to do about it.

use crate::memory::{Access, MemoryType};

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
    Device { device: String, message: String },

    #[error("out of memory: {0}")]
    NoMemory(String),

    #[error("{context}: {message}")]
    Io { context: String, message: String },

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
            message: err.to_string(),
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
