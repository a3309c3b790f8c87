//! Setting up a two-process run over the bootstrap channel: the
//! parameters agreed (a mismatch refused with its reason, on both sides),
//! the Transports' URLs exchanged and connected both ways, and the remote
//! keys of the buffers each side writes into.

use serde::{Deserialize, Serialize};
use uct_core::bootstrap::BootstrapChannel;
use uct_transfer::{Memory, MemoryType, RemoteBuffer, Transport};

use super::error::{BenchError, Result};
use super::params::BenchParams;
use super::run::{Client, Server};

/// The first messages: the client's parameters and the server's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Hello {
    Params(Box<BenchParams>),
    Accept,
    Refuse(String),
}

/// The largest set-up message a server takes: parameters, URLs and keys are
/// a few KiB.
const MAX_FRAME: usize = 1 << 20;

/// The client's half of the agreement.
pub fn propose(ch: &mut BootstrapChannel, ours: &BenchParams) -> Result<()> {
    ch.send_msg(&Hello::Params(Box::new(ours.clone())))?;
    match ch.recv_msg::<Hello>()? {
        Hello::Accept => Ok(()),
        Hello::Refuse(why) => Err(BenchError::Refused(why)),
        other => Err(BenchError::Protocol(format!(
            "expected the server's answer, got {other:?}"
        ))),
    }
}

/// The server's half: the client's proposal against its own parameters;
/// a refusal goes back to the client too.
pub fn agree(ch: &mut BootstrapChannel, ours: &BenchParams) -> Result<BenchParams> {
    ch.set_max_frame(MAX_FRAME);
    let theirs = match ch.recv_msg::<Hello>()? {
        Hello::Params(p) => *p,
        other => {
            return Err(BenchError::Protocol(format!(
                "expected the client's parameters, got {other:?}"
            )))
        }
    };
    let why = ours
        .mismatch(&theirs)
        .or_else(|| theirs.check().err().map(|e| format!("on the server: {e}")));
    if let Some(why) = why {
        let _ = ch.send_msg(&Hello::Refuse(why.clone()));
        return Err(BenchError::Refused(why));
    }
    ch.send_msg(&Hello::Accept)?;
    Ok(theirs)
}

/// Binds `t`, exchanges URLs and connects both ways: the client first,
/// then the server (as perftest does, so that transports with one
/// connection per pair of ifaces find the client's).
fn connect(t: &Transport, ch: &mut BootstrapChannel, client: bool) -> Result<()> {
    let url = t.bind()?;
    let peer: String = ch.exchange(&url)?;
    if client {
        t.connect(&peer)?;
        ch.barrier()?;
    } else {
        ch.barrier()?;
        t.connect(&peer)?;
    }
    Ok(())
}

/// Allocates this side's buffers, sends the key of the one the peer writes
/// into, and reads the peer's. A side that cannot allocate says why to the
/// other, so that both report the same reason.
fn buffers(
    t: &Transport,
    ch: &mut BootstrapChannel,
    mem_type: MemoryType,
    len: usize,
    peer_writes_main: bool,
) -> Result<(Memory, Memory, RemoteBuffer)> {
    let allocated = Memory::alloc(t, mem_type, len)
        .and_then(|main| Memory::alloc(t, MemoryType::Host, 1).map(|aux| (main, aux)));
    let ours: std::result::Result<String, String> = match &allocated {
        Ok((main, aux)) => Ok(if peer_writes_main {
            main.remote_key()
        } else {
            aux.remote_key()
        }),
        Err(e) => Err(e.to_string()),
    };
    let theirs: std::result::Result<String, String> = ch.exchange(&ours)?;
    let (main, aux) = allocated?;
    let key = theirs.map_err(|e| BenchError::Refused(format!("on the peer: {e}")))?;
    let remote = RemoteBuffer::parse(&key)?;
    ch.barrier()?;
    Ok((main, aux, remote))
}

/// The client, connected, with its buffers: the send buffer, and where the
/// answers land.
pub fn client(t: &Transport, mut ch: BootstrapChannel, params: &BenchParams) -> Result<Client> {
    connect(t, &mut ch, true)?;
    let mem_type = params.mem_type().map_err(BenchError::Usage)?;
    let (src, answers, remote) = buffers(t, &mut ch, mem_type, params.buffer_len(), false)?;
    if remote.len() < params.buffer_len() {
        return Err(BenchError::Protocol(format!(
            "the server's buffer has {} bytes, {} were agreed",
            remote.len(),
            params.buffer_len()
        )));
    }
    Ok(Client {
        ch,
        src,
        _answers: answers,
        remote,
        outstanding: params.outstanding,
    })
}

/// The server, connected, with its buffers: the receive buffer, and the
/// one its zero-length answers are views of.
pub fn server(t: &Transport, mut ch: BootstrapChannel, params: &BenchParams) -> Result<Server> {
    connect(t, &mut ch, false)?;
    let mem_type = params.mem_type().map_err(BenchError::Usage)?;
    let (dst, zero, answers) = buffers(t, &mut ch, mem_type, params.buffer_len(), true)?;
    Ok(Server {
        ch,
        dst,
        zero,
        answers,
    })
}
