//! `uct-stress ceiling`: what the machine itself allows, measured with no
//! transport in the way, so that a perftest row at parity with
//! ucx_perftest can be compared with the bound both tools sit under
//! (docs/perf-notes.md, "Rows below the bar").
//!
//! - memcpy: one thread copies a buffer of the size into another, as a
//!   posix put or an active message's copy does (bandwidth rows).
//! - process_vm_writev: one call per size into this process's own memory,
//!   as a cma put makes one into the peer's (cma bandwidth rows).
//! - tcp stream: two threads on loopback, messages of the size written and
//!   read whole (tcp bandwidth rows: the kernel's two copies).
//! - cache-line ping-pong: two threads on CPUs 0 and 1 hand a counter back
//!   and forth; half the median round trip is the floor of any one-way
//!   latency through shared memory (posix latency rows); atomic ping-pong
//!   hands it over with a locked add instead of a store (add_lat).
//! - tcp ping-pong: two threads on loopback, TCP_NODELAY, a message of the
//!   size each way; half the median round trip (tcp latency rows).

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::perf::clock::Clock;

/// One measured ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    /// memcpy, process_vm_writev, tcp_stream, cacheline_pingpong,
    /// atomic_pingpong, tcp_pingpong.
    pub what: &'static str,
    pub size: usize,
    /// MiB/s for bandwidth, microseconds one way for latency.
    pub value: f64,
    pub unit: &'static str,
    /// What a batch's value is: "mean" (the batch's work over its time)
    /// or "median" (half the median round trip, latencies).
    pub per_batch: &'static str,
    /// Every timed batch's value, in order.
    pub batches: Vec<f64>,
}

/// The longest any read of the tcp measures waits.
const IO_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Batches per ceiling; the median is reported.
const BATCHES: usize = 5;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Pins the calling thread to one CPU, as compare-ucx pins both tools'
/// processes (taskset -c 0 / 1); a CPU that is not there is left alone.
fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of the set we own; cpu < CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: the set is valid for its size; 0 is the calling thread.
    let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

/// Bytes moved per batch: enough that a batch takes tens of milliseconds.
fn batch_bytes(size: usize) -> usize {
    (256usize << 20).max(size * 16)
}

/// Operations per batch: batch_bytes' worth, but at most `cap`, so that
/// small sizes, where each operation is a system call (about 1 us) or a
/// few nanoseconds of copy, still finish a batch in well under a second.
fn batch_ops(size: usize, cap: usize) -> usize {
    (batch_bytes(size) / size).clamp(1, cap)
}

/// Caps of batch_ops: a user-space copy, and a system call.
const COPY_OPS: usize = 20_000_000;
const SYSCALL_OPS: usize = 200_000;

fn result(what: &'static str, size: usize, unit: &'static str, batches: Vec<f64>) -> Ceiling {
    Ceiling {
        what,
        size,
        value: median(&batches),
        unit,
        per_batch: if unit == "us" { "median" } else { "mean" },
        batches,
    }
}

/// memcpy of `size` bytes from one buffer into another, one thread on CPU 1.
pub fn memcpy_bw(size: usize) -> Ceiling {
    pin(1);
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    let iters = batch_ops(size, COPY_OPS);
    let mut batches = Vec::with_capacity(BATCHES);
    for _ in 0..=BATCHES {
        let t = Instant::now();
        for _ in 0..iters {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        }
        batches.push(mib_s(size * iters, t));
    }
    batches.remove(0); // warm-up
    result("memcpy", size, "MiB/s", batches)
}

fn mib_s(bytes: usize, since: Instant) -> f64 {
    bytes as f64 / (1 << 20) as f64 / since.elapsed().as_secs_f64()
}

/// One process_vm_writev of `size` bytes into this process's own buffer
/// per operation (the kernel pins the target pages and copies, as for a
/// peer). Buffers of 2 MiB and more are huge-page backed, as perftest's.
pub fn process_vm_writev_bw(size: usize) -> Result<Ceiling, String> {
    pin(1);
    let src = Mapping::new(size)?;
    let dst = Mapping::new(size)?;
    let iters = batch_ops(size, SYSCALL_OPS);
    let mut batches = Vec::with_capacity(BATCHES);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for _ in 0..=BATCHES {
        let t = Instant::now();
        for _ in 0..iters {
            let local = libc::iovec {
                iov_base: src.ptr.cast(),
                iov_len: size,
            };
            let remote = libc::iovec {
                iov_base: dst.ptr.cast(),
                iov_len: size,
            };
            // SAFETY: both iovecs cover mappings this function owns, of
            // `size` bytes each; the remote one is in our own process.
            let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
            if n != size as isize {
                return Err(format!(
                    "process_vm_writev of {size} bytes into this process returned {n}: {}; a seccomp profile (containers) may forbid it, as it would cma",
                    std::io::Error::last_os_error()
                ));
            }
        }
        batches.push(mib_s(size * iters, t));
    }
    batches.remove(0);
    Ok(result("process_vm_writev", size, "MiB/s", batches))
}

