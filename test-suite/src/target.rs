//! The target side of a conformance pair: the iface that is written to,
//! read from and sent to. It lives either in this process ([`InProcess`])
//! or in a child process spawned by the test and driven over the bootstrap
//! channel ([`Spawned`], served by `run_agent`).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uct_core::bootstrap::{BootstrapChannel, BootstrapListener};
use uct_core::{Access, EpParams, Iface, MemHandle, MemoryType, Registry, RkeyBundle};

/// Environment variables that make a test binary act as an agent.
pub const ROLE_VAR: &str = "UCT_CONFORMANCE_ROLE";
const CONNECT_VAR: &str = "UCT_CONFORMANCE_CONNECT";
const TRANSPORT_VAR: &str = "UCT_CONFORMANCE_TRANSPORT";
const DEVICE_VAR: &str = "UCT_CONFORMANCE_DEVICE";

/// A region the target allocated; its rkey is packed as a peer gets it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteMem {
    pub id: u64,
    pub addr: u64,
    pub len: usize,
    pub rkey: Vec<u8>,
}

/// The inbox that [`Target::listen`] fills with the target iface's
/// immediates (puts with immediate data) instead of active messages: no
/// active-message id is this large. Each entry is the immediate (u32), the
/// length its put carried (u64) and how many active messages of any id the
/// target had received before it (u64), little-endian: what order they
/// came in.
pub const IMM_INBOX: u8 = u8::MAX;

/// What a conformance case may ask of the target.
pub trait Target: Send {
    fn device_address(&self) -> Vec<u8>;
    fn iface_address(&self) -> Vec<u8>;
    /// Allocates (or registers) target memory.
    fn alloc(&mut self, len: usize, access: Access) -> Result<RemoteMem, String>;
    fn read(&mut self, mem: &RemoteMem, offset: usize, len: usize) -> Result<Vec<u8>, String>;
    fn write(&mut self, mem: &RemoteMem, offset: usize, data: &[u8]) -> Result<(), String>;
    /// Deregisters and frees.
    fn free(&mut self, mem: &RemoteMem) -> Result<(), String>;
    /// Starts collecting active messages with `id`, or the immediates
    /// ([`IMM_INBOX`]).
    fn listen(&mut self, id: u8) -> Result<(), String>;
    /// Messages received on `id` so far, without taking them.
    fn inbox_len(&mut self, id: u8) -> Result<usize, String>;
    /// Takes the messages received on `id`.
    fn take_inbox(&mut self, id: u8) -> Result<Vec<Vec<u8>>, String>;
    /// Takes at most `max` of the messages received on `id`, oldest first.
    fn take_some(&mut self, id: u8, max: usize) -> Result<Vec<Vec<u8>>, String>;
    /// Stops (`true`) or restarts driving the target iface: held, it
    /// receives nothing, so that its senders meet back-pressure.
    fn hold(&mut self, held: bool) -> Result<(), String>;
    /// Drives the target iface (a no-op for a child, which drives itself).
    fn progress(&mut self) -> usize;
    /// Creates the target's endpoint back (CONNECT_TO_EP transports) and
    /// returns its address.
    fn create_ep(&mut self) -> Result<Vec<u8>, String>;
    /// Connects that endpoint to the initiator's endpoint.
    fn connect_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<(), String>;
    /// Closes the target iface (its process stays).
    fn close(&mut self) -> Result<(), String>;
    /// Kills the target process, where there is one.
    fn kill(&mut self) -> Result<bool, String>;
    /// "in-process" or "two processes".
    fn mode(&self) -> &'static str;
}

type Inboxes = Arc<Mutex<HashMap<u8, Vec<Vec<u8>>>>>;

/// The target iface in this process.
pub struct InProcess {
    iface: Option<Box<dyn Iface>>,
    mems: HashMap<u64, MemHandle>,
    /// Host buffers registered with MDs that do not allocate.
    buffers: Vec<Box<[u8]>>,
    next: u64,
    inboxes: Inboxes,
    ep: Option<Box<dyn uct_core::Endpoint>>,
    dev_addr: Vec<u8>,
    iface_addr: Vec<u8>,
    held: bool,
}

