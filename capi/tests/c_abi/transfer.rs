//! Writes, reads and notifications through the C ABI, in one process;
//! URLs and keys that are wrong.

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use uct_rs::*;

use crate::common::*;

const LEN: usize = 64 * 1024;

/// A notified write from a to b and a read back, every byte checked.
fn write_and_wait_over(tl: &str) {
    let (a, b) = pair(tl, false);
    let (src, dst) = (alloc(a, LEN), alloc(b, LEN));
    let data = pattern(1, LEN);
    fill(src, 0, &data);
    let (v, r) = (view(src, 0, LEN), remote_of(dst));
    let (s, req) = write(a, v, r, Some(0xfeed));
    ok(s, &format!("{tl}: write"));
    ok(uct_rs_request_wait(req, LIMIT_MS), "request_wait");
    // Done stays done.
    ok(uct_rs_request_test(req), "request_test after done");
    let (s, note) = wait_note(b, LIMIT_MS);
    ok(s, &format!("{tl}: wait_for_write"));
    assert_eq!((note.length, note.tag), (LEN, 0xfeed));
    assert!(contents(dst, 0, LEN) == data, "{tl}: the bytes differ");

    // A read of the second half back into the first half of src.
    let half = LEN / 2;
    let mut slice = null_mut();
    // SAFETY: `slice` is writable.
    ok(
        unsafe { uct_rs_remote_slice(r, half, half, &mut slice) },
        "remote_slice",
    );
    let v0 = view(src, 0, half);
    fill(src, 0, &vec![0; half]);
    let mut rd = null_mut();
    // SAFETY: `rd` is writable.
    ok(unsafe { uct_rs_read(a, v0, slice, &mut rd) }, "read");
    ok(uct_rs_request_wait(rd, LIMIT_MS), "read wait");
    assert!(
        contents(src, 0, half) == data[half..],
        "{tl}: read bytes differ"
    );

    let mut stats = UctRsStats::default();
    // SAFETY: `stats` is writable.
    ok(unsafe { uct_rs_transport_stats(a, &mut stats) }, "stats");
    assert_eq!((stats.writes, stats.reads), (1, 1));
    for h in [req, rd] {
        ok(uct_rs_request_free(h), "request_free");
    }
    for v in [v, v0] {
        ok(uct_rs_view_free(v), "view_free");
    }
    for r in [r, slice] {
        ok(uct_rs_remote_free(r), "remote_free");
    }
    ok(uct_rs_mem_free(src), "mem_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn write_and_wait_for_write_over_self() {
    write_and_wait_over("self");
}

#[test]
fn write_and_wait_for_write_over_posix() {
    write_and_wait_over("posix");
}

#[test]
fn write_and_wait_for_write_over_tcp() {
    write_and_wait_over("tcp");
}

#[test]
fn notifications_are_tested_without_blocking_and_waits_time_out() {
    let (a, b) = pair("self", true);
    let mut note = UctRsNotification::default();
    // SAFETY: `note` is writable.
    let s = unsafe { uct_rs_test_for_write(b, &mut note) };
    assert_eq!(s, Status::UCT_RS_IN_PROGRESS, "{}", last());
    let started = Instant::now();
    let (s, _) = wait_note(b, 50);
    fails(s, Status::UCT_RS_ERR_TIMED_OUT, "a wait nothing answers");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert!(started.elapsed() < Duration::from_secs(10));

    let (src, dst) = (alloc(a, 256), alloc(b, 256));
    fill(src, 0, &pattern(3, 256));
    let (v, r) = (view(src, 0, 256), remote_of(dst));
    for tag in [1, 2] {
        let (s, req) = write(a, v, r, Some(tag));
        ok(s, "write");
        ok(uct_rs_request_wait(req, LIMIT_MS), "wait");
        ok(uct_rs_request_free(req), "free");
    }
    // In the order written, each once.
    for tag in [1, 2] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // SAFETY: `note` is writable.
            let s = unsafe { uct_rs_test_for_write(b, &mut note) };
            if s == Status::UCT_RS_OK {
                break;
            }
            assert_eq!(s, Status::UCT_RS_IN_PROGRESS, "{}", last());
            assert!(Instant::now() < deadline, "notification {tag} never came");
        }
        assert_eq!((note.tag, note.length), (tag, 256));
    }
    // SAFETY: as above.
    let s = unsafe { uct_rs_test_for_write(b, &mut note) };
    assert_eq!(s, Status::UCT_RS_IN_PROGRESS, "a notification came twice");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(src), "mem_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn bad_urls_are_refused_by_name() {
    let t = transport("self", false);
    let peer = transport("self", false);
    let peer_url = bind(peer);
    let msg = fails(
        connect(t, &peer_url),
        Status::UCT_RS_ERR_STATE,
        "connect before bind",
    );
    assert!(msg.contains("call uct_rs_transport_bind() first"), "{msg}");
    let url = bind(t);
    fails(connect(t, "hello"), Status::UCT_RS_ERR_BAD_URL, "garbage");
    let cut = &url[..url.len() - 3];
    let msg = fails(
        connect(t, cut),
        Status::UCT_RS_ERR_BAD_URL,
        "a truncated URL",
    );
    assert!(msg.starts_with("uct_rs_transport_connect: "), "{msg}");
    let other_version = url.replacen("uct://v1/", "uct://v9/", 1);
    fails(
        connect(t, &other_version),
        Status::UCT_RS_ERR_BAD_URL,
        "another version",
    );
    // SAFETY: NULL is refused.
    let s = unsafe { uct_rs_transport_connect(t, std::ptr::null()) };
    fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, "a NULL URL");
    let bytes = b"uct://\xff\0";
    // SAFETY: a NUL-terminated byte string.
    let s = unsafe { uct_rs_transport_connect(t, bytes.as_ptr().cast()) };
    fails(
        s,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        "a URL that is not UTF-8",
    );
    ok(uct_rs_transport_destroy(t), "destroy");
    ok(uct_rs_transport_destroy(peer), "destroy");
}

