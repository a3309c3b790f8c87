//! uct-stress: bounded stress runs for the shell suites (test-suite/shell):
//! memory alloc/export/register cycles with an fd count before and after,
//! many endpoints on one iface, each checked; how cost grows with the
//! number of peers (`scale`). Long transfers are perftest's.

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use uct_core::{
    Access, Completion, EpParams, IfaceParams, Iov, MemoryType, Registry, RkeyBundle, Status,
};

#[derive(Parser, Debug)]
#[command(
    name = "uct-stress",
    about = "Bounded stress runs: memory cycles and many endpoints, each checked; exit 0 when every check held",
    after_help = "Examples:\n  uct-stress mem-cycles --md gaudi0 --count 500       alloc, DMA-buf query, free (fds counted)\n  uct-stress mem-cycles --md gaudi0 --nic rc          ... and register each with the NIC\n  uct-stress endpoints -t tcp -d lo --count 64        64 endpoints to one iface, a put on each\n  uct-stress scale -t posix --endpoints 1,8,64,256    cost per peer at 1..256 peers (--json for JSON)\n  uct-stress ceiling --sizes 8,64k,4m                 memcpy, process_vm_writev, tcp: the machine's own bounds"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Allocate on a memory domain, query its DMA-buf, optionally register
    /// with a transport's MD, free; check that no fd and no allocation
    /// is left.
    MemCycles {
        /// Memory domain that allocates (gaudi0, posix, ...).
        #[arg(long)]
        md: String,
        /// Also register every allocation with this transport's MD.
        #[arg(long)]
        nic: Option<String>,
        #[arg(long, default_value_t = 200)]
        count: u64,
        /// Bytes per allocation.
        #[arg(long, default_value_t = 1 << 20)]
        size: usize,
        /// Stop early after this many seconds.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Open COUNT endpoints from one iface to another, put a different
    /// pattern through each, flush, and check every byte.
    Endpoints {
        #[arg(short = 't', long = "transport")]
        transport: String,
        #[arg(short = 'd', long = "device")]
        device: Option<String>,
        #[arg(long, default_value_t = 64)]
        count: usize,
    },
    /// How cost grows with peers: for each count N, a hub iface connects
    /// one endpoint to each of N peer ifaces (one endpoint per peer, as on
    /// a cluster), all in this process (self reaches no other); prints the
    /// setup time and resident memory per peer, one hub progress() with
    /// every endpoint idle (median), and the rate of 8 B active messages
    /// round-robin over the endpoints (docs/scale.md). Rows go to stdout
    /// as they are measured; with --json, a JSON array at the end and each
    /// row on stderr as it is measured.
    Scale {
        #[arg(short = 't', long = "transport")]
        transport: String,
        #[arg(short = 'd', long = "device")]
        device: Option<String>,
        /// Endpoint counts, comma-separated.
        #[arg(long, default_value = "1,8,64,256", value_delimiter = ',')]
        endpoints: Vec<usize>,
        /// Messages per rate measurement.
        #[arg(long, default_value_t = 200_000)]
        messages: u64,
        /// Progress calls per timed batch (the median of 5 batches).
        #[arg(long, default_value_t = 100_000)]
        progress_calls: u64,
        /// Print the rows as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What the machine allows with no transport in the way, for the
    /// ceilings of docs/perf-notes.md: memcpy, process_vm_writev and a
    /// loopback tcp stream per size (MiB/s), a cache-line ping-pong
    /// between CPUs 0 and 1 (by store and by atomic add; half the median
    /// round trip) and a loopback tcp ping-pong (us one way);
    /// the median of 5 batches, pinned as compare-ucx pins the tools.
    Ceiling {
        /// Sizes, comma-separated (8, 1k, 64k, 4m).
        #[arg(long, default_value = "8,1k,8k,64k,1m,4m", value_delimiter = ',')]
        sizes: Vec<String>,
        /// Print the ceilings as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// What one run of mem-cycles did, for its report line.
struct CycleReport<'a> {
    md: &'a str,
    mem_type: MemoryType,
    /// The owner answered a memory query (and, for device memory, gave a
    /// DMA-buf, which the allocation exported).
    queried: bool,
    /// The NIC's memory domain every allocation was registered with.
    nic_md: Option<&'a str>,
    /// Cycles that ran, and cycles asked for.
    done: u64,
    asked: u64,
    seconds: u64,
    elapsed: Duration,
    fds: usize,
}

impl CycleReport<'_> {
    /// The steps of one cycle, named for what they do: an MD's `alloc` of
    /// host memory registers it with that MD only (a NIC only when the MD is
    /// a NIC's); device memory is exported as a DMA-buf instead; `--nic`
    /// adds a registration named with the NIC's MD.
    fn steps(&self) -> String {
        let mut steps = vec!["alloc".to_string()];
        if self.mem_type.is_host_accessible() {
            steps.push(format!("register with {}", self.md));
        }
        if self.queried {
            if self.mem_type.is_host_accessible() {
                steps.push("query".into());
            } else {
                steps.push("export".into());
                steps.push("query".into());
            }
        }
        if let Some(nic) = self.nic_md {
            steps.push(format!("register with {nic}"));
        }
        steps.push("free".into());
        steps.join("/")
    }

    /// One line: what ran, how many times (the count that ran, never the
    /// count asked for), and why it stopped short when it did.
    fn line(&self) -> String {
        let count = if self.done < self.asked {
            format!(
                "x{} of {} (stopped at the --seconds {} limit)",
                self.done, self.asked, self.seconds
            )
        } else {
            format!("x{}", self.done)
        };
        format!(
            "mem-cycles: {} {} {count} on {} in {:.1}s; fds {} before and after",
            self.mem_type,
            self.steps(),
            self.md,
            self.elapsed.as_secs_f64(),
            self.fds
        )
    }
}

fn mem_cycles(
    md_name: &str,
    nic: Option<&str>,
    count: u64,
    size: usize,
    seconds: u64,
) -> Result<String, String> {
    let reg = Registry::global();
    let md = reg.open_md(md_name).map_err(|e| e.to_string())?;
    let mem_type = *md
        .attrs()
        .alloc_mem_types
        .first()
        .ok_or_else(|| format!("memory domain {md_name} does not allocate"))?;
    let nic_md = match nic {
        Some(transport) => Some(
            reg.open_iface(transport, None, &IfaceParams::default())
                .map_err(|e| e.to_string())?
                .md()
                .clone(),
        ),
        None => None,
    };
    // Let lazily opened fds (logging, modules) settle before counting.
    drop(md.alloc(size, mem_type, Access::all_rights()));
    let before = open_fds();
    let start = Instant::now();
    let mut done = 0u64;
    let mut queried = false;
    while done < count && start.elapsed() < Duration::from_secs(seconds) {
        let mem = md
            .alloc(size, mem_type, Access::all_rights())
            .map_err(|e| format!("cycle {done}: alloc: {e}"))?;
        if let Some(query) = mem.query_owner() {
            let info = query.map_err(|e| format!("cycle {done}: query: {e}"))?;
            if mem_type != MemoryType::Host && info.dmabuf.is_none() {
                return Err(format!("cycle {done}: no DMA-buf for {mem_type} memory"));
            }
            queried = true;
        }
        if let Some(nic_md) = &nic_md {
            let registered = nic_md
                .register_handle(&mem, Access::all_rights())
                .map_err(|e| format!("cycle {done}: register with {}: {e}", nic_md.name()))?;
            drop(registered);
        }
        drop(mem);
        done += 1;
    }
    if done == 0 {
        return Err(format!(
            "no cycle ran on {md_name} within --seconds {seconds}; give it more time"
        ));
    }
    let after = open_fds();
    if after != before {
        return Err(format!(
            "{done} cycles: {before} fds open before, {after} after"
        ));
    }
    Ok(CycleReport {
        md: md_name,
        mem_type,
        queried,
        nic_md: nic_md.as_ref().map(|m| m.name()),
        done,
        asked: count,
        seconds,
        elapsed: start.elapsed(),
        fds: before,
    }
    .line())
}

/// Turns of a waiting loop between two liveness probes of the endpoints
/// (`Endpoint::check`, rate-limited by the transport): a turn is a
/// progress call on each iface.
const CHECK_EVERY: u32 = 64;

/// The bound on every wait of a run.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Probes every endpoint's peer, and fails once `start` is [`WAIT_LIMIT`]
/// ago: what each turn of a wait does every [`CHECK_EVERY`] turns.
fn still_waiting(
    eps: &mut [&mut Box<dyn uct_core::Endpoint>],
    start: Instant,
    what: &str,
) -> Result<(), String> {
    for ep in eps.iter_mut() {
        ep.check().map_err(|e| format!("waiting for {what}: {e}"))?;
    }
    if start.elapsed() > WAIT_LIMIT {
        return Err(format!(
            "{what} did not complete in {} s",
            WAIT_LIMIT.as_secs()
        ));
    }
    Ok(())
}

fn endpoints(transport: &str, device: Option<&str>, count: usize) -> Result<String, String> {
    let text = |e: uct_core::UctError| e.to_string();
    let reg = Registry::global();
    let params = IfaceParams::default();
    let mut sender = reg.open_iface(transport, device, &params).map_err(text)?;
    let mut receiver = reg.open_iface(transport, device, &params).map_err(text)?;
    let md = receiver.md().clone();
    let chunk = 4096usize;
    let target = md
        .alloc(chunk * count, MemoryType::Host, Access::all_rights())
        .map_err(text)?;
    let src = sender
        .md()
        .alloc(chunk * count, MemoryType::Host, Access::all_rights())
        .map_err(text)?;
    let rkey = reg
        .unpack_rkey(
            &RkeyBundle::single(md.pack_rkey(&target).map_err(text)?)
                .pack()
                .map_err(text)?,
            md.name(),
        )
        .map_err(text)?;
    let by_iface = sender
        .attrs()
        .caps
        .contains(uct_core::Caps::CONNECT_TO_IFACE);
    let mut eps = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..count {
        if by_iface {
            eps.push(
                sender
                    .create_ep(EpParams::ToIface {
                        device_addr: receiver.device_address(),
                        iface_addr: receiver.iface_address(),
                    })
                    .map_err(text)?,
            );
        } else {
            let mut ep = sender.create_ep(EpParams::Unconnected).map_err(text)?;
            let mut peer = receiver.create_ep(EpParams::Unconnected).map_err(text)?;
            let (ep_addr, peer_addr) = (
                ep.ep_address().map_err(text)?,
                peer.ep_address().map_err(text)?,
            );
            ep.connect_to_ep(&receiver.device_address(), &peer_addr)
                .map_err(text)?;
            peer.connect_to_ep(&sender.device_address(), &ep_addr)
                .map_err(text)?;
            eps.push(ep);
            peers.push(peer);
        }
    }
    for i in 0..count {
        let pat: Vec<u8> = (0..chunk).map(|j| (i * 7 + j) as u8).collect();
        src.write(i * chunk, &pat).map_err(text)?;
    }
    let start = Instant::now();
    let comps: Vec<Completion> = (0..count).map(|_| Completion::new()).collect();
    for (i, ep) in eps.iter_mut().enumerate() {
        let mut turns = 0u32;
        loop {
            let status = ep
                .put_zcopy(
                    &[Iov::new(&src, i * chunk, chunk)],
                    target.addr() + (i * chunk) as u64,
                    &rkey,
                    Some(&comps[i]),
                )
                .map_err(|err| format!("endpoint {i}: put: {err}"))?;
            if status != Status::NoResource {
                break;
            }
            sender.progress();
            receiver.progress();
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(CHECK_EVERY) {
                still_waiting(&mut [ep], start, &format!("endpoint {i}: room to put"))?;
            }
        }
    }
    let flushes: Vec<Completion> = (0..count).map(|_| Completion::new()).collect();
    for (i, ep) in eps.iter_mut().enumerate() {
        let mut turns = 0u32;
        loop {
            let status = ep
                .flush(Some(&flushes[i]))
                .map_err(|err| format!("endpoint {i}: flush: {err}"))?;
            if status != Status::NoResource {
                break;
            }
            sender.progress();
            receiver.progress();
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(CHECK_EVERY) {
                still_waiting(&mut [ep], start, &format!("endpoint {i}: room to flush"))?;
            }
        }
    }
    let mut turns = 0u32;
    while !(comps.iter().chain(&flushes).all(|c| c.is_complete())) {
        sender.progress();
        receiver.progress();
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(CHECK_EVERY) {
            let mut all: Vec<_> = eps.iter_mut().chain(peers.iter_mut()).collect();
            still_waiting(&mut all, start, "the puts and flushes")?;
        }
    }
    for c in comps.iter().chain(&flushes) {
        c.result().map_err(text)?;
    }
    let got = target.to_vec().map_err(text)?;
    for i in 0..count {
        let want: Vec<u8> = (0..chunk).map(|j| (i * 7 + j) as u8).collect();
        if got[i * chunk..(i + 1) * chunk] != want[..] {
            return Err(format!("endpoint {i}: the data at the target is wrong"));
        }
    }
    drop(peers);
    Ok(format!(
        "endpoints: {count} endpoints over {transport}, one {chunk}-byte put each, all verified in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    ))
}

fn scale(params: tools::scale::ScaleParams, json: bool) -> Result<String, String> {
    if !json {
        println!(
            "{:>10} {:>9} {:>12} {:>11} {:>14} {:>16} {:>16} {:>12}",
            "transport",
            "endpoints",
            "setup us/ep",
            "RSS KiB/ep",
            "peer iface us",
            "peer iface KiB",
            "idle progress ns",
            "8 B msg/s"
        );
    }
    let rows = tools::scale::run(&params, |row| {
        if json {
            eprintln!(
                "scale: {} {} endpoints: setup {:.1} us/ep, {:.1} KiB/ep, idle progress {:.1} ns, {:.0} msg/s",
                row.transport,
                row.endpoints,
                row.setup_us_per_endpoint,
                row.rss_kib_per_endpoint,
                row.idle_progress_ns,
                row.msg_rate
            );
        } else {
            println!(
                "{:>10} {:>9} {:>12.1} {:>11.1} {:>14.1} {:>16.1} {:>16.1} {:>12.0}",
                row.transport,
                row.endpoints,
                row.setup_us_per_endpoint,
                row.rss_kib_per_endpoint,
                row.peer_iface_us,
                row.peer_iface_rss_kib,
                row.idle_progress_ns,
                row.msg_rate
            );
        }
    })?;
    if json {
        return serde_json::to_string_pretty(&rows).map_err(|e| e.to_string());
    }
    Ok(format!(
        "scale: {} over {} endpoint counts measured",
        params.transport,
        rows.len()
    ))
}

fn ceiling(sizes: &[String], json: bool) -> Result<String, String> {
    let sizes = sizes
        .iter()
        .map(|s| tools::ceiling::parse_size(s))
        .collect::<Result<Vec<_>, _>>()?;
    let rows = tools::ceiling::run(&sizes, |c| {
        let line = format!(
            "{:<20} {:>8} {:>14.3} {:<5} batches {}",
            c.what,
            tools::text::size(c.size as u64),
            c.value,
            c.unit,
            c.batches
                .iter()
                .map(|b| format!("{b:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    })?;
    if json {
        return serde_json::to_string_pretty(&rows).map_err(|e| e.to_string());
    }
    Ok(format!("ceiling: {} ceilings measured", rows.len()))
}

fn main() {
    uct_builtins::link();
    uct_core::logging::init();
    let outcome = match Cli::parse().cmd {
        Cmd::MemCycles {
            md,
            nic,
            count,
            size,
            seconds,
        } => mem_cycles(&md, nic.as_deref(), count, size, seconds),
        Cmd::Endpoints {
            transport,
            device,
            count,
        } => endpoints(&transport, device.as_deref(), count),
        Cmd::Scale {
            transport,
            device,
            endpoints,
            messages,
            progress_calls,
            json,
        } => scale(
            tools::scale::ScaleParams {
                transport,
                device,
                counts: endpoints,
                messages,
                progress_calls,
            },
            json,
        ),
        Cmd::Ceiling { sizes, json } => ceiling(&sizes, json),
    };
    match outcome {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("uct-stress: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(done: u64, asked: u64) -> CycleReport<'static> {
        CycleReport {
            md: "gaudi0",
            mem_type: MemoryType::Gaudi,
            queried: true,
            nic_md: None,
            done,
            asked,
            seconds: 20,
            elapsed: Duration::from_secs(20),
            fds: 9,
        }
    }

    #[test]
    fn the_count_reported_is_the_count_that_ran() {
        let line = report(1234, 2000).line();
        assert!(line.contains(" x1234 of 2000 "), "{line}");
        assert!(line.contains("stopped at the --seconds 20 limit"), "{line}");
        assert!(!line.contains("x2000"), "{line}");
        let line = report(2000, 2000).line();
        assert!(line.contains(" x2000 on gaudi0"), "{line}");
        assert!(!line.contains("stopped"), "{line}");
    }

    #[test]
    fn steps_are_named_for_what_they_do() {
        let gaudi = report(1, 1);
        assert_eq!(gaudi.steps(), "alloc/export/query/free");
        let nic = CycleReport {
            nic_md: Some("mlx5_0"),
            ..report(1, 1)
        };
        assert_eq!(nic.steps(), "alloc/export/query/register with mlx5_0/free");
        let host = CycleReport {
            md: "posix",
            mem_type: MemoryType::Host,
            queried: false,
            ..report(1, 1)
        };
        assert_eq!(host.steps(), "alloc/register with posix/free");
        let line = host.line();
        assert!(
            line.contains("host alloc/register with posix/free x1 on posix in"),
            "{line}"
        );
    }

    #[test]
    fn a_run_cut_short_by_its_time_limit_says_so() {
        uct_builtins::link();
        let line = mem_cycles("posix", None, u64::MAX, 4096, 1).expect("mem-cycles on posix");
        assert!(
            line.contains(&format!(" of {} (stopped", u64::MAX)),
            "{line}"
        );
        let line = mem_cycles("posix", None, 3, 4096, 60).expect("mem-cycles on posix");
        assert!(
            line.contains("host alloc/register with posix/free x3 on posix"),
            "{line}"
        );
        assert!(
            mem_cycles("posix", None, 3, 4096, 0).is_err(),
            "no cycle ran"
        );
    }
}
