//! `Memory` (registered memory: the application's buffer in place, or
//! allocated), `View` (a range of it) and `RemoteBuffer` (a peer's memory,
//! from its key string).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use uct_transfer::{Access, Memory, MemoryType, RemoteBuffer, View};

use crate::errors::{self, IntoPy};
use crate::hold::{self, Held, Hold};
use crate::transport::PyTransport;

fn access_of(read_only: bool) -> Access {
    if read_only {
        Access::remote_read_only()
    } else {
        Access::all()
    }
}

/// A memory type from its name (host, gaudi, cuda, dmabuf).
pub fn mem_type_of(name: &str) -> PyResult<MemoryType> {
    MemoryType::parse(name).map_err(|e| errors::input(e.to_string()))
}

/// Whether `obj` is a torch tensor: an instance of the `torch.Tensor` of
/// the torch this interpreter imported (torch is not a dependency). Never
/// duck-typed: an object that only looks like one would hand us a pointer
/// with no buffer behind it.
fn is_tensor(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let modules = obj.py().import("sys")?.getattr("modules")?;
    let Ok(torch) = modules.get_item("torch") else {
        return Ok(false);
    };
    let Ok(tensor_type) = torch.getattr("Tensor") else {
        return Ok(false);
    };
    obj.is_instance(&tensor_type)
}

/// The address and length of a torch tensor's bytes, and what keeps them:
/// a CPU tensor goes through its NumPy view (`tensor.detach().numpy()`,
/// which shares its memory), so that the buffer protocol's checks
/// (writable, contiguous) and hold apply as to any buffer; the view keeps
/// the tensor alive. A GPU tensor's memory needs a GPU memory domain.
fn tensor(obj: &Bound<'_, PyAny>) -> PyResult<(*mut u8, usize, Hold)> {
    let device = obj.getattr("device")?;
    let device_type: String = device.getattr("type")?.extract()?;
    if device_type != "cpu" {
        return Err(errors::input(format!(
            "a torch tensor on {} cannot be registered by this build (only CPU tensors); copy it to the CPU (tensor.cpu()), or allocate device memory with Memory.alloc(transport, size, mem_type=...)",
            device.str()?
        )));
    }
    if !obj.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(errors::input(
            "this torch tensor is not contiguous; register tensor.contiguous()",
        ));
    }
    let array = obj.call_method0("detach")?.call_method0("numpy")?;
    hold::export(&array)
}

/// The transfer API's advice in Python's words (`Memory.alloc`, not
/// `Memory::alloc`; a keyword argument, not a builder call).
fn in_python_terms(e: PyErr) -> PyErr {
    Python::attach(|py| {
        let value = e.value(py);
        let Ok(text) = value.str().map(|s| s.to_string()) else {
            return e;
        };
        let fixed = text
            .replace("Memory::alloc", "uct_rs.Memory.alloc")
            .replace(
                "build the Transport with .transport(\"cma\")",
                "create the Transport with transport=\"cma\"",
            )
            .replace(".transport(\"tcp\")", "\"tcp\"");
        if fixed == text {
            return e;
        }
        PyErr::from_type(value.get_type(), fixed)
    })
}

/// Memory registered with a Transport: a writable buffer of the
/// application, registered in place (no copy), or memory the transport
/// allocated (`Memory.alloc`). Host memory is itself a writable buffer:
/// `numpy.frombuffer(mem, dtype=...)` or `memoryview(mem)` see its bytes.
#[pyclass(frozen, name = "Memory", module = "uct_rs")]
pub struct PyMemory {
    pub mem: Memory,
    /// The application's memory, where it is: kept while this Memory, a
    /// View of it, or an operation using it lives.
    pub hold: Option<Held>,
}

