//! perftest: latency, bandwidth and message rate of a uct-rs transport.
//!
//! No HOST: loopback in one process (a server thread and a client thread,
//! both ends over the transport). `--listen`: the server side; `HOST`: the
//! client side. Both sides agree their parameters over the bootstrap channel
//! and refuse a mismatch.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use tools::perf::error::{PerfError, Result};
use tools::perf::params::{parse_sizes, Format, Layout, Params, TestKind};
use tools::perf::report::{self, Row};
use tools::perf::session::{open_iface, Role, ServerOptions, Session};
use tools::perf::{layout, run};
use tools::plot::{Panel, Series};
use uct_core::bootstrap::{BootstrapChannel, BootstrapError, BootstrapListener};
use uct_core::Registry;

#[derive(Parser, Debug)]
#[command(
    name = "perftest",
    version,
    about = "Measure latency, bandwidth and message rate of a uct-rs transport",
    after_help = "Modes:\n  perftest -t posix                        loopback in one process: a sweep of put_bw over 8 B..4 MiB\n  perftest --listen -t tcp                 server: waits for one client on -p PORT\n  perftest 127.0.0.1 -t tcp                client: runs the test against that server\n\nExamples:\n  perftest -t posix --test put_lat -s 8\n  perftest -t tcp --test am_bw -s 8:64k -D bcopy\n  perftest -t cma --test get_bw -s 64k,4M --format csv\n  perftest -t posix --test put_bw -s 4k --validate\n  perftest -t cuda_copy -m host,cuda -s 64k:256M   host-to-device copies on cuda0\n\nBandwidth is MiB/s (2^20 bytes) and Gb/s (10^9 bits), counted until the receiver\nconfirms it has the data. Latency tests that ping-pong (put_lat, am_lat, add_lat)\nreport half the round trip, as ucx_perftest does.\n\nTimes come from the TSC (x86_64) where it runs at a constant rate or where reading\nthe monotonic clock is slow (a VM on hpet), and its calibration holds; else from\nthe monotonic clock. PERFTEST_CLOCK=tsc or =monotonic chooses."
)]
struct Args {
    /// Server to connect to; without it, and without --listen, the test runs
    /// in one process.
    host: Option<String>,

    /// Be the server: wait for one client, run its test, exit.
    #[arg(long)]
    listen: bool,

    /// Transport: self, posix, cma, tcp, rc, cuda_copy (what `transport-info -d` lists).
    #[arg(short = 't', long = "transport", value_name = "NAME")]
    transport: Option<String>,

    /// Device of the transport (default: its first), e.g. lo, eth0, mlx5_0:1.
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    device: Option<String>,

