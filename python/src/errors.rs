//! The transfer API's errors as Python exceptions, which carry its message.
//!
//! The classes are defined in Python (`uct_rs/_errors.py`), where an
//! exception can have two bases: `InputError` is both a `uct_rs.Error` and
//! a `ValueError`, `Timeout` both a `uct_rs.Error` and a `TimeoutError`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use uct_transfer::TransferError;

/// Which class of `uct_rs` an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad input: a URL, a key, a range, a buffer, a setting
    /// (`uct_rs.InputError`, a `ValueError`).
    Input,
    /// The peer died or cannot be reached (`uct_rs.PeerError`).
    Peer,
    /// A wait ran out of time (`uct_rs.Timeout`, a `TimeoutError`).
    Timeout,
    /// Anything else (`uct_rs.Error`).
    Other,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Input => "InputError",
            Kind::Peer => "PeerError",
            Kind::Timeout => "Timeout",
            Kind::Other => "Error",
        }
    }
}

/// The kind of a transfer error: what the caller passed is wrong, the peer
/// is gone, or something else.
pub fn kind_of(e: &TransferError) -> Kind {
    use TransferError as E;
    match e {
        E::BadUrl { .. }
        | E::TruncatedUrl { .. }
        | E::UrlVersion { .. }
        | E::NoCommonTransport { .. }
        | E::BadKey { .. }
        | E::KeyTransport { .. }
        | E::OutOfRange { .. }
        | E::LengthMismatch { .. }
        | E::RemoteAccess { .. }
        | E::ForeignMemory { .. }
        | E::Config(_)
        | E::MemoryType(_) => Kind::Input,
        E::PeerFailed { .. } | E::PeerUnreachable { .. } => Kind::Peer,
        E::TimedOut { .. } => Kind::Timeout,
        _ => Kind::Other,
    }
}

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class `name` of `uct_rs._errors`.
fn class<'py>(py: Python<'py>, kind: Kind) -> PyResult<Bound<'py, PyType>> {
    let module =
        ERRORS_MODULE.get_or_try_init(py, || py.import("uct_rs._errors").map(|m| m.unbind()))?;
    Ok(module.bind(py).getattr(kind.class_name())?.cast_into()?)
}

/// An exception of `kind` with `message`.
pub fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, kind) {
        Ok(ty) => PyErr::from_type(ty, message),
        // The package is broken (uct_rs._errors missing): still say what
        // failed.
        Err(e) => PyRuntimeError::new_err(format!("{message} (and uct_rs._errors: {e})")),
    })
}

/// Bad input, as `uct_rs.InputError` (a `ValueError`).
pub fn input(message: impl Into<String>) -> PyErr {
    raise(Kind::Input, message)
}

/// A transfer error as the exception of its kind, with its message.
pub fn to_py(e: TransferError) -> PyErr {
    raise(kind_of(&e), e.to_string())
}

/// `Result<T, TransferError>` into `PyResult<T>`.
pub trait IntoPy<T> {
    /// The error as its Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, TransferError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_dead_peers_and_timeouts_are_told_apart() {
        let bad_url = TransferError::BadUrl { why: "x".into() };
        assert_eq!(kind_of(&bad_url), Kind::Input);
        let range = TransferError::OutOfRange {
            what: "view",
            offset: 1,
            len: 2,
            of: "memory",
            size: 1,
        };
        assert_eq!(kind_of(&range), Kind::Input);
        let timed_out = TransferError::TimedOut {
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(kind_of(&timed_out), Kind::Timeout);
        assert_eq!(kind_of(&TransferError::Closed), Kind::Other);
        assert_eq!(kind_of(&TransferError::NotConnected), Kind::Other);
    }
}
