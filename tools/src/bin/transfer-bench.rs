//! transfer-bench: the transfer API measured as seed 004's
//! BM_RdmaTransport_Write: per size, the real time of one notified write,
//! the CPU time per write and the bytes per second.
//!
//! No HOST and no `--listen`: both Transports in this process. `--listen`:
//! the receiving side; `HOST`: the sending side, which measures. Both
//! sides agree their parameters over the bootstrap channel and refuse a
//! mismatch.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Parser;
use tools::transfer_bench::drive::Driver;
use tools::transfer_bench::error::{BenchError, Result};
use tools::transfer_bench::params::{BenchParams, Plan, ProgressMode};
use tools::transfer_bench::report::{self, Document, Header, RailRow, Row};
use tools::transfer_bench::run::{self, Checks, Loopback, Measurement};
use tools::transfer_bench::session;
use uct_core::bootstrap::{BootstrapChannel, BootstrapError, BootstrapListener};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer, Transport};

const ONE_PROCESS_TIME: &str = "from the post of a notified write to the receiver's wait_for_write resolving (and the write's own future, so that the view may be reused), one write at a time";
const TWO_PROCESS_TIME: &str = "the round trip of a notified write and the receiver's zero-length notified answer, less the answer's one-way time (half the median round trip of a zero-length write and its answer, measured right after each write)";
const ONE_PROCESS_WINDOW: &str = "the measured loop's elapsed time / writes, with -O notified writes posted (before each new post the oldest is retired: the receiver's wait_for_write for it, then its own future)";
const TWO_PROCESS_WINDOW: &str = "elapsed time / writes, from the first post to the receiver's zero-length notified answer to the last write (a write posted whenever fewer than -O writes' futures are pending; the receiver waits for every notification), less the answer's one-way time (half the median of 15 zero-length round trips made right after)";

#[derive(Parser, Debug)]
#[command(
    name = "transfer-bench",
    version,
    about = "Measure notified writes of the uct-rs transfer API (uct-transfer), as seed 004's BM_RdmaTransport_Write",
    after_help = "Modes:\n  transfer-bench -t posix                  both sides in this process, driven by one thread\n  transfer-bench --listen -t tcp           receiver: waits for one sender on -p PORT\n  transfer-bench 127.0.0.1 -t tcp          sender: measures against that receiver\n\n\
What is measured, one notified write at a time (write_tagged, then wait_for_write; -O 1):\n  real time   One process: from the post of the write to the receiver's\n              wait_for_write resolving (the write's own future too).\n              Two processes: the sender cannot see the receiver's clock, so the\n              receiver answers every notification with a zero-length notified\n              write; the real time is that round trip less the answer's one-way\n              time, which is half the median round trip of a zero-length write and its\n              answer, measured right after each write (the same operation\n              both ways, under the same conditions).\n  CPU time    Process CPU time over the measured loop / iterations (the sending\n              process in two processes). With manual progress the measuring\n              thread polls, so CPU time is close to real time.\n  bytes/s     size / real time.\n  --validate  The sender fills each write with a pattern of its iteration, the\n              receiver checks every byte after the notification; filling and\n              checking are not timed.\n\n\
With -O N (N > 1), N notified writes in flight:\n  real time   Elapsed time / writes. One process: the loop keeps N writes\n              posted; before each new post it retires the oldest (the\n              receiver's wait_for_write for it, then its future). Two\n              processes: the sender posts whenever fewer than N write futures\n              are pending, the receiver waits for every notification and\n              answers the last one with a zero-length notified write; the\n              time runs from the first post to that answer, less half the\n              median of 15 zero-length round trips made right after.\n  bytes/s     size / real time (N writes overlap: compare with perftest\n              put_bw -O N).\n  --validate  One slot per write in flight on each side; a slot is refilled\n              only once the receiver checked it (in two processes the\n              receiver answers every write). Filling and checking are taken\n              off the time, which is then only indicative.\n\n\
Examples:\n  transfer-bench -t posix -s 1M --format json\n  transfer-bench -t tcp -d lo -s 8k,64k,1M -n 2000\n  transfer-bench -t posix -s 8k:4M --validate\n  transfer-bench -t tcp -d lo -s 1M,4M,16M -O 32\n  transfer-bench -t rc -d mlx5_0:1 -m gaudi\n  transfer-bench -t tcp --rails 2 -s 4M --validate     (two rails, per-rail counts after the table)\n  transfer-bench -t tcp --devices dummy0,dummy1 -s 64M -n 500"
)]
struct Args {
    /// Receiver to connect to; without it, and without --listen, both sides
    /// run in this process.
    host: Option<String>,