#[test]
fn bad_keys_lengths_and_ranges_are_refused_at_once() {
    let (a, b) = pair("self", false);
    let (s, r) = parse("uctkey:v1:garbage");
    fails(s, Status::UCT_RS_ERR_BAD_KEY, "a garbage key");
    assert!(r.is_null());
    let (src, dst) = (alloc(a, 128), alloc(b, 64));
    let k = key(dst);
    let (s, _) = parse(&k[..k.len() - 4]);
    fails(s, Status::UCT_RS_ERR_BAD_KEY, "a truncated key");
    let mut v = null_mut();
    // SAFETY: `v` is writable.
    let s = unsafe { uct_rs_mem_view(src, 100, 64, &mut v) };
    fails(s, Status::UCT_RS_ERR_OUT_OF_RANGE, "a view past the end");
    let (v, r) = (view(src, 0, 128), remote_of(dst));
    let (s, req) = write(a, v, r, None);
    let msg = fails(s, Status::UCT_RS_ERR_OUT_OF_RANGE, "lengths that differ");
    assert!(msg.contains("128 bytes and the remote slice 64"), "{msg}");
    assert!(req.is_null(), "a request was made for a refused write");
    let mut slice = null_mut();
    // SAFETY: `slice` is writable.
    let s = unsafe { uct_rs_remote_slice(r, 32, 64, &mut slice) };
    fails(s, Status::UCT_RS_ERR_OUT_OF_RANGE, "a slice past the end");
    let mut req = null_mut();
    // SAFETY: `req` is writable.
    let s = unsafe { uct_rs_write(a, v, r, 0x10, 0, &mut req) };
    fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, "unknown flags");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(src), "mem_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
}

