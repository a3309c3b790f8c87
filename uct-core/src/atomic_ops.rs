//! Atomic operations on a word of host memory, for the transports that
//! execute them with the CPU (self, posix, tcp's target side).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::ep::{AtomicValue, FetchOp};
use crate::error::{Result, UctError};

/// Applies `op` to the word at `p` and returns its old value.
///
/// # Safety
/// `p` must point to live memory of `op.width()` bytes, aligned to that
/// width, that is only accessed atomically while this runs.
pub unsafe fn fetch_at(p: *mut u8, op: FetchOp) -> Result<u64> {
    use AtomicValue::{U32, U64};
    // SAFETY: the caller guarantees `p` is live, 4-byte aligned for a
    // 32-bit op and accessed only atomically; only called for U32 ops.
    let a32 = || unsafe { AtomicU32::from_ptr(p as *mut u32) };
    // SAFETY: as above, 8 bytes and 8-byte aligned for a 64-bit op.
    let a64 = || unsafe { AtomicU64::from_ptr(p as *mut u64) };
    let sc = Ordering::SeqCst;
    Ok(match op {
        FetchOp::Add(U32(v)) => a32().fetch_add(v, sc) as u64,
        FetchOp::Add(U64(v)) => a64().fetch_add(v, sc),
        FetchOp::Swap(U32(v)) => a32().swap(v, sc) as u64,
        FetchOp::Swap(U64(v)) => a64().swap(v, sc),
        FetchOp::CompareSwap {
            compare: U32(c),
            swap: U32(s),
        } => match a32().compare_exchange(c, s, sc, sc) {
            Ok(v) | Err(v) => v as u64,
        },
        FetchOp::CompareSwap {
            compare: U64(c),
            swap: U64(s),
        } => match a64().compare_exchange(c, s, sc, sc) {
            Ok(v) | Err(v) => v,
        },
        FetchOp::CompareSwap { .. } => {
            return Err(UctError::InvalidParam(
                "compare and swap values must have the same width".into(),
            ))
        }
    })
}

/// Checks that `addr` is aligned for an atomic of `width` bytes.
pub fn check_aligned(addr: u64, width: usize) -> Result<()> {
    if addr.is_multiple_of(width as u64) {
        Ok(())
    } else {
        Err(UctError::Misaligned {
            addr,
            align: width as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_on_both_widths() {
        let mut w = 5u64;
        let p = &mut w as *mut u64 as *mut u8;
        // SAFETY: a live aligned local word.
        unsafe {
            assert_eq!(fetch_at(p, FetchOp::Add(AtomicValue::U64(2))).unwrap(), 5);
            assert_eq!(fetch_at(p, FetchOp::Swap(AtomicValue::U64(9))).unwrap(), 7);
            let miss = FetchOp::CompareSwap {
                compare: AtomicValue::U64(1),
                swap: AtomicValue::U64(3),
            };
            assert_eq!(fetch_at(p, miss).unwrap(), 9);
            let mixed = FetchOp::CompareSwap {
                compare: AtomicValue::U32(1),
                swap: AtomicValue::U64(3),
            };
            assert!(fetch_at(p, mixed).is_err());
        }
        assert_eq!(w, 9);
        let mut v = u32::MAX;
        // SAFETY: as above, 4 bytes.
        let old = unsafe {
            fetch_at(
                &mut v as *mut u32 as *mut u8,
                FetchOp::Add(AtomicValue::U32(2)),
            )
        }
        .unwrap();
        assert_eq!((old, v), (u32::MAX as u64, 1));
        assert!(check_aligned(12, 8).is_err() && check_aligned(16, 8).is_ok());
    }
}