/// An anonymous mapping, 2 MiB aligned and MADV_HUGEPAGE from 2 MiB up.
struct Mapping {
    /// Where the buffer starts (aligned).
    ptr: *mut u8,
    /// What mmap returned, and its length, for munmap.
    base: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(size: usize) -> Result<Self, String> {
        const HUGE: usize = 2 << 20;
        let huge = size >= HUGE;
        let len = if huge {
            size.div_ceil(HUGE) * HUGE + HUGE
        } else {
            size.max(1)
        };
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut ptr = base.cast::<u8>();
        if huge {
            let off = (HUGE - ptr as usize % HUGE) % HUGE;
            // SAFETY: off < 2 MiB and the mapping has 2 MiB spare at its end.
            ptr = unsafe { ptr.add(off) };
            // SAFETY: advice on a range inside our own mapping.
            unsafe { libc::madvise(ptr.cast(), size, libc::MADV_HUGEPAGE) };
        }
        // SAFETY: the range is inside the mapping; touching it faults it in
        // before anything is timed.
        unsafe { std::ptr::write_bytes(ptr, 0x33, size) };
        Ok(Self { ptr, base, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base and len are what mmap returned; nothing refers to the
        // buffer once its Mapping is dropped.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Two threads on loopback: one writes messages of `size` bytes, the
/// other reads them; MiB/s of what was read.
pub fn tcp_stream_bw(size: usize) -> Result<Ceiling, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind on 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let total = (batch_ops(size, SYSCALL_OPS) / 4).max(1) * size;
    let rounds = BATCHES + 1;
    let reader = std::thread::spawn(move || -> Result<(), String> {
        pin(0);
        let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let _ = s.set_read_timeout(Some(IO_LIMIT));
        let mut buf = vec![0u8; size];
        for _ in 0..rounds {
            let mut left = total;
            while left > 0 {
                let n = s
                    .read(&mut buf[..size.min(left)])
                    .map_err(|e| format!("read: {e}"))?;
                if n == 0 {
                    return Err("the writer closed early".into());
                }
                left -= n;
            }
            s.write_all(&[1]).map_err(|e| format!("ack: {e}"))?;
        }
        Ok(())
    });
    pin(1);
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    // A stray connection or a stalled peer thread must not hang the run.
    let _ = s.set_read_timeout(Some(IO_LIMIT));
    let buf = vec![0x5au8; size];
    let mut batches = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..total / size {
            s.write_all(&buf).map_err(|e| format!("write: {e}"))?;
        }
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).map_err(|e| format!("ack: {e}"))?;
        batches.push(mib_s(total, t));
    }
    reader
        .join()
        .map_err(|_| "the reader thread panicked".to_string())??;
    batches.remove(0);
    Ok(result("tcp_stream", size, "MiB/s", batches))
}

/// Half the median of round trips timed in `clock` ticks, in us one way:
/// the figure the perftests' latency rows report. `laps` is not empty.
fn half_median_us(clock: &Clock, laps: &mut [u64]) -> f64 {
    let mid = laps.len() / 2;
    let (_, median, _) = laps.select_nth_unstable(mid);
    clock.ns(*median) / 1e3 / 2.0
}

/// How a cache-line ping-pong hands the counter over.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// A plain store of the next value (put_lat's sequence word).
    Store,
    /// A locked add of 1 (add_lat's non-fetching atomic), measured apart
    /// because a locked read-modify-write may move the line otherwise than
    /// a store does (docs/perf-notes.md has both, regime by regime).
    Add,
}

