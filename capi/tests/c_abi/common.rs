//! Safe wrappers over the extern "C" functions for the tests: each checks
//! the status and says the thread's last error when it is not what was
//! expected.

use std::ffi::{c_char, CStr, CString};
use std::ptr::null_mut;

use uct_rs::*;

/// The bound on every wait: a hang is a failure, not a stuck run.
pub const LIMIT_MS: i64 = 60_000;

/// The calling thread's last error message.
pub fn last() -> String {
    // SAFETY: uct_rs_last_error returns this thread's message, valid
    // until its next failed call; it is copied at once.
    unsafe { CStr::from_ptr(uct_rs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts `s` is UCT_RS_OK, with the message otherwise.
#[track_caller]
pub fn ok(s: Status, what: &str) {
    assert_eq!(s, Status::UCT_RS_OK, "{what}: {}", last());
}

/// Asserts `s` is `want`; returns the message of that error.
#[track_caller]
pub fn fails(s: Status, want: Status, what: &str) -> String {
    assert_eq!(s, want, "{what}: got {s:?} ({})", last());
    last()
}

/// Copies a string uct-rs returned and frees it.
pub fn take(s: *mut c_char) -> String {
    // SAFETY: `s` is a NUL-terminated string uct-rs returned, not yet
    // freed.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    ok(uct_rs_string_free(s), "uct_rs_string_free");
    text
}

/// Options for `tl` (tcp on loopback), with manual progress or not.
pub struct Opts {
    pub opts: UctRsTransportOptions,
    _strings: Vec<CString>,
}

pub fn options(tl: &str, manual: bool) -> Opts {
    let mut opts = std::mem::MaybeUninit::<UctRsTransportOptions>::uninit();
    // SAFETY: a writable options struct; init fills every field.
    ok(
        unsafe { uct_rs_transport_options_init(opts.as_mut_ptr()) },
        "options_init",
    );
    // SAFETY: options_init returned OK, so every field is set.
    let mut opts = unsafe { opts.assume_init() };
    let name = CString::new(tl).unwrap();
    opts.transport = name.as_ptr();
    let mut strings = vec![name];
    if tl == "tcp" {
        let lo = CString::new("lo").unwrap();
        opts.device = lo.as_ptr();
        strings.push(lo);
    }
    if manual {
        opts.progress = UCT_RS_PROGRESS_MANUAL;
    }
    Opts {
        opts,
        _strings: strings,
    }
}

/// A transport over `tl`.
pub fn transport(tl: &str, manual: bool) -> *mut UctRsTransport {
    let o = options(tl, manual);
    let mut t = null_mut();
    // SAFETY: the options' strings live in `o` during the call; `t` is
    // writable.
    ok(
        unsafe { uct_rs_transport_create(&o.opts, &mut t) },
        &format!("create a {tl} transport"),
    );
    t
}

/// The URL of `t`.
pub fn bind(t: *mut UctRsTransport) -> String {
    let mut url = null_mut();
    // SAFETY: `url` is writable.
    ok(unsafe { uct_rs_transport_bind(t, &mut url) }, "bind");
    take(url)
}

/// Connects `t` to `url`.
pub fn connect(t: *mut UctRsTransport, url: &str) -> Status {
    let url = CString::new(url).unwrap();
    // SAFETY: a NUL-terminated string alive for the call.
    unsafe { uct_rs_transport_connect(t, url.as_ptr()) }
}

/// Two transports over `tl`, bound and connected to each other.
pub fn pair(tl: &str, manual: bool) -> (*mut UctRsTransport, *mut UctRsTransport) {
    let (a, b) = (transport(tl, manual), transport(tl, manual));
    let (ua, ub) = (bind(a), bind(b));
    ok(connect(a, &ub), "connect a");
    ok(connect(b, &ua), "connect b");
    let mut name = null_mut();
    // SAFETY: `name` is writable.
    ok(unsafe { uct_rs_transport_name(a, &mut name) }, "name");
    assert_eq!(take(name), tl);
    (a, b)
}

/// `len` bytes of host memory of `t`, every right for peers.
pub fn alloc(t: *mut UctRsTransport, len: usize) -> *mut UctRsMemory {
    let mut m = null_mut();
    // SAFETY: `m` is writable.
    ok(
        unsafe { uct_rs_mem_alloc(t, UCT_RS_MEMORY_HOST, len, UCT_RS_REMOTE_ALL, &mut m) },
        "mem_alloc",
    );
    m
}

/// A view of `m`.
pub fn view(m: *mut UctRsMemory, offset: usize, len: usize) -> *mut UctRsView {
    let mut v = null_mut();
    // SAFETY: `v` is writable.
    ok(
        unsafe { uct_rs_mem_view(m, offset, len, &mut v) },
        "mem_view",
    );
    v
}

/// The remote key of `m`.
pub fn key(m: *mut UctRsMemory) -> String {
    let mut k = null_mut();
    // SAFETY: `k` is writable.
    ok(unsafe { uct_rs_mem_remote_key(m, &mut k) }, "remote_key");
    take(k)
}

/// Parses `key` as the peer would; the status and the remote buffer.
pub fn parse(key: &str) -> (Status, *mut UctRsRemote) {
    let key = CString::new(key).unwrap();
    let mut r = null_mut();
    // SAFETY: a NUL-terminated string alive for the call; `r` writable.
    let s = unsafe { uct_rs_remote_parse(key.as_ptr(), &mut r) };
    (s, r)
}

/// The remote buffer of `m`, as its peer sees it.
pub fn remote_of(m: *mut UctRsMemory) -> *mut UctRsRemote {
    let (s, r) = parse(&key(m));
    ok(s, "remote_parse");
    r
}

/// Copies `data` into `m` at `offset`.
pub fn fill(m: *mut UctRsMemory, offset: usize, data: &[u8]) {
    // SAFETY: `data` is readable for its length.
    ok(
        unsafe { uct_rs_mem_write(m, offset, data.as_ptr().cast(), data.len()) },
        "mem_write",
    );
}

/// `len` bytes of `m` from `offset`.
pub fn contents(m: *mut UctRsMemory, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` is writable for `len` bytes.
    ok(
        unsafe { uct_rs_mem_read(m, offset, out.as_mut_ptr().cast(), len) },
        "mem_read",
    );
    out
}

/// Posts a write; the status and the request.
pub fn write(
    t: *mut UctRsTransport,
    v: *mut UctRsView,
    r: *mut UctRsRemote,
    notify_tag: Option<u32>,
) -> (Status, *mut UctRsRequest) {
    let mut req = null_mut();
    let flags = if notify_tag.is_some() {
        UCT_RS_WRITE_NOTIFY
    } else {
        0
    };
    // SAFETY: `req` is writable.
    let s = unsafe { uct_rs_write(t, v, r, flags, notify_tag.unwrap_or(0), &mut req) };
    (s, req)
}

/// Waits for the next notification of `t`.
pub fn wait_note(t: *mut UctRsTransport, timeout_ms: i64) -> (Status, UctRsNotification) {
    let mut n = UctRsNotification::default();
    // SAFETY: `n` is writable.
    let s = unsafe { uct_rs_wait_for_write(t, timeout_ms, &mut n) };
    (s, n)
}

/// The pattern byte `i` of message `round`: every byte differs from its
/// neighbours and from the other rounds'.
pub fn pattern(round: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(round.wrapping_mul(7)) as u8
                ^ 0x5a
        })
        .collect()
}
