//! The settings a Transport is built from: the transport, its device(s)
//! and rails, the memory types, the depth, who drives progress.

use std::sync::Arc;

use uct_core::{IfaceParams, MemoryType, Registry};

use crate::error::{Result, TransferError};
use crate::ops::Inbox;
use crate::select;
use crate::shared::{install_handlers, Open, Shared};
use crate::stats::Counters;
use crate::transport::Transport;

/// Who drives progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// A thread the Transport owns (the default).
    #[default]
    Thread,
    /// The caller, through [`Transport::progress`] (or [`Transport::wait`]).
    Manual,
}

/// Settings of a Transport; see [`Transport::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    transport: String,
    device: Option<String>,
    mem_types: Vec<MemoryType>,
    depth: usize,
    progress: Progress,
    max_piece: usize,
    backlog: usize,
    rails: Option<usize>,
    devices: Option<Vec<String>>,
    stripe_min: Option<usize>,
}

/// Operations in flight by default before a new one waits.
pub const DEFAULT_DEPTH: usize = 64;

/// The smallest write striped over several rails by default
/// (`UCT_TRANSFER_STRIPE_MIN`); see docs/perf-rails.md for the
/// measurement behind it.
pub const DEFAULT_STRIPE_MIN: usize = 512 * 1024;

impl Default for Builder {
    fn default() -> Self {
        Builder {
            transport: "auto".into(),
            device: None,
            mem_types: vec![MemoryType::Host],
            depth: DEFAULT_DEPTH,
            progress: Progress::Thread,
            max_piece: usize::MAX,
            backlog: crate::ops::MAX_BACKLOG,
            rails: None,
            devices: None,
            stripe_min: None,
        }
    }
}

impl Builder {
    /// The transport: `rc`, `tcp`, `posix`, `cma`, `self`, or `auto` (the
    /// default): the best one for the memory types and the peer.
    pub fn transport(mut self, name: &str) -> Self {
        self.transport = name.to_string();
        self
    }

    /// The device (as `transport-info -d` names it); the first one found
    /// by default. `UCT_NET_DEVICES` limits network devices as well.
    pub fn device(mut self, name: &str) -> Self {
        self.device = Some(name.to_string());
        self
    }

    /// The memory types the Transport will register (host by default);
    /// `auto` chooses among transports that reach all of them.
    pub fn memory_types(mut self, types: &[MemoryType]) -> Self {
        self.mem_types = types.to_vec();
        self
    }

