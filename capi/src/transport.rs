//! Transports: options, create, bind, connect, progress, destroy.

use std::ffi::c_char;
use std::sync::{Arc, LazyLock, RwLock};

use uct_transfer::{MemoryType, Progress, Transport};

use crate::error::{call, CapiError};
use crate::ffi::{give_string, text, text_or_null, Out};
use crate::handle::{drop_last, Kind, Table};
use crate::status::Status;

/// A transport (opaque): one side of a connection.
pub struct UctRsTransport {
    _opaque: [u8; 0],
}

/// A memory type: one of the `UCT_RS_MEMORY_*` values.
pub type UctRsMemoryType = u32;
/// Host (CPU) memory.
pub const UCT_RS_MEMORY_HOST: UctRsMemoryType = 0;
/// Intel Gaudi device memory.
pub const UCT_RS_MEMORY_GAUDI: UctRsMemoryType = 1;
/// CUDA device memory.
pub const UCT_RS_MEMORY_CUDA: UctRsMemoryType = 2;
/// A DMA-buf of unknown origin.
pub const UCT_RS_MEMORY_DMABUF: UctRsMemoryType = 3;

/// Who drives progress: one of the `UCT_RS_PROGRESS_*` values.
pub type UctRsProgress = u32;
/// A thread the transport owns drives progress (the default).
pub const UCT_RS_PROGRESS_THREAD: UctRsProgress = 0;
/// The caller drives progress: `uct_rs_transport_progress`, or any wait
/// (`uct_rs_request_wait`, `uct_rs_wait_for_write`, which drive it while
/// they wait). Nothing moves, and no dead peer is noticed, otherwise.
pub const UCT_RS_PROGRESS_MANUAL: UctRsProgress = 1;

/// The settings of a new transport. Fill it with
/// `uct_rs_transport_options_init`, which sets `size` to the size this
/// header declares, then change what you need. `size` names the version
/// of the struct: a library refuses options of any other size
/// (`UCT_RS_ERR_INVALID_ARGUMENT`), so build against the header of the
/// library you load.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsTransportOptions {
    /// `sizeof(uct_rs_transport_options)`, set by
    /// `uct_rs_transport_options_init`: the version of this struct.
    pub size: usize,
    /// The transport: `"auto"` (NULL means the same: the best one for the
    /// peer and the memory types), `"rc"`, `"tcp"`, `"posix"`, `"cma"` or
    /// `"self"`. The string is read during `uct_rs_transport_create` only.
    pub transport: *const c_char,
    /// The device (as `transport-info -d` names it; `"lo"` for tcp on
    /// loopback), or NULL for the first one found.
    pub device: *const c_char,
    /// The memory types the transport will register: an array of
    /// `num_memory_types` `UCT_RS_MEMORY_*` values, or NULL for host
    /// memory only. `"auto"` picks among transports that reach all of them.
    pub memory_types: *const UctRsMemoryType,
    /// The length of `memory_types`.
    pub num_memory_types: usize,
    /// `UCT_RS_PROGRESS_THREAD` (the default) or `UCT_RS_PROGRESS_MANUAL`.
    pub progress: UctRsProgress,
    /// Requests in flight before the next one waits (it never fails for
    /// that); 0 for the default (64).
    pub max_in_flight: usize,
    /// Notifications kept for waits not yet made; a peer that sends more
    /// fails the connection. 0 for the default (2^20).
    pub max_notification_backlog: usize,
}

/// Statistics of a transport (`uct_rs_transport_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UctRsStats {
    /// Writes posted.
    pub writes: u64,
    /// Bytes those writes carried.
    pub bytes_written: u64,
    /// Reads posted.
    pub reads: u64,
    /// Notifications sent as the immediate data of the write.
    pub notifications_sent_by_immediate: u64,
    /// Notifications sent as a message after the write.
    pub notifications_sent_by_message: u64,
    /// Notifications received as immediate data.
    pub notifications_received_by_immediate: u64,
    /// Notifications received as a message.
    pub notifications_received_by_message: u64,
}

