//! Whether a device's ports are still up: the rc endpoints on a port whose
//! link went down fail within [`POLL_EVERY`] of their next look at the
//! clock, with an error that names the device, the port and the reason.
//!
//! rxe keeps looping a QP's traffic back to its own device after its link
//! went down, and real NICs retry for seconds (the QP's retry count times
//! its timeout) before they fail a request: neither tells a rail that is
//! gone soon enough. So each device is watched twice over:
//! - its asynchronous events (IBV_EVENT_PORT_ERR, IBV_EVENT_DEVICE_FATAL),
//!   read from the context's event file made non-blocking, so that a link
//!   that went down and came back between two looks is still seen;
//! - the port's state (ibv_query_port), in case the events are lost to
//!   another reader of this context or the device is being removed.
//!
//! A port that went down stays down for the endpoints that saw it up: their
//! generation changed. New endpoints, once the port is ACTIVE again, work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use md_ib::verbs::Context;
use rdma_sys::*;
use uct_core::coarse_clock::CoarseInstant;

/// How often a device is looked at, at most: an ibv_query_port per port
/// (a system call) and a read of the event file.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// What is known about one port.
#[derive(Debug, Default, Clone)]
struct PortState {
    /// How many times it went down.
    downs: u64,
    /// Why it is down now, if it is.
    down: Option<String>,
    /// Why it last went down.
    last: Option<String>,
}

#[derive(Debug, Default)]
struct Watched {
    last_poll: Option<CoarseInstant>,
    ports: HashMap<u8, PortState>,
}

/// The port watcher of one open device, shared by its ifaces and their
/// endpoints.
pub struct PortWatch {
    ctx: Arc<Context>,
    /// The event file is non-blocking: events can be read.
    events: bool,
    state: Mutex<Watched>,
}

/// `struct ibv_async_event` as C lays it out, read without trusting its
/// event type to be one the bindings' enum knows.
#[repr(C)]
struct RawEvent {
    element: RawElement,
    event_type: u32,
}

#[repr(C)]
union RawElement {
    ptr: *mut std::ffi::c_void,
    port_num: i32,
}

impl PortWatch {
    /// Watches `ctx`: makes its event file non-blocking (without that only
    /// the port state is polled, and a warning says so).
    pub fn new(ctx: Arc<Context>) -> Arc<PortWatch> {
        // SAFETY: `ctx` is open (the Arc keeps it so); async_fd is a field
        // the context was created with, read once.
        let fd = unsafe { (*ctx.as_ptr()).async_fd };
        // SAFETY: fcntl on the context's own event file, which stays open
        // while the context is; only O_NONBLOCK is added.
        let events = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !events {
            log::warn!(
                "rc {}: cannot make the device's event file non-blocking ({}); a port that goes down is seen from its state only",
                ctx.name(),
                std::io::Error::last_os_error()
            );
        }
        Arc::new(PortWatch {
            ctx,
            events,
            state: Mutex::new(Watched::default()),
        })
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        self.ctx.name()
    }

    /// How many times `port` went down so far: an endpoint keeps it from
    /// its creation and hands it to [`PortWatch::check`].
    pub fn generation(&self, port: u8) -> u64 {
        let mut st = self.lock();
        st.ports.entry(port).or_default().downs
    }

    /// Why `port` is unusable for an endpoint created at `generation`:
    /// it is down now, or went down since. Looks at the device when it was
    /// not looked at in the last [`POLL_EVERY`].
    pub fn check(&self, port: u8, generation: u64, now: CoarseInstant) -> Option<String> {
        self.look(port, generation, now, false)
    }

    /// As [`PortWatch::check`], looking at the device now whenever it was
    /// looked at last: for an error completion, which may be the port's
    /// doing (rxe fails the QP's requests with "local QP operation error"
    /// once its link is down).
    pub fn check_now(&self, port: u8, generation: u64, now: CoarseInstant) -> Option<String> {
        self.look(port, generation, now, true)
    }

