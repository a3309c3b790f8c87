//! What a perftest run measures; both sides agree on it before running.

use serde::{Deserialize, Serialize};

/// The measurements perftest knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TestKind {
    PutLat,
    PutBw,
    GetLat,
    GetBw,
    AmLat,
    AmBw,
    AddLat,
    FaddLat,
    CswapLat,
    AddMr,
}

impl TestKind {
    pub const ALL: [TestKind; 10] = [
        TestKind::PutLat,
        TestKind::PutBw,
        TestKind::GetLat,
        TestKind::GetBw,
        TestKind::AmLat,
        TestKind::AmBw,
        TestKind::AddLat,
        TestKind::FaddLat,
        TestKind::CswapLat,
        TestKind::AddMr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TestKind::PutLat => "put_lat",
            TestKind::PutBw => "put_bw",
            TestKind::GetLat => "get_lat",
            TestKind::GetBw => "get_bw",
            TestKind::AmLat => "am_lat",
            TestKind::AmBw => "am_bw",
            TestKind::AddLat => "add_lat",
            TestKind::FaddLat => "fadd_lat",
            TestKind::CswapLat => "cswap_lat",
            TestKind::AddMr => "add_mr",
        }
    }

    pub fn parse(s: &str) -> Result<TestKind, String> {
        TestKind::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = TestKind::ALL.iter().map(|t| t.name()).collect();
                format!("unknown test '{s}'; use one of {}", all.join(", "))
            })
    }

    /// Ping-pong tests report half a round trip.
    pub fn is_pingpong(self) -> bool {
        matches!(self, TestKind::PutLat | TestKind::AmLat | TestKind::AddLat)
    }

    /// One-sided tests: the server has no part in the operations (no
    /// reply, no active-message handler) until the client says it is done.
    pub fn target_is_passive(self) -> bool {
        // Every kind named: a new one must be placed here.
        match self {
            TestKind::PutBw
            | TestKind::GetLat
            | TestKind::GetBw
            | TestKind::FaddLat
            | TestKind::CswapLat
            | TestKind::AddMr => true,
            // The server answers ping-pongs; am_bw's handler counts.
            TestKind::PutLat | TestKind::AmLat | TestKind::AddLat | TestKind::AmBw => false,
        }
    }

    /// Latency tests report latency first; the others bandwidth and rate.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            TestKind::PutLat
                | TestKind::GetLat
                | TestKind::AmLat
                | TestKind::AddLat
                | TestKind::FaddLat
                | TestKind::CswapLat
        )
    }

    pub fn is_atomic(self) -> bool {
        matches!(
            self,
            TestKind::AddLat | TestKind::FaddLat | TestKind::CswapLat | TestKind::AddMr
        )
    }

    /// The operation class whose size limits apply.
    pub fn op(self) -> Op {
        match self {
            TestKind::PutLat | TestKind::PutBw => Op::Put,
            TestKind::GetLat | TestKind::GetBw => Op::Get,
            TestKind::AmLat | TestKind::AmBw => Op::Am,
            _ => Op::Atomic,
        }
    }
}

/// Operation classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    Am,
    Atomic,
}

/// How the sender hands data to the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    Short,
    Bcopy,
    Zcopy,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Short => "short",
            Layout::Bcopy => "bcopy",
            Layout::Zcopy => "zcopy",
        }
    }

    pub fn parse(s: &str) -> Result<Layout, String> {
        match s {
            "short" => Ok(Layout::Short),
            "bcopy" => Ok(Layout::Bcopy),
            "zcopy" => Ok(Layout::Zcopy),
            _ => Err(format!(
                "unknown data layout '{s}'; use short, bcopy or zcopy"
            )),
        }
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// Everything both sides must agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub transport: String,
    pub device: Option<String>,
    pub mem_send: String,
    pub mem_recv: String,
    pub test: TestKind,
    /// None: the best layout the transport offers for each size.
    pub layout: Option<Layout>,
    pub sizes: Vec<usize>,
    /// None: chosen per size.
    pub iters: Option<u64>,
    pub warmup: Option<u64>,
    /// Most operations in flight in bandwidth tests.
    pub outstanding: usize,
    pub validate: bool,
    /// Testing aid: validation reaches even host buffers through the
    /// transport, as it must for device memory.
    pub stage_validation: bool,
    pub percentile: f64,
    /// Testing aid: flip one byte of the transfer of this iteration.
    pub inject_corruption: Option<u64>,
}

/// Most iterations, or warm-up iterations, per size. A client keeps one
/// sample per iteration (8 bytes); at this bound a run is hours long.
pub const MAX_ITERS: u64 = 100_000_000;

/// Fewest iterations a latency test runs by default, whatever its size.
pub const LATENCY_MIN_ITERS: u64 = 10;