    /// Memory type of the send side and, after a comma, the receive side:
    /// host, gaudi or cuda. Device memory comes from the first MD that
    /// allocates it (Gaudi: hl-thunk, UCT_GAUDI_HLTHUNK_LIB; CUDA: the
    /// driver, libuct_cuda.so) and is registered with the NIC as a DMA-buf
    /// (rc on mlx5, efa, irdma or bnxt_re; CUDA also through
    /// nvidia_peermem). `-t cuda_copy -m host,cuda` measures host-to-device
    /// copies, `-m cuda,host` device-to-host, in one process.
    #[arg(
        short = 'm',
        long = "mem",
        value_name = "TYPE[,TYPE]",
        default_value = "host"
    )]
    mem: String,

    /// put_lat, put_bw, get_lat, get_bw, am_lat, am_bw, add_lat, fadd_lat,
    /// cswap_lat or add_mr.
    #[arg(long = "test", value_name = "NAME", default_value = "put_bw")]
    test: String,

    /// Data layout of the sender: short, bcopy or zcopy (default: the
    /// cheapest one that carries the size).
    #[arg(short = 'D', value_name = "LAYOUT")]
    layout: Option<String>,

    /// Sizes: a list (8,64,4k) or a doubling range (8:4M).
    #[arg(
        short = 's',
        long = "sizes",
        value_name = "SIZES",
        default_value = "8:4M"
    )]
    sizes: String,

    /// Iterations per size, at least 1 (default: enough to move about 256
    /// MiB, between 1,000 and 100,000; latency tests 20,000, fewer above 13
    /// KiB so that they move at most 256 MiB each way, at least 10; 200
    /// with --validate).
    #[arg(short = 'n', value_name = "ITERS", value_parser = at_least_one::<u64>("-n", "iterations per size"))]
    iters: Option<u64>,

    /// Warm-up iterations per size (default: a tenth of -n).
    #[arg(short = 'w', value_name = "WARMUP")]
    warmup: Option<u64>,

    /// Most operations in flight in bandwidth tests, at least 1.
    #[arg(short = 'O', value_name = "OUTSTANDING", default_value_t = 32,
          value_parser = at_least_one::<usize>("-O", "operations in flight"))]
    outstanding: usize,

    /// Check every byte end to end, with a pattern that changes every
    /// iteration (slow: one check per iteration). Device memory, which the
    /// CPU cannot read, is filled and checked through host memory over the
    /// transport (host -> device -> host).
    #[arg(long)]
    validate: bool,

    /// Which latency percentile to report beside p50 and the average.
    #[arg(short = 'R', value_name = "PERCENTILE", default_value_t = 99.0)]
    percentile: f64,

    /// Output format: table, csv or json.
    #[arg(long, value_name = "FORMAT", default_value = "table")]
    format: String,

    /// Print only the result lines: no header, no progress.
    #[arg(short = 'f')]
    final_only: bool,

    /// Client: draw bandwidth and latency against size for the sweep into
    /// this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,

    /// Server: the largest message size a client may ask for (units k, M,
    /// G); the server allocates a send and a receive buffer of the largest
    /// size asked, in whole pages. Sizes a transport cannot carry in one
    /// operation are refused too.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_max_size)]
    max_size: usize,

    /// Server: keep progressing in a busy loop through one-sided tests
    /// (put_bw, get_lat, get_bw, fadd_lat, cswap_lat, add_mr) too. By
    /// default the server sleeps in poll(2) during those where the
    /// transport needs no progress of the target (rc, posix, cma), waking
    /// every 10 ms, and leaves its CPU to the client, as ib_write_bw's
    /// server does; ucx_perftest's spins.
    #[arg(long)]
    server_spin: bool,

    /// TCP port of the bootstrap channel between client and server.
    #[arg(short = 'p', long = "port", default_value_t = 13338)]
    port: u16,

    /// Testing aid: corrupt the transfer of this iteration on purpose, so
    /// that --validate must report it.
    #[arg(long, value_name = "ITER", hide = true)]
    inject_corruption: Option<u64>,

    /// Testing aid: with --validate, fill and check host buffers through a
    /// loopback endpoint of the transport, the way device memory is.
    #[arg(long, hide = true)]
    stage_validation: bool,
}

/// A clap parser for a count that must be at least 1: `-n 0` used to run
/// one iteration silently, `-O 0` to mean 1.
fn at_least_one<T>(
    flag: &'static str,
    what: &'static str,
) -> impl Fn(&str) -> std::result::Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialEq + From<u8>,
{
    move |s| match s.parse::<T>() {
        Ok(n) if n == T::from(0) => Err(format!("{flag} must be at least 1 ({what})")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{flag} takes a whole number ({what}), not {s:?}")),
    }
}

fn parse_max_size(s: &str) -> std::result::Result<usize, String> {
    uct_core::config::parse_size(s)
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("'{s}' is not a size such as 64M or 1G"))
}

fn params_from(args: &Args) -> Result<Params> {
    let usage = PerfError::Usage;
    let transport = args.transport.clone().ok_or_else(|| {
        let mut names: Vec<String> = Registry::global()
            .resources()
            .into_iter()
            .map(|r| r.tl.transport)
            .collect();
        names.dedup();
        usage(format!(
            "choose a transport with -t; available here: {}",
            names.join(", ")
        ))
    })?;
    let (mem_send, mem_recv) = match args.mem.split_once(',') {
        Some((s, r)) => (s.to_string(), r.to_string()),
        None => (args.mem.clone(), args.mem.clone()),
    };
    for m in [&mem_send, &mem_recv] {
        uct_core::MemoryType::parse(m).map_err(|e| usage(e.to_string()))?;
    }
    if !(0.0..=100.0).contains(&args.percentile) {
        return Err(usage(format!(
            "-R {} is not a percentile; use a number from 0 to 100",
            args.percentile
        )));
    }
    let params = Params {
        transport,
        device: args.device.clone(),
        mem_send,
        mem_recv,
        test: TestKind::parse(&args.test).map_err(usage)?,
        layout: args
            .layout
            .as_deref()
            .map(Layout::parse)
            .transpose()
            .map_err(usage)?,
        sizes: parse_sizes(&args.sizes).map_err(usage)?,
        iters: args.iters,
        warmup: args.warmup,
        outstanding: args.outstanding,
        validate: args.validate,
        stage_validation: args.stage_validation,
        percentile: args.percentile,
        inject_corruption: args.inject_corruption,
    };
    // What a server would refuse, refused here first (no server limit on
    // sizes: the transport's own is checked once it is open).
    params.within_limits(usize::MAX).map_err(usage)?;
    Ok(params)
}