    fn look(&self, port: u8, generation: u64, now: CoarseInstant, force: bool) -> Option<String> {
        let mut st = self.lock();
        st.ports.entry(port).or_default();
        let due = force
            || st
                .last_poll
                .is_none_or(|t| now.saturating_duration_since(t) >= POLL_EVERY);
        if due {
            st.last_poll = Some(now);
            self.poll(&mut st);
        }
        st.verdict(port, generation)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poll(&self, st: &mut Watched) {
        if self.events {
            self.read_events(st);
        }
        let ports: Vec<u8> = st.ports.keys().copied().collect();
        for port in ports {
            st.learn(self.ctx.name(), Seen::State(port, self.query(port)));
        }
    }

    /// Reads every event waiting; the file is non-blocking.
    fn read_events(&self, st: &mut Watched) {
        let name = self.ctx.name().to_string();
        loop {
            let mut ev = RawEvent {
                element: RawElement {
                    ptr: std::ptr::null_mut(),
                },
                event_type: 0,
            };
            // SAFETY: `ctx` is open; `ev` has the layout of struct
            // ibv_async_event (a pointer-sized union, then a 32-bit enum),
            // which the call fills. The event file is non-blocking, so the
            // call returns at once when no event waits.
            let r = unsafe {
                ibv_get_async_event(
                    self.ctx.as_ptr(),
                    &mut ev as *mut RawEvent as *mut ibv_async_event,
                )
            };
            if r != 0 {
                return;
            }
            // SAFETY: for port events the union holds the port number;
            // for others it is read and not used. The union's first 4
            // bytes are initialised either way (the call wrote it).
            let port_num = unsafe { ev.element.port_num };
            let port = u8::try_from(port_num).unwrap_or(0);
            const PORT_ERR: u32 = ibv_event_type::IBV_EVENT_PORT_ERR as u32;
            const PORT_ACTIVE: u32 = ibv_event_type::IBV_EVENT_PORT_ACTIVE as u32;
            const DEVICE_FATAL: u32 = ibv_event_type::IBV_EVENT_DEVICE_FATAL as u32;
            let seen = match ev.event_type {
                PORT_ERR => Some(Seen::PortErr(port)),
                PORT_ACTIVE => Some(Seen::PortActive(port)),
                DEVICE_FATAL => Some(Seen::DeviceFatal),
                other => {
                    log::debug!("rc {name}: asynchronous event {other} ignored");
                    None
                }
            };
            if let Some(seen) = seen {
                st.learn(&name, seen);
            }
            // SAFETY: the event came from ibv_get_async_event on this
            // context and is acknowledged once.
            unsafe { ibv_ack_async_event(&mut ev as *mut RawEvent as *mut ibv_async_event) };
        }
    }

    fn query(&self, port: u8) -> Result<ibv_port_state::Type, String> {
        // SAFETY: ibv_port_attr is plain C data: all zeroes is valid.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; the exported ibv_query_port fills the
        // compat prefix of the (larger) struct, which `attr` contains.
        let r = unsafe {
            ibv_query_port(
                self.ctx.as_ptr(),
                port,
                &mut attr as *mut _ as *mut _compat_ibv_port_attr,
            )
        };
        if r != 0 {
            return Err(format!("ibv_query_port: {}", md_ib::error::errno_text(r)));
        }
        Ok(attr.state)
    }
}

/// What the device said, for [`Watched::learn`].
#[derive(Debug)]
enum Seen {
    PortErr(u8),
    PortActive(u8),
    DeviceFatal,
    /// ibv_query_port's answer for a port: its state, or the failure.
    State(u8, Result<ibv_port_state::Type, String>),
}

impl Watched {
    /// Takes in what device `dev` said.
    fn learn(&mut self, dev: &str, seen: Seen) {
        match seen {
            Seen::PortErr(port) => self.went_down(
                port,
                format!("{dev} port {port} went DOWN (IBV_EVENT_PORT_ERR)"),
            ),
            Seen::PortActive(port) => {
                if let Some(p) = self.ports.get_mut(&port) {
                    p.down = None;
                }
            }
            Seen::DeviceFatal => {
                let ports: Vec<u8> = self.ports.keys().copied().collect();
                for port in ports {
                    self.went_down(
                        port,
                        format!("{dev} port {port}: the device failed (IBV_EVENT_DEVICE_FATAL)"),
                    );
                }
            }
            Seen::State(port, Ok(ibv_port_state::IBV_PORT_ACTIVE)) => {
                self.ports.entry(port).or_default().down = None;
            }
            Seen::State(port, Ok(state)) => self.went_down(
                port,
                format!(
                    "{dev} port {port} is {} (ibv_query_port)",
                    state_name(state)
                ),
            ),
            Seen::State(port, Err(e)) => {
                self.went_down(port, format!("{dev} port {port} cannot be queried ({e})"))
            }
        }
    }

