//! DMA-buf export of CUDA memory: `cuMemGetHandleForAddressRange` wants a
//! page-aligned range, and a NIC registers the buffer inside it by its
//! offset. The arithmetic is here, apart from the driver, so that it is
//! tested on any host.

/// The page-aligned range exported for a buffer, and where the buffer
/// starts inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRange {
    /// First byte exported: the buffer's start rounded down to a page.
    pub base: u64,
    /// Bytes exported: to the buffer's end rounded up to a page.
    pub size: u64,
    /// The buffer's offset in the exported range (`ibv_reg_dmabuf_mr`'s
    /// offset).
    pub offset: u64,
}

/// The whole pages around `[addr, addr + len)`; `None` for an empty
/// buffer, a page size that is not a power of two, or a range that would
/// wrap around the address space.
pub fn export_range(addr: u64, len: u64, page: u64) -> Option<ExportRange> {
    if len == 0 || page == 0 || !page.is_power_of_two() {
        return None;
    }
    let base = addr & !(page - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(page)?;
    Some(ExportRange {
        base,
        size: end - base,
        offset: addr - base,
    })
}

/// The host page size (what the driver aligns DMA-buf exports to).
pub fn host_page_size() -> u64 {
    // SAFETY: sysconf reads a system constant and has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

/// The driver's flags for an export: with the PCIe mapping type first
/// where asked (`UCT_CUDA_DMABUF_PCIE`), then without it, as drivers that
/// do not know the flag refuse it (and choosing it wrongly broke
/// registration on GB200 in UCX, PR 11584).
pub fn flag_attempts(pcie: bool) -> &'static [u64] {
    if pcie {
        &[crate::driver::RANGE_FLAG_DMA_BUF_MAPPING_PCIE, 0]
    } else {
        &[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    #[test]
    fn an_aligned_buffer_is_exported_as_it_is() {
        let r = export_range(0x7f00_0000_0000, 2 * PAGE, PAGE).unwrap();
        assert_eq!(
            r,
            ExportRange {
                base: 0x7f00_0000_0000,
                size: 2 * PAGE,
                offset: 0
            }
        );
    }

    #[test]
    fn an_unaligned_buffer_gets_the_pages_around_it_and_its_offset() {
        // Starts 256 bytes into a page, ends 100 bytes into the third.
        let addr = 0x10_0000 + 256;
        let r = export_range(addr, 2 * PAGE - 256 + 100, PAGE).unwrap();
        assert_eq!(r.base, 0x10_0000);
        assert_eq!(r.size, 3 * PAGE);
        assert_eq!(r.offset, 256);
        assert_eq!(r.base + r.offset, addr);
        assert!(r.base + r.size >= addr + 2 * PAGE - 256 + 100);
    }

    #[test]
    fn one_byte_exports_one_page() {
        let r = export_range(0x20_0fff, 1, PAGE).unwrap();
        assert_eq!((r.base, r.size, r.offset), (0x20_0000, PAGE, 0xfff));
        // The last byte of a page and the first of the next: two pages.
        let r = export_range(0x20_0fff, 2, PAGE).unwrap();
        assert_eq!((r.base, r.size, r.offset), (0x20_0000, 2 * PAGE, 0xfff));
    }

    #[test]
    fn bigger_pages_align_the_same_way() {
        let huge = 2 << 20;
        let r = export_range(huge + 5, 10, huge).unwrap();
        assert_eq!((r.base, r.size, r.offset), (huge, huge, 5));
    }

    #[test]
    fn empty_wrapping_and_odd_page_sizes_are_refused() {
        assert_eq!(export_range(PAGE, 0, PAGE), None);
        assert_eq!(export_range(u64::MAX - 10, 100, PAGE), None);
        // Ends inside the last page: rounding up would wrap.
        assert_eq!(export_range(u64::MAX - PAGE, 10, PAGE), None);
        assert_eq!(export_range(PAGE, 1, 3000), None);
        assert_eq!(export_range(PAGE, 1, 0), None);
    }

    #[test]
    fn the_pcie_flag_is_tried_first_and_then_dropped() {
        assert_eq!(flag_attempts(false), &[0]);
        assert_eq!(flag_attempts(true), &[1, 0]);
        assert!(host_page_size().is_power_of_two());
    }
}
