//! `Transport`: bind, connect, write, read, flush, wait for notified
//! writes; the Builder's settings as keyword arguments.

use std::sync::{Arc, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use uct_transfer::{Progress, RemoteBuffer, Transport, View};

use crate::errors::{self, IntoPy, Kind};
use crate::hold::Held;
use crate::memory::{mem_type_of, PyMemory, PyRemoteBuffer, PyView};
use crate::pending::{next_write, wait_for, BoxFuture, Inner, Outcome, PyPending, What};

/// One side of a connection: bind() gives a URL for the peer, connect()
/// takes the peer's. Both sides bind and both connect. Keyword arguments
/// are the settings: `transport` ("auto", "posix", "tcp", "rc", "cma",
/// "self"), `device` ("lo" for tcp on loopback), `memory_types` (["host"]
/// by default), `max_in_flight` (operations in flight before the next one
/// waits), `progress` ("thread": a thread the Transport owns drives it;
/// "manual": the caller's wait() and progress() do), and
/// `max_notification_backlog`.
#[pyclass(frozen, name = "Transport", module = "uct_rs")]
pub struct PyTransport {
    /// None once closed.
    inner: RwLock<Option<Arc<Transport>>>,
}

impl PyTransport {
    /// The open Transport, or uct_rs.Error if it was closed.
    pub fn get(&self) -> PyResult<Arc<Transport>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                errors::raise(
                    Kind::Other,
                    "the transport is closed; create another Transport",
                )
            })
    }
}

/// The local side of an operation: a View, or a whole Memory.
fn local_of(obj: &Bound<'_, PyAny>) -> PyResult<(View, Option<Held>)> {
    if let Ok(v) = obj.cast::<PyView>() {
        let v = v.get();
        return Ok((v.view.clone(), v.hold.clone()));
    }
    if let Ok(m) = obj.cast::<PyMemory>() {
        let m = m.get();
        return Ok((m.mem.whole(), m.hold.clone()));
    }
    Err(errors::input(format!(
        "the local side must be a uct_rs.View or a uct_rs.Memory, not a {}",
        obj.get_type().name()?
    )))
}

/// The remote side of an operation: a RemoteBuffer, or a key string.
fn remote_of(obj: &Bound<'_, PyAny>) -> PyResult<RemoteBuffer> {
    if let Ok(r) = obj.cast::<PyRemoteBuffer>() {
        return Ok(r.get().remote.clone());
    }
    if let Ok(key) = obj.extract::<&str>() {
        return RemoteBuffer::parse(key).py_err();
    }
    Err(errors::input(format!(
        "the remote side must be a uct_rs.RemoteBuffer or a remote key string, not a {}",
        obj.get_type().name()?
    )))
}

fn progress_of(name: &str) -> PyResult<Progress> {
    match name {
        "thread" => Ok(Progress::Thread),
        "manual" => Ok(Progress::Manual),
        other => Err(errors::input(format!(
            "progress {other:?} is not known; use \"thread\" (the default) or \"manual\""
        ))),
    }
}

fn positive(what: &str, n: Option<usize>) -> PyResult<Option<usize>> {
    match n {
        Some(0) => Err(errors::input(format!("{what} of 0; give at least 1"))),
        n => Ok(n),
    }
}

/// A Pending over `fut`, which uses `holds` of the application's memory.
fn pending(
    t: &Arc<Transport>,
    fut: uct_transfer::OpFuture,
    holds: Vec<Held>,
    what: &'static str,
) -> PyPending {
    let fut: BoxFuture = Box::pin(async move { fut.await.map(|()| Outcome::Done) });
    PyPending {
        inner: Inner::new(fut, t, holds, What::Op(what)),
    }
}