fn format_of(args: &Args) -> Result<Format> {
    match args.format.as_str() {
        "table" => Ok(Format::Table),
        "csv" => Ok(Format::Csv),
        "json" => Ok(Format::Json),
        other => Err(PerfError::Usage(format!(
            "unknown format '{other}'; use table, csv or json"
        ))),
    }
}

const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server waits for its client.
const SERVER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Waits up to [`SERVER_WAIT`] for a client that completes the bootstrap
/// handshake. The channel keeps the listener's timeout, so every later wait
/// on it is bounded by [`BOOTSTRAP_TIMEOUT`]; a connection that fails its
/// handshake (a port scanner, a client of another version) is reported and
/// the server keeps waiting.
fn accept_client(listener: &BootstrapListener) -> Result<BootstrapChannel> {
    let start = std::time::Instant::now();
    loop {
        match listener.accept() {
            Ok(ch) => return Ok(ch),
            Err(e) => {
                // The listening socket itself failed: nothing to wait for.
                let listening = matches!(&e, BootstrapError::Io { what, .. } if what == "accept");
                if listening || start.elapsed() >= SERVER_WAIT {
                    return Err(e.into());
                }
                if !matches!(e, BootstrapError::Timeout { .. }) {
                    eprintln!("perftest: a connection failed its handshake ({e}); still waiting");
                }
            }
        }
    }
}

