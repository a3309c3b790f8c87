//! The seed's ping-pong, in two processes, over any transport and with
//! host or Gaudi memory.
//!
//! ```text
//! ping_pong --listen [-p PORT] [-t TRANSPORT] [-m host|gaudi] [-s BYTES] [-n ROUNDS]
//! ping_pong HOST [-p PORT] [-t TRANSPORT] [-m host|gaudi] [-s BYTES] [-n ROUNDS]
//! ```
//!
//! The server prints its URL; both sides swap URLs and remote keys over a
//! small TCP channel (the application's own way: the transfer API does not
//! care how they travel), bind, connect, and then ping-pong: the client
//! writes its buffer into the server's with a notification, the server
//! waits for it and writes its own back. Host memory is checked byte by
//! byte, and each notification's tag and length; Gaudi memory (the
//! hl-thunk simulator here, a TEST DOUBLE) cannot be read by the CPU and
//! is not. Every wait has a 30 s deadline; the time printed is that of the
//! transfers alone.

use std::time::{Duration, Instant};

use uct_core::bootstrap::{BootstrapChannel, BootstrapListener};
use uct_transfer::{Memory, MemoryType, RemoteBuffer, Transport};

const DEFAULT_PORT: u16 = 13337;

struct Args {
    host: Option<String>,
    listen: bool,
    port: u16,
    transport: String,
    mem: MemoryType,
    size: usize,
    rounds: u32,
}

const USAGE: &str = "usage: ping_pong (--listen | HOST) [-p PORT] [-t auto|rc|tcp|posix|cma|self] [-m host|gaudi] [-s BYTES] [-n ROUNDS]";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        host: None,
        listen: false,
        port: DEFAULT_PORT,
        transport: "auto".into(),
        mem: MemoryType::Host,
        size: 8192,
        rounds: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().ok_or(format!("{arg} needs {what}"));
        match arg.as_str() {
            "--listen" => a.listen = true,
            "-p" => a.port = value("a port")?.parse().map_err(|e| format!("-p: {e}"))?,
            "-t" => a.transport = value("a transport")?,
            "-m" => {
                a.mem = MemoryType::parse(&value("a memory type")?).map_err(|e| e.to_string())?
            }
            "-s" => a.size = value("a size")?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" => a.rounds = value("a count")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-h" | "--help" => return Err(USAGE.into()),
            h if !h.starts_with('-') && a.host.is_none() => a.host = Some(h.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.listen == a.host.is_some() {
        return Err(format!("give either --listen or HOST\n{USAGE}"));
    }
    if a.size == 0 {
        return Err("-s must be at least 1".into());
    }
    Ok(a)
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let transport = Transport::builder()
        .transport(&args.transport)
        .memory_types(&[args.mem])
        .build()?;
    let memory = Memory::alloc(&transport, args.mem, args.size)?;
    let url = transport.bind()?;
    let timeout = Duration::from_secs(30);
    let mut ch = if args.listen {
        let listener = BootstrapListener::bind(("0.0.0.0", args.port), timeout)?;
        println!("server: listening on port {}; URL {url}", args.port);
        listener.accept()?
    } else {
        let host = args.host.as_deref().unwrap_or("127.0.0.1");
        BootstrapChannel::connect((host, args.port), timeout)?
    };
    let ours = (url, memory.remote_key(), args.size as u64, args.rounds);
    let (peer_url, peer_key, size, rounds): (String, String, u64, u32) = ch.exchange(&ours)?;
    if (size, rounds) != (args.size as u64, args.rounds) {
        return Err(format!(
            "the peer runs -s {size} -n {rounds}, this side -s {} -n {}; start both with the same",
            args.size, args.rounds
        )
        .into());
    }
    transport.connect(&peer_url)?;
    let remote = RemoteBuffer::parse(&peer_key)?;
    ch.barrier()?;
    println!(
        "{}: connected over {}, {} bytes of {} memory",
        if args.listen { "server" } else { "client" },
        transport.transport_name().unwrap_or_default(),
        args.size,
        args.mem
    );
    let host = args.mem.is_host_accessible();
    let view = memory.whole();
    // Every wait has a deadline: a stuck peer ends the run with an error.
    let limit = Duration::from_secs(30);
    // Only the transfers are timed, not the filling and checking.
    let mut timed = Duration::ZERO;
    for round in 0..args.rounds {
        let fill = (round % 251) as u8 + 1;
        if args.listen {
            let t = Instant::now();
            let n = transport.wait_within(transport.wait_for_write(), limit)??;
            timed += t.elapsed();
            check(&memory, host, n, round, fill)?;
            if host {
                memory.write_bytes(0, &vec![fill ^ 0xff; args.size])?;
            }
            let t = Instant::now();
            transport.wait_within(transport.write_tagged(&view, &remote, round), limit)??;
            timed += t.elapsed();
        } else {
            if host {
                memory.write_bytes(0, &vec![fill; args.size])?;
            }
            let t = Instant::now();
            transport.wait_within(transport.write_tagged(&view, &remote, round), limit)??;
            let n = transport.wait_within(transport.wait_for_write(), limit)??;
            timed += t.elapsed();
            check(&memory, host, n, round, fill ^ 0xff)?;
        }
    }
    let per = timed / args.rounds.max(1);
    println!(
        "{} rounds of {} bytes: {:.1} us per round trip{}",
        args.rounds,
        args.size,
        per.as_secs_f64() * 1e6,
        if host {
            ", every byte checked"
        } else {
            " (device memory: bytes not checked by the CPU)"
        }
    );
    ch.barrier()?;
    Ok(())
}

/// Checks the notification of round `round` (its tag and length) and that
/// the whole buffer holds `fill` (host memory only).
fn check(
    memory: &Memory,
    host: bool,
    n: uct_transfer::Notification,
    round: u32,
    fill: u8,
) -> Result<(), String> {
    if n.tag != round {
        return Err(format!(
            "the notification of round {round} carries tag {}",
            n.tag
        ));
    }
    if n.len != memory.len() {
        return Err(format!(
            "a notification of {} bytes, not {}",
            n.len,
            memory.len()
        ));
    }
    if !host {
        return Ok(());
    }
    let mut got = vec![0u8; n.len];
    memory.read_bytes(0, &mut got).map_err(|e| e.to_string())?;
    match got.iter().position(|&b| b != fill) {
        Some(at) => Err(format!("byte {at} is {:#x}, not {fill:#x}", got[at])),
        None => Ok(()),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("ping_pong: {e}");
        std::process::exit(1);
    }
}