/// Most sizes in one run (8 B to 1 GiB doubling is 28).
pub const MAX_SIZES: usize = 64;

/// The default of a server's `--max-size`: the largest message a client may
/// ask for, and so about half of the memory the server allocates for it
/// (a send and a receive buffer of this size).
pub const DEFAULT_MAX_SIZE: usize = 1 << 30;

/// Buffers are whole pages.
const PAGE: usize = 4096;

impl Params {
    /// The length of each of the two buffers: the largest size (at least 64
    /// bytes) in whole pages; None when that does not fit in a `usize`.
    pub fn buffer_len(&self) -> Option<usize> {
        let max = self.sizes.iter().copied().max().unwrap_or(8).max(64);
        max.checked_next_multiple_of(PAGE)
    }

    /// Checks a proposal against the bounds every side keeps and a server's
    /// `--max-size`, before anything is allocated; the error says what was
    /// asked and what would be accepted.
    pub fn within_limits(&self, max_size: usize) -> Result<(), String> {
        if self.sizes.is_empty() || self.sizes.len() > MAX_SIZES {
            return Err(format!(
                "{} sizes asked; a run has 1 to {MAX_SIZES} sizes",
                self.sizes.len()
            ));
        }
        if let Some(&size) = self.sizes.iter().find(|&&s| s == 0 || s > max_size) {
            return Err(format!(
                "size {size} asked, outside 1..={max_size} bytes (the server's --max-size {}); use smaller -s, or start the server with a larger --max-size",
                crate::text::size(max_size as u64)
            ));
        }
        if self.buffer_len().is_none() {
            return Err("the sizes asked do not fit in memory".into());
        }
        if self.iters == Some(0) {
            return Err("0 iterations per size asked; -n must be at least 1".into());
        }
        if self.outstanding == 0 {
            return Err("0 operations in flight asked; -O must be at least 1".into());
        }
        for (what, n) in [
            ("iterations", self.iters),
            ("warm-up iterations", self.warmup),
        ] {
            if let Some(n) = n.filter(|&n| n > MAX_ITERS) {
                return Err(format!(
                    "{n} {what} per size asked, more than the {MAX_ITERS} allowed; use a smaller -n or -w"
                ));
            }
        }
        Ok(())
    }

    /// Iterations for `size`: as given, or enough to move about 256 MiB,
    /// between 1,000 and 100,000; latency tests 20,000, or as many as move
    /// 256 MiB each way when that is fewer, at least 10 (`put_lat -s 1G`
    /// ran 20,000 round trips of 1 GiB, tens of minutes, without a word).
    pub fn iters_for(&self, size: usize) -> u64 {
        if let Some(n) = self.iters {
            return n.max(1);
        }
        if self.validate {
            return 200;
        }
        let by_bytes = (256u64 << 20) / size.max(1) as u64;
        if self.test.is_latency() {
            return by_bytes.clamp(LATENCY_MIN_ITERS, 20_000);
        }
        by_bytes.clamp(1_000, 100_000)
    }

    pub fn warmup_for(&self, size: usize) -> u64 {
        self.warmup
            .unwrap_or_else(|| (self.iters_for(size) / 10).clamp(10, 10_000))
    }

    /// The client's parameters that the server must share.
    pub fn mismatch(&self, server: &Params) -> Option<String> {
        let mut diffs = Vec::new();
        if self.transport != server.transport {
            diffs.push(format!(
                "transport: client {}, server {}",
                self.transport, server.transport
            ));
        }
        if server.device.is_some() && self.device.is_some() && self.device != server.device {
            diffs.push(format!(
                "device: client {}, server {}",
                self.device.as_deref().unwrap_or("-"),
                server.device.as_deref().unwrap_or("-")
            ));
        }
        // The server allocates both buffers: only memory it was started with.
        if self.mem_send != server.mem_send {
            diffs.push(format!(
                "memory type on the send side: client asked {}, server runs {}",
                self.mem_send, server.mem_send
            ));
        }
        if self.mem_recv != server.mem_recv {
            diffs.push(format!(
                "memory type on the receive side: client asked {}, server runs {}",
                self.mem_recv, server.mem_recv
            ));
        }
        (!diffs.is_empty()).then(|| diffs.join("; "))
    }
}