/// Runs every size on one side; the client prints as it goes.
fn run_sizes(mut session: Session, out: Option<&Output>) -> Result<Vec<Row>> {
    layout::check_sizes(&session)?;
    let mut rows = Vec::new();
    let sizes = session.params.sizes.clone();
    for &size in &sizes {
        let params = &session.params;
        let (iters, warmup) = (params.iters_for(size), params.warmup_for(size));
        if let Some(out) = out {
            out.progress(&format!(
                "{} {}, {iters} iterations",
                params.test.name(),
                tools::text::size(size as u64)
            ));
        }
        let test = session.params.test.name();
        run::phase(&mut session, size, warmup).map_err(|e| e.during(test, size, "warm-up"))?;
        let measured = run::phase(&mut session, size, iters)
            .map_err(|e| e.during(test, size, "measurement"))?;
        if let Some(measurement) = measured {
            let layout = layout::layout_for(&session, size)?.name();
            let params = &session.params;
            let row = Row::new(
                params.test,
                &params.transport,
                layout,
                &measurement,
                params.percentile,
            );
            if let Some(out) = out {
                out.row(&row);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

struct Output {
    format: Format,
    final_only: bool,
    /// The progress line: only when stderr is a terminal and not with -f.
    bar: Option<ProgressBar>,
}

impl Output {
    fn new(format: Format, final_only: bool, sizes: usize) -> Output {
        let bar = (std::io::stderr().is_terminal() && !final_only).then(|| {
            let bar = ProgressBar::new(sizes as u64);
            let style = ProgressStyle::with_template(
                "{spinner} [{pos}/{len}] {msg} ({elapsed} so far, about {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Output {
            format,
            final_only,
            bar,
        }
    }

    /// The size being measured, on the progress line.
    fn progress(&self, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg.to_string());
        }
    }

    /// Prints a line of results without tearing the progress line.
    fn print(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    fn header(&self, params: &Params) {
        if self.final_only {
            return;
        }
        match self.format {
            Format::Table => {
                println!(
                    "# perftest: {} over {}{}, memory {} -> {}{}",
                    params.test.name(),
                    params.transport,
                    params
                        .device
                        .as_deref()
                        .map(|d| format!("/{d}"))
                        .unwrap_or_default(),
                    params.mem_send,
                    params.mem_recv,
                    if params.validate {
                        ", validating every byte"
                    } else {
                        ""
                    }
                );
                println!(
                    "{}",
                    report::table_header(params.percentile, params.test.is_latency())
                );
            }
            Format::Csv => println!("{}", report::csv_header()),
            Format::Json => {}
        }
    }

    fn row(&self, row: &Row) {
        match self.format {
            Format::Table => self.print(&report::table_row(row)),
            Format::Csv => self.print(&report::csv_row(row)),
            Format::Json => {}
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    fn finish(&self, rows: &[Row]) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.format == Format::Json {
            match serde_json::to_string_pretty(rows) {
                Ok(json) => println!("{json}"),
                Err(e) => eprintln!("perftest: cannot encode JSON: {e}"),
            }
        }
    }
}

fn main_result(args: Args) -> Result<()> {
    let params = params_from(&args)?;
    if args.plot.is_some() && args.listen {
        return Err(PerfError::Usage(
            "--plot draws the client's results; give it to the client, not to --listen".into(),
        ));
    }
    if args.server_spin && args.host.is_some() {
        return Err(PerfError::Usage(
            "--server-spin sets how the server waits; give it to the server (--listen), not to a client".into(),
        ));
    }
    let out = Output::new(format_of(&args)?, args.final_only, params.sizes.len());
    let reg = Registry::global();
    if args.listen {
        if args.host.is_some() {
            return Err(PerfError::Usage(
                "--listen takes no HOST; start the client with the server's address".into(),
            ));
        }
        // Refuse at once what this side cannot run.
        drop(open_iface(reg, &params)?);
        let listener = BootstrapListener::bind(("0.0.0.0", args.port), BOOTSTRAP_TIMEOUT)?;
        eprintln!(
            "perftest: waiting for a client on port {} ({} over {})",
            args.port,
            params.test.name(),
            params.transport
        );
        let ch = accept_client(&listener)?;
        let options = ServerOptions {
            max_size: args.max_size,
            spin: args.server_spin,
        };
        let session = Session::serve(reg, &params, ch, &options)?;
        run_sizes(session, None)?;
        return Ok(());
    }
    drop(open_iface(reg, &params)?);
    let client_ch = match &args.host {
        Some(host) => BootstrapChannel::connect((host.as_str(), args.port), BOOTSTRAP_TIMEOUT)?,
        None => {
            // Loopback: a server thread in this process.
            let listener = BootstrapListener::bind("127.0.0.1:0", BOOTSTRAP_TIMEOUT)?;
            let addr = listener.local_addr()?;
            let server_params = params.clone();
            let server_options = ServerOptions {
                spin: args.server_spin,
                ..ServerOptions::default()
            };
            std::thread::Builder::new()
                .name("perftest-server".into())
                .spawn(move || {
                    let served = listener
                        .accept()
                        .map_err(PerfError::from)
                        .and_then(|ch| {
                            Session::serve(Registry::global(), &server_params, ch, &server_options)
                        })
                        .and_then(|session| run_sizes(session, None));
                    if let Err(e) = served {
                        log::debug!("perftest server thread: {e}");
                    }
                })
                .map_err(|e| PerfError::Usage(format!("cannot start the server thread: {e}")))?;
            BootstrapChannel::connect(addr, BOOTSTRAP_TIMEOUT)?
        }
    };
    let session = Session::open(reg, &params, client_ch, Role::Client)?;
    // A size the transport cannot carry is one error line, before any output.
    layout::check_sizes(&session)?;
    out.header(&session.params);
    let rows = run_sizes(session, Some(&out))?;
    out.finish(&rows);
    if let Some(path) = &args.plot {
        plot(path, &params, &rows)?;
    }
    Ok(())
}

/// `--plot`: bandwidth and latency against size, one SVG.
fn plot(path: &std::path::Path, params: &Params, rows: &[Row]) -> Result<()> {
    let points = |f: fn(&Row) -> f64| rows.iter().map(|r| (r.size as u64, f(r))).collect();
    let series = |name: &str, points| Series {
        name: name.to_string(),
        points,
        reference: false,
        group: 0,
    };
    let bandwidth = Panel {
        title: "bandwidth".into(),
        y_label: "MiB/s".into(),
        series: vec![series("MiB/s", points(|r| r.bandwidth_mib_s))],
    };
    let latency = Panel {
        title: if params.test.is_latency() {
            "latency, p50 (one way)".into()
        } else {
            "time per operation, p50".into()
        },
        y_label: "us".into(),
        series: vec![series("p50 us", points(|r| r.latency_p50_us))],
    };
    let title = format!(
        "perftest: {} over {}, memory {} -> {}",
        params.test.name(),
        params.transport,
        params.mem_send,
        params.mem_recv
    );
    tools::plot::draw(path, &title, &[bandwidth, latency], 1)
        .map_err(|e| PerfError::Usage(e.to_string()))?;
    eprintln!("perftest: wrote the plot {}", path.display());
    Ok(())
}

fn main() {
    uct_builtins::link();
    uct_core::logging::init();
    let args = Args::parse();
    let result = main_result(args);
    let backwards = tools::perf::clock::backwards();
    if backwards > 0 {
        // The interval back to the CPU that is ahead is long by as much,
        // and not counted: hence "at least".
        eprintln!(
            "perftest: warning: at least {backwards} intervals ran backwards on the TSC (the \
             thread moved between CPUs whose TSCs are out of step) and were counted as 0; pin \
             perftest to one CPU (taskset -c N) or set PERFTEST_CLOCK=monotonic"
        );
    }
    if let Err(e) = result {
        eprintln!("\rperftest: {e}");
        std::process::exit(e.exit_code());
    }
}