    /// Be the receiver: wait for one sender, answer its run, exit.
    #[arg(long)]
    listen: bool,

    /// TCP port of the bootstrap channel between the two processes.
    #[arg(short = 'p', long = "port", default_value_t = 13339)]
    port: u16,

    /// Transport: posix, tcp, rc, self, cma or auto (what `transport-info -d`
    /// lists).
    #[arg(
        short = 't',
        long = "transport",
        value_name = "NAME",
        default_value = "posix"
    )]
    transport: String,

    /// Device of the transport (default: its first), e.g. lo, mlx5_0:1.
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    device: Option<String>,

    /// Rails: this many devices of the transport (as it lists them, or
    /// --devices), each with its own connection; writes of at least
    /// --stripe-min are striped over them. Per-rail counts are printed
    /// after the results. Both sides must give the same.
    #[arg(long = "rails", value_name = "N")]
    rails: Option<usize>,

    /// The rails' devices, comma-separated, in rail order (e.g.
    /// dummy0,dummy1; a device may repeat: two connections over one link).
    #[arg(long = "devices", value_name = "LIST", conflicts_with = "device")]
    devices: Option<String>,

    /// Smallest write striped over the rails (default: the transfer API's,
    /// UCT_TRANSFER_STRIPE_MIN); units k, M, G.
    #[arg(long = "stripe-min", value_name = "SIZE")]
    stripe_min: Option<String>,

    /// Memory type of both buffers: host, or gaudi (allocated by the Gaudi
    /// memory domain, hl-thunk, UCT_GAUDI_HLTHUNK_LIB; a transport that
    /// cannot reach it refuses it at registration).
    #[arg(short = 'm', long = "mem", value_name = "TYPE", default_value = "host")]
    mem: String,

    /// Sizes: a list (8k,64k,1M) or a doubling range (8k:256M); units k, M, G.
    #[arg(
        short = 's',
        long = "sizes",
        value_name = "SIZES",
        default_value = "8k:256M"
    )]
    sizes: String,

    /// Notified writes in flight (1: one at a time, the seed's loop; the
    /// sender's choice, which the receiver takes).
    #[arg(
        short = 'O',
        long = "outstanding",
        value_name = "N",
        default_value_t = 1
    )]
    outstanding: usize,

    /// Measured iterations per size (default: enough for --min-time, at
    /// least 10; at most 200 with --validate).
    #[arg(short = 'n', value_name = "ITERS")]
    iters: Option<u64>,

    /// Warm-up iterations per size (default: about 32 MiB worth, 2 to 2000).
    #[arg(short = 'w', value_name = "WARMUP")]
    warmup: Option<u64>,

    /// Seconds the measured loop of each size should last when -n is not
    /// given.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.5)]
    min_time: f64,

    /// Who drives progress: manual (the measuring thread, the default) or
    /// thread (each Transport's progress thread).
    #[arg(long, value_name = "MODE", default_value = "manual")]
    progress: String,

    /// Check every byte at the receiver after each notified write.
    #[arg(long)]
    validate: bool,

    /// Output format: table, csv or json.
    #[arg(long, value_name = "FORMAT", default_value = "table")]
    format: String,

    /// Seconds any one wait may last before the run ends with an error (a
    /// dead peer ends it sooner, within the transport's peer timeout).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    timeout: u64,

    /// Testing aid: corrupt the write of this iteration (counted over the
    /// run, warm-ups included) so that --validate must report it.
    #[arg(long, value_name = "ITER", hide = true)]
    inject_corruption: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Table,
    Csv,
    Json,
}

const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a receiver waits for its sender.
const SERVER_WAIT: Duration = Duration::from_secs(24 * 3600);

fn usage(msg: impl Into<String>) -> BenchError {
    BenchError::Usage(msg.into())
}

fn params_from(args: &Args) -> Result<BenchParams> {
    let sizes = tools::perf::params::parse_sizes(&args.sizes).map_err(usage)?;
    let params = BenchParams {
        version: env!("CARGO_PKG_VERSION").to_string(),
        transport: args.transport.clone(),
        device: args.device.clone(),
        mem: args.mem.clone(),
        sizes,
        validate: args.validate,
        outstanding: args.outstanding,
        rails: rails_of(args)?,
    };
    params.check().map_err(usage)?;
    Ok(params)
}