impl InProcess {
    pub fn new(iface: Box<dyn Iface>) -> Self {
        InProcess {
            dev_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
            iface: Some(iface),
            mems: HashMap::new(),
            buffers: Vec::new(),
            next: 1,
            inboxes: Arc::default(),
            ep: None,
            held: false,
        }
    }

    fn iface(&mut self) -> Result<&mut Box<dyn Iface>, String> {
        self.iface
            .as_mut()
            .ok_or_else(|| "the target iface is closed".to_string())
    }

    fn mem(&self, remote: &RemoteMem) -> Result<&MemHandle, String> {
        self.mems
            .get(&remote.id)
            .ok_or_else(|| format!("target region {} is freed", remote.id))
    }
}

impl Target for InProcess {
    fn device_address(&self) -> Vec<u8> {
        self.dev_addr.clone()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.iface_addr.clone()
    }

    fn alloc(&mut self, len: usize, access: Access) -> Result<RemoteMem, String> {
        let md = self.iface()?.md().clone();
        let attrs = md.attrs();
        let mem = if attrs.flags.contains(uct_core::MdFlags::ALLOC)
            && attrs.alloc_mem_types.contains(&MemoryType::Host)
        {
            md.alloc(len, MemoryType::Host, access)
                .map_err(|e| format!("alloc: {e}"))?
        } else {
            let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
            // SAFETY: the buffer is kept in `self.buffers` for the life of
            // the target, which outlives the handle.
            let mem = unsafe { md.register(buf.as_mut_ptr(), len, access) }
                .map_err(|e| format!("register: {e}"))?;
            self.buffers.push(buf);
            mem
        };
        let entry = md.pack_rkey(&mem).map_err(|e| format!("pack rkey: {e}"))?;
        let rkey = RkeyBundle::single(entry)
            .pack()
            .map_err(|e| format!("pack: {e}"))?;
        let id = self.next;
        self.next += 1;
        let out = RemoteMem {
            id,
            addr: mem.addr(),
            len,
            rkey,
        };
        self.mems.insert(id, mem);
        Ok(out)
    }