#[pymethods]
impl PyMemory {
    /// Registers `buffer` with `transport` in place: a bytearray, a
    /// writable memoryview, a NumPy array (any writable, contiguous buffer)
    /// or a CPU torch tensor (an instance of torch.Tensor, through its
    /// NumPy view). Its bytes are not copied; the buffer is held (a buffer
    /// export, so a bytearray or array cannot be resized) while this
    /// Memory, its views or operations on them live. Do not resize_ or
    /// set_ a registered tensor meanwhile: torch does not stop it.
    /// `read_only=True`: peers may read it, not write it. posix cannot
    /// register memory it did not allocate: use Memory.alloc there.
    #[new]
    #[pyo3(signature = (transport, buffer, *, read_only=false))]
    fn new(
        py: Python<'_>,
        transport: &PyTransport,
        buffer: &Bound<'_, PyAny>,
        read_only: bool,
    ) -> PyResult<Self> {
        let t = transport.get()?;
        let (ptr, len, hold) = if is_tensor(buffer)? {
            tensor(buffer)?
        } else {
            hold::export(buffer)?
        };
        let hold = Arc::new(hold);
        let addr = ptr as usize;
        let mem = py.detach(move || {
            // SAFETY: `hold` (the buffer export, which also stops a resize,
            // or the tensor) is kept by this Memory, by every View cut from
            // it and by every operation posted from those until the
            // operation resolved (pending.rs; an orphaned one by the
            // dispatcher), so the bytes outlive every use of the
            // registration; the uct Memory itself lives no longer than
            // they do, except inside operations, which hold the hold.
            unsafe { Memory::register_raw(&t, addr as *mut u8, len, access_of(read_only)) }
        });
        Ok(PyMemory {
            mem: mem.map_err(|e| in_python_terms(errors::to_py(e)))?,
            hold: Some(hold),
        })
    }

    /// Allocates `size` bytes of `mem_type` memory (host, or a device's:
    /// gaudi) with `transport`, which peers may read and write
    /// (`read_only=True`: only read). Over posix this is the way to share
    /// memory; host memory is a buffer NumPy can view.
    #[staticmethod]
    #[pyo3(signature = (transport, size, *, mem_type="host", read_only=false))]
    fn alloc(
        py: Python<'_>,
        transport: &PyTransport,
        size: usize,
        mem_type: &str,
        read_only: bool,
    ) -> PyResult<Self> {
        let t = transport.get()?;
        let mem_type = mem_type_of(mem_type)?;
        let mem = py
            .detach(move || Memory::alloc_with(&t, mem_type, size, access_of(read_only)))
            .py_err()?;
        Ok(PyMemory { mem, hold: None })
    }

    /// A View of `length` bytes from `offset` (to the end by default).
    #[pyo3(signature = (offset=0, length=None))]
    fn view(&self, offset: usize, length: Option<usize>) -> PyResult<PyView> {
        let length = match length {
            Some(l) => l,
            None => self.mem.len().checked_sub(offset).ok_or_else(|| {
                errors::input(format!(
                    "view offset {offset} is out of range: the memory has {} bytes",
                    self.mem.len()
                ))
            })?,
        };
        Ok(PyView {
            view: self.mem.view(offset, length).py_err()?,
            hold: self.hold.clone(),
        })
    }

    /// The printable key a peer passes to RemoteBuffer (or straight to
    /// write and read) to reach this memory.
    fn remote_key(&self) -> String {
        self.mem.remote_key()
    }

    /// Its length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }

    fn __len__(&self) -> usize {
        self.mem.len()
    }

    /// The address of its first byte (a device address for device memory).
    #[getter]
    fn address(&self) -> u64 {
        self.mem.addr()
    }