/// The rails asked: --rails, or as many as --devices names, or 1.
fn rails_of(args: &Args) -> Result<usize> {
    let named = devices_of(args).map(|d| d.len());
    match (args.rails, named) {
        (Some(n), Some(d)) if n != d => Err(usage(format!(
            "--rails {n} with --devices naming {d}; give one or the other"
        ))),
        (Some(n), _) | (None, Some(n)) => Ok(n),
        (None, None) => Ok(1),
    }
}

fn devices_of(args: &Args) -> Option<Vec<String>> {
    args.devices
        .as_ref()
        .map(|d| d.split(',').map(|s| s.trim().to_string()).collect())
}

/// The Transports' local settings the two sides need not share: the
/// rails' devices and the stripe minimum.
#[derive(Default)]
struct Local {
    devices: Option<Vec<String>>,
    stripe_min: Option<usize>,
}

fn local_of(args: &Args) -> Result<Local> {
    let stripe_min = match &args.stripe_min {
        Some(s) => Some(
            uct_core::config::parse_size(s)
                .filter(|&b| b > 0)
                .ok_or_else(|| usage(format!("--stripe-min {s} is not a size (e.g. 256k)")))?
                as usize,
        ),
        None => None,
    };
    Ok(Local {
        devices: devices_of(args),
        stripe_min,
    })
}

fn plan_from(args: &Args) -> Result<Plan> {
    if !(args.min_time.is_finite() && args.min_time > 0.0 && args.min_time <= 3600.0) {
        return Err(usage(format!(
            "--min-time {} is not a duration; give seconds, e.g. 0.5",
            args.min_time
        )));
    }
    for (what, n) in [("-n", args.iters), ("-w", args.warmup)] {
        if let Some(n) = n.filter(|&n| n > tools::transfer_bench::params::MAX_ITERS) {
            return Err(usage(format!(
                "{what} {n} is more than {} iterations; use fewer",
                tools::transfer_bench::params::MAX_ITERS
            )));
        }
    }
    Ok(Plan {
        iters: args.iters,
        warmup: args.warmup,
        min_time: Duration::from_secs_f64(args.min_time),
        validate: args.validate,
        outstanding: args.outstanding,
    })
}

fn format_of(s: &str) -> Result<Format> {
    match s {
        "table" => Ok(Format::Table),
        "csv" => Ok(Format::Csv),
        "json" => Ok(Format::Json),
        other => Err(usage(format!(
            "unknown format '{other}'; use table, csv or json"
        ))),
    }
}

/// A Transport as the command line asks.
fn build(params: &BenchParams, local: &Local, progress: ProgressMode) -> Result<Transport> {
    let mem_type = params.mem_type().map_err(usage)?;
    let mut types = vec![mem_type];
    if mem_type != MemoryType::Host {
        // The receiver's zero-length answers land in host memory.
        types.push(MemoryType::Host);
    }
    let mut b = Transport::builder()
        .transport(&params.transport)
        .memory_types(&types)
        // -O writes, and a receiver's answer, never wait for room.
        .max_in_flight(uct_transfer::DEFAULT_DEPTH.max(params.outstanding + 1))
        .progress(match progress {
            ProgressMode::Manual => Progress::Manual,
            ProgressMode::Thread => Progress::Thread,
        });
    if let Some(d) = &params.device {
        b = b.device(d);
    }
    match &local.devices {
        Some(d) => b = b.devices(&d.iter().map(String::as_str).collect::<Vec<_>>()),
        None if params.rails > 1 => b = b.rails(params.rails),
        None => {}
    }
    if let Some(m) = local.stripe_min {
        b = b.stripe_min(m);
    }
    b.build()
        .map_err(|e| usage(format!("cannot open transport {}: {e}", params.transport)))
}

/// Where results go, and the progress line on a terminal.
struct Output {
    format: Format,
    tty: bool,
    rows: Vec<Row>,
}

impl Output {
    fn progress(&self, msg: &str) {
        if self.tty {
            eprint!("\r\x1b[2K{msg}");
            let _ = std::io::stderr().flush();
        }
    }