    fn read(&mut self, remote: &RemoteMem, offset: usize, len: usize) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; len];
        self.mem(remote)?
            .read(offset, &mut v)
            .map_err(|e| e.to_string())?;
        Ok(v)
    }

    fn write(&mut self, remote: &RemoteMem, offset: usize, data: &[u8]) -> Result<(), String> {
        self.mem(remote)?
            .write(offset, data)
            .map_err(|e| e.to_string())
    }

    fn free(&mut self, remote: &RemoteMem) -> Result<(), String> {
        self.mems
            .remove(&remote.id)
            .map(drop)
            .ok_or_else(|| format!("region {} freed twice", remote.id))
    }

    fn listen(&mut self, id: u8) -> Result<(), String> {
        let sink = self.inboxes.clone();
        sink.lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_default();
        if id == IMM_INBOX {
            return self
                .iface()?
                .set_imm_handler(Box::new(move |e| {
                    let mut inboxes = sink.lock().unwrap_or_else(|e| e.into_inner());
                    let ams: usize = inboxes
                        .iter()
                        .filter(|(id, _)| **id != IMM_INBOX)
                        .map(|(_, messages)| messages.len())
                        .sum();
                    let mut entry = e.imm.to_le_bytes().to_vec();
                    entry.extend_from_slice(&(e.len as u64).to_le_bytes());
                    entry.extend_from_slice(&(ams as u64).to_le_bytes());
                    inboxes.entry(IMM_INBOX).or_default().push(entry);
                }))
                .map_err(|e| format!("set immediate handler: {e}"));
        }
        self.iface()?
            .set_am_handler(
                id,
                Box::new(move |msg| {
                    sink.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(msg.id)
                        .or_default()
                        .push(msg.data.to_vec())
                }),
            )
            .map_err(|e| format!("set AM handler: {e}"))
    }

    fn inbox_len(&mut self, id: u8) -> Result<usize, String> {
        Ok(self
            .inboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .map_or(0, Vec::len))
    }

    fn take_inbox(&mut self, id: u8) -> Result<Vec<Vec<u8>>, String> {
        Ok(self
            .inboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&id)
            .map(std::mem::take)
            .unwrap_or_default())
    }

    fn take_some(&mut self, id: u8, max: usize) -> Result<Vec<Vec<u8>>, String> {
        let mut inboxes = self.inboxes.lock().unwrap_or_else(|e| e.into_inner());
        let inbox = inboxes.entry(id).or_default();
        let n = inbox.len().min(max);
        Ok(inbox.drain(..n).collect())
    }

    fn hold(&mut self, held: bool) -> Result<(), String> {
        self.held = held;
        Ok(())
    }

    fn progress(&mut self) -> usize {
        if self.held {
            return 0;
        }
        self.iface.as_mut().map_or(0, |i| i.progress())
    }

    fn create_ep(&mut self) -> Result<Vec<u8>, String> {
        let ep = self
            .iface()?
            .create_ep(EpParams::Unconnected)
            .map_err(|e| e.to_string())?;
        let addr = ep.ep_address().map_err(|e| e.to_string())?;
        self.ep = Some(ep);
        Ok(addr)
    }

    fn connect_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<(), String> {
        self.ep
            .as_mut()
            .ok_or("no target endpoint")?
            .connect_to_ep(device_addr, ep_addr)
            .map_err(|e| e.to_string())
    }

    fn close(&mut self) -> Result<(), String> {
        self.ep = None;
        self.iface = None;
        Ok(())
    }

    fn kill(&mut self) -> Result<bool, String> {
        Ok(false)
    }

    fn mode(&self) -> &'static str {
        "in-process"
    }
}

/// Commands to an agent.
#[derive(Debug, Serialize, Deserialize)]
enum Cmd {
    Alloc {
        len: usize,
        access: u8,
    },
    Read {
        id: u64,
        offset: usize,
        len: usize,
    },
    Write {
        id: u64,
        offset: usize,
        data: Vec<u8>,
    },
    Free {
        id: u64,
    },
    Listen {
        id: u8,
    },
    InboxLen {
        id: u8,
    },
    TakeInbox {
        id: u8,
    },
    TakeSome {
        id: u8,
        max: usize,
    },
    Hold {
        held: bool,
    },
    CreateEp,
    ConnectEp {
        device_addr: Vec<u8>,
        ep_addr: Vec<u8>,
    },
    Close,
}

/// Answers of an agent.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Ready {
        device_addr: Vec<u8>,
        iface_addr: Vec<u8>,
    },
    Mem(RemoteMem),
    Data(Vec<u8>),
    Len(usize),
    Inbox(Vec<Vec<u8>>),
    Addr(Vec<u8>),
    Done,
    Error(String),
}

const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A target iface in a child process.
pub struct Spawned {
    child: Child,
    ch: BootstrapChannel,
    dev_addr: Vec<u8>,
    iface_addr: Vec<u8>,
}

