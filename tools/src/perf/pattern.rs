//! The validation pattern: the bytes each iteration sends, different for
//! every iteration and every message size, and the check of what arrived.
//! perftest and dmabuf-demo both use it.

/// Fills `buf` with the bytes of iteration `iter` for a message of
/// `buf.len()` bytes.
pub fn pattern_into(buf: &mut [u8], iter: u64) {
    let mut state = (iter.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ buf.len() as u64;
    for chunk in buf.chunks_mut(8) {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bytes = state.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Why `data` is not iteration `iter`'s pattern of `size` bytes, if not.
pub fn check_pattern(data: &[u8], size: usize, iter: u64) -> Option<String> {
    if data.len() != size {
        return Some(format!("{} bytes arrived, {size} were sent", data.len()));
    }
    let mut want = vec![0u8; size];
    pattern_into(&mut want, iter);
    data.iter()
        .zip(&want)
        .position(|(got, expected)| got != expected)
        .map(|at| format!("byte {at} is {:#04x}, expected {:#04x}", data[at], want[at]))
}
