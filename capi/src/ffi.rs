//! The caller's pointers: out-parameters, strings in, and strings handed
//! out (which C frees with `uct_rs_string_free`, checked against the
//! strings this library issued).

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;
use std::sync::LazyLock;

use dashmap::DashMap;

use crate::error::CapiError;

/// An out-parameter, checked before any work is done, so that a call
/// whose result has nowhere to go changes nothing.
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks `ptr` (parameter `param`): not NULL and aligned for `T`.
    ///
    /// # Safety
    /// `ptr` is NULL or valid for a write of a `T` until [`Out::set`].
    pub(crate) unsafe fn new(ptr: *mut T, param: &'static str) -> Result<Out<T>, CapiError> {
        let ptr = NonNull::new(ptr).ok_or(CapiError::Null {
            param,
            wanted: "a pointer to where the result goes",
        })?;
        if !ptr.as_ptr().is_aligned() {
            return Err(CapiError::Argument(format!(
                "{param} ({:p}) is not aligned for what it points to; pass the address of a variable of that type",
                ptr.as_ptr()
            )));
        }
        Ok(Out(ptr))
    }

    /// Writes the result.
    pub(crate) fn set(self, value: T) {
        // SAFETY: `new`'s caller promised the pointer valid for this
        // write; it is not NULL and is aligned.
        unsafe { self.0.as_ptr().write(value) }
    }
}

/// The UTF-8 string at `ptr` (parameter `param`).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid
/// and unchanged for `'a`.
pub(crate) unsafe fn text<'a>(
    ptr: *const c_char,
    param: &'static str,
) -> Result<&'a str, CapiError> {
    // SAFETY: as the caller promised.
    unsafe { text_or_null(ptr, param) }?.ok_or(CapiError::Null {
        param,
        wanted: "a NUL-terminated string",
    })
}

/// As [`text`], with NULL read as "not given".
///
/// # Safety
/// As [`text`].
pub(crate) unsafe fn text_or_null<'a>(
    ptr: *const c_char,
    param: &'static str,
) -> Result<Option<&'a str>, CapiError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL, and NUL-terminated and alive for 'a as the caller
    // promised.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map(Some).map_err(|e| {
        CapiError::Argument(format!(
            "{param} is not UTF-8 ({e}); pass the string as uct-rs gave it, or plain ASCII"
        ))
    })
}

/// Addresses of the strings handed out and not yet freed.
static ISSUED: LazyLock<DashMap<usize, ()>> = LazyLock::new(DashMap::new);

/// `s` as a C string the caller owns and frees with `uct_rs_string_free`.
pub(crate) fn give_string(s: String) -> Result<*mut c_char, CapiError> {
    let c = CString::new(s).map_err(|e| {
        CapiError::Internal(format!(
            "a string to hand out holds a NUL at byte {}",
            e.nul_position()
        ))
    })?;
    let ptr = c.into_raw();
    ISSUED.insert(ptr.addr(), ());
    Ok(ptr)
}

/// Frees a string [`give_string`] handed out; anything else is refused.
/// Known by address only: a stale pointer whose address a newer string
/// reuses frees that string (the C doc says so).
pub(crate) fn take_string(ptr: *mut c_char) -> Result<(), CapiError> {
    if ptr.is_null() {
        return Err(CapiError::Null {
            param: "string",
            wanted: "a string that a uct-rs function returned",
        });
    }
    if ISSUED.remove(&ptr.addr()).is_none() {
        return Err(CapiError::InvalidHandle(format!(
            "string {ptr:p} is not one uct-rs handed out, or was freed already; free only what uct-rs returned, once, with uct_rs_string_free"
        )));
    }
    // SAFETY: the address was made by CString::into_raw in give_string and
    // taken out of the table just now, so it is freed here once.
    drop(unsafe { CString::from_raw(ptr) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_handed_out_are_freed_once() {
        let s = give_string("uct://v1/x".into()).unwrap();
        take_string(s).unwrap();
        assert!(matches!(take_string(s), Err(CapiError::InvalidHandle(_))));
        let mut own = *b"mine\0";
        assert!(take_string(own.as_mut_ptr().cast()).is_err());
        assert!(take_string(std::ptr::null_mut()).is_err());
    }

    #[test]
    fn out_and_text_check_their_pointers() {
        // SAFETY: NULL is allowed and refused.
        assert!(unsafe { Out::<u64>::new(std::ptr::null_mut(), "out") }.is_err());
        let mut v = 0u64;
        // SAFETY: `v` is a valid, aligned u64.
        unsafe { Out::new(&mut v, "out") }.unwrap().set(5);
        assert_eq!(v, 5);
        // SAFETY: static NUL-terminated strings, and NULL.
        unsafe {
            assert_eq!(text(c"tcp".as_ptr(), "t").unwrap(), "tcp");
            assert!(text(std::ptr::null(), "t").is_err());
            assert_eq!(text_or_null(std::ptr::null(), "t").unwrap(), None);
            assert!(text(c"\xff".as_ptr(), "t").is_err());
        }
    }
}