#[pymethods]
impl PyTransport {
    /// Opens the candidate transports (see the class documentation for the
    /// settings).
    #[new]
    #[pyo3(signature = (transport="auto", *, device=None, memory_types=None, max_in_flight=None, progress="thread", max_notification_backlog=None))]
    fn new(
        py: Python<'_>,
        transport: &str,
        device: Option<&str>,
        memory_types: Option<Vec<String>>,
        max_in_flight: Option<usize>,
        progress: &str,
        max_notification_backlog: Option<usize>,
    ) -> PyResult<Self> {
        let mut b = Transport::builder()
            .transport(transport)
            .progress(progress_of(progress)?);
        if let Some(d) = device {
            b = b.device(d);
        }
        if let Some(types) = memory_types {
            let types = types
                .iter()
                .map(|t| mem_type_of(t))
                .collect::<PyResult<Vec<_>>>()?;
            b = b.memory_types(&types);
        }
        if let Some(n) = positive("max_in_flight", max_in_flight)? {
            b = b.max_in_flight(n);
        }
        if let Some(n) = positive("max_notification_backlog", max_notification_backlog)? {
            b = b.max_notification_backlog(n);
        }
        let t = py.detach(move || b.build()).py_err()?;
        Ok(PyTransport {
            inner: RwLock::new(Some(Arc::new(t))),
        })
    }

    /// Whether this machine can connect two processes at all (a transport
    /// other than self is usable here).
    #[staticmethod]
    fn supported(py: Python<'_>) -> bool {
        py.detach(Transport::supported)
    }

    /// Every transport this process knows, usable or not, with the reason
    /// for those that are not.
    #[staticmethod]
    fn probe(py: Python<'_>) -> Vec<PyProbe> {
        py.detach(Transport::probe)
            .into_iter()
            .map(|p| PyProbe { probe: p })
            .collect()
    }

    /// The URL the peer passes to connect(); the same on every call.
    fn bind(&self, py: Python<'_>) -> PyResult<String> {
        let t = self.get()?;
        py.detach(move || t.bind()).py_err()
    }

    /// Connects to the peer whose bind() returned `url`. A URL that is not
    /// one raises ValueError (uct_rs.InputError); a peer that cannot be
    /// reached, uct_rs.PeerError.
    fn connect(&self, py: Python<'_>, url: &str) -> PyResult<()> {
        let t = self.get()?;
        let url = url.to_string();
        py.detach(move || t.connect(&url)).py_err()
    }

    /// Whether connect() succeeded.
    #[getter]
    fn connected(&self) -> PyResult<bool> {
        Ok(self.get()?.connected())
    }

