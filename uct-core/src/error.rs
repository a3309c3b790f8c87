//! The error type of the transport layer. Every message says what failed and
//! what to do about it.

use std::fmt;
use std::sync::Arc;

use crate::memory::{Access, MemoryType};

/// The underlying error of a [`UctError`] (an `io::Error`, a driver's or a
/// verbs error), kept so that callers can walk the chain and downcast.
/// Shared, so that `UctError` stays `Clone`; two sources are equal when
/// their messages are.
///
/// It is not an error itself but derefs to the one it holds: the `source()`
/// of a `UctError` is therefore the wrapped error, not a wrapper around it,
/// and `source().downcast_ref::<std::io::Error>()` finds an `io::Error`.
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

impl std::ops::Deref for ErrorSource {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
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
    /// A parameter the caller passed is not acceptable; the text says which.
    #[error("invalid parameter: {0}")]
    InvalidParam(String),

    /// The transport lacks the capability the operation needs.
    #[error("{transport} does not support {operation}; check `transport-info -d -t {transport}` for its capabilities")]
    Unsupported {
        /// The transport asked.
        transport: String,
        /// The operation it does not have.
        operation: String,
    },

    /// Memory of a type the MD or transport cannot touch.
    #[error("{owner} cannot use {mem_type} memory: {hint}")]
    MemoryTypeUnsupported {
        /// The memory type offered.
        mem_type: MemoryType,
        /// The MD or transport that refused it.
        owner: String,
        /// What to use instead.
        hint: String,
    },

    /// A remote access reaches outside the region the peer registered.
    #[error("remote access [{addr:#x}, +{len}) is outside the registered region [{base:#x}, +{region_len}); use an address and length inside the range the peer registered")]
    OutOfRange {
        /// First remote address of the access.
        addr: u64,
        /// Its length in bytes.
        len: u64,
        /// First address of the registered region.
        base: u64,
        /// Length of the registered region.
        region_len: u64,
    },

    /// A local buffer access reaches outside its memory handle.
    #[error("local buffer access at offset {offset} length {len} is outside the memory handle of {handle_len} bytes")]
    LocalOutOfRange {
        /// Offset into the handle.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Length of the handle.
        handle_len: usize,
    },

    /// The region does not grant the rights the operation needs.
    #[error("access denied: the region grants {granted}, the operation needs {needed}; register the region with the rights the peer needs")]
    AccessDenied {
        /// Rights the operation needs.
        needed: Access,
        /// Rights the region was registered with.
        granted: Access,
    },

    /// The rkey's secret does not match the registration it names.
    #[error("the rkey's secret does not match the registered region; the rkey is forged, stale or from another registration")]
    BadSecret,

    /// The rkey names a region that is not registered (any more).
    #[error("region {region_id} is not registered (it was deregistered or never existed); ask the peer for a fresh rkey")]
    NoSuchRegion {
        /// The region id the rkey carries.
        region_id: u64,
    },

    /// Rkey bytes that do not decode.
    #[error("malformed rkey: {0}; pass the exact bytes produced by pack_rkey")]
    BadRkey(String),

    /// An rkey unpacked by the wrong component.
    #[error("the rkey belongs to {found}, not {expected}; unpack it with the component of the transport that uses it")]
    RkeyMismatch {
        /// The component that tried to unpack it.
        expected: String,
        /// The component that packed it.
        found: String,
    },

    /// An atomic at an address not aligned to its width.
    #[error(
        "atomic access at {addr:#x} is not aligned to {align} bytes; align the remote address"
    )]
    Misaligned {
        /// The remote address.
        addr: u64,
        /// The alignment required, in bytes.
        align: u64,
    },

    /// A device or memory domain that is not present.
    #[error("no such device: {0}; `transport-info -d` lists the devices present")]
    NoDevice(String),

    /// A transport that is not present; the text says why.
    #[error("no such transport: {0}; `transport-info -d` lists the transports present")]
    NoTransport(String),

    /// The peer's address cannot be reached from this iface.
    #[error("cannot reach the peer: {0}")]
    Unreachable(String),

    /// A wait passed its deadline.
    #[error("timed out: {0}")]
    Timeout(String),

    /// The endpoint can no longer be used (peer gone, NIC error).
    #[error("endpoint failed: {0}; create a new endpoint to the peer")]
    EndpointFailed(String),

    /// An operation canceled before it completed (its endpoint closed).
    #[error("operation canceled: {0}")]
    Canceled(String),

    /// The peer broke the wire protocol; the connection was closed.
    #[error("protocol error from the peer: {0}; the connection was closed")]
    Protocol(String),

    /// A device or driver refused; `message` says what to do.
    #[error("{device}: {message}")]
    Device {
        /// The device, library or driver.
        device: String,
        /// What failed and what to do.
        message: String,
        /// The driver's or library's own error, where there is one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// Memory could not be allocated or registered for lack of it.
    #[error("out of memory: {0}")]
    NoMemory(String),

    /// A system call or lower library failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error it gave.
        #[source]
        source: ErrorSource,
    },

    /// An invalid configuration value.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),

    /// The bootstrap channel failed.
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

    /// A capability the transport does not have.
    pub fn unsupported(transport: &str, operation: &str) -> Self {
        UctError::Unsupported {
            transport: transport.to_string(),
            operation: operation.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_errors_keep_their_source() {
        let err = UctError::io(
            "open /dev/shm/x",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        // The source is the io::Error itself, not a wrapper.
        let io = err
            .source()
            .and_then(|source| source.downcast_ref::<std::io::Error>())
            .expect("the io::Error");
        assert_eq!(io.raw_os_error(), Some(libc::ENOENT));
        assert!(err.to_string().starts_with("open /dev/shm/x: "), "{err}");
        // Clone and equality survive the source.
        assert_eq!(err.clone(), err);
    }

    #[test]
    fn device_errors_keep_an_optional_source() {
        let with = UctError::Device {
            device: "rxe0".into(),
            message: "refused".into(),
            source: Some(std::io::Error::from_raw_os_error(libc::EPERM).into()),
        };
        assert_eq!(
            with.source()
                .and_then(|source| source.downcast_ref::<std::io::Error>())
                .and_then(std::io::Error::raw_os_error),
            Some(libc::EPERM)
        );
        let without = UctError::Device {
            device: "rxe0".into(),
            message: "refused".into(),
            source: None,
        };
        assert!(without.source().is_none());
        assert_ne!(with, without);
        assert_eq!(with.to_string(), "rxe0: refused");
    }
}
