//! The probe and the registry listing, as a C program reads them.

use std::ffi::{c_char, CStr};
use std::ptr::null_mut;

use uct_rs::*;

use crate::common::*;

/// The string at `p`, or None for NULL.
fn s(p: *const c_char) -> Option<String> {
    // SAFETY: the listing's strings stay valid until it is freed, which
    // the tests do last.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn count(l: *mut UctRsListing, what: UctRsListKind) -> usize {
    let mut n = 0;
    // SAFETY: `n` is writable.
    ok(
        unsafe { uct_rs_listing_count(l, what, &mut n) },
        "listing_count",
    );
    n
}

#[test]
fn the_listing_shows_what_transport_info_shows() {
    let mut l = null_mut();
    // SAFETY: `l` is writable.
    ok(unsafe { uct_rs_listing_create(&mut l) }, "listing_create");

    let mut build = std::mem::MaybeUninit::<UctRsBuildInfo>::uninit();
    // SAFETY: a writable build info.
    ok(
        unsafe { uct_rs_listing_build(l, build.as_mut_ptr()) },
        "build",
    );
    // SAFETY: filled on OK.
    let build = unsafe { build.assume_init() };
    assert_eq!(s(build.version).as_deref(), Some(env!("CARGO_PKG_VERSION")));
    assert!(s(build.module_abi_fingerprint).is_some_and(|f| !f.is_empty()));
    assert_eq!(
        s(build.profile).as_deref(),
        Some("debug")
            .filter(|_| cfg!(debug_assertions))
            .or(Some("release"))
    );

    let mut probed = Vec::new();
    for i in 0..count(l, UCT_RS_LIST_PROBE) {
        let mut e = std::mem::MaybeUninit::<UctRsProbeEntry>::uninit();
        // SAFETY: a writable entry.
        ok(
            unsafe { uct_rs_listing_probe(l, i, e.as_mut_ptr()) },
            "probe",
        );
        // SAFETY: filled on OK.
        let e = unsafe { e.assume_init() };
        let name = s(e.transport).unwrap();
        if e.usable {
            assert!(s(e.device).is_some() && e.reason.is_null(), "{name}");
        } else {
            assert!(
                s(e.reason).is_some_and(|r| !r.is_empty()),
                "{name} has no reason"
            );
        }
        probed.push((name, e.usable));
    }
    for tl in ["self", "posix", "tcp"] {
        assert!(
            probed.contains(&(tl.to_string(), true)),
            "{tl} not usable in {probed:?}"
        );
    }
    let mut supported = false;
    // SAFETY: `supported` is writable.
    ok(unsafe { uct_rs_supported(&mut supported) }, "supported");
    assert!(
        supported,
        "posix and tcp are usable, so two processes can connect"
    );

    let mut components = Vec::new();
    for i in 0..count(l, UCT_RS_LIST_COMPONENTS) {
        let mut e = std::mem::MaybeUninit::<UctRsComponentEntry>::uninit();
        // SAFETY: a writable entry.
        ok(
            unsafe { uct_rs_listing_component(l, i, e.as_mut_ptr()) },
            "component",
        );
        // SAFETY: filled on OK.
        let e = unsafe { e.assume_init() };
        components.push((
            s(e.name).unwrap(),
            s(e.origin).unwrap(),
            s(e.transports).unwrap(),
        ));
    }
    assert!(
        components
            .iter()
            .any(|(n, o, t)| n == "tcp" && o == "builtin" && t == "tcp"),
        "{components:?}"
    );

    for i in 0..count(l, UCT_RS_LIST_MODULES) {
        let mut e = std::mem::MaybeUninit::<UctRsModuleEntry>::uninit();
        // SAFETY: a writable entry.
        ok(
            unsafe { uct_rs_listing_module(l, i, e.as_mut_ptr()) },
            "module",
        );
        // SAFETY: filled on OK.
        let e = unsafe { e.assume_init() };
        let status = s(e.status).unwrap();
        assert!(["loaded", "not loaded", "refused", "failed"].contains(&status.as_str()));
        assert_eq!(status == "loaded", e.reason.is_null(), "{:?}", s(e.name));
    }

    let mut mds = Vec::new();
    for i in 0..count(l, UCT_RS_LIST_MEMORY_DOMAINS) {
        let mut e = std::mem::MaybeUninit::<UctRsMemoryDomainEntry>::uninit();
        // SAFETY: a writable entry.
        ok(
            unsafe { uct_rs_listing_memory_domain(l, i, e.as_mut_ptr()) },
            "md",
        );
        // SAFETY: filled on OK.
        let e = unsafe { e.assume_init() };
        assert_eq!(e.usable, !e.name.is_null(), "{:?}", s(e.component));
        mds.push((s(e.name), s(e.flags).unwrap()));
    }
    assert!(
        mds.iter()
            .any(|(n, f)| n.is_some() && f.split(',').any(|x| x == "reg")),
        "no memory domain registers: {mds:?}"
    );

    let mut tcp = None;
    for i in 0..count(l, UCT_RS_LIST_TRANSPORTS) {
        let mut e = std::mem::MaybeUninit::<UctRsTransportEntry>::uninit();
        // SAFETY: a writable entry.
        ok(
            unsafe { uct_rs_listing_transport(l, i, e.as_mut_ptr()) },
            "transport",
        );
        // SAFETY: filled on OK.
        let e = unsafe { e.assume_init() };
        if !e.usable {
            assert!(s(e.reason).is_some(), "{:?}", s(e.transport));
        }
        if s(e.transport).as_deref() == Some("tcp") && s(e.device).as_deref() == Some("lo") {
            tcp = Some((
                s(e.capabilities).unwrap(),
                s(e.memory_types).unwrap(),
                e.max_put_zcopy,
            ));
        }
    }
    let (caps, types, max) = tcp.expect("tcp on lo is listed");
    assert!(caps.split(',').any(|c| c == "put_zcopy"), "{caps}");
    assert!(types.split(',').any(|t| t == "host"), "{types}");
    assert!(max > 0);

    let mut e = std::mem::MaybeUninit::<UctRsProbeEntry>::uninit();
    let n = count(l, UCT_RS_LIST_PROBE);
    // SAFETY: a writable entry; refused before it is written.
    let st = unsafe { uct_rs_listing_probe(l, n, e.as_mut_ptr()) };
    fails(st, Status::UCT_RS_ERR_OUT_OF_RANGE, "an index past the end");
    let mut c = 0;
    // SAFETY: `c` is writable.
    let st = unsafe { uct_rs_listing_count(l, 99, &mut c) };
    fails(st, Status::UCT_RS_ERR_INVALID_ARGUMENT, "an unknown list");
    ok(uct_rs_listing_free(l), "listing_free");
    fails(
        uct_rs_listing_free(l),
        Status::UCT_RS_ERR_INVALID_HANDLE,
        "free twice",
    );
}
