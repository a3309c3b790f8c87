//! The error of the C layer, the calling thread's last message, and the
//! guard every exported function runs its body in: a Rust panic never
//! crosses into C, it becomes `UCT_RS_ERR_PANIC`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use uct_core::UctError;
use uct_transfer::TransferError;

use crate::status::Status;

/// Errors of the C layer: its own (handles, arguments, busy memory, a
/// caught panic) and the transfer API's.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// A handle that cannot be used; the text says why.
    #[error("{0}")]
    InvalidHandle(String),

    /// A pointer argument that is NULL where it may not be.
    #[error("{param} is NULL; pass {wanted}")]
    Null {
        /// The parameter.
        param: &'static str,
        /// What it must point to.
        wanted: &'static str,
    },

    /// An argument that is not acceptable; the text says which and why.
    #[error("{0}")]
    Argument(String),

    /// An index or range outside what there is.
    #[error("{0}")]
    OutOfRange(String),

    /// Memory that a pending request still uses.
    #[error("{0}")]
    Busy(String),

    /// A panic caught at the boundary.
    #[error("a Rust panic inside uct-rs ({0}): a bug in uct-rs; report it with RUST_BACKTRACE=1 set. The handles of this call may be unusable: destroy them")]
    Panic(String),

    /// An internal limit or inconsistency.
    #[error("{0}")]
    Internal(String),

    /// An error of the transfer API.
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

impl From<UctError> for CapiError {
    fn from(e: UctError) -> Self {
        CapiError::Transfer(TransferError::Uct(e))
    }
}

impl CapiError {
    /// The status C sees for it.
    pub fn status(&self) -> Status {
        match self {
            CapiError::InvalidHandle(_) => Status::UCT_RS_ERR_INVALID_HANDLE,
            CapiError::Null { .. } | CapiError::Argument(_) => Status::UCT_RS_ERR_INVALID_ARGUMENT,
            CapiError::OutOfRange(_) => Status::UCT_RS_ERR_OUT_OF_RANGE,
            CapiError::Busy(_) => Status::UCT_RS_ERR_BUSY,
            CapiError::Panic(_) => Status::UCT_RS_ERR_PANIC,
            CapiError::Internal(_) => Status::UCT_RS_ERR_INTERNAL,
            CapiError::Transfer(e) => transfer_status(e),
        }
    }
}

/// The status of an error of the transfer API.
pub fn transfer_status(e: &TransferError) -> Status {
    use TransferError as T;
    match e {
        T::BadUrl { .. } | T::TruncatedUrl { .. } | T::UrlVersion { .. } => {
            Status::UCT_RS_ERR_BAD_URL
        }
        T::NoCommonTransport { .. } | T::NoTransport(_) => Status::UCT_RS_ERR_NO_TRANSPORT,
        T::NotBound | T::NotConnected | T::AlreadyConnected { .. } => Status::UCT_RS_ERR_STATE,
        T::PeerUnreachable { .. } => Status::UCT_RS_ERR_UNREACHABLE,
        T::PeerFailed { .. } => Status::UCT_RS_ERR_PEER_FAILED,
        T::Closed => Status::UCT_RS_ERR_CLOSED,
        T::BadKey { .. } | T::KeyTransport { .. } => Status::UCT_RS_ERR_BAD_KEY,
        T::OutOfRange { .. } | T::LengthMismatch { .. } => Status::UCT_RS_ERR_OUT_OF_RANGE,
        T::RemoteAccess { .. } | T::ForeignMemory { .. } => Status::UCT_RS_ERR_ACCESS,
        T::NoNotifications { .. } => Status::UCT_RS_ERR_UNSUPPORTED,
        T::Panicked { .. } => Status::UCT_RS_ERR_PANIC,
        T::TimedOut { .. } => Status::UCT_RS_ERR_TIMED_OUT,
        T::PolledAgain => Status::UCT_RS_ERR_INTERNAL,
        T::Config(_) => Status::UCT_RS_ERR_INVALID_ARGUMENT,
        T::MemoryType(_) => Status::UCT_RS_ERR_MEMORY_TYPE,
        T::Uct(u) => uct_status(u),
    }
}

