//! `cudaprobe_detect`: what memory a pointer is, as
//! [`uct_transfer::Memory::detect`] (and so `Memory::register`) sees it.
//!
//! A device pointer means something only in the process that allocated
//! it, so the check "a pointer from PyTorch is detected as cuda memory of
//! cuda0" runs in Python's process: `scripts/cuda-h100` loads this library
//! with ctypes and passes `tensor.data_ptr()`. The cuda memory domains
//! come from the module `libuct_cuda.so`, found through `UCT_MODULE_DIR`.

use std::ffi::{c_char, c_int};

/// Writes `"<memory type> <memory domain or ->"` (e.g. `cuda cuda0`, or
/// `host -`) for `[ptr, ptr + len)` into `out` as a NUL-terminated string,
/// cut to `out_len` bytes, and returns 0; on failure writes
/// `error <reason>` and returns 1.
///
/// # Safety
/// `out` points to `out_len` writable bytes (or `out_len` is 0).
#[no_mangle]
pub unsafe extern "C" fn cudaprobe_detect(
    ptr: u64,
    len: u64,
    out: *mut c_char,
    out_len: usize,
) -> c_int {
    let answer = std::panic::catch_unwind(|| uct_transfer::Memory::detect(ptr, len as usize));
    let (rc, text) = match answer {
        Ok(Ok((mem_type, md))) => (0, format!("{mem_type} {}", md.as_deref().unwrap_or("-"))),
        Ok(Err(e)) => (1, format!("error {e}")),
        Err(_) => (1, "error: detection panicked".to_string()),
    };
    if out.is_null() || out_len == 0 {
        return rc;
    }
    let n = text.len().min(out_len - 1);
    // SAFETY: the caller gives `out_len` writable bytes at `out`; n + 1 of
    // them are written, n <= out_len - 1.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), n);
        *out.add(n) = 0;
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_pointer_is_host_memory_here() {
        let data = vec![1u8; 4096];
        let mut out = [0 as c_char; 64];
        // SAFETY: `out` has 64 writable bytes.
        let rc = unsafe { cudaprobe_detect(data.as_ptr() as u64, 4096, out.as_mut_ptr(), 64) };
        // SAFETY: the call wrote a NUL-terminated string into `out`.
        let text = unsafe { std::ffi::CStr::from_ptr(out.as_ptr()) }.to_string_lossy();
        assert_eq!((rc, text.as_ref()), (0, "host -"));
        let mut short = [0x7f as c_char; 3];
        // SAFETY: `short` has 3 writable bytes.
        unsafe { cudaprobe_detect(data.as_ptr() as u64, 1, short.as_mut_ptr(), 3) };
        assert_eq!(short, [b'h' as c_char, b'o' as c_char, 0]);
    }
}