/// Parses `8,64,4096` or a doubling range `8:4M`; units k, M, G.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let one = |t: &str| -> Result<usize, String> {
        uct_core::config::parse_size(t)
            .map(|v| v as usize)
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("'{t}' is not a size; write 8, 64k, 4M or a range like 8:4M"))
    };
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once(':') {
            let (mut lo, hi) = (one(a)?, one(b)?);
            if lo > hi {
                return Err(format!(
                    "range {part} goes down; write the smaller size first"
                ));
            }
            while lo <= hi {
                out.push(lo);
                lo *= 2;
            }
        } else {
            out.push(one(part)?);
        }
    }
    if out.is_empty() {
        return Err("no sizes given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passive_server_is_one_with_no_part_in_the_operations() {
        for t in TestKind::ALL {
            // A ping-pong's server answers, am_bw's handler counts.
            let server_acts = t.is_pingpong() || t == TestKind::AmBw;
            assert_eq!(t.target_is_passive(), !server_acts, "{}", t.name());
        }
    }

    fn params(sizes: Vec<usize>) -> Params {
        Params {
            transport: "tcp".into(),
            device: None,
            mem_send: "host".into(),
            mem_recv: "host".into(),
            test: TestKind::PutBw,
            layout: None,
            sizes,
            iters: None,
            warmup: None,
            outstanding: 1,
            validate: false,
            stage_validation: false,
            percentile: 99.0,
            inject_corruption: None,
        }
    }

    #[test]
    fn latency_tests_default_to_at_most_256_mib_each_way() {
        let lat = |size| Params {
            test: TestKind::PutLat,
            ..params(vec![size])
        };
        assert_eq!(lat(8).iters_for(8), 20_000);
        // 256 MiB / 64 KiB = 4096 round trips.
        assert_eq!(lat(65536).iters_for(65536), 4096);
        // 1 GiB: the floor, not 20,000 round trips of a GiB.
        assert_eq!(lat(1 << 30).iters_for(1 << 30), LATENCY_MIN_ITERS);
        assert!(lat(1 << 30).warmup_for(1 << 30) <= LATENCY_MIN_ITERS);
        // An explicit -n is honoured.
        let asked = Params {
            iters: Some(50_000),
            ..lat(1 << 30)
        };
        assert_eq!(asked.iters_for(1 << 30), 50_000);
    }

    #[test]
    fn zero_iterations_or_window_are_refused_by_the_limits() {
        let zero_n = Params {
            iters: Some(0),
            ..params(vec![8])
        };
        let e = zero_n.within_limits(1 << 20).unwrap_err();
        assert!(e.contains("-n must be at least 1"), "{e}");
        let zero_o = Params {
            outstanding: 0,
            ..params(vec![8])
        };
        let e = zero_o.within_limits(1 << 20).unwrap_err();
        assert!(e.contains("-O must be at least 1"), "{e}");
    }

    #[test]
    fn buffers_are_whole_pages_and_never_overflow() {
        assert_eq!(params(vec![8]).buffer_len(), Some(4096));
        assert_eq!(params(vec![4096]).buffer_len(), Some(4096));
        assert_eq!(params(vec![4097, 8]).buffer_len(), Some(8192));
        assert_eq!(params(vec![usize::MAX]).buffer_len(), None);
        assert_eq!(params(vec![usize::MAX - 4094]).buffer_len(), None);
    }

    #[test]
    fn limits_are_checked_at_their_edges() {
        let max = 1 << 20;
        assert!(params(vec![max]).within_limits(max).is_ok());
        let e = params(vec![8, max + 1]).within_limits(max).unwrap_err();
        assert!(
            e.contains("size 1048577") && e.contains("--max-size 1M"),
            "{e}"
        );
        assert!(params(vec![0]).within_limits(max).is_err());
        assert!(params(vec![]).within_limits(max).is_err());
        assert!(params(vec![8; MAX_SIZES]).within_limits(max).is_ok());
        assert!(params(vec![8; MAX_SIZES + 1]).within_limits(max).is_err());
        let iters = |iters, warmup| Params {
            iters,
            warmup,
            ..params(vec![8])
        };
        assert!(iters(Some(MAX_ITERS), Some(MAX_ITERS))
            .within_limits(max)
            .is_ok());
        let e = iters(Some(MAX_ITERS + 1), None)
            .within_limits(max)
            .unwrap_err();
        assert!(e.contains("iterations"), "{e}");
        let e = iters(None, Some(u64::MAX)).within_limits(max).unwrap_err();
        assert!(e.contains("warm-up iterations"), "{e}");
    }

    #[test]
    fn the_server_allocates_only_the_memory_it_runs_with() {
        let server = params(vec![8]);
        let client = Params {
            mem_send: "gaudi".into(),
            ..params(vec![8])
        };
        let why = client.mismatch(&server).expect("a mismatch");
        assert!(
            why.contains("send side: client asked gaudi, server runs host"),
            "{why}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_sizes("8:64").unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(parse_sizes("8,4k,1M").unwrap(), vec![8, 4096, 1 << 20]);
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes("64:8").is_err());
        assert!(parse_sizes("0").is_err());
    }
}
