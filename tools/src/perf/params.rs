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

impl Params {
    /// Iterations for `size`: as given, or enough to move about 256 MiB,
    /// between 1,000 and 100,000 (latency tests: 20,000).
    pub fn iters_for(&self, size: usize) -> u64 {
        if let Some(n) = self.iters {
            return n.max(1);
        }
        if self.validate {
            return 200;
        }
        if self.test.is_latency() {
            return 20_000;
        }
        ((256u64 << 20) / size.max(1) as u64).clamp(1_000, 100_000)
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
    fn sizes() {
        assert_eq!(parse_sizes("8:64").unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(parse_sizes("8,4k,1M").unwrap(), vec![8, 4096, 1 << 20]);
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes("64:8").is_err());
        assert!(parse_sizes("0").is_err());
    }
}
