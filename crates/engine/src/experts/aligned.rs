//! A zeroed byte buffer whose start is 4 KiB-aligned, so that O_DIRECT reads can land in it
//! directly (the kernel requires buffer, offset and length to be block-aligned) and `f32`/bf16
//! views of it are always aligned; and its huge-page variant for expert slots.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};

/// Alignment of slot memory and of every block in the disk expert file.
pub const ALIGN: usize = 4096;

/// A transparent huge page on x86-64 and most arm64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;

/// `len` bytes, 4 KiB-aligned.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory with no interior sharing.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(padded(len.max(1)), ALIGN).expect("valid layout");
        // SAFETY: `layout` has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len, layout }
    }

    /// A zeroed buffer of `len` bytes on whole 2 MiB pages, advised to the kernel as
    /// transparent huge pages (`MADV_HUGEPAGE`, Linux; elsewhere, with THP off, or with
    /// `SPECFIT_HUGE_PAGES=0` it is a plain 2 MiB-aligned buffer). Expert slots live here: O_DIRECT
    /// reads into huge pages are faster and steadier than into 4 KiB pages (measurements in
    /// BENCHMARKS.md, "Expert slots on huge pages"; `examples/cache_twins.rs`).
    pub fn huge_zeroed(len: usize) -> AlignedBuf {
        let size = len.max(1).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        match AlignedBuf::try_huge_zeroed(len) {
            Some(b) => b,
            None => std::alloc::handle_alloc_error(
                Layout::from_size_align(size, HUGE_PAGE).expect("valid layout"),
            ),
        }
    }

    /// [`AlignedBuf::huge_zeroed`], or `None` when the memory cannot be had (a cache of more
    /// slots than the machine holds), instead of aborting.
    pub fn try_huge_zeroed(len: usize) -> Option<AlignedBuf> {
        let size = len.max(1).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let layout = Layout::from_size_align(size, HUGE_PAGE).ok()?;
        // SAFETY: `layout` has non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        #[cfg(target_os = "linux")]
        if huge_pages_wanted() {
            // SAFETY: `ptr..ptr + size` is this allocation, page-aligned. The advice is only a
            // hint: its failure (THP compiled out, say) leaves ordinary pages, so it is ignored.
            unsafe {
                libc::madvise(ptr.cast(), size, libc::MADV_HUGEPAGE);
            }
        }
        // Zeroing after the advice makes the first touch fault in huge pages.
        // SAFETY: `ptr` is valid for `size` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, size) };
        Some(AlignedBuf { ptr, len, layout })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` initialised (zeroed or written) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Bytes `start..start + len` without forming a reference to the rest of the buffer, so that
    /// other ranges may be written meanwhile through [`AlignedBuf::range_ptr`] pointers.
    pub fn range(&self, start: usize, len: usize) -> &[u8] {
        assert!(start + len <= self.len, "range outside the buffer");
        // SAFETY: in bounds (asserted); the caller never writes this range while it is borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }

    /// A raw pointer to byte `start`, for a writer that owns that range until it is done.
    pub fn range_ptr(&mut self, start: usize, len: usize) -> *mut u8 {
        assert!(start + len <= self.len, "range outside the buffer");
        // SAFETY: in bounds (asserted).
        unsafe { self.ptr.add(start) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Whether [`AlignedBuf::huge_zeroed`] advises huge pages: unless `SPECFIT_HUGE_PAGES=0`.
fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("SPECFIT_HUGE_PAGES").map_or(true, |v| v != "0"))
}

/// `bytes` rounded up to a multiple of 4 KiB.
pub fn padded(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [1usize, 4096, 4097, 20000] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert!(b.as_slice().iter().all(|&v| v == 0));
            b.as_mut_slice()[len - 1] = 1;
            assert_eq!(b.as_slice()[len - 1], 1);
        }
        assert_eq!(padded(1), 4096);
        assert_eq!(padded(4096), 4096);
        assert_eq!(padded(4097), 8192);
    }

    #[test]
    fn huge_page_buffers_are_aligned_zeroed_and_writable_to_the_end() {
        for len in [1usize, HUGE_PAGE - 1, HUGE_PAGE, HUGE_PAGE + 4096] {
            let mut b = AlignedBuf::huge_zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
            assert!(b.as_slice().iter().all(|&v| v == 0));
            b.as_mut_slice()[len - 1] = 7;
            assert_eq!(b.as_slice()[len - 1], 7);
        }
    }
}
