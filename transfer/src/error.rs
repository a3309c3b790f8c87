//! The error type of the transfer API. Every message says what was wrong
//! and what to do.

use uct_core::{Access, UctError};

/// Result of a transfer operation.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;

/// Errors of the transfer API. `Clone`, so that one failure (a dead peer, a
/// dropped transport) can resolve every pending future.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// The string is not a transfer URL at all.
    #[error("not a uct-rs transfer URL ({why}); pass the exact string the peer's bind() returned")]
    BadUrl {
        /// What was wrong with it.
        why: String,
    },

    /// The URL was cut short or altered on its way.
    #[error("the URL is truncated or altered ({why}); pass the peer's bind() string whole")]
    TruncatedUrl {
        /// What showed it.
        why: String,
    },

    /// The URL was written by another format version.
    #[error("the URL is format version {found}, this build reads version {expected}; run the same uct-rs version on both sides")]
    UrlVersion {
        /// The version in the URL.
        found: String,
        /// The version this build writes and reads.
        expected: u32,
    },

    /// The peer offers no transport this side can use to reach it.
    #[error("the peer's URL offers {offered}, and this transport uses {ours}; {hint}")]
    NoCommonTransport {
        /// What the peer's URL offers.
        offered: String,
        /// What this side bound.
        ours: String,
        /// What to do.
        hint: String,
    },

    /// bind() has not been called.
    #[error("the transport is not bound; call bind() first and pass its URL to the peer")]
    NotBound,

    /// connect() has not succeeded yet.
    #[error("the transport is not connected; call connect() with the peer's URL first")]
    NotConnected,

    /// connect() was called on a connected transport.
    #[error("the transport is already connected (to a peer over {transport}); create another Transport for another peer")]
    AlreadyConnected {
        /// The transport of the connection it has.
        transport: String,
    },

    /// The peer of a connect() could not be reached.
    #[error("cannot connect to the peer over {transport}: {source}; check that the peer is running and its URL is current")]
    PeerUnreachable {
        /// The transport tried.
        transport: String,
        /// Why.
        source: UctError,
    },

    /// The peer died or the connection failed; every pending operation
    /// ends with this.
    #[error("the peer failed: {source}; create a new Transport and connect again")]
    PeerFailed {
        /// What the transport reported.
        source: UctError,
    },

    /// The Transport was dropped with the operation pending.
    #[error("the transport was dropped with this operation pending")]
    Closed,

    /// A remote key string that cannot be read.
    #[error(
        "bad remote key ({why}); pass the exact string the peer's Memory::remote_key() returned"
    )]
    BadKey {
        /// What was wrong with it.
        why: String,
    },

    /// A remote key with no entry for the transport in use.
    #[error("the remote key was registered for {registered}, not for {ours}; the peer must register its memory with a Transport of the same kind as this one")]
    KeyTransport {
        /// What the key's entries name.
        registered: String,
        /// This side's transport and memory domain.
        ours: String,
    },

    /// A view or slice out of range.
    #[error(
        "{what} [{offset}, +{len}) is out of range: the {of} has {size} bytes; cut it inside them"
    )]
    OutOfRange {
        /// "view" or "remote slice".
        what: &'static str,
        /// The offset asked.
        offset: usize,
        /// The length asked.
        len: usize,
        /// "memory" or "remote buffer".
        of: &'static str,
        /// Its size.
        size: usize,
    },

    /// The local view and the remote slice differ in length.
    #[error("the local view has {local} bytes and the remote slice {remote}; cut the remote buffer to the view's length with slice()")]
    LengthMismatch {
        /// Bytes of the view.
        local: usize,
        /// Bytes of the remote slice.
        remote: usize,
    },

    /// The remote buffer does not grant the right an operation needs.
    #[error("the remote buffer grants {granted}, and a {op} needs {needed}; the peer must register it with that right")]
    RemoteAccess {
        /// "write" or "read".
        op: &'static str,
        /// The rights in the key.
        granted: Access,
        /// The right needed.
        needed: Access,
    },

    /// Memory registered with another Transport.
    #[error("this memory is registered with memory domain(s) {registered}, not with {ours} that the transport uses; register it with this Transport")]
    ForeignMemory {
        /// The MDs it is registered with.
        registered: String,
        /// The MD of the transport.
        ours: String,
    },

    /// The chosen transport cannot notify.
    #[error("{transport} cannot notify the peer of a write (it has no active messages and no immediate data); write with notify=false, or use posix, tcp or rc")]
    NoNotifications {
        /// The transport.
        transport: String,
    },

    /// Progress panicked (a bug in a transport); the connection is closed.
    #[error("progress panicked ({what}): a bug in the transport; the connection is closed, report it with RUST_BACKTRACE=1")]
    Panicked {
        /// The panic's message.
        what: String,
    },

    /// A wait with a deadline ran out.
    #[error(
        "nothing came within {after:?}; the peer is stuck or slow (a dead one is reported as such)"
    )]
    TimedOut {
        /// The deadline.
        after: std::time::Duration,
    },

    /// A future polled again after it resolved.
    #[error("this future was polled again after it resolved; await each future once")]
    PolledAgain,

    /// A bad setting of the builder.
    #[error("invalid setting: {0}")]
    Config(String),

    /// No transport here can do what was asked.
    #[error("no usable transport: {0}")]
    NoTransport(String),

    /// Memory a transport cannot reach, refused at registration.
    #[error("{0}")]
    MemoryType(String),

    /// An error of the transport layer.
    #[error(transparent)]
    Uct(#[from] UctError),
}
