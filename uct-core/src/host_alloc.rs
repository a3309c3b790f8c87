//! Host memory for memory domains to hand out: page-aligned and zeroed;
//! from 2 MiB on, mapped with transparent huge pages advised, so that the
//! kernel walks (and NICs and process_vm_* pin) few large pages instead of
//! many small ones.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::error::{Result, UctError};

const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;

/// Where the buffer came from, which says how to free it.
enum Provenance {
    /// The global allocator, with this layout.
    Heap(Layout),
    /// The whole mapping (start, length), of which the buffer is a part.
    Mmap(NonNull<u8>, usize),
}

/// An owned, zeroed, page-aligned host buffer.
pub struct HostAlloc {
    ptr: NonNull<u8>,
    len: usize,
    provenance: Provenance,
}

// SAFETY: the buffer is owned exclusively; access to its bytes is the
// caller's protocol (memory handles).
unsafe impl Send for HostAlloc {}
// SAFETY: `&HostAlloc` only hands out the pointer and the length; it never
// reads or writes the bytes itself, so sharing it cannot race. Whoever
// dereferences the pointer follows the memory handles' contract.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `len` bytes of page-aligned host memory (huge pages where the size warrants and the system allows).
    pub fn new(len: usize) -> Result<HostAlloc> {
        if len >= HUGE {
            if let Some(a) = Self::huge(len) {
                return Ok(a);
            }
        }
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| UctError::NoMemory(format!("allocating {len} bytes of host memory")))?;
        Ok(HostAlloc {
            ptr,
            len,
            provenance: Provenance::Heap(layout),
        })
    }

    /// A 2 MiB-aligned anonymous mapping with huge pages advised; None if
    /// the mapping fails (the heap is tried instead).
    fn huge(len: usize) -> Option<HostAlloc> {
        let map_len = len.checked_add(HUGE)?;
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = NonNull::new(p as *mut u8)?;
        let aligned = (p as usize).next_multiple_of(HUGE);
        // SAFETY: `aligned` lies within the mapping: at most HUGE - 1 past
        // its start, and len bytes after it fit in map_len.
        let ptr = unsafe { NonNull::new_unchecked(aligned as *mut u8) };
        // Advice only: without THP support this changes nothing.
        // SAFETY: the range is inside our mapping.
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                len.next_multiple_of(HUGE),
                libc::MADV_HUGEPAGE,
            )
        };
        Some(HostAlloc {
            ptr,
            len,
            provenance: Provenance::Mmap(start, map_len),
        })
    }

    /// Start of the allocation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        match self.provenance {
            // SAFETY: allocated in `new` with this layout, freed once.
            Provenance::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: unmapping exactly the mapping made in `huge`, once.
            Provenance::Mmap(start, len) => unsafe {
                libc::munmap(start.as_ptr() as *mut libc::c_void, len);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_huge_are_aligned_and_zeroed() {
        for len in [1usize, 4096, 100_000, 3 << 20] {
            let a = HostAlloc::new(len).unwrap();
            assert_eq!(a.as_ptr() as usize % PAGE, 0);
            if len >= HUGE {
                assert_eq!(a.as_ptr() as usize % HUGE, 0);
            }
            // SAFETY: `a` owns `len` zero-initialised bytes at `as_ptr()`,
            // alive until `a` drops, and no other reference to them exists.
            let s = unsafe { std::slice::from_raw_parts_mut(a.as_ptr(), len) };
            assert!(s.iter().all(|&b| b == 0));
            s.fill(7);
        }
    }
}