/// Half the median round trip of a counter handed between CPUs 0 and 1
/// through one cache line each way: the floor of a one-way latency
/// through shared memory. Each round trip is timed with perftest's clock,
/// as both perftests time theirs, and a batch reports the median, the
/// figure their latency rows report: a mean over the batch would count
/// the preemptions that their medians leave out. A batch is a million
/// round trips or one second, whichever ends first: both threads spin,
/// and on a loaded machine a hand-off can wait for a time slice.
pub fn cacheline_pingpong(how: Handoff) -> Ceiling {
    #[repr(align(128))]
    struct Line(AtomicU64);
    const STOP: u64 = u64::MAX;
    // Each side counts up by one per round trip, so a store of the next
    // value and an add of 1 leave the same value behind. For the add that
    // holds because the pinger waits for the echo before its next
    // hand-off: neither side ever skips a value.
    let hand = move |line: &Line, next: u64| match how {
        Handoff::Store => line.0.store(next, Ordering::Release),
        Handoff::Add => {
            let before = line.0.fetch_add(1, Ordering::AcqRel);
            debug_assert_eq!(before + 1, next, "the ping-pong lost a step");
        }
    };
    let ping = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let iters: u64 = 1_000_000;
    let rounds = BATCHES + 1;
    let p2 = ping.clone();
    let echo = std::thread::spawn(move || {
        pin(0);
        let mut last = 0;
        let mut idle = 0u32;
        loop {
            let v = p2.0 .0.load(Ordering::Acquire);
            if v == STOP {
                return;
            }
            if v != last {
                last = v;
                hand(&p2.1, v);
                idle = 0;
            } else {
                idle += 1;
                if idle.is_multiple_of(1 << 16) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    });
    pin(1);
    let clock = Clock::new();
    // Reserved before any batch, so that no lap reallocates; the first
    // batch, which is dropped, takes most of the first-touch page faults.
    let mut laps: Vec<u64> = Vec::with_capacity(iters as usize);
    let mut batches = Vec::with_capacity(rounds);
    let mut i = 0u64;
    for _ in 0..rounds {
        let t = Instant::now();
        laps.clear();
        let mut last = clock.now();
        while (laps.len() as u64) < iters {
            i += 1;
            hand(&ping.0, i);
            let mut spins = 0u32;
            while ping.1 .0.load(Ordering::Acquire) != i {
                spins += 1;
                // Both threads on one CPU (pinning refused, a 1-CPU
                // cpuset): give the echo its turn.
                if spins.is_multiple_of(1 << 16) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            let now = clock.now();
            laps.push(now.wrapping_sub(last));
            last = now;
            if laps.len().is_multiple_of(64) && t.elapsed().as_secs() >= 1 {
                break;
            }
        }
        batches.push(half_median_us(&clock, &mut laps));
    }
    ping.0 .0.store(STOP, Ordering::Release);
    let _ = echo.join();
    batches.remove(0);
    let what = match how {
        Handoff::Store => "cacheline_pingpong",
        Handoff::Add => "atomic_pingpong",
    };
    result(what, 8, "us", batches)
}

/// Half the median round trip of `size` bytes each way over loopback TCP.
pub fn tcp_pingpong(size: usize) -> Result<Ceiling, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind on 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let iters = (20_000usize).min((256usize << 20) / size.max(1)).max(100);
    let rounds = BATCHES + 1;
    let echo = std::thread::spawn(move || -> Result<(), String> {
        pin(0);
        let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let _ = s.set_nodelay(true);
        // A stray connection or a stalled peer thread must not hang the run.
        let _ = s.set_read_timeout(Some(IO_LIMIT));
        let mut buf = vec![0u8; size];
        for _ in 0..iters * rounds {
            s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
            s.write_all(&buf).map_err(|e| format!("write: {e}"))?;
        }
        Ok(())
    });
    pin(1);
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    // A stray connection or a stalled peer thread must not hang the run.
    let _ = s.set_read_timeout(Some(IO_LIMIT));
    let mut buf = vec![0x5au8; size];
    let clock = Clock::new();
    let mut laps: Vec<u64> = Vec::with_capacity(iters);
    let mut batches = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        laps.clear();
        let mut last = clock.now();
        for _ in 0..iters {
            s.write_all(&buf).map_err(|e| format!("write: {e}"))?;
            s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
            let now = clock.now();
            laps.push(now.wrapping_sub(last));
            last = now;
        }
        batches.push(half_median_us(&clock, &mut laps));
    }
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())??;
    batches.remove(0);
    Ok(result("tcp_pingpong", size, "us", batches))
}

/// Parses "8", "1k", "64K", "1m", "4M" (binary units).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: give bytes, or a number with k, m or g"))?;
    match n.checked_mul(mult) {
        Some(0) => Err("a size of 0 measures nothing: give at least 1 byte".into()),
        Some(v) if v <= 1 << 30 => Ok(v),
        _ => Err(format!("{s:?} is over the 1 GiB this tool copies at most")),
    }
}

/// Every ceiling for every size, each reported to `each` as it is measured.
/// Latency ceilings are taken at sizes up to 64 KiB (perftest's latency
/// rows), bandwidth ceilings at every size.
pub fn run(sizes: &[usize], mut each: impl FnMut(&Ceiling)) -> Result<Vec<Ceiling>, String> {
    let mut out = Vec::new();
    let mut keep = |c: Ceiling, out: &mut Vec<Ceiling>| {
        each(&c);
        out.push(c);
    };
    keep(cacheline_pingpong(Handoff::Store), &mut out);
    keep(cacheline_pingpong(Handoff::Add), &mut out);
    for &size in sizes {
        keep(memcpy_bw(size), &mut out);
        keep(process_vm_writev_bw(size)?, &mut out);
        keep(tcp_stream_bw(size)?, &mut out);
        if size <= 64 << 10 {
            keep(tcp_pingpong(size)?, &mut out);
        }
    }
    Ok(out)
}