/// The status of an error of the transport layer.
fn uct_status(e: &UctError) -> Status {
    use UctError as U;
    match e {
        U::InvalidParam(_) | U::Misaligned { .. } | U::Config(_) => {
            Status::UCT_RS_ERR_INVALID_ARGUMENT
        }
        U::Unsupported { .. } => Status::UCT_RS_ERR_UNSUPPORTED,
        U::MemoryTypeUnsupported { .. } => Status::UCT_RS_ERR_MEMORY_TYPE,
        U::OutOfRange { .. } | U::LocalOutOfRange { .. } => Status::UCT_RS_ERR_OUT_OF_RANGE,
        U::AccessDenied { .. } | U::BadSecret | U::NoSuchRegion { .. } => Status::UCT_RS_ERR_ACCESS,
        U::BadRkey(_) | U::RkeyMismatch { .. } => Status::UCT_RS_ERR_BAD_KEY,
        U::NoDevice(_) | U::NoTransport(_) => Status::UCT_RS_ERR_NO_TRANSPORT,
        U::Unreachable(_) => Status::UCT_RS_ERR_UNREACHABLE,
        U::Timeout(_) => Status::UCT_RS_ERR_TIMED_OUT,
        U::EndpointFailed(_) => Status::UCT_RS_ERR_PEER_FAILED,
        _ => Status::UCT_RS_ERR_TRANSPORT,
    }
}

/// The result of a function body: a status that is not an error
/// (`UCT_RS_OK`, `UCT_RS_IN_PROGRESS`), or the error.
pub type CallResult = Result<Status, CapiError>;

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
fn set_last_error(message: String) {
    // A message quoting the caller's bytes may hold a NUL: show it instead
    // of cutting the message there.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // At thread exit the slot may be gone: the message is then dropped.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// The calling thread's last error message, or `""`.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The message of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs the body of exported function `func`: its error becomes its
/// status and this thread's last message ("func: message"), and a panic
/// becomes `UCT_RS_ERR_PANIC`.
pub(crate) fn call(func: &'static str, body: impl FnOnce() -> CallResult) -> Status {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        crate::testing::panic_if_asked(func);
        body()
    }));
    let err = match outcome {
        Ok(Ok(status)) => return status,
        Ok(Err(e)) => e,
        Err(payload) => {
            let what = panic_message(&*payload);
            // A payload whose drop panics must not unwind into C either.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            CapiError::Panic(what)
        }
    };
    let status = err.status();
    // Building the message runs Display code, which must not unwind into
    // C either; a panic there leaves a plainer message.
    let message = catch_unwind(AssertUnwindSafe(|| {
        let message = match &err {
            CapiError::Transfer(e) => in_c_words(&e.to_string()),
            other => other.to_string(),
        };
        format!("{func}: {message}")
    }))
    .unwrap_or_else(|_| format!("{func}: failed, and describing the failure panicked"));
    set_last_error(message);
    status
}

/// The transfer API's advice, which names its Rust calls, in the words of
/// the C API.
fn in_c_words(message: &str) -> String {
    const WORDS: [(&str, &str); 9] = [
        ("Memory::remote_key()", "uct_rs_mem_remote_key()"),
        ("use Memory::alloc", "use uct_rs_mem_alloc"),
        (
            "build the Transport with .transport(\"cma\")",
            "create the transport with options.transport \"cma\"",
        ),
        (".transport(\"tcp\")", "\"tcp\""),
        ("bind()", "uct_rs_transport_bind()"),
        ("connect()", "uct_rs_transport_connect()"),
        ("with slice()", "with uct_rs_remote_slice()"),
        (
            "write with notify=false",
            "write without UCT_RS_WRITE_NOTIFY",
        ),
        ("this Transport", "this transport"),
    ];
    WORDS
        .iter()
        .fold(message.to_string(), |m, (rust, c)| m.replace(rust, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is this thread's message, alive until its
        // next failed call.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn an_error_becomes_its_status_and_the_threads_message() {
        let s = call("uct_rs_demo", || Err(TransferError::NotBound.into()));
        assert_eq!(s, Status::UCT_RS_ERR_STATE);
        assert!(last().starts_with("uct_rs_demo: the transport is not bound"));
        // Success leaves the message of the last failure.
        assert_eq!(
            call("uct_rs_demo", || Ok(Status::UCT_RS_OK)),
            Status::UCT_RS_OK
        );
        assert!(last().starts_with("uct_rs_demo: the transport is not bound"));
        // Another thread has its own.
        let other = std::thread::spawn(last).join().unwrap();
        assert_eq!(other, "");
    }

    #[test]
    fn advice_names_the_c_calls() {
        call("uct_rs_demo", || Err(TransferError::NotBound.into()));
        assert!(
            last().contains("call uct_rs_transport_bind() first"),
            "{}",
            last()
        );
    }

    #[test]
    fn a_nul_in_a_message_is_shown_not_cut() {
        call("uct_rs_demo", || Err(CapiError::Argument("a\0b".into())));
        assert_eq!(last(), "uct_rs_demo: a\\0b");
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let s = call("uct_rs_demo", || panic!("boom"));
        assert_eq!(s, Status::UCT_RS_ERR_PANIC);
        assert!(
            last().contains("a Rust panic inside uct-rs (boom)"),
            "{}",
            last()
        );
    }
}
