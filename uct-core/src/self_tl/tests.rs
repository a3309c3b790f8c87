//! Puts with immediate data over `self`, driven through the registry and the
//! `Iface`/`Endpoint` traits as any user would.

use std::sync::{Arc, Mutex};

use super::SELF_IMM_QUEUE_LEN;
use crate::{
    Access, Caps, EpParams, Iface, ImmEvent, Iov, MemHandle, MemoryType, Registry, RemoteKey,
    RkeyBundle, Status, UctError,
};

struct Pair {
    iface: Box<dyn Iface>,
    ep: Box<dyn crate::Endpoint>,
    target: MemHandle,
    source: MemHandle,
    rkey: RemoteKey,
}

/// One iface, an endpoint to itself, a `len`-byte target granting `rights`
/// and a source of the same size.
fn pair(len: usize, rights: Access) -> Pair {
    let registry = Registry::global();
    let resource = registry.find_resource("self", None).unwrap();
    let md = resource.md.clone();
    let mut iface = resource
        .component
        .open_iface(&md, &resource.tl, &Default::default())
        .unwrap();
    let target = md.alloc(len, MemoryType::Host, rights).unwrap();
    let source = md.alloc(len, MemoryType::Host, Access::all()).unwrap();
    let packed = RkeyBundle::single(md.pack_rkey(&target).unwrap())
        .pack()
        .unwrap();
    let rkey = registry.unpack_rkey(&packed, md.name()).unwrap();
    let ep = iface
        .create_ep(EpParams::ToIface {
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
        })
        .unwrap();
    Pair {
        iface,
        ep,
        target,
        source,
        rkey,
    }
}

/// A handler that records every event.
fn recorder(iface: &mut dyn Iface) -> Arc<Mutex<Vec<ImmEvent>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    iface
        .set_imm_handler(Box::new(move |e| s.lock().unwrap().push(e)))
        .unwrap();
    seen
}

#[test]
fn a_thousand_immediates_arrive_once_in_order_after_their_data() {
    const N: usize = 1000;
    let lens: Vec<usize> = (0..N).map(|i| (i * 37) % 4096 + 1).collect();
    let offsets: Vec<usize> = lens
        .iter()
        .scan(0, |at, &l| {
            let o = *at;
            *at += l;
            Some(o)
        })
        .collect();
    let total: usize = lens.iter().sum();
    let mut p = pair(total, Access::all());
    assert!(p.iface.attrs().caps.contains(Caps::PUT_IMM));
    let pattern = |i: usize| (i as u8) ^ 0x5a;
    for i in 0..N {
        p.source
            .write(offsets[i], &vec![pattern(i); lens[i]])
            .unwrap();
    }

    // The handler checks the last byte of write `imm` in the target memory:
    // the data must be there when its immediate is delivered.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, target, offs) = (seen.clone(), p.target.clone(), offsets.clone());
    p.iface
        .set_imm_handler(Box::new(move |e: ImmEvent| {
            if e.len == 0 {
                s.lock().unwrap().push(e);
                return;
            }
            let i = e.imm as usize - 1;
            let mut last = [0u8];
            target.read(offs[i] + e.len - 1, &mut last).unwrap();
            assert_eq!(
                last[0],
                pattern(i),
                "write {i} not in place at its immediate"
            );
            s.lock().unwrap().push(e);
        }))
        .unwrap();

    for i in 0..N {
        let iov = [Iov::new(&p.source, offsets[i], lens[i])];
        let addr = p.target.addr() + offsets[i] as u64;
        while p
            .ep
            .put_zcopy_imm(&iov, addr, &p.rkey, i as u32 + 1, None)
            .unwrap()
            == Status::NoResource
        {
            p.iface.progress();
        }
        // Nothing is delivered inline from the put.
        if i == 0 {
            assert!(seen.lock().unwrap().is_empty());
        }
        if i % 100 == 99 {
            p.iface.progress();
        }
    }
    // A zero-length write carries the immediate alone.
    let st =
        p.ep.put_zcopy_imm(&[], p.target.addr(), &p.rkey, 0xffff_ffff, None)
            .unwrap();
    assert_eq!(st, Status::Done);
    while seen.lock().unwrap().len() < N + 1 {
        assert!(p.iface.progress() > 0, "immediates lost");
    }
    let seen = seen.lock().unwrap();
    let expect: Vec<ImmEvent> = (0..N)
        .map(|i| ImmEvent {
            imm: i as u32 + 1,
            len: lens[i],
        })
        .chain([ImmEvent {
            imm: 0xffff_ffff,
            len: 0,
        }])
        .collect();
    assert_eq!(*seen, expect);
    assert_eq!(p.iface.progress(), 0, "an immediate delivered twice");
}

