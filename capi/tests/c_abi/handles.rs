//! Handles and arguments the caller got wrong: each is an error with a
//! message, never a crash.

use std::ffi::CString;
use std::ptr::null_mut;

use uct_rs::*;

use crate::common::*;

#[test]
fn a_null_handle_of_every_kind_is_an_error() {
    let mut url = null_mut();
    // SAFETY: `url` is writable.
    let s = unsafe { uct_rs_transport_bind(null_mut(), &mut url) };
    let msg = fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "bind(NULL)");
    assert!(
        msg.starts_with("uct_rs_transport_bind: transport is NULL"),
        "{msg}"
    );
    assert!(url.is_null(), "an out-parameter was written on failure");

    let mut info = UctRsRegionInfo::default();
    // SAFETY: `info` is writable.
    let s = unsafe { uct_rs_mem_info(null_mut(), &mut info) };
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "mem_info(NULL)");
    let s = uct_rs_view_free(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "view_free(NULL)");
    let s = uct_rs_remote_free(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "remote_free(NULL)");
    let s = uct_rs_request_test(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "request_test(NULL)");
    let s = uct_rs_request_wait(null_mut(), 0);
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "request_wait(NULL)");
    let s = uct_rs_listing_free(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "listing_free(NULL)");
    let s = uct_rs_transport_destroy(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "destroy(NULL)");
    let s = uct_rs_mem_free(null_mut());
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "mem_free(NULL)");
}

#[test]
fn a_freed_handle_is_an_error_and_stays_one() {
    let t = transport("self", false);
    ok(uct_rs_transport_destroy(t), "destroy");
    let msg = fails(
        uct_rs_transport_destroy(t),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "destroy twice",
    );
    assert!(msg.contains("a transport handle that was freed"), "{msg}");
    let mut url = null_mut();
    // SAFETY: `url` is writable.
    let s = unsafe { uct_rs_transport_bind(t, &mut url) };
    fails(s, Status::UCT_RS_ERR_INVALID_HANDLE, "bind after destroy");
    // A new transport never gets the freed handle back.
    let t2 = transport("self", false);
    assert_ne!(t, t2);
    ok(uct_rs_transport_destroy(t2), "destroy");
}

#[test]
fn a_handle_of_another_kind_is_refused_by_name() {
    let t = transport("self", false);
    let m = alloc(t, 64);
    let msg = fails(
        uct_rs_transport_destroy(m.cast()),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "a memory passed as a transport",
    );
    assert!(
        msg.contains("is a memory handle, not a transport handle"),
        "{msg}"
    );
    let v = view(m, 0, 64);
    let msg = fails(
        uct_rs_mem_free(v.cast()),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "a view passed as a memory",
    );
    assert!(
        msg.contains("is a view handle, not a memory handle"),
        "{msg}"
    );
    // Both are still there.
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_mem_free(m), "mem_free");
    ok(uct_rs_transport_destroy(t), "destroy");
}

#[test]
fn garbage_and_never_issued_handles_are_refused() {
    let mut local = 0u64;
    let fake: *mut UctRsTransport = (&raw mut local).cast();
    let msg = fails(
        uct_rs_transport_destroy(fake),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "a pointer of the program's",
    );
    assert!(msg.contains("not a uct-rs handle"), "{msg}");
    let t = transport("self", false);
    // The same kind, an id far past any issued.
    let future: *mut UctRsTransport = t.map_addr(|a| a + (1usize << 48));
    let msg = fails(
        uct_rs_transport_destroy(future),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "a handle never issued",
    );
    assert!(msg.contains("never issued"), "{msg}");
    ok(uct_rs_transport_destroy(t), "destroy");
}

#[test]
fn strings_are_freed_once_and_only_ours() {
    let t = transport("self", false);
    let mut url = null_mut();
    // SAFETY: `url` is writable.
    ok(unsafe { uct_rs_transport_bind(t, &mut url) }, "bind");
    ok(uct_rs_string_free(url), "string_free");
    fails(
        uct_rs_string_free(url),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "free twice",
    );
    let mine = CString::new("mine").unwrap().into_raw();
    fails(
        uct_rs_string_free(mine),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "free a string of the program's",
    );
    // SAFETY: made by into_raw above, and left alone by uct-rs.
    drop(unsafe { CString::from_raw(mine) });
    ok(uct_rs_transport_destroy(t), "destroy");
}