    fn header(&self, h: &Header) {
        match self.format {
            Format::Table => println!("{}", report::table_header(h)),
            Format::Csv => println!("{}", report::CSV_HEADER),
            Format::Json => {}
        }
    }

    fn row(&mut self, m: &Measurement) {
        self.progress("");
        let row = Row::new(m);
        match self.format {
            Format::Table => println!("{}", report::table_row(&row)),
            Format::Csv => println!("{}", report::csv_row(&row)),
            Format::Json => {}
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    /// The end: each rail's counts (several rails) under the table, or
    /// the JSON document.
    fn finish(&self, h: &Header, t: &Transport) {
        let rails: Vec<RailRow> = t.rails().iter().map(RailRow::of).collect();
        let total: u64 = rails.iter().map(|r| r.bytes_written).sum();
        let shown: &[RailRow] = if rails.len() > 1 { &rails } else { &[] };
        if self.format != Format::Json {
            for r in shown {
                // Under the CSV rows too, as comments.
                let lead = if self.format == Format::Csv { "# " } else { "" };
                println!("{lead}{}", report::rail_line(r, total));
            }
        }
        if self.format == Format::Json {
            let doc = Document {
                header: h,
                results: &self.rows,
                rails: shown,
            };
            match serde_json::to_string_pretty(&doc) {
                Ok(json) => println!("{json}"),
                Err(e) => eprintln!("transfer-bench: cannot encode JSON: {e}"),
            }
        }
    }
}

fn header(params: &BenchParams, t: &Transport, progress: ProgressMode, two: bool) -> Header {
    Header {
        tool: "transfer-bench",
        version: env!("CARGO_PKG_VERSION"),
        transport: t
            .transport_name()
            .unwrap_or_else(|| params.transport.clone()),
        // Several rails: every rail's device, in rail order.
        device: match t.rails() {
            r if r.len() > 1 => Some(
                r.iter()
                    .map(|r| r.device.as_str())
                    .collect::<Vec<_>>()
                    .join("+"),
            ),
            _ => params.device.clone(),
        },
        mem_type: params.mem.clone(),
        progress: progress.name(),
        mode: if two { "two processes" } else { "one process" },
        validate: params.validate,
        outstanding: params.outstanding,
        real_time: match (two, params.outstanding > 1) {
            (false, false) => ONE_PROCESS_TIME,
            (true, false) => TWO_PROCESS_TIME,
            (false, true) => ONE_PROCESS_WINDOW,
            (true, true) => TWO_PROCESS_WINDOW,
        },
    }
}

/// Runs every size with `phase`, printing as it goes.
fn sweep(
    params: &BenchParams,
    plan: &Plan,
    out: &mut Output,
    next: &mut u64,
    mut phase: impl FnMut(usize, u64, u64) -> Result<Measurement>,
) -> Result<()> {
    let n = params.sizes.len();
    for (i, &size) in params.sizes.iter().enumerate() {
        out.progress(&format!(
            "[{}/{n}] {}: warming up and measuring...",
            i + 1,
            tools::text::size(size as u64)
        ));
        let m = run::measure_size(size, plan, next, &mut phase)?;
        out.row(&m);
    }
    Ok(())
}

fn loopback(
    args: &Args,
    params: &BenchParams,
    progress: ProgressMode,
    out: &mut Output,
) -> Result<()> {
    let plan = plan_from(args)?;
    let local = local_of(args)?;
    let tx = build(params, &local, progress)?;
    let rx = build(params, &local, progress)?;
    let (tx_url, rx_url) = (tx.bind()?, rx.bind()?);
    tx.connect(&rx_url)?;
    rx.connect(&tx_url)?;
    let mem_type = params.mem_type().map_err(usage)?;
    let len = params.buffer_len();
    let src = Memory::alloc(&tx, mem_type, len)?;
    let dst = Memory::alloc(&rx, mem_type, len)?;
    let remote = RemoteBuffer::parse(&dst.remote_key())?;
    let lb = Loopback {
        tx,
        rx,
        src,
        dst,
        remote,
        outstanding: params.outstanding,
    };
    let h = header(params, &lb.tx, progress, false);
    out.header(&h);
    let manual = match progress {
        ProgressMode::Manual => vec![&lb.tx, &lb.rx],
        ProgressMode::Thread => Vec::new(),
    };
    let driver = Driver::new(manual, Duration::from_secs(args.timeout));
    let checks = Checks {
        validate: params.validate,
        inject: args.inject_corruption,
    };
    let mut next = 0;
    sweep(params, &plan, out, &mut next, |size, iters, first| {
        run::loopback_phase(&lb, &driver, size, iters, first, &checks)
    })?;
    out.finish(&h, &lb.tx);
    Ok(())
}

/// Waits up to [`SERVER_WAIT`] for a sender that completes the bootstrap
/// handshake; a connection that fails it (a port scanner, another version)
/// is reported and the wait goes on.
fn accept_client(listener: &BootstrapListener) -> Result<BootstrapChannel> {
    let start = std::time::Instant::now();
    loop {
        match listener.accept() {
            Ok(ch) => return Ok(ch),
            Err(e) => {
                let listening = matches!(&e, BootstrapError::Io { what, .. } if what == "accept");
                if listening || start.elapsed() >= SERVER_WAIT {
                    return Err(e.into());
                }
                if !matches!(e, BootstrapError::Timeout { .. }) {
                    eprintln!(
                        "transfer-bench: a connection failed its handshake ({e}); still waiting"
                    );
                }
            }
        }
    }
}

fn listen(args: &Args, params: &BenchParams, progress: ProgressMode) -> Result<()> {
    if args.host.is_some() {
        return Err(usage(
            "--listen takes no HOST; start the sender with this receiver's address",
        ));
    }
    // Refuse at once what this side cannot open.
    let t = build(params, &local_of(args)?, progress)?;
    let listener = BootstrapListener::bind(("0.0.0.0", args.port), BOOTSTRAP_TIMEOUT)?;
    eprintln!(
        "transfer-bench: waiting for a sender on port {} ({} over {})",
        args.port, params.mem, params.transport
    );
    let mut ch = accept_client(&listener)?;
    let agreed = session::agree(&mut ch, params)?;
    let mut server = session::server(&t, ch, &agreed)?;
    let manual = match progress {
        ProgressMode::Manual => vec![&t],
        ProgressMode::Thread => Vec::new(),
    };
    let driver = Driver::new(manual, Duration::from_secs(args.timeout));
    let served = run::serve(&t, &mut server, &driver, agreed.validate);
    let rails: Vec<RailRow> = t.rails().iter().map(RailRow::of).collect();
    if rails.len() > 1 {
        let total = rails.iter().map(|r| r.bytes_written).sum();
        for r in &rails {
            eprintln!("transfer-bench: receiver {}", report::rail_line(r, total));
        }
    }
    served
}

fn send(
    args: &Args,
    host: &str,
    params: &BenchParams,
    progress: ProgressMode,
    out: &mut Output,
) -> Result<()> {
    let plan = plan_from(args)?;
    let t = build(params, &local_of(args)?, progress)?;
    let mut ch = BootstrapChannel::connect((host, args.port), BOOTSTRAP_TIMEOUT)?;
    session::propose(&mut ch, params)?;
    let mut client = session::client(&t, ch, params)?;
    let manual = match progress {
        ProgressMode::Manual => vec![&t],
        ProgressMode::Thread => Vec::new(),
    };
    let driver = Driver::new(manual, Duration::from_secs(args.timeout));
    let checks = Checks {
        validate: params.validate,
        inject: args.inject_corruption,
    };
    let h = header(params, &t, progress, true);
    out.header(&h);
    sweep(params, &plan, out, &mut 0, |size, iters, first| {
        run::client_phase(&t, &mut client, &driver, size, iters, first, &checks)
    })?;
    client.ch.send_msg(&run::Ctl::End)?;
    out.finish(&h, &t);
    Ok(())
}

fn main_result(args: Args) -> Result<()> {
    let params = params_from(&args)?;
    let progress = ProgressMode::parse(&args.progress).map_err(usage)?;
    let mut out = Output {
        format: format_of(&args.format)?,
        tty: std::io::stderr().is_terminal(),
        rows: Vec::new(),
    };
    if args.listen {
        return listen(&args, &params, progress);
    }
    match args.host.clone() {
        Some(host) => send(&args, &host, &params, progress, &mut out),
        None => loopback(&args, &params, progress, &mut out),
    }
}

fn main() {
    uct_builtins::link();
    uct_core::logging::init();
    let args = Args::parse();
    if let Err(e) = main_result(args) {
        eprintln!("\rtransfer-bench: {e}");
        std::process::exit(e.exit_code());
    }
}
