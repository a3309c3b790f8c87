//! uct-transfer: the transfer API of uct-rs, after seed 004's
//! RdmaTransport, over every transport uct-rs has (rc, tcp, posix, self,
//! and cma where it can) and every memory type.
//!
//! - [`Transport::bind`] gives a printable URL; the peer passes it to
//!   [`Transport::connect`]. Both sides bind and both connect.
//! - [`Memory`] is registered once; [`View`]s are cut from it.
//!   [`Memory::remote_key`] is a printable, versioned key, read back by
//!   [`RemoteBuffer::parse`].
//! - [`Transport::write`] returns a future; with `notify`, the peer's
//!   [`Transport::wait_for_write`] resolves once the bytes have landed.
//!   On rc the notification is the immediate of one RDMA WRITE WITH
//!   IMMEDIATE, on tcp and self of one put with immediate data; elsewhere
//!   (and for a write split in pieces) an active message after the data.
//! - The futures are plain `std::future::Future`s: any executor runs them.
//!   Progress comes from a thread the Transport owns, or from the caller
//!   ([`Progress::Manual`], [`Transport::progress`]).
//!
//! # Example: ping-pong in one process
//!
//! ```
//! use uct_transfer::{Memory, MemoryType, RemoteBuffer, Transport};
//!
//! # fn main() -> uct_transfer::Result<()> {
//! let server = Transport::builder().transport("self").build()?;
//! let client = Transport::builder().transport("self").build()?;
//! let (server_url, client_url) = (server.bind()?, client.bind()?);
//! server.connect(&client_url)?;
//! client.connect(&server_url)?;
//!
//! let src = Memory::alloc(&server, MemoryType::Host, 8192)?;
//! let dst = Memory::alloc(&client, MemoryType::Host, 8192)?;
//! src.write_bytes(0, &[0xab; 8192])?;
//! // The client's key travels to the server however the application likes.
//! let remote = RemoteBuffer::parse(&dst.remote_key())?;
//!
//! let wrote = server.write(&src.whole(), &remote, true);
//! let landed = client.wait_for_write();
//! futures_lite_block_on(wrote)?;
//! let note = futures_lite_block_on(landed)?;
//! assert_eq!(note.len, 8192);
//! let mut back = vec![0; 8192];
//! dst.read_bytes(0, &mut back)?;
//! assert!(back.iter().all(|&b| b == 0xab));
//! # Ok(())
//! # }
//! # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     futures::executor::block_on(f)
//! # }
//! ```

#![warn(missing_docs)]

mod builder;
mod engine;
mod error;
mod key;
mod memory;
mod ops;
mod progress;
mod rails;
mod select;
mod shared;
mod stats;
mod stripe;
mod text;
mod transport;
mod url;
mod view;

pub use error::{Result, TransferError};
pub use key::{RemoteBuffer, KEY_VERSION, MAX_RAILS};
pub use memory::{Memory, View};
pub use ops::{Notification, OpFuture, WaitForWrite};
pub use select::{Probe, AUTO_ORDER};
pub use stats::{RailStats, Stats};
pub use transport::{BatchWrite, Builder, Progress, Transport, DEFAULT_DEPTH, DEFAULT_STRIPE_MIN};
pub use uct_core::{Access, MemHandle, MemoryType};
pub use url::URL_VERSION;