/// A live transport, as its table holds it. Calls borrow the Transport
/// for their length; destroy takes it out and waits for them.
pub(crate) struct TransportCell {
    live: RwLock<Option<Arc<Transport>>>,
    pub(crate) manual: bool,
}

impl TransportCell {
    /// The Transport, or `Closed` once destroy has begun.
    pub(crate) fn get(&self) -> Result<Arc<Transport>, CapiError> {
        self.live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(CapiError::Transfer(uct_transfer::TransferError::Closed))
    }
}

pub(crate) static TRANSPORTS: LazyLock<Table<TransportCell>> =
    LazyLock::new(|| Table::new(Kind::Transport));

/// The memory type of C value `t` (parameter `param`).
pub(crate) fn memory_type(t: UctRsMemoryType, param: &str) -> Result<MemoryType, CapiError> {
    Ok(match t {
        UCT_RS_MEMORY_HOST => MemoryType::Host,
        UCT_RS_MEMORY_GAUDI => MemoryType::Gaudi,
        UCT_RS_MEMORY_CUDA => MemoryType::Cuda,
        UCT_RS_MEMORY_DMABUF => MemoryType::DmaBuf,
        other => {
            return Err(CapiError::Argument(format!(
                "{param} {other} is not a memory type; use UCT_RS_MEMORY_HOST, _GAUDI, _CUDA or _DMABUF"
            )))
        }
    })
}

/// The C value of memory type `t`.
pub(crate) fn memory_type_value(t: MemoryType) -> UctRsMemoryType {
    match t {
        MemoryType::Host => UCT_RS_MEMORY_HOST,
        MemoryType::Gaudi => UCT_RS_MEMORY_GAUDI,
        MemoryType::Cuda => UCT_RS_MEMORY_CUDA,
        MemoryType::DmaBuf => UCT_RS_MEMORY_DMABUF,
    }
}

fn defaults() -> UctRsTransportOptions {
    UctRsTransportOptions {
        size: std::mem::size_of::<UctRsTransportOptions>(),
        transport: std::ptr::null(),
        device: std::ptr::null(),
        memory_types: std::ptr::null(),
        num_memory_types: 0,
        progress: UCT_RS_PROGRESS_THREAD,
        max_in_flight: 0,
        max_notification_backlog: 0,
    }
}

/// Fills `options` with the defaults: `"auto"`, the first device, host
/// memory, a progress thread, 64 requests in flight; and its `size`.
///
/// Ownership: the caller owns `options`. Thread-safe.
///
/// # Safety
/// `options` is NULL (refused) or points to a writable
/// `uct_rs_transport_options`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_options_init(
    options: *mut UctRsTransportOptions,
) -> Status {
    call("uct_rs_transport_options_init", || {
        // SAFETY: the caller's contract.
        unsafe { Out::new(options, "options") }?.set(defaults());
        Ok(Status::UCT_RS_OK)
    })
}