#[test]
fn a_registered_host_buffer_is_written_from_and_checked_for_its_type() {
    let (a, b) = pair("tcp", false);
    let mut buf = pattern(5, 4096);
    let mut m = null_mut();
    // SAFETY: `buf` outlives the memory, which is freed below once the
    // write is done.
    ok(
        unsafe {
            uct_rs_mem_register(
                a,
                buf.as_mut_ptr().cast(),
                buf.len(),
                UCT_RS_MEMORY_HOST,
                UCT_RS_REMOTE_READ,
                &mut m,
            )
        },
        "mem_register",
    );
    let mut info = UctRsRegionInfo::default();
    // SAFETY: `info` is writable.
    ok(unsafe { uct_rs_mem_info(m, &mut info) }, "mem_info");
    assert_eq!(info.address, buf.as_ptr() as u64);
    assert_eq!((info.length, info.rights), (4096, UCT_RS_REMOTE_READ));
    let dst = alloc(b, 4096);
    let (v, r) = (view(m, 0, 4096), remote_of(dst));
    let (s, req) = write(a, v, r, Some(9));
    ok(s, "write from a registered buffer");
    ok(uct_rs_request_wait(req, LIMIT_MS), "wait");
    assert!(contents(dst, 0, 4096) == buf);
    let mut m2 = null_mut();
    // SAFETY: as above; refused before registering.
    let s = unsafe {
        uct_rs_mem_register(
            a,
            buf.as_mut_ptr().cast(),
            buf.len(),
            UCT_RS_MEMORY_CUDA,
            UCT_RS_REMOTE_ALL,
            &mut m2,
        )
    };
    let msg = fails(s, Status::UCT_RS_ERR_MEMORY_TYPE, "host memory called CUDA");
    assert!(msg.contains("pass UCT_RS_MEMORY_HOST"), "{msg}");
    ok(uct_rs_request_free(req), "request_free");
    ok(uct_rs_view_free(v), "view_free");
    ok(uct_rs_remote_free(r), "remote_free");
    ok(uct_rs_mem_free(m), "mem_free");
    ok(uct_rs_mem_free(dst), "mem_free");
    ok(uct_rs_transport_destroy(a), "destroy");
    ok(uct_rs_transport_destroy(b), "destroy");
    // The buffer is the test's again.
    buf.fill(0);
}

#[test]
fn posix_refuses_to_register_a_buffer_it_did_not_allocate() {
    let t = transport("posix", false);
    let mut buf = vec![0u8; 4096];
    let mut m = null_mut();
    // SAFETY: refused before anything keeps the pointer.
    let s = unsafe {
        uct_rs_mem_register(
            t,
            buf.as_mut_ptr().cast(),
            buf.len(),
            UCT_RS_MEMORY_HOST,
            UCT_RS_REMOTE_ALL,
            &mut m,
        )
    };
    let msg = fails(s, Status::UCT_RS_ERR_MEMORY_TYPE, "posix and a buffer");
    assert!(msg.contains("use uct_rs_mem_alloc"), "{msg}");
    ok(uct_rs_transport_destroy(t), "destroy");
}

#[test]
fn a_registration_past_the_end_of_the_address_space_is_refused() {
    let t = transport("tcp", false);
    let mut buf = vec![0u8; 4096];
    for (what, len) in [
        ("SIZE_MAX bytes", usize::MAX),
        ("more than PTRDIFF_MAX bytes", isize::MAX as usize + 1),
        ("a range that wraps", usize::MAX - buf.as_ptr() as usize + 2),
    ] {
        let mut m = null_mut();
        // SAFETY: refused before anything keeps or touches the pointer.
        let s = unsafe {
            uct_rs_mem_register(
                t,
                buf.as_mut_ptr().cast(),
                len,
                UCT_RS_MEMORY_HOST,
                UCT_RS_REMOTE_ALL,
                &mut m,
            )
        };
        let msg = fails(s, Status::UCT_RS_ERR_INVALID_ARGUMENT, what);
        assert!(
            msg.contains("past the end of the address space"),
            "{what}: {msg}"
        );
        assert!(m.is_null(), "{what}");
    }
    buf.fill(1);
    ok(uct_rs_transport_destroy(t), "destroy");
}

/// The transfer API refuses such a range itself, not only the C ABI.
#[test]
fn transfer_register_raw_refuses_a_range_past_the_end_too() {
    use uct_transfer::{Access, Memory, TransferError, Transport};
    let t = Transport::builder().transport("tcp").build().unwrap();
    let mut buf = vec![0u8; 4096];
    for (what, len) in [
        ("usize::MAX bytes", usize::MAX),
        ("more than isize::MAX bytes", isize::MAX as usize + 1),
        ("a range that wraps", usize::MAX - buf.as_ptr() as usize + 2),
    ] {
        // SAFETY: refused before anything keeps or touches the pointer.
        let e = unsafe { Memory::register_raw(&t, buf.as_mut_ptr(), len, Access::all()) };
        match e {
            Err(TransferError::Config(msg)) => {
                assert!(
                    msg.contains("past the end of the address space"),
                    "{what}: {msg}"
                )
            }
            other => panic!("{what}: {:?}", other.map(|_| ())),
        }
    }
    buf.fill(1);
}
