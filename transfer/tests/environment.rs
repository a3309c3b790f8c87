//! UCT_TLS and UCT_NET_DEVICES reach the transfer API: `auto` offers only
//! what they allow, a transport they exclude is refused with the reason,
//! and probe() says why. One test in this binary: the registry reads the
//! environment once per process.

mod common;

use uct_transfer::{Progress, TransferError, Transport};

#[test]
fn uct_tls_and_uct_net_devices_limit_what_a_transport_offers() {
    // Before anything opens the registry.
    std::env::set_var("UCT_TLS", "tcp,self");
    std::env::set_var("UCT_NET_DEVICES", "lo");
    let t = Transport::new().unwrap();
    let url = t.bind().unwrap();
    assert!(url.contains("/self:") && url.contains("/tcp:lo:"), "{url}");
    assert!(!url.contains("/posix:") && !url.contains("/cma:"), "{url}");
    let probe = Transport::probe();
    let posix = probe
        .iter()
        .find(|p| p.transport == "posix")
        .expect("posix is known");
    assert!(!posix.usable);
    assert!(
        posix
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("UCT_TLS"),
        "{posix:?}"
    );
    let tcp: Vec<_> = probe
        .iter()
        .filter(|p| p.transport == "tcp" && p.usable)
        .collect();
    assert_eq!(tcp.len(), 1, "{tcp:?}");
    assert_eq!(tcp[0].device.as_deref(), Some("lo"));
    assert!(Transport::supported());
    let e = Transport::builder().transport("posix").build().unwrap_err();
    assert!(
        matches!(&e, TransferError::NoTransport(m) if m.contains("UCT_TLS")),
        "{e}"
    );
    // Two auto transports in one process pick self; tcp when named.
    let (a, b) = (Transport::new().unwrap(), Transport::new().unwrap());
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    assert_eq!(a.transport_name().as_deref(), Some("self"));
    let (c, _d) = common::pair("tcp", Progress::Manual);
    assert_eq!(c.transport_name().as_deref(), Some("tcp"));
}

#[test]
fn transports_and_memory_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Transport>();
    both::<uct_transfer::Memory>();
    both::<uct_transfer::View>();
    both::<uct_transfer::RemoteBuffer>();
    both::<uct_transfer::OpFuture>();
    both::<uct_transfer::WaitForWrite>();
}
