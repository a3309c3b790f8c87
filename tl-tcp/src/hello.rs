//! Who is on the other end of a link, without I/O. A link we dialled
//! reaches the iface listening at the address the application gave us, and
//! only such a link carries our own traffic (requests, active messages) to
//! that iface. A link we accepted must open with a Hello, and only then: it
//! must echo our iface's cookie (so the caller got our address from the
//! address exchange, not from a port scan), and the IP it claims must be
//! the one the connection comes from. What it claims beyond that (its port
//! and its cookie, both public in its address) is its word, used only to
//! name it: it proves nothing, so an accepted link carries only what the
//! peer starts (its requests, and our answers to them), never our traffic
//! for the iface it claims to be.

use std::net::IpAddr;
use std::time::Instant;

use crate::address::{ip_of, PeerAddr};
use crate::wire::Header;

/// What we know of the other end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// We connected to this iface's listener.
    Dialled(PeerAddr),
    /// The peer connected and has not said Hello yet (since then).
    AwaitingHello(Instant),
    /// The peer connected and said Hello, claiming to be this iface.
    Accepted(PeerAddr),
}

impl Role {
    /// Whether a link of this role carries our traffic to the iface at
    /// `to`: only a link we dialled to that very address (and cookie).
    pub(crate) fn reaches(&self, to: &PeerAddr) -> bool {
        matches!(self, Role::Dialled(a) if a == to)
    }

    /// Whether the peer opened the link: it carries the peer's requests
    /// and our answers; we opened it: our requests and the peer's answers.
    pub(crate) fn peer_opened(&self) -> bool {
        !matches!(self, Role::Dialled(_))
    }

    /// The peer iface, once known.
    pub(crate) fn peer(&self) -> Option<PeerAddr> {
        match self {
            Role::Dialled(a) | Role::Accepted(a) => Some(*a),
            Role::AwaitingHello(_) => None,
        }
    }
}

/// Checks the first frame of an accepted link: a Hello that echoes
/// `own_cookie` and claims the IP the connection comes from (`socket_ip`).
/// Returns who the peer claims to be, or why the link must be closed.
pub(crate) fn check_hello(
    header: &Header,
    own_cookie: u64,
    socket_ip: Option<IpAddr>,
) -> Result<PeerAddr, String> {
    let Header::Hello {
        addr,
        port,
        cookie,
        echo,
    } = header
    else {
        return Err(format!(
            "the first frame of a connection must be a Hello, not {}; is the peer a uct-rs tcp iface of this version?",
            frame_name(header)
        ));
    };
    if *echo != own_cookie {
        return Err(
            "the Hello does not echo this iface's cookie: the peer did not get this iface's address from the address exchange"
                .into(),
        );
    }
    let claimed = ip_of(*addr);
    let from = socket_ip.map(canonical);
    if from != Some(canonical(claimed)) {
        return Err(format!(
            "the Hello claims to come from {claimed}, the connection comes from {}",
            from.map(|ip| ip.to_string())
                .unwrap_or_else(|| "an unknown address".into())
        ));
    }
    if *port == 0 {
        return Err("the Hello claims port 0, where no iface listens".into());
    }
    Ok(PeerAddr {
        sock: std::net::SocketAddr::new(claimed, *port),
        cookie: *cookie,
    })
}

/// An IP as one form (IPv4 rather than IPv4-mapped IPv6), for comparison.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// A frame's kind, for messages (its fields may be a peer's junk).
pub(crate) fn frame_name(header: &Header) -> &'static str {
    match header {
        Header::Am { .. } => "an active message",
        Header::Put { .. } => "a put",
        Header::Get { .. } => "a get",
        Header::GetReply { .. } => "a get reply",
        Header::Atomic { .. } => "an atomic",
        Header::AtomicReply { .. } => "an atomic reply",
        Header::Flush { .. } => "a flush",
        Header::FlushReply { .. } => "a flush reply",
        Header::Nack { .. } => "a nack",
        Header::Hello { .. } => "a Hello",
        Header::PutImm { .. } => "a put with immediate data",
        Header::PutImmReply { .. } => "a reply to a put with immediate data",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ip_bytes;

    const OURS: u64 = 0xc0ffee;

    fn hello(ip: &str, port: u16, cookie: u64, echo: u64) -> Header {
        Header::Hello {
            addr: ip_bytes(ip.parse().unwrap()),
            port,
            cookie,
            echo,
        }
    }

    fn lo() -> Option<IpAddr> {
        Some("127.0.0.1".parse().unwrap())
    }

    #[test]
    fn a_hello_that_echoes_our_cookie_from_the_ip_it_claims_is_accepted() {
        let p = check_hello(&hello("127.0.0.1", 4242, 7, OURS), OURS, lo()).unwrap();
        assert_eq!(p.sock, "127.0.0.1:4242".parse().unwrap());
        assert_eq!(p.cookie, 7);
        // The socket may report the peer as IPv4-mapped IPv6.
        let mapped = Some("::ffff:127.0.0.1".parse().unwrap());
        assert!(check_hello(&hello("127.0.0.1", 4242, 7, OURS), OURS, mapped).is_ok());
    }

    #[test]
    fn every_other_first_frame_is_refused_with_its_reason() {
        let refused = |h: Header, from: Option<IpAddr>, why: &str| {
            let e = check_hello(&h, OURS, from).unwrap_err();
            assert!(e.contains(why), "{h:?}: {e}");
        };
        refused(hello("127.0.0.1", 1, 7, OURS + 1), lo(), "cookie");
        refused(hello("127.0.0.1", 1, 7, 0), lo(), "cookie");
        refused(hello("10.1.2.3", 1, 7, OURS), lo(), "comes from 127.0.0.1");
        refused(hello("127.0.0.1", 1, 7, OURS), None, "unknown address");
        refused(hello("127.0.0.1", 0, 7, OURS), lo(), "port 0");
        refused(
            Header::Am { id: 1 },
            lo(),
            "must be a Hello, not an active message",
        );
        refused(Header::Flush { req: 1 }, lo(), "not a flush");
    }

    #[test]
    fn only_a_link_dialled_to_the_peers_address_carries_its_traffic() {
        let p = PeerAddr {
            sock: "127.0.0.1:4242".parse().unwrap(),
            cookie: 7,
        };
        let other_cookie = PeerAddr { cookie: 8, ..p };
        let other_port = PeerAddr {
            sock: "127.0.0.1:4243".parse().unwrap(),
            ..p
        };
        assert!(Role::Dialled(p).reaches(&p));
        assert!(!Role::Dialled(p).reaches(&other_cookie));
        assert!(!Role::Dialled(p).reaches(&other_port));
        // A Hello claiming P, cookie and all, is P's word, not a proof.
        assert!(!Role::Accepted(p).reaches(&p));
        assert!(!Role::AwaitingHello(Instant::now()).reaches(&p));
        assert_eq!(Role::AwaitingHello(Instant::now()).peer(), None);
        assert!(!Role::Dialled(p).peer_opened());
        assert!(Role::Accepted(p).peer_opened());
        assert!(Role::AwaitingHello(Instant::now()).peer_opened());
    }
}