impl Spawned {
    /// Starts this test binary again as an agent serving `transport` on
    /// `device`, and connects to it through the bootstrap channel.
    pub fn spawn(transport: &str, device: &str) -> Result<Spawned, String> {
        let listener =
            BootstrapListener::bind("127.0.0.1:0", AGENT_TIMEOUT).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .env(ROLE_VAR, "agent")
            .env(CONNECT_VAR, addr.to_string())
            .env(TRANSPORT_VAR, transport)
            .env(DEVICE_VAR, device)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn the agent process: {e}"))?;
        let mut ch = match listener.accept() {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the agent did not connect: {e}"));
            }
        };
        match ch.recv_msg::<Reply>() {
            Ok(Reply::Ready {
                device_addr,
                iface_addr,
            }) => Ok(Spawned {
                child,
                ch,
                dev_addr: device_addr,
                iface_addr,
            }),
            Ok(Reply::Error(e)) => {
                let _ = child.wait();
                Err(format!(
                    "the agent could not open {transport}/{device}: {e}"
                ))
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("the agent answered {other:?}"))
            }
        }
    }

    fn call(&mut self, cmd: Cmd) -> Result<Reply, String> {
        self.ch
            .send_msg(&cmd)
            .map_err(|e| format!("to agent: {e}"))?;
        match self
            .ch
            .recv_msg::<Reply>()
            .map_err(|e| format!("from agent: {e}"))?
        {
            Reply::Error(e) => Err(e),
            reply => Ok(reply),
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unexpected(reply: Reply) -> String {
    format!("unexpected agent reply {reply:?}")
}

impl Target for Spawned {
    fn device_address(&self) -> Vec<u8> {
        self.dev_addr.clone()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.iface_addr.clone()
    }

    fn alloc(&mut self, len: usize, access: Access) -> Result<RemoteMem, String> {
        match self.call(Cmd::Alloc {
            len,
            access: access.bits(),
        })? {
            Reply::Mem(remote) => Ok(remote),
            reply => Err(unexpected(reply)),
        }
    }

    fn read(&mut self, remote: &RemoteMem, offset: usize, len: usize) -> Result<Vec<u8>, String> {
        match self.call(Cmd::Read {
            id: remote.id,
            offset,
            len,
        })? {
            Reply::Data(d) => Ok(d),
            reply => Err(unexpected(reply)),
        }
    }

    fn write(&mut self, remote: &RemoteMem, offset: usize, data: &[u8]) -> Result<(), String> {
        self.call(Cmd::Write {
            id: remote.id,
            offset,
            data: data.to_vec(),
        })
        .map(drop)
    }

    fn free(&mut self, remote: &RemoteMem) -> Result<(), String> {
        self.call(Cmd::Free { id: remote.id }).map(drop)
    }

    fn listen(&mut self, id: u8) -> Result<(), String> {
        self.call(Cmd::Listen { id }).map(drop)
    }

    fn inbox_len(&mut self, id: u8) -> Result<usize, String> {
        match self.call(Cmd::InboxLen { id })? {
            Reply::Len(n) => Ok(n),
            reply => Err(unexpected(reply)),
        }
    }

    fn take_inbox(&mut self, id: u8) -> Result<Vec<Vec<u8>>, String> {
        match self.call(Cmd::TakeInbox { id })? {
            Reply::Inbox(v) => Ok(v),
            reply => Err(unexpected(reply)),
        }
    }

    fn take_some(&mut self, id: u8, max: usize) -> Result<Vec<Vec<u8>>, String> {
        match self.call(Cmd::TakeSome { id, max })? {
            Reply::Inbox(v) => Ok(v),
            reply => Err(unexpected(reply)),
        }
    }

    fn hold(&mut self, held: bool) -> Result<(), String> {
        self.call(Cmd::Hold { held }).map(drop)
    }

    fn progress(&mut self) -> usize {
        0
    }

    fn create_ep(&mut self) -> Result<Vec<u8>, String> {
        match self.call(Cmd::CreateEp)? {
            Reply::Addr(a) => Ok(a),
            reply => Err(unexpected(reply)),
        }
    }

    fn connect_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<(), String> {
        self.call(Cmd::ConnectEp {
            device_addr: device_addr.to_vec(),
            ep_addr: ep_addr.to_vec(),
        })
        .map(drop)
    }

    fn close(&mut self) -> Result<(), String> {
        self.call(Cmd::Close).map(drop)
    }

    fn kill(&mut self) -> Result<bool, String> {
        self.child.kill().map_err(|e| e.to_string())?;
        self.child.wait().map_err(|e| e.to_string())?;
        Ok(true)
    }

    fn mode(&self) -> &'static str {
        "two processes"
    }
}

/// If this process was started as an agent, serves until the parent goes
/// away and exits; otherwise returns at once.
pub fn run_agent_if_asked() {
    if std::env::var(ROLE_VAR).as_deref() != Ok("agent") {
        return;
    }
    std::process::exit(match run_agent() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("conformance agent: {e}");
            1
        }
    });
}