    /// Its memory type: host, gaudi, ...
    #[getter]
    fn mem_type(&self) -> &'static str {
        self.mem.mem_type().name()
    }

    /// Whether peers may only read it.
    #[getter]
    fn read_only(&self) -> bool {
        !self.mem.access().contains(Access::REMOTE_WRITE)
    }

    fn __repr__(&self) -> String {
        format!(
            "Memory(nbytes={}, mem_type='{}', {}{})",
            self.mem.len(),
            self.mem.mem_type().name(),
            if self.read_only() {
                "read-only"
            } else {
                "read-write"
            },
            if self.hold.is_some() {
                ", registered in place"
            } else {
                ", allocated"
            }
        )
    }

    /// # Safety
    /// `view` is the Py_buffer CPython hands an exporter.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (addr, len, mem_type) = {
            let m = &slf.get().mem;
            (m.addr(), m.len(), m.mem_type())
        };
        if !mem_type.is_host_accessible() {
            return Err(PyBufferError::new_err(format!(
                "{} memory is not CPU-accessible and has no buffer; move it through host memory with the transport",
                mem_type.name()
            )));
        }
        let len = isize::try_from(len)
            .map_err(|_| PyBufferError::new_err("the memory is too large for a buffer"))?;
        // SAFETY: `view` is CPython's (the caller's contract); the bytes
        // are host memory of `len` bytes that live as long as this Memory,
        // which the view references (FillInfo takes a reference to `slf`).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), addr as *mut c_void, len, 0, flags)
        };
        if rc < 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}

/// A range of a Memory: what a write sends from and a read lands in.
#[pyclass(frozen, name = "View", module = "uct_rs")]
pub struct PyView {
    pub view: View,
    pub hold: Option<Held>,
}

#[pymethods]
impl PyView {
    /// Its offset in the memory.
    #[getter]
    fn offset(&self) -> usize {
        self.view.offset()
    }

    /// Its length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.len()
    }

    fn __len__(&self) -> usize {
        self.view.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "View(offset={}, nbytes={})",
            self.view.offset(),
            self.view.len()
        )
    }
}

/// A peer's memory, read from the key its Memory.remote_key() returned.
#[pyclass(frozen, name = "RemoteBuffer", module = "uct_rs")]
pub struct PyRemoteBuffer {
    pub remote: RemoteBuffer,
}

#[pymethods]
impl PyRemoteBuffer {
    /// Reads a remote key; a key that is not one raises ValueError
    /// (uct_rs.InputError) saying what is wrong with it.
    #[new]
    fn new(key: &str) -> PyResult<Self> {
        Ok(PyRemoteBuffer {
            remote: RemoteBuffer::parse(key).py_err()?,
        })
    }

    /// The `length` bytes from `offset` of it (to the end by default).
    #[pyo3(signature = (offset=0, length=None))]
    fn slice(&self, offset: usize, length: Option<usize>) -> PyResult<Self> {
        let length = match length {
            Some(l) => l,
            None => self.remote.len().checked_sub(offset).ok_or_else(|| {
                errors::input(format!(
                    "remote slice offset {offset} is out of range: the remote buffer has {} bytes",
                    self.remote.len()
                ))
            })?,
        };
        Ok(PyRemoteBuffer {
            remote: self.remote.slice(offset, length).py_err()?,
        })
    }

    /// Its key string (of the whole remote buffer, not of a slice).
    #[getter]
    fn key(&self) -> String {
        self.remote.key().to_string()
    }

    /// Its length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.remote.len()
    }

    fn __len__(&self) -> usize {
        self.remote.len()
    }

    /// Whether the peer lets us write it (or only read).
    #[getter]
    fn writable(&self) -> bool {
        self.remote.access().contains(Access::REMOTE_WRITE)
    }

    /// The peer's memory type.
    #[getter]
    fn mem_type(&self) -> &'static str {
        self.remote.mem_type().name()
    }

    fn __str__(&self) -> String {
        self.remote.key().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "RemoteBuffer(nbytes={}, mem_type='{}', {})",
            self.remote.len(),
            self.remote.mem_type().name(),
            if self.writable() {
                "writable"
            } else {
                "read-only"
            }
        )
    }
}