    /// Operations in flight before the next one waits (not fails);
    /// [`DEFAULT_DEPTH`] by default.
    pub fn max_in_flight(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// Who drives progress. With [`Progress::Manual`] nothing moves, and
    /// no dead peer is noticed, unless the caller calls
    /// [`Transport::progress`] (or waits with [`Transport::wait`]): a
    /// future awaited on another executor without it never resolves.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Notifications kept for waits not yet made (2^20 by default). A peer
    /// that sends more than this ahead of the application's
    /// `wait_for_write`s fails the connection: wait for notifications as
    /// they come, or raise this.
    pub fn max_notification_backlog(mut self, notifications: usize) -> Self {
        self.backlog = notifications.max(1);
        self
    }

    /// Rails: `n` devices of the (named) transport, each with its own
    /// connection, as the transport lists them (`Builder::device` first).
    /// Writes of at least the stripe minimum are split over them, and a
    /// rail that fails is taken out while the others carry on. One by
    /// default, or `UCT_TRANSFER_RAILS`. Both sides must have the same
    /// rails: connect refuses another count by name.
    pub fn rails(mut self, n: usize) -> Self {
        self.rails = Some(n);
        self
    }

    /// Rails on these devices, in this order (as `transport-info -d` names
    /// them); a device may repeat (two connections over one link: no more
    /// bandwidth, but a rail that can fail alone, for tests).
    pub fn devices(mut self, names: &[&str]) -> Self {
        self.devices = Some(names.iter().map(|d| d.to_string()).collect());
        self
    }

    /// The smallest write split over several rails (smaller ones go whole
    /// on one rail, in turn); [`DEFAULT_STRIPE_MIN`] by default, or
    /// `UCT_TRANSFER_STRIPE_MIN`.
    pub fn stripe_min(mut self, bytes: usize) -> Self {
        self.stripe_min = Some(bytes.max(1));
        self
    }

    /// The rails asked for: devices(), rails(), `UCT_TRANSFER_RAILS`, or 1.
    fn rail_count(&self) -> Result<usize> {
        let n = match (&self.devices, self.rails) {
            (Some(d), Some(n)) if d.len() != n => {
                return Err(TransferError::Config(format!(
                    "rails({n}) and devices() naming {} devices; give one or the other",
                    d.len()
                )))
            }
            (Some(d), _) => d.len(),
            (None, Some(n)) => n,
            (None, None) => match std::env::var("UCT_TRANSFER_RAILS") {
                Ok(v) => {
                    let n = v.trim().parse::<usize>().map_err(|_| {
                        TransferError::Config(format!(
                            "UCT_TRANSFER_RAILS={v:?} is not a number of rails (1 to {})",
                            crate::key::MAX_RAILS
                        ))
                    })?;
                    if n > 1 && self.transport == "auto" {
                        log::warn!("transfer: UCT_TRANSFER_RAILS={n} applies to a named transport (tcp, rc); auto uses one rail");
                        1
                    } else {
                        n
                    }
                }
                Err(_) => 1,
            },
        };
        if n == 0 || n > crate::key::MAX_RAILS {
            return Err(TransferError::Config(format!(
                "{n} rails: a Transport has 1 to {}",
                crate::key::MAX_RAILS
            )));
        }
        if (n > 1 || self.devices.is_some()) && self.transport == "auto" {
            return Err(TransferError::Config(format!(
                "{n} rails of auto: rails are devices of one transport; name it with .transport(\"tcp\") or \"rc\""
            )));
        }
        Ok(n)
    }

    /// The stripe minimum: stripe_min(), `UCT_TRANSFER_STRIPE_MIN`, or the
    /// default.
    fn stripe_min_bytes(&self) -> Result<usize> {
        if let Some(b) = self.stripe_min {
            return Ok(b);
        }
        match std::env::var("UCT_TRANSFER_STRIPE_MIN") {
            Ok(v) => uct_core::config::parse_size(&v)
                .map(|b| (b as usize).max(1))
                .ok_or_else(|| {
                    TransferError::Config(format!(
                        "UCT_TRANSFER_STRIPE_MIN={v:?} is not a size (bytes, or with K, M, G)"
                    ))
                }),
            Err(_) => Ok(DEFAULT_STRIPE_MIN),
        }
    }

    /// Splits writes and reads in pieces of at most `bytes` (besides the
    /// transport's own largest zcopy): a test seam for writes split in
    /// pieces, which real transports do only beyond a GiB.
    #[doc(hidden)]
    pub fn max_write_piece(mut self, bytes: usize) -> Self {
        self.max_piece = bytes.max(1);
        self
    }

    /// Opens the candidate transports.
    pub fn build(self) -> Result<Transport> {
        if self.depth == 0 {
            return Err(TransferError::Config(
                "max_in_flight of 0: at least one operation must be able to run".into(),
            ));
        }
        let rails = self.rail_count()?;
        let stripe_min = self.stripe_min_bytes()?;
        uct_builtins::link();
        let registry = Registry::global();
        let picked = if rails > 1 || self.devices.is_some() {
            select::rail_candidates(
                registry,
                &self.transport,
                self.device.as_deref(),
                self.devices.as_deref(),
                rails,
            )?
        } else {
            select::candidates(
                registry,
                &self.transport,
                self.device.as_deref(),
                &self.mem_types,
            )?
        };
        let inbox = Inbox::new(self.backlog);
        let counters = Arc::new(Counters::default());
        let token = random_token();
        let mut cands = Vec::with_capacity(picked.len());
        for (rail, c) in picked.into_iter().enumerate() {
            let mut iface = match c.resource.component.open_iface(
                &c.resource.md,
                &c.resource.tl,
                &IfaceParams::default(),
            ) {
                Ok(i) => i,
                Err(e) if self.transport == "auto" => {
                    log::info!("transfer: {} not used: {e}", c.resource.tl.transport);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            install_handlers(iface.as_mut(), &inbox, &counters, token)?;
            cands.push(Open {
                mem_types: iface.attrs().mem_types.clone(),
                component: c.resource.component.name().to_string(),
                md: c.resource.md.clone(),
                iface,
                pending_ep: None,
                rail: if rails > 1 { rail } else { 0 },
            });
        }
        if cands.is_empty() {
            return Err(TransferError::NoTransport(
                "every candidate failed to open; run with RUST_LOG=info to see why".into(),
            ));
        }
        let mut shared = Shared::new(cands, inbox, counters, self.depth, token);
        shared.max_piece = self.max_piece;
        shared.rails = rails;
        shared.stripe_min = stripe_min;
        let shared = Arc::new(shared);
        let thread = match self.progress {
            Progress::Manual => None,
            Progress::Thread => Some(crate::progress::spawn(shared.clone())?),
        };
        Ok(Transport { shared, thread })
    }
}

/// A random token for notifications (see [`Shared::token`]); never 0.
fn random_token() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Only distinct from other Transports, not secret: the URL's
        // secrecy is what the token rests on.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        return t ^ (std::process::id() as u64).rotate_left(40) | 1;
    }
    u64::from_ne_bytes(b) | 1
}
