//! What the caller frees or destroys while something still uses it:
//! memory a request in flight uses is not freed, a view outlives nothing,
//! and a destroy ends pending requests and waits with an error.

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use uct_rs::*;

use crate::common::*;

/// Drives `peer`'s progress until `req` is done; its status.
fn finish(req: *mut UctRsRequest, peer: *mut UctRsTransport) -> Status {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // SAFETY: a NULL count is allowed.
        ok(
            unsafe { uct_rs_transport_progress(peer, null_mut()) },
            "progress",
        );
        let s = uct_rs_request_test(req);
        if s != Status::UCT_RS_IN_PROGRESS {
            return s;
        }
        assert!(Instant::now() < deadline, "the request never completed");
    }
}

#[test]
fn memory_a_pending_request_uses_is_not_freed() {
    // Manual progress over tcp: a write stays in flight until both sides
    // drive progress.
    let (a, b) = pair("tcp", true);
    let (src, dst) = (alloc(a, 1 << 20), alloc(b, 1 << 20));
    let data = pattern(9, 1 << 20);
    fill(src, 0, &data);
    let (v, r) = (view(src, 0, 1 << 20), remote_of(dst));
    let (s, req) = write(a, v, r, None);
    ok(s, "write");
    assert_eq!(
        uct_rs_request_test(req),
        Status::UCT_RS_IN_PROGRESS,
        "the write completed without the peer's progress: this test needs it pending"
    );
    let msg = fails(
        uct_rs_mem_free(src),
        Status::UCT_RS_ERR_BUSY,
        "free while a write uses it",
    );
    assert!(
        msg.contains("1 request(s) using this memory are in flight"),
        "{msg}"
    );
    // Still whole: its view and key work.
    let _ = key(src);
    ok(finish(req, b), "the write, once both sides progress");
    assert!(contents(dst, 0, 1 << 20) == data);
    ok(uct_rs_mem_free(src), "free once the write is done");
    // Its view is now invalid, not dangling.
    let (s, none) = write(a, v, r, None);
    let msg = fails(
        s,
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "a view of freed memory",
    );
    assert!(msg.contains("memory of this view was freed"), "{msg}");
    assert!(none.is_null());
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_request_free(req), "request_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn a_freed_request_still_keeps_its_memory_busy() {
    let (a, b) = pair("tcp", true);
    let (src, dst) = (alloc(a, 4096), alloc(b, 4096));
    let (v, r) = (view(src, 0, 4096), remote_of(dst));
    let (s, req) = write(a, v, r, None);
    ok(s, "write");
    ok(uct_rs_request_free(req), "request_free while in flight");
    fails(
        uct_rs_mem_free(src),
        Status::UCT_RS_ERR_BUSY,
        "free while a freed request's write is in flight",
    );
    // Destroying the transport ends the write, and frees the memory.
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_mem_free(src), "free after the transport is gone");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn destroy_ends_pending_requests_with_closed() {
    let (a, b) = pair("tcp", true);
    let (src, dst) = (alloc(a, 4096), alloc(b, 4096));
    let (v, r) = (view(src, 0, 4096), remote_of(dst));
    let (s, req) = write(a, v, r, Some(1));
    ok(s, "write");
    let mut flush = null_mut();
    // SAFETY: `flush` is writable.
    ok(unsafe { uct_rs_flush(a, &mut flush) }, "flush");
    assert_eq!(uct_rs_request_test(req), Status::UCT_RS_IN_PROGRESS);
    ok(uct_rs_transport_destroy(a), "destroy with requests pending");
    for (what, h) in [("write", req), ("flush", flush)] {
        let msg = fails(
            uct_rs_request_wait(h, LIMIT_MS),
            Status::UCT_RS_ERR_CLOSED,
            what,
        );
        assert!(msg.contains("dropped with this operation pending"), "{msg}");
        // And stays so.
        fails(uct_rs_request_test(h), Status::UCT_RS_ERR_CLOSED, what);
        ok(uct_rs_request_free(h), "request_free");
    }
    ok(uct_rs_mem_free(src), "free after destroy");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn destroy_ends_a_wait_in_another_thread() {
    let (a, b) = pair("self", false);
    let addr = b.addr();
    let waiter = std::thread::spawn(move || {
        let b: *mut UctRsTransport = std::ptr::without_provenance_mut(addr);
        let started = Instant::now();
        let (s, _) = wait_note(b, -1);
        (s, last(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    ok(
        uct_rs_transport_destroy(b),
        "destroy while another thread waits",
    );
    let (s, msg, took) = waiter.join().unwrap();
    assert_eq!(s, Status::UCT_RS_ERR_CLOSED, "{msg}");
    assert!(
        took < Duration::from_secs(10),
        "the wait ended after {took:?}"
    );
    ok(uct_rs_transport_destroy(a), "destroy");
}

#[test]
fn a_wait_in_manual_mode_drives_progress_itself() {
    let (a, b) = pair("tcp", true);
    let (src, dst) = (alloc(a, 8192), alloc(b, 8192));
    let data = pattern(11, 8192);
    fill(src, 0, &data);
    let (v, r) = (view(src, 0, 8192), remote_of(dst));
    let (s, req) = write(a, v, r, Some(77));
    ok(s, "write");
    // b's wait drives b (which executes the put); a's wait drives a.
    let (s, note) = wait_note(b, LIMIT_MS);
    ok(s, "wait_for_write");
    assert_eq!((note.tag, note.length), (77, 8192));
    ok(uct_rs_request_wait(req, LIMIT_MS), "request_wait");
    assert!(contents(dst, 0, 8192) == data);
    let s = uct_rs_request_wait(req, 0);
    ok(s, "a wait of 0 on a done request");
    ok(uct_rs_request_free(req), "request_free");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(src), "mem_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn free_wait_times_out_then_frees_once_the_request_is_done() {
    let (a, b) = pair("tcp", true);
    let mut buf = pattern(3, 1 << 20);
    let mut src = null_mut();
    // SAFETY: `buf` stays allocated until uct_rs_mem_free_wait returned OK.
    ok(
        unsafe {
            uct_rs_mem_register(
                a,
                buf.as_mut_ptr().cast(),
                buf.len(),
                UCT_RS_MEMORY_HOST,
                UCT_RS_REMOTE_READ,
                &mut src,
            )
        },
        "mem_register",
    );
    let dst = alloc(b, 1 << 20);
    let (v, r) = (view(src, 0, 1 << 20), remote_of(dst));
    let (s, req) = write(a, v, r, None);
    ok(s, "write");
    ok(uct_rs_request_free(req), "request_free while in flight");
    assert_eq!(
        uct_rs_request_test(req),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "the freed request"
    );
    fails(
        uct_rs_mem_free_wait(src, 0),
        Status::UCT_RS_ERR_TIMED_OUT,
        "free_wait with no time while the peer does not progress",
    );
    // Still whole after the timeout.
    let _ = key(src);
    // The peer progresses in another thread; free_wait drives a's.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let peer = {
        let (stop, b) = (stop.clone(), b as usize);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: b stays alive until this thread is joined.
                ok(
                    unsafe { uct_rs_transport_progress(b as *mut UctRsTransport, null_mut()) },
                    "progress",
                );
            }
        })
    };
    ok(uct_rs_mem_free_wait(src, -1), "free_wait for ever");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    peer.join().unwrap();
    assert!(contents(dst, 0, 1 << 20) == buf, "the write landed whole");
    fails(
        uct_rs_mem_free(src),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "memory freed by free_wait",
    );
    // The buffer is the test's again.
    buf.fill(0);
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}