/// The builder `o` describes.
///
/// # Safety
/// The pointers in `o` are NULL or valid as its fields' docs say.
unsafe fn builder_of(o: &UctRsTransportOptions) -> Result<uct_transfer::Builder, CapiError> {
    // SAFETY: the caller's contract covers the fields.
    let (transport, device) = unsafe {
        (
            text_or_null(o.transport, "options->transport")?,
            text_or_null(o.device, "options->device")?,
        )
    };
    let mut b = Transport::builder().transport(transport.unwrap_or("auto"));
    if let Some(d) = device {
        b = b.device(d);
    }
    if !o.memory_types.is_null() || o.num_memory_types > 0 {
        if o.memory_types.is_null() || !o.memory_types.is_aligned() {
            return Err(CapiError::Argument(format!(
                "options->memory_types is {:p} with options->num_memory_types {}; pass an array of that many UCT_RS_MEMORY_* values, or NULL and 0 for host memory",
                o.memory_types, o.num_memory_types
            )));
        }
        if o.num_memory_types == 0 || o.num_memory_types > 16 {
            return Err(CapiError::Argument(format!(
                "options->num_memory_types is {}; pass 1 to 16 memory types, or NULL and 0 for host memory",
                o.num_memory_types
            )));
        }
        // SAFETY: not NULL, aligned, and `num_memory_types` long as the
        // caller promised.
        let raw = unsafe { std::slice::from_raw_parts(o.memory_types, o.num_memory_types) };
        let types = raw
            .iter()
            .map(|&t| memory_type(t, "options->memory_types[]"))
            .collect::<Result<Vec<_>, _>>()?;
        b = b.memory_types(&types);
    }
    b = b.progress(match o.progress {
        UCT_RS_PROGRESS_THREAD => Progress::Thread,
        UCT_RS_PROGRESS_MANUAL => Progress::Manual,
        other => {
            return Err(CapiError::Argument(format!(
                "options->progress {other} is not known; use UCT_RS_PROGRESS_THREAD or UCT_RS_PROGRESS_MANUAL"
            )))
        }
    });
    if o.max_in_flight > 0 {
        b = b.max_in_flight(o.max_in_flight);
    }
    if o.max_notification_backlog > 0 {
        b = b.max_notification_backlog(o.max_notification_backlog);
    }
    Ok(b)
}

/// Creates a transport with `options` (NULL: the defaults of
/// `uct_rs_transport_options_init`). It opens every candidate transport
/// now; `uct_rs_transport_bind` then gives the URL for the peer.
///
/// Ownership: `*transport` is the caller's, to destroy with
/// `uct_rs_transport_destroy`; the strings and array in `options` are
/// read during the call only. Thread-safe; the transport may be used from
/// any thread, by several at once.
///
/// # Safety
/// `options` is NULL or points to a `uct_rs_transport_options` whose
/// pointers are NULL or valid as its fields say; `transport` is NULL
/// (refused) or points to a writable `uct_rs_transport *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_create(
    options: *const UctRsTransportOptions,
    transport: *mut *mut UctRsTransport,
) -> Status {
    call("uct_rs_transport_create", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(transport, "transport") }?;
        crate::global::registry()?;
        let o = if options.is_null() {
            defaults()
        } else {
            if !options.is_aligned() {
                return Err(CapiError::Argument(
                    "options is not aligned; pass the address of a uct_rs_transport_options".into(),
                ));
            }
            // SAFETY: not NULL and aligned; the caller promised a
            // uct_rs_transport_options there. Its size field is read first,
            // and the rest only once it says the struct is this version's.
            let size = unsafe { options.cast::<usize>().read() };
            let ours = std::mem::size_of::<UctRsTransportOptions>();
            if size != ours {
                return Err(CapiError::Argument(format!(
                    "options->size is {size}, and this library reads options of {ours} bytes; call uct_rs_transport_options_init before setting fields, and build against the uct_rs.h of this library"
                )));
            }
            // SAFETY: as above; the whole struct is there.
            unsafe { options.read() }
        };
        // SAFETY: the caller's contract covers the fields.
        let builder = unsafe { builder_of(&o) }?;
        let t = builder.build()?;
        let cell = TransportCell {
            live: RwLock::new(Some(Arc::new(t))),
            manual: o.progress == UCT_RS_PROGRESS_MANUAL,
        };
        out.set(TRANSPORTS.insert(Arc::new(cell))?);
        Ok(Status::UCT_RS_OK)
    })
}

/// The transport's URL, for the peer's `uct_rs_transport_connect`: the
/// transports it offers with their addresses, and the token its
/// notifications must carry. The same URL on every call.
///
/// Ownership: `*url` is the caller's, to free with `uct_rs_string_free`.
/// Thread-safe.
///
/// # Safety
/// `url` is NULL (refused) or points to a writable `char *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_bind(
    transport: *mut UctRsTransport,
    url: *mut *mut c_char,
) -> Status {
    call("uct_rs_transport_bind", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(url, "url") }?;
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        out.set(give_string(t.bind()?)?);
        Ok(Status::UCT_RS_OK)
    })
}

