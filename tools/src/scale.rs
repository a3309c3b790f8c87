//! `uct-stress scale`: how the cost of a transport grows with the number of
//! peers. One "hub" iface connects one endpoint to each of N peer ifaces
//! (one endpoint per peer, as on a cluster; N endpoints to one iface would
//! share one ring or one socket and hide what grows). For each N it
//! measures the setup time and resident memory per endpoint (apart from
//! those of the peer ifaces, which on a cluster live in the peers'
//! processes and here live in this one), the time of one `progress()` of the hub with every endpoint
//! idle, and the message rate of 8-byte active messages sent round-robin
//! over the N endpoints by one thread, which also drains the peers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uct_core::{Caps, Endpoint, EpParams, Iface, IfaceParams, Registry, Status};

/// The active message id the peers count.
const AM_ID: u8 = 7;

/// One row of the table: one transport at one endpoint count.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    pub transport: String,
    pub endpoints: usize,
    /// Connecting the hub's endpoint (and its reverse, for transports that
    /// connect endpoint to endpoint), per endpoint.
    pub setup_us_per_endpoint: f64,
    /// VmRSS after the endpoints were created less before, per endpoint,
    /// in KiB.
    pub rss_kib_per_endpoint: f64,
    /// Opening one peer iface (its handler set), us.
    pub peer_iface_us: f64,
    /// VmRSS growth per peer iface opened, KiB.
    pub peer_iface_rss_kib: f64,
    /// One hub progress call with nothing in flight, median of batches, ns.
    pub idle_progress_ns: f64,
    /// 8 B active messages per second, round-robin over the endpoints.
    pub msg_rate: f64,
}

/// What a scale run is asked to do.
#[derive(Debug, Clone)]
pub struct ScaleParams {
    pub transport: String,
    pub device: Option<String>,
    pub counts: Vec<usize>,
    /// Messages per rate measurement.
    pub messages: u64,
    /// Progress calls per timed batch (5 batches).
    pub progress_calls: u64,
}

/// Resident memory of this process, KiB (VmRSS).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Peers and endpoints of one count.
struct Fleet {
    peers: Vec<Box<dyn Iface>>,
    /// The hub's endpoint to each peer.
    eps: Vec<Box<dyn Endpoint>>,
    /// The peers' endpoints back, for endpoint-to-endpoint transports.
    back: Vec<Box<dyn Endpoint>>,
    /// Messages the peers' handlers counted.
    received: Arc<AtomicU64>,
    /// Opening the peers, then connecting the endpoints: time and VmRSS
    /// growth (KiB) of each phase.
    open: (Duration, u64),
    eps_setup: (Duration, u64),
}

fn text(e: uct_core::UctError) -> String {
    e.to_string()
}

fn connect(
    reg: &Registry,
    hub: &mut Box<dyn Iface>,
    p: &ScaleParams,
    count: usize,
    received: &Arc<AtomicU64>,
) -> Result<Fleet, String> {
    let by_iface = hub.attrs().caps.contains(Caps::CONNECT_TO_IFACE);
    let mut fleet = Fleet {
        peers: Vec::with_capacity(count),
        eps: Vec::with_capacity(count),
        back: Vec::new(),
        received: received.clone(),
        open: (Duration::ZERO, 0),
        eps_setup: (Duration::ZERO, 0),
    };
    let (rss0, start) = (rss_kib(), Instant::now());
    for i in 0..count {
        let mut peer = reg
            .open_iface(&p.transport, p.device.as_deref(), &IfaceParams::default())
            .map_err(|e| format!("peer iface {i}: {e}"))?;
        let counter = received.clone();
        peer.set_am_handler(
            AM_ID,
            Box::new(move |_msg| {
                counter.fetch_add(1, Ordering::Relaxed);
            }),
        )
        .map_err(text)?;
        fleet.peers.push(peer);
    }
    let (rss1, opened) = (rss_kib(), Instant::now());
    fleet.open = (opened - start, rss1.saturating_sub(rss0));
    for (i, peer) in fleet.peers.iter_mut().enumerate() {
        if by_iface {
            let ep = hub
                .create_ep(EpParams::ToIface {
                    device_addr: peer.device_address(),
                    iface_addr: peer.iface_address(),
                })
                .map_err(|e| format!("endpoint {i}: {e}"))?;
            fleet.eps.push(ep);
        } else {
            let mut ep = hub.create_ep(EpParams::Unconnected).map_err(text)?;
            let mut rev = peer.create_ep(EpParams::Unconnected).map_err(text)?;
            let (a, b) = (
                ep.ep_address().map_err(text)?,
                rev.ep_address().map_err(text)?,
            );
            ep.connect_to_ep(&peer.device_address(), &b)
                .map_err(|e| format!("endpoint {i}: {e}"))?;
            rev.connect_to_ep(&hub.device_address(), &a)
                .map_err(|e| format!("endpoint {i} (back): {e}"))?;
            fleet.eps.push(ep);
            fleet.back.push(rev);
        }
    }
    fleet.eps_setup = (opened.elapsed(), rss_kib().saturating_sub(rss1));
    Ok(fleet)
}