    /// Records a port going down (only if it was up: the first reason
    /// stays).
    fn went_down(&mut self, port: u8, why: String) {
        let p = self.ports.entry(port).or_default();
        if p.down.is_none() {
            p.downs += 1;
            log::debug!("rc: {why}");
            p.last = Some(why.clone());
            p.down = Some(why);
        }
    }

    /// Why `port` is unusable for an endpoint made at `generation`.
    fn verdict(&self, port: u8, generation: u64) -> Option<String> {
        let p = self.ports.get(&port)?;
        if let Some(why) = &p.down {
            return Some(why.clone());
        }
        if p.downs != generation {
            let why = p.last.as_deref().unwrap_or("went DOWN");
            return Some(format!("{why}, and came back since"));
        }
        None
    }
}

/// A port state's name as ibv_port_state_str gives it, without PORT_.
fn state_name(state: ibv_port_state::Type) -> String {
    match state {
        ibv_port_state::IBV_PORT_NOP => "NOP".into(),
        ibv_port_state::IBV_PORT_DOWN => "DOWN".into(),
        ibv_port_state::IBV_PORT_INIT => "INIT".into(),
        ibv_port_state::IBV_PORT_ARMED => "ARMED".into(),
        ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE".into(),
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER".into(),
        other => format!("in state {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(ports: &[u8]) -> Watched {
        let mut w = Watched::default();
        for p in ports {
            w.ports.insert(*p, PortState::default());
        }
        w
    }

    #[test]
    fn a_port_error_event_names_the_device_port_and_event() {
        let mut w = watched(&[1]);
        let gen = w.ports[&1].downs;
        assert_eq!(w.verdict(1, gen), None);
        w.learn("rxe1", Seen::PortErr(1));
        assert_eq!(
            w.verdict(1, gen).as_deref(),
            Some("rxe1 port 1 went DOWN (IBV_EVENT_PORT_ERR)")
        );
        // The state read after the event keeps the event's reason.
        w.learn("rxe1", Seen::State(1, Ok(ibv_port_state::IBV_PORT_DOWN)));
        assert_eq!(
            w.verdict(1, gen).as_deref(),
            Some("rxe1 port 1 went DOWN (IBV_EVENT_PORT_ERR)")
        );
    }

    #[test]
    fn a_port_that_came_back_stays_failed_for_old_endpoints_only() {
        let mut w = watched(&[1]);
        let old = w.ports[&1].downs;
        w.learn("rxe1", Seen::PortErr(1));
        w.learn("rxe1", Seen::PortActive(1));
        w.learn("rxe1", Seen::State(1, Ok(ibv_port_state::IBV_PORT_ACTIVE)));
        assert_eq!(
            w.verdict(1, old).as_deref(),
            Some("rxe1 port 1 went DOWN (IBV_EVENT_PORT_ERR), and came back since")
        );
        let new = w.ports[&1].downs;
        assert_eq!(w.verdict(1, new), None);
    }

    #[test]
    fn a_down_state_without_an_event_is_seen() {
        let mut w = watched(&[1, 2]);
        w.learn("mlx5_0", Seen::State(2, Ok(ibv_port_state::IBV_PORT_DOWN)));
        assert_eq!(w.verdict(1, 0), None);
        assert_eq!(
            w.verdict(2, 0).as_deref(),
            Some("mlx5_0 port 2 is DOWN (ibv_query_port)")
        );
        w.learn(
            "mlx5_0",
            Seen::State(1, Err("ibv_query_port: ENODEV".into())),
        );
        assert_eq!(
            w.verdict(1, 0).as_deref(),
            Some("mlx5_0 port 1 cannot be queried (ibv_query_port: ENODEV)")
        );
    }

    #[test]
    fn a_fatal_device_fails_every_port() {
        let mut w = watched(&[1, 2]);
        w.learn("mlx5_0", Seen::DeviceFatal);
        for port in [1, 2] {
            let why = w.verdict(port, 0).unwrap_or_default();
            assert!(
                why.contains(&format!("mlx5_0 port {port}")) && why.contains("DEVICE_FATAL"),
                "{why}"
            );
        }
    }

    #[test]
    fn an_event_for_an_unwatched_port_is_kept_for_later() {
        let mut w = watched(&[]);
        w.learn("rxe0", Seen::PortErr(1));
        assert!(w.verdict(1, 0).is_some());
    }
}