#[test]
fn null_out_pointers_and_bad_arguments_change_nothing() {
    // SAFETY: NULL is refused before any use.
    let s = unsafe { uct_rs_transport_create(std::ptr::null(), null_mut()) };
    fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, "create into NULL");

    let mut o = options("self", false);
    o.opts.size -= 8;
    let mut t = null_mut();
    // SAFETY: `o` is a whole options struct; `t` is writable.
    let s = unsafe { uct_rs_transport_create(&o.opts, &mut t) };
    let msg = fails(
        s,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        "options of another size",
    );
    assert!(msg.contains("uct_rs_transport_options_init"), "{msg}");

    let mut o = options("self", false);
    o.opts.progress = 9;
    // SAFETY: as above.
    let s = unsafe { uct_rs_transport_create(&o.opts, &mut t) };
    fails(
        s,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        "an unknown progress mode",
    );
    let bad_types = [UCT_RS_MEMORY_HOST, 77];
    let mut o = options("self", false);
    o.opts.memory_types = bad_types.as_ptr();
    o.opts.num_memory_types = bad_types.len();
    // SAFETY: as above; the array lives for the call.
    let s = unsafe { uct_rs_transport_create(&o.opts, &mut t) };
    fails(
        s,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        "an unknown memory type",
    );
    let o = options("warp-drive", false);
    // SAFETY: as above.
    let s = unsafe { uct_rs_transport_create(&o.opts, &mut t) };
    let msg = fails(s, Status::UCT_RS_ERR_NO_TRANSPORT, "an unknown transport");
    assert!(msg.contains("warp-drive"), "{msg}");
    assert!(t.is_null());

    let t = transport("self", false);
    let mut m = null_mut();
    // SAFETY: `m` is writable.
    let s = unsafe { uct_rs_mem_alloc(t, UCT_RS_MEMORY_HOST, 64, 0x80, &mut m) };
    fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, "unknown rights");
    // SAFETY: as above.
    let s = unsafe { uct_rs_mem_alloc(t, 42, 64, UCT_RS_REMOTE_ALL, &mut m) };
    fails(
        s,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        "an unknown memory type",
    );
    // SAFETY: as above.
    let s = unsafe { uct_rs_mem_alloc(t, UCT_RS_MEMORY_HOST, 0, UCT_RS_REMOTE_ALL, &mut m) };
    fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, "0 bytes");
    assert!(m.is_null());
    ok(uct_rs_transport_destroy(t), "destroy");
}

#[test]
fn statuses_have_names_and_a_version() {
    let name = |s: i32| {
        // SAFETY: uct_rs_status_name returns a static string.
        unsafe { std::ffi::CStr::from_ptr(uct_rs_status_name(s)) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(name(0), "UCT_RS_OK");
    assert_eq!(
        name(Status::UCT_RS_ERR_BAD_URL as i32),
        "UCT_RS_ERR_BAD_URL"
    );
    assert_eq!(name(-999), "UCT_RS_UNKNOWN_STATUS");
    let mut v = std::ptr::null();
    // SAFETY: `v` is writable.
    ok(unsafe { uct_rs_version(&mut v) }, "version");
    // SAFETY: a static string.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_panic_inside_a_call_becomes_a_status() {
    uct_rs::testing::panic_in_next_call();
    let mut supported = false;
    // SAFETY: `supported` is writable.
    let s = unsafe { uct_rs_supported(&mut supported) };
    let msg = fails(s, Status::UCT_RS_ERR_PANIC, "a call that panics");
    assert!(
        msg.contains("a Rust panic inside uct-rs (the test hook's panic inside uct_rs_supported)"),
        "{msg}"
    );
    // The next call works.
    // SAFETY: as above.
    ok(unsafe { uct_rs_supported(&mut supported) }, "supported");
}