    /// The transport connected over (None before connect).
    #[getter]
    fn transport_name(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.transport_name())
    }

    /// What it has done so far: writes, bytes, reads, notifications.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.get()?.stats();
        let d = PyDict::new(py);
        d.set_item("writes", s.writes)?;
        d.set_item("bytes_written", s.bytes_written)?;
        d.set_item("reads", s.reads)?;
        d.set_item(
            "notifications_sent_by_immediate",
            s.notifications_sent_by_immediate,
        )?;
        d.set_item(
            "notifications_sent_by_message",
            s.notifications_sent_by_message,
        )?;
        d.set_item(
            "notifications_received_by_immediate",
            s.notifications_received_by_immediate,
        )?;
        d.set_item(
            "notifications_received_by_message",
            s.notifications_received_by_message,
        )?;
        Ok(d)
    }

    /// Writes `local` (a View or a Memory) to `remote` (a RemoteBuffer or
    /// a key string) of the same length, zero-copy. With `notify=True` (or
    /// a `tag`), the peer's next wait_for_write returns once the bytes
    /// have landed. Returns a Pending: wait() on it or await it.
    #[pyo3(signature = (local, remote, *, notify=false, tag=None))]
    fn write(
        &self,
        py: Python<'_>,
        local: &Bound<'_, PyAny>,
        remote: &Bound<'_, PyAny>,
        notify: bool,
        tag: Option<u32>,
    ) -> PyResult<PyPending> {
        let t = self.get()?;
        let (view, hold) = local_of(local)?;
        let remote = remote_of(remote)?;
        let t2 = t.clone();
        let fut = py.detach(move || match tag {
            Some(tag) => t2.write_tagged(&view, &remote, tag),
            None => t2.write(&view, &remote, notify),
        });
        Ok(pending(&t, fut, hold.into_iter().collect(), "write"))
    }

    /// Reads `remote` (a RemoteBuffer or a key string) into `local` (a
    /// View or a Memory) of the same length. Returns a Pending.
    fn read(
        &self,
        py: Python<'_>,
        local: &Bound<'_, PyAny>,
        remote: &Bound<'_, PyAny>,
    ) -> PyResult<PyPending> {
        let t = self.get()?;
        let (view, hold) = local_of(local)?;
        let remote = remote_of(remote)?;
        let t2 = t.clone();
        let fut = py.detach(move || t2.read(&view, &remote));
        Ok(pending(&t, fut, hold.into_iter().collect(), "read"))
    }

    /// A Pending that completes once every operation posted before it has
    /// completed at the peer.
    fn flush(&self, py: Python<'_>) -> PyResult<PyPending> {
        let t = self.get()?;
        let t2 = t.clone();
        let fut = py.detach(move || t2.flush());
        Ok(pending(&t, fut, Vec::new(), "flush"))
    }

    /// Blocks (the GIL released) until the peer's next notified write has
    /// landed, at most `timeout` seconds (None: for ever), and returns its
    /// Notification. Raises uct_rs.Timeout when the time runs out (the
    /// next call waits for the same notification), uct_rs.PeerError when
    /// the peer died.
    #[pyo3(signature = (timeout=None))]
    fn wait_for_write(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let p = self.wait_for_write_async()?;
        wait_for(py, &p.inner, timeout)
    }

    /// The peer's next notified write, as a Pending to await (or wait()
    /// on): its result is a Notification.
    fn wait_for_write_async(&self) -> PyResult<PyPending> {
        let t = self.get()?;
        Ok(PyPending {
            inner: Inner::new(next_write(&t), &t, Vec::new(), What::Wait),
        })
    }

    /// Drives progress once; returns the events handled. Needed only with
    /// progress="manual", and then only for awaits (wait() drives it).
    fn progress(&self, py: Python<'_>) -> PyResult<usize> {
        let t = self.get()?;
        Ok(py.detach(move || t.progress()))
    }

    /// Closes the transport: its pending operations and waits end with
    /// uct_rs.Error; later calls raise it. The transport closes once the
    /// last operation that uses it is done with it.
    fn close(&self, py: Python<'_>) {
        let t = self.inner.write().unwrap_or_else(|p| p.into_inner()).take();
        // Dropping it joins its progress thread: not under the GIL.
        py.detach(move || drop(t));
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(t) => match t.transport_name() {
                Some(name) => format!("<Transport connected over {name}>"),
                None => "<Transport not connected>".to_string(),
            },
            Err(_) => "<Transport closed>".to_string(),
        }
    }
}

/// What probe() finds for one transport: its device where it is usable,
/// the reason where it is not.
#[pyclass(frozen, name = "Probe", module = "uct_rs")]
pub struct PyProbe {
    probe: uct_transfer::Probe,
}

#[pymethods]
impl PyProbe {
    /// The transport's name.
    #[getter]
    fn transport(&self) -> &str {
        &self.probe.transport
    }

    /// Its device, where it has one here.
    #[getter]
    fn device(&self) -> Option<&str> {
        self.probe.device.as_deref()
    }

    /// Whether it can be used.
    #[getter]
    fn usable(&self) -> bool {
        self.probe.usable
    }

    /// Why not, where it cannot.
    #[getter]
    fn reason(&self) -> Option<&str> {
        self.probe.reason.as_deref()
    }

    fn __repr__(&self) -> String {
        match (&self.probe.device, &self.probe.reason) {
            (Some(d), _) if self.probe.usable => {
                format!(
                    "Probe(transport='{}', device='{d}', usable=True)",
                    self.probe.transport
                )
            }
            (_, reason) => format!(
                "Probe(transport='{}', usable=False, reason={:?})",
                self.probe.transport,
                reason.as_deref().unwrap_or("unknown")
            ),
        }
    }
}