/// Times one idle hub progress call.
fn idle_progress_ns(hub: &mut Box<dyn Iface>, calls: u64) -> f64 {
    let mut batches = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..calls {
            std::hint::black_box(hub.progress());
        }
        batches.push(start.elapsed().as_nanos() as f64 / calls.max(1) as f64);
    }
    median(batches)
}

/// Sends `messages` 8-byte active messages round-robin and waits until the
/// peers counted them all; messages per second.
fn message_rate(hub: &mut Box<dyn Iface>, fleet: &mut Fleet, messages: u64) -> Result<f64, String> {
    let n = fleet.eps.len();
    let before = fleet.received.load(Ordering::Relaxed);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60);
    let payload = [0u8; 0];
    for m in 0..messages {
        let i = (m % n as u64) as usize;
        // No room: drain everything, then try again.
        while let Status::NoResource = fleet.eps[i].am_short(AM_ID, m, &payload).map_err(text)? {
            hub.progress();
            for peer in fleet.peers.iter_mut() {
                peer.progress();
            }
            if Instant::now() > deadline {
                return Err(format!("endpoint {i}: no room to send for 60 s"));
            }
        }
        // The peers drain as a round completes.
        if i == n - 1 {
            for peer in fleet.peers.iter_mut() {
                peer.progress();
            }
        }
    }
    while fleet.received.load(Ordering::Relaxed) - before < messages {
        hub.progress();
        for peer in fleet.peers.iter_mut() {
            peer.progress();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {messages} messages arrived within 60 s",
                fleet.received.load(Ordering::Relaxed) - before
            ));
        }
    }
    Ok(messages as f64 / start.elapsed().as_secs_f64())
}

/// Runs every count; `progress` is told each row as it is measured.
pub fn run(p: &ScaleParams, mut progress: impl FnMut(&ScaleRow)) -> Result<Vec<ScaleRow>, String> {
    let reg = Registry::global();
    let mut hub = reg
        .open_iface(&p.transport, p.device.as_deref(), &IfaceParams::default())
        .map_err(|e| format!("{}: {e}", p.transport))?;
    if !hub.attrs().caps.contains(Caps::AM_SHORT) {
        return Err(format!(
            "{} has no active messages; scale measures posix, tcp and self",
            p.transport
        ));
    }
    let received = Arc::new(AtomicU64::new(0));
    let mut rows = Vec::new();
    for &count in &p.counts {
        if count == 0 {
            return Err("an endpoint count of 0 measures nothing; use 1 or more".into());
        }
        let mut fleet = connect(reg, &mut hub, p, count, &received)?;
        // A first round reaches every peer (lazy connections, first-use
        // mappings) before anything is timed.
        message_rate(&mut hub, &mut fleet, count as u64)?;
        let idle = idle_progress_ns(&mut hub, p.progress_calls);
        let rate = message_rate(&mut hub, &mut fleet, p.messages)?;
        let row = ScaleRow {
            transport: p.transport.clone(),
            endpoints: count,
            setup_us_per_endpoint: fleet.eps_setup.0.as_secs_f64() * 1e6 / count as f64,
            rss_kib_per_endpoint: fleet.eps_setup.1 as f64 / count as f64,
            peer_iface_us: fleet.open.0.as_secs_f64() * 1e6 / count as f64,
            peer_iface_rss_kib: fleet.open.1 as f64 / count as f64,
            idle_progress_ns: idle,
            msg_rate: rate,
        };
        progress(&row);
        rows.push(row);
        // Endpoints before the peers they reach.
        drop(fleet.eps);
        drop(fleet.back);
        drop(fleet.peers);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_batches_ignores_one_slow_batch() {
        assert_eq!(median(vec![10.0, 11.0, 900.0, 10.5, 10.2]), 10.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn rss_is_read_from_proc() {
        assert!(rss_kib() > 0);
    }
}