fn run_agent() -> Result<(), String> {
    let var = |n: &str| std::env::var(n).map_err(|_| format!("{n} is not set"));
    let connect = var(CONNECT_VAR)?;
    let transport = var(TRANSPORT_VAR)?;
    let device = var(DEVICE_VAR)?;
    let mut ch =
        BootstrapChannel::connect(connect.as_str(), AGENT_TIMEOUT).map_err(|e| e.to_string())?;
    let iface = match Registry::global().open_iface(&transport, Some(&device), &Default::default())
    {
        Ok(i) => i,
        Err(e) => {
            let _ = ch.send_msg(&Reply::Error(e.to_string()));
            return Err(e.to_string());
        }
    };
    let mut target = InProcess::new(iface);
    ch.send_msg(&Reply::Ready {
        device_addr: target.device_address(),
        iface_addr: target.iface_address(),
    })
    .map_err(|e| e.to_string())?;
    loop {
        // Keep the iface progressing between commands.
        let mut idle = 0u32;
        while !ch
            .poll_readable(if target.held {
                // Held: wait for the next command without driving the iface.
                Duration::from_millis(10)
            } else {
                Duration::ZERO
            })
            .map_err(|e| e.to_string())?
        {
            if target.progress() == 0 {
                idle = idle.saturating_add(1);
                if idle > 1000 {
                    std::thread::yield_now();
                }
            } else {
                idle = 0;
            }
        }
        let cmd: Cmd = match ch.recv_msg() {
            Ok(c) => c,
            // The parent is gone: nothing left to serve.
            Err(_) => return Ok(()),
        };
        let reply = match cmd {
            Cmd::Alloc { len, access } => target
                .alloc(len, Access::from_bits_truncate(access))
                .map(Reply::Mem),
            Cmd::Read { id, offset, len } => {
                let remote = RemoteMem {
                    id,
                    addr: 0,
                    len: 0,
                    rkey: vec![],
                };
                target.read(&remote, offset, len).map(Reply::Data)
            }
            Cmd::Write { id, offset, data } => {
                let remote = RemoteMem {
                    id,
                    addr: 0,
                    len: 0,
                    rkey: vec![],
                };
                target.write(&remote, offset, &data).map(|_| Reply::Done)
            }
            Cmd::Free { id } => {
                let remote = RemoteMem {
                    id,
                    addr: 0,
                    len: 0,
                    rkey: vec![],
                };
                target.free(&remote).map(|_| Reply::Done)
            }
            Cmd::Listen { id } => target.listen(id).map(|_| Reply::Done),
            Cmd::InboxLen { id } => target.inbox_len(id).map(Reply::Len),
            Cmd::TakeInbox { id } => target.take_inbox(id).map(Reply::Inbox),
            Cmd::TakeSome { id, max } => target.take_some(id, max).map(Reply::Inbox),
            Cmd::Hold { held } => target.hold(held).map(|_| Reply::Done),
            Cmd::CreateEp => target.create_ep().map(Reply::Addr),
            Cmd::ConnectEp {
                device_addr,
                ep_addr,
            } => target
                .connect_ep(&device_addr, &ep_addr)
                .map(|_| Reply::Done),
            Cmd::Close => target.close().map(|_| Reply::Done),
        };
        ch.send_msg(&reply.unwrap_or_else(Reply::Error))
            .map_err(|e| e.to_string())?;
    }
}