/// Connects to the peer whose `uct_rs_transport_bind` gave `peer_url`.
/// Both sides bind and both connect. A string that is not a URL gives
/// `UCT_RS_ERR_BAD_URL`; a peer that cannot be reached
/// `UCT_RS_ERR_UNREACHABLE`; after a failure the transport may try
/// another URL.
///
/// Ownership: `peer_url` is read during the call only. Thread-safe.
///
/// # Safety
/// `peer_url` is NULL (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_connect(
    transport: *mut UctRsTransport,
    peer_url: *const c_char,
) -> Status {
    call("uct_rs_transport_connect", || {
        // SAFETY: the caller's contract.
        let url = unsafe { text(peer_url, "peer_url") }?;
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        t.connect(url)?;
        Ok(Status::UCT_RS_OK)
    })
}

/// Drives progress once; `*events` (if not NULL) gets the number of
/// events handled. Needed with `UCT_RS_PROGRESS_MANUAL` (harmless
/// otherwise).
///
/// Ownership: nothing changes hands. Thread-safe.
///
/// # Safety
/// `events` is NULL or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_progress(
    transport: *mut UctRsTransport,
    events: *mut usize,
) -> Status {
    call("uct_rs_transport_progress", || {
        let out = if events.is_null() {
            None
        } else {
            // SAFETY: the caller's contract.
            Some(unsafe { Out::new(events, "events") }?)
        };
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        let n = t.progress();
        if let Some(out) = out {
            out.set(n);
        }
        Ok(Status::UCT_RS_OK)
    })
}

/// The name of the transport connected over (`"tcp"`, `"posix"`, ...);
/// `UCT_RS_ERR_STATE` before connect.
///
/// Ownership: `*name` is the caller's, to free with `uct_rs_string_free`.
/// Thread-safe.
///
/// # Safety
/// `name` is NULL (refused) or points to a writable `char *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_name(
    transport: *mut UctRsTransport,
    name: *mut *mut c_char,
) -> Status {
    call("uct_rs_transport_name", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(name, "name") }?;
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        let n = t.transport_name().ok_or(CapiError::Transfer(
            uct_transfer::TransferError::NotConnected,
        ))?;
        out.set(give_string(n)?);
        Ok(Status::UCT_RS_OK)
    })
}

/// What the transport has done so far.
///
/// Ownership: the caller owns `*stats`. Thread-safe.
///
/// # Safety
/// `stats` is NULL (refused) or points to a writable `uct_rs_stats`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_transport_stats(
    transport: *mut UctRsTransport,
    stats: *mut UctRsStats,
) -> Status {
    call("uct_rs_transport_stats", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(stats, "stats") }?;
        let s = TRANSPORTS.get(transport, "transport")?.get()?.stats();
        out.set(UctRsStats {
            writes: s.writes,
            bytes_written: s.bytes_written,
            reads: s.reads,
            notifications_sent_by_immediate: s.notifications_sent_by_immediate,
            notifications_sent_by_message: s.notifications_sent_by_message,
            notifications_received_by_immediate: s.notifications_received_by_immediate,
            notifications_received_by_message: s.notifications_received_by_message,
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Destroys the transport: the connection closes, and every request still
/// pending on it ends with `UCT_RS_ERR_CLOSED` (as does a wait in another
/// thread, within 100 ms). When it returns, no request of this transport
/// touches memory any more. Memory registered with it stays valid until
/// freed.
///
/// Ownership: the handle is invalid afterwards (later calls with it give
/// `UCT_RS_ERR_INVALID_HANDLE`). Thread-safe: it waits for calls on this
/// transport in other threads to return.
#[no_mangle]
pub extern "C" fn uct_rs_transport_destroy(transport: *mut UctRsTransport) -> Status {
    call("uct_rs_transport_destroy", || {
        let cell = TRANSPORTS.remove(transport, "transport")?;
        let t = cell.live.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            // Dropping the last reference joins the progress thread and
            // resolves what is pending.
            drop_last(t);
        }
        Ok(Status::UCT_RS_OK)
    })
}
