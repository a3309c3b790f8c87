//! Views: bounds-checked ranges of registered memory, what writes send
//! from and reads land in.

use crate::memory::Memory;

/// A bounds-checked range of a [`Memory`]: what `write` sends from and
/// `read` lands in. Cheap to clone; keeps the memory registered.
#[derive(Clone, Debug)]
pub struct View {
    pub(crate) mem: Memory,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl View {
    /// The address of its first byte.
    pub fn data(&self) -> u64 {
        self.mem.addr() + self.offset as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its offset in the memory.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The memory it is cut from.
    pub fn memory(&self) -> &Memory {
        &self.mem
    }
}
