//! Attacks on the tcp transport, speaking its real wire format
//! (`tl_tcp::wire`, `tl_tcp::address`) on raw sockets, on the loopback
//! only: forged Hellos, a get flood, a nack flood, a connection flood and
//! random frames (each described at its function).

mod raw;

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tl_tcp::address::{iface_addr, ip_bytes, parse_addr};
use tl_tcp::wire::{Header, WireAtomic, WireError, WireKey};

use super::{common, control, Attack, Outcome, Target};
use raw::{
    connect, frame, hello_from, honest_hello, peak_rss_kib, read_for, victim, wire_key, write_all,
    Rng, Wrote,
};

/// The tcp attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    let tcp = |name, run| Attack {
        name,
        transport: "tcp",
        run,
    };
    vec![
        tcp("tcp/forged-hello", forged_hello),
        tcp("tcp/get-flood", get_flood),
        tcp("tcp/nack-flood", nack_flood),
        tcp("tcp/connection-flood", connection_flood),
        tcp("tcp/random-frames", random_frames),
    ]
}

/// Claims to be another iface P (one of ours, whose real address the
/// victim is then given) from raw connections: with P's own cookie (public
/// in P's address) and the victim's echoed, a Hello word for word P's; with
/// the victim's cookie echoed but a wrong cookie for P; with a wrong echo;
/// with neither. When the victim's application connects to P, none of them
/// may receive a byte; those with a wrong echo must be closed; those with
/// the right one cannot be told from a peer and may stay, unused (the
/// victim sends to P only on a connection it opens to P's address).
fn forged_hello(t: &Target) -> Result<Outcome, String> {
    let v = victim(t)?;
    let mut p_iface = common::open_iface("tcp").map_err(|e| common::named(&e))?;
    let p = parse_addr(&p_iface.device_address(), &p_iface.iface_address())
        .map_err(|e| e.to_string())?;
    let mut rng = Rng::seeded();
    // (what, P's cookie claimed, echo, whether the victim must close it)
    let forgeries = [
        (
            "P's address, P's own cookie, the victim's cookie echoed",
            p.cookie,
            v.cookie,
            false,
        ),
        (
            "P's address, a wrong cookie, the victim's cookie echoed",
            rng.next(),
            v.cookie,
            false,
        ),
        (
            "P's address, P's cookie, a wrong echo",
            p.cookie,
            v.cookie ^ (rng.next() | 1),
            true,
        ),
        ("P's address, no cookie, no echo", 0, 0, true),
    ];
    let mut forgers = Vec::new();
    for (what, cookie, echo, must_close) in forgeries {
        let mut s = connect(v.sock)?;
        if write_all(
            &mut s,
            &hello_from(p.sock.port(), cookie, echo),
            Duration::from_secs(5),
        ) != Wrote::All
        {
            return Err(format!("could not send the forged Hello ({what})"));
        }
        forgers.push((what, s, must_close));
    }
    // Let the victim take them in before its application connects to P.
    std::thread::sleep(Duration::from_millis(300));
    let line = control::connect_line(&p_iface.device_address(), &p_iface.iface_address());
    let target = t.clone();
    let asked = std::thread::spawn(move || control::request(&target, &line));
    let t0 = Instant::now();
    while !asked.is_finished() && t0.elapsed() < control::DEADLINE + Duration::from_secs(2) {
        if p_iface.progress() == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let answer = asked
        .join()
        .map_err(|_| "the control thread panicked".to_string())?;
    if let Err(e) = &answer {
        if e.starts_with("control:") {
            return Err(e.clone());
        }
    }
    let mut open = Vec::new();
    let mut unused = Vec::new();
    for (what, s, must_close) in forgers.iter_mut() {
        let turn = || _ = p_iface.progress();
        let r = read_for(s, Duration::from_secs(2), |_| false, turn);
        if r.bytes > 0 {
            return Ok(Outcome::Breach(format!(
                "a forger ({what}) received {} bytes meant for P: {:?}",
                r.bytes, r.frames
            )));
        }
        match (r.closed, *must_close) {
            (false, true) => open.push(*what),
            (false, false) => unused.push(*what),
            (true, _) => {}
        }
    }
    if !open.is_empty() {
        return Ok(Outcome::Breach(format!(
            "the victim kept links whose Hello did not echo its cookie: {}",
            open.join("; ")
        )));
    }
    eprintln!("tcp/forged-hello: the victim's connect to P answered {answer:?}");
    if unused.is_empty() {
        return Ok(Outcome::Closed);
    }
    Ok(Outcome::Refused(format!(
        "NotUsed: the victim sent nothing for P on the {} links that claimed to be P with its cookie echoed ({}); it sends to P only on a connection it opens to P's address; the others were closed",
        unused.len(),
        unused.join("; ")
    )))
}

/// How many gets of half the read-write region the flood sends at most.
const FLOOD_GETS: u64 = 4096;
/// A write that stalls this long: the victim stopped reading.
const STALL: Duration = Duration::from_secs(3);
/// Growth of the victim's peak RSS that the get flood tolerates.
const FLOOD_RSS_BOUND_MIB: u64 = 128;

/// Links of the get flood besides the one that floods until it stalls.
const FLOOD_LINKS: usize = 32;
/// Gets each of those links sends at once.
const GETS_PER_LINK: u64 = 256;

/// Gets of half the read-write region that are never read, on many links
/// that each said Hello (2 GiB asked for on the main one, as much again on
/// each other): the victim must stop executing them once their replies
/// wait (and so stop reading), and its peak RSS must stay bounded in all,
/// not per link.
fn get_flood(t: &Target) -> Result<Outcome, String> {
    let v = victim(t)?;
    let key = wire_key(&t.rw.rkey)?;
    let half = (t.rw.len / 2) as u64;
    let before = peak_rss_kib(t.pid)?;
    let mut rng = Rng::seeded();
    let mut links = Vec::new();
    for _ in 0..FLOOD_LINKS {
        let mut s = connect(v.sock)?;
        let mut bytes = honest_hello(&v, &mut rng);
        for req in 0..GETS_PER_LINK {
            let get = Header::Get {
                req,
                key,
                addr: t.rw.addr + half,
                len: half,
            };
            bytes.extend(frame(&get, &[]));
        }
        // A link the victim stopped reading is what the flood wants.
        let _ = write_all(&mut s, &bytes, Duration::from_millis(200));
        links.push(s);
    }
    let mut s = connect(v.sock)?;
    if write_all(&mut s, &honest_hello(&v, &mut rng), STALL) != Wrote::All {
        return Ok(Outcome::Closed);
    }
    let mut sent = 0;
    let mut ended = Wrote::All;
    for req in 0..FLOOD_GETS {
        let get = Header::Get {
            req,
            key,
            addr: t.rw.addr + half,
            len: half,
        };
        ended = write_all(&mut s, &frame(&get, &[]), STALL);
        if ended != Wrote::All {
            break;
        }
        sent += 1;
    }
    // What it took in, it may still be executing.
    std::thread::sleep(Duration::from_secs(1));
    let grew = peak_rss_kib(t.pid)?.saturating_sub(before) / 1024;
    let asked = (sent + FLOOD_LINKS as u64 * GETS_PER_LINK) * half / (1 << 20);
    drop(links);
    if grew >= FLOOD_RSS_BOUND_MIB {
        return Ok(Outcome::Breach(format!(
            "the victim's peak RSS grew {grew} MiB for {sent} gets and {GETS_PER_LINK} on each of {FLOOD_LINKS} more links ({asked} MiB asked for, never read)"
        )));
    }
    Ok(match ended {
        Wrote::Closed => Outcome::Closed,
        Wrote::Stalled => Outcome::Refused(format!(
            "Paused: the victim stopped reading after {sent} gets, and {GETS_PER_LINK} on each of {FLOOD_LINKS} more links ({asked} MiB asked for, replies unread); its peak RSS grew {grew} MiB"
        )),
        Wrote::All => Outcome::Refused(format!(
            "Paused: the victim took all {sent} gets, and {GETS_PER_LINK} on each of {FLOOD_LINKS} more links ({asked} MiB asked for, replies unread), and its peak RSS grew only {grew} MiB"
        )),
    })
}

/// Has the victim connect to a listener of ours, then answers its link
/// with 100,000 Nacks of requests it never sent (random ids): the victim
/// must close the link, not store them.
fn nack_flood(t: &Target) -> Result<Outcome, String> {
    victim(t)?;
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("listen on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("our listener: {e}"))?
        .port();
    let mut rng = Rng::seeded();
    let cookie = rng.next();
    let lo = ip_bytes(std::net::Ipv4Addr::LOCALHOST.into());
    let line = control::connect_line(&lo, &iface_addr(port, cookie));
    let target = t.clone();
    let asked = std::thread::spawn(move || control::request(&target, &line));
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("our listener: {e}"))?;
    let t0 = Instant::now();
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if t0.elapsed() > control::DEADLINE {
                    return Err("the victim did not connect to our listener".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accept the victim's connection: {e}")),
        }
    };
    s.set_nonblocking(true)
        .map_err(|e| format!("set non-blocking: {e}"))?;
    // Its Hello must echo our cookie: it got our address from the request.
    let hello = read_for(
        &mut s,
        Duration::from_secs(5),
        |h| matches!(h, Header::Hello { .. }),
        || {},
    );
    match hello.frames.first() {
        Some(Header::Hello { echo, .. }) if *echo == cookie => {}
        other => {
            return Err(format!(
                "the victim's link did not open with our Hello: {other:?}"
            ))
        }
    }
    let mut flood = Vec::new();
    let mut sent = 0;
    let mut ended = Wrote::All;
    for i in 0..100_000u32 {
        flood.extend(frame(
            &Header::Nack {
                req: rng.next(),
                error: WireError::BadSecret,
            },
            &[],
        ));
        if flood.len() > 64 << 10 || i == 99_999 {
            ended = write_all(&mut s, &flood, STALL);
            flood.clear();
            if ended != Wrote::All {
                break;
            }
            sent = i + 1;
        }
    }
    let after = read_for(&mut s, Duration::from_secs(5), |_| false, || {});
    let answer = asked
        .join()
        .map_err(|_| "the control thread panicked".to_string())?;
    eprintln!("tcp/nack-flood: {sent} nacks sent; the victim's connect answered {answer:?}");
    if ended == Wrote::Closed || after.closed {
        Ok(Outcome::Closed)
    } else {
        Ok(Outcome::Breach(format!(
            "the victim took {sent} Nacks of requests it never sent and kept the link open"
        )))
    }
}

/// Connections the flood opens.
const FLOOD_CONNECTIONS: usize = 10_000;
/// Connections the flood keeps open at once (within the attacker's fds).
const FLOOD_OPEN: usize = 256;
/// How long the victim may take to close a junk connection.
const CLOSE_DEADLINE: Duration = Duration::from_secs(3);

/// 10,000 connections to the victim's port, each sending a few KiB of
/// random bytes: every one must be closed by the victim. When
/// UCT_BOOTSTRAP_TIMEOUT is short (10 s or less, as the victim inherits the
/// suite's environment), silent connections must be closed within it too.
fn connection_flood(t: &Target) -> Result<Outcome, String> {
    let v = victim(t)?;
    let hello_timeout = std::env::var("UCT_BOOTSTRAP_TIMEOUT")
        .ok()
        .and_then(|s| uct_core::config::parse_duration(&s))
        .filter(|d| *d <= Duration::from_secs(10));
    let mut silent = Vec::new();
    if hello_timeout.is_some() {
        for _ in 0..8 {
            silent.push(connect(v.sock)?);
        }
    }
    let silent_since = Instant::now();
    let mut rng = Rng::seeded();
    let mut open: std::collections::VecDeque<TcpStream> = Default::default();
    let mut lingering = 0;
    let mut refused = 0;
    let t0 = Instant::now();
    let check =
        |s: &mut TcpStream| -> bool { read_for(s, CLOSE_DEADLINE, |_| false, || {}).closed };
    for _ in 0..FLOOD_CONNECTIONS {
        if t0.elapsed() > Duration::from_secs(40) {
            return Err("the flood took over 40 s (the victim accepts too slowly?)".into());
        }
        let mut s = match TcpStream::connect_timeout(&v.sock, Duration::from_secs(2)) {
            Ok(s) => s,
            Err(_) => {
                // A full backlog refuses: the victim's bound, not a breach.
                refused += 1;
                continue;
            }
        };
        let _ = s.set_nonblocking(true);
        let n = 1024 + (rng.next() % 4096) as usize;
        let _ = write_all(&mut s, &rng.bytes(n), Duration::from_millis(500));
        open.push_back(s);
        if open.len() >= FLOOD_OPEN {
            if let Some(mut old) = open.pop_front() {
                lingering += usize::from(!check(&mut old));
            }
        }
    }
    for mut s in open.drain(..) {
        lingering += usize::from(!check(&mut s));
    }
    let mut silent_open = 0;
    if let Some(timeout) = hello_timeout {
        // At least one look each, however long the flood took.
        let limit = (timeout + Duration::from_secs(2))
            .saturating_sub(silent_since.elapsed())
            .max(Duration::from_millis(100));
        for s in silent.iter_mut() {
            silent_open += usize::from(!read_for(s, limit, |_| false, || {}).closed);
        }
    }
    eprintln!(
        "tcp/connection-flood: {FLOOD_CONNECTIONS} connections in {:?}, {refused} refused at connect, {lingering} not closed, {} silent ones checked ({silent_open} open)",
        t0.elapsed(),
        silent.len()
    );
    if lingering > 0 || silent_open > 0 {
        return Ok(Outcome::Breach(format!(
            "{lingering} junk connections still open {CLOSE_DEADLINE:?} after their bytes, {silent_open} silent ones after UCT_BOOTSTRAP_TIMEOUT"
        )));
    }
    Ok(Outcome::Closed)
}

/// Frames the random-frames attack sends in all, and per connection.
const RANDOM_FRAMES: usize = 100_000;
const FRAMES_PER_LINK: usize = 500;

/// A well-formed request with a key the victim never gave out (random, or
/// the stale one of a deregistered region).
fn random_request(rng: &mut Rng, stale: WireKey) -> (Header, Vec<u8>) {
    let key = if rng.next().is_multiple_of(4) {
        stale
    } else {
        WireKey {
            region_id: rng.next(),
            secret: rng.next(),
        }
    };
    let (req, addr) = (rng.next(), rng.next());
    match rng.next() % 5 {
        0 | 1 => {
            let n = (rng.next() % 512) as usize;
            (Header::Put { req, key, addr }, rng.bytes(n))
        }
        2 => (
            Header::Get {
                req,
                key,
                addr,
                len: rng.next() % 100_000_000,
            },
            vec![],
        ),
        3 => (
            Header::Atomic {
                req,
                key,
                addr: addr & !7,
                width: if rng.next().is_multiple_of(2) { 4 } else { 8 },
                op: WireAtomic::FetchAdd,
                value: 1,
            },
            vec![],
        ),
        _ => (Header::Flush { req }, vec![]),
    }
}

/// 100,000 frames after a valid Hello, in links of 500: well-formed
/// requests with random or stale keys (each must be refused with a named
/// error), and in each link one frame with a bit flipped anywhere (which
/// must be refused or close the link). A get or atomic that succeeds is a
/// breach.
fn random_frames(t: &Target) -> Result<Outcome, String> {
    let v = victim(t)?;
    let stale = wire_key(&t.stale.rkey)?;
    let mut rng = Rng::seeded();
    let mut refusals: std::collections::BTreeMap<String, usize> = Default::default();
    let mut closed = 0;
    let t0 = Instant::now();
    for link in 0..RANDOM_FRAMES / FRAMES_PER_LINK {
        if t0.elapsed() > Duration::from_secs(50) {
            return Err(format!("only {link} links of frames in 50 s"));
        }
        let mut s = connect(v.sock)?;
        let mut bytes = honest_hello(&v, &mut rng);
        let flip_at = (rng.next() as usize) % FRAMES_PER_LINK;
        for i in 0..FRAMES_PER_LINK {
            let (header, data) = random_request(&mut rng, stale);
            let mut f = frame(&header, &data);
            if i == flip_at {
                let bit = (rng.next() as usize) % (f.len() * 8);
                f[bit / 8] ^= 1 << (bit % 8);
            }
            bytes.extend(f);
        }
        // Answered last if the link lives through the batch.
        let mark = u64::MAX - link as u64;
        bytes.extend(frame(&Header::Flush { req: mark }, &[]));
        if write_all(&mut s, &bytes, STALL) != Wrote::All {
            closed += 1;
            continue;
        }
        let got = read_for(
            &mut s,
            Duration::from_secs(5),
            |h| matches!(h, Header::FlushReply { req } if *req == mark),
            || {},
        );
        for h in &got.frames {
            let error = match h {
                Header::GetReply { error, .. } | Header::AtomicReply { error, .. } => match error {
                    Some(e) => e.clone(),
                    None => {
                        return Ok(Outcome::Breach(format!(
                            "a request with a random or stale key succeeded: {h:?}"
                        )))
                    }
                },
                Header::Nack { error, .. } => error.clone(),
                _ => continue,
            };
            let name = format!("{error:?}");
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            *refusals.entry(name).or_default() += 1;
        }
        let answered = got
            .frames
            .iter()
            .any(|h| matches!(h, Header::FlushReply { req } if *req == mark));
        if got.closed {
            closed += 1;
        } else if !answered {
            // A flip lengthened a frame and the victim waits for its bytes:
            // zeros complete it, then are no frame (header length 0).
            let zeros = vec![0u8; 18 << 20];
            let _ = write_all(&mut s, &zeros, STALL);
            if !read_for(&mut s, Duration::from_secs(5), |_| false, || {}).closed {
                return Err(format!("link {link}: neither answered nor closed"));
            }
            closed += 1;
        }
    }
    if refusals.is_empty() {
        return Err("no request was answered: the attack did not reach the victim".into());
    }
    let named: Vec<String> = refusals
        .iter()
        .map(|(name, n)| format!("{name} x{n}"))
        .collect();
    Ok(Outcome::Refused(format!(
        "{}; {closed} of {} links closed on a malformed frame",
        named.join(", "),
        RANDOM_FRAMES / FRAMES_PER_LINK
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tl_tcp::wire::{parse, Parsed};

    #[test]
    fn random_requests_are_well_formed_frames() {
        let mut rng = Rng(7);
        let stale = WireKey {
            region_id: 1,
            secret: 2,
        };
        for _ in 0..1000 {
            let (h, data) = random_request(&mut rng, stale);
            let f = frame(&h, &data);
            match parse(&f, 16 << 20) {
                Ok(Parsed::Frame { header, total, .. }) => {
                    assert_eq!(header, h);
                    assert_eq!(total, f.len());
                }
                other => panic!("{h:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_hello_is_what_tl_tcp_decodes() {
        let addr = ip_bytes(std::net::Ipv4Addr::LOCALHOST.into());
        let (port, cookie, echo) = (4242, 7, 9);
        let hello = Header::Hello {
            addr,
            port,
            cookie,
            echo,
        };
        let f = hello_from(port, cookie, echo);
        assert!(matches!(parse(&f, 0), Ok(Parsed::Frame { header, .. }) if header == hello));
    }

    #[test]
    fn only_loopback_victims_are_attacked() {
        let mut t = Target {
            transport: "tcp".into(),
            device_addr: ip_bytes("10.0.0.1".parse().unwrap()).to_vec(),
            iface_addr: iface_addr(1, 2),
            ..Default::default()
        };
        assert!(victim(&t).unwrap_err().contains("loopback"));
        t.device_addr = ip_bytes("127.0.0.1".parse().unwrap()).to_vec();
        assert_eq!(victim(&t).unwrap().cookie, 2);
        t.iface_addr = vec![1, 2];
        assert!(victim(&t).is_err());
    }
}