#[test]
fn a_full_queue_answers_no_resource_and_posts_nothing() {
    let mut p = pair(4096, Access::all());
    let seen = recorder(p.iface.as_mut());
    p.source.write(0, &[7u8; 8]).unwrap();
    let iov = [Iov::new(&p.source, 0, 8)];
    for i in 0..SELF_IMM_QUEUE_LEN {
        let st =
            p.ep.put_zcopy_imm(&[], p.target.addr(), &p.rkey, i as u32, None)
                .unwrap();
        assert_eq!(st, Status::Done);
    }
    let at = p.target.addr() + 100;
    let st = p.ep.put_zcopy_imm(&iov, at, &p.rkey, 9999, None).unwrap();
    assert_eq!(st, Status::NoResource);
    let mut landed = [0u8; 8];
    p.target.read(100, &mut landed).unwrap();
    assert_eq!(landed, [0u8; 8], "a NoResource put wrote its data");

    assert_eq!(p.iface.progress(), SELF_IMM_QUEUE_LEN);
    assert_eq!(seen.lock().unwrap().len(), SELF_IMM_QUEUE_LEN);
    let st = p.ep.put_zcopy_imm(&iov, at, &p.rkey, 9999, None).unwrap();
    assert_eq!(st, Status::Done);
    assert_eq!(p.iface.progress(), 1);
    p.target.read(100, &mut landed).unwrap();
    assert_eq!(landed, [7u8; 8]);
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&ImmEvent { imm: 9999, len: 8 })
    );
}

#[test]
fn immediates_with_no_handler_are_dropped_without_panic() {
    let mut p = pair(64, Access::all());
    for i in 0..3 {
        let st = p.ep.put_zcopy_imm(&[], p.target.addr(), &p.rkey, i, None);
        assert_eq!(st, Ok(Status::Done));
    }
    assert_eq!(p.iface.progress(), 3);
    let seen = recorder(p.iface.as_mut());
    let st = p.ep.put_zcopy_imm(&[], p.target.addr(), &p.rkey, 42, None);
    assert_eq!(st, Ok(Status::Done));
    p.iface.progress();
    assert_eq!(*seen.lock().unwrap(), vec![ImmEvent { imm: 42, len: 0 }]);
}

#[test]
fn a_refused_put_queues_no_immediate() {
    let mut p = pair(64, Access::remote_read_only());
    let seen = recorder(p.iface.as_mut());
    let iov = [Iov::new(&p.source, 0, 8)];
    let err =
        p.ep.put_zcopy_imm(&iov, p.target.addr(), &p.rkey, 1, None)
            .unwrap_err();
    assert!(matches!(err, UctError::AccessDenied { .. }), "{err}");
    let err =
        p.ep.put_zcopy_imm(&iov, p.target.addr() + 60, &p.rkey, 2, None)
            .unwrap_err();
    assert!(matches!(err, UctError::OutOfRange { .. }), "{err}");
    assert_eq!(p.iface.progress(), 0);
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn a_put_to_a_closed_iface_fails_the_endpoint() {
    let Pair {
        iface,
        mut ep,
        target,
        rkey,
        ..
    } = pair(64, Access::all());
    drop(iface);
    let err = ep
        .put_zcopy_imm(&[], target.addr(), &rkey, 1, None)
        .unwrap_err();
    assert!(matches!(err, UctError::EndpointFailed(_)), "{err}");
}

/// Active messages and immediates reach the target in the order they were
/// sent, interleaved, as one connection delivers them.
#[test]
fn messages_and_immediates_arrive_in_the_order_sent() {
    let mut p = pair(64, Access::all());
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    p.iface
        .set_imm_handler(Box::new(move |e| {
            o.lock().unwrap().push(format!("imm{}", e.imm))
        }))
        .unwrap();
    let o = order.clone();
    p.iface
        .set_am_handler(
            3,
            Box::new(move |m| o.lock().unwrap().push(format!("am{}", m.data[8]))),
        )
        .unwrap();
    let iov = [Iov::new(&p.source, 0, 8)];
    for i in 0..4u8 {
        assert_eq!(p.ep.am_short(3, 0, &[i]).unwrap(), Status::Done);
        let st =
            p.ep.put_zcopy_imm(&iov, p.target.addr(), &p.rkey, i as u32, None);
        assert_eq!(st.unwrap(), Status::Done);
    }
    p.iface.progress();
    let want: Vec<String> = (0..4)
        .flat_map(|i| [format!("am{i}"), format!("imm{i}")])
        .collect();
    assert_eq!(*order.lock().unwrap(), want);
}

/// A self address with this process's pid but another process's number
/// (a process in another pid namespace, as in containers, often pid 1) is
/// not reachable, and an endpoint to it is refused by name.
#[test]
fn an_address_with_our_pid_from_another_process_is_unreachable() {
    let mut p = pair(64, Access::all());
    let mut dev = p.iface.device_address();
    assert_eq!(dev.len(), 12);
    dev[4] ^= 0xff;
    let iface = p.iface.iface_address();
    assert!(!p.iface.is_reachable(&dev, &iface));
    assert!(p.iface.is_reachable(&p.iface.device_address(), &iface));
    let e = p
        .iface
        .create_ep(EpParams::ToIface {
            device_addr: dev,
            iface_addr: iface,
        })
        .err()
        .expect("refused");
    assert!(matches!(e, UctError::Unreachable(_)), "{e}");
}
