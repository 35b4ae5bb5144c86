//! A zeroed `f32` buffer whose start is 4 KiB-aligned, so that O_DIRECT reads can land in it
//! directly (the kernel requires buffer, offset and length to be block-aligned).

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment of slot memory and of every block in the disk expert file.
pub const ALIGN: usize = 4096;

/// `len` floats, 4 KiB-aligned.
pub struct AlignedBuf {
    ptr: *mut f32,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory with no interior sharing.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` floats.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let bytes = (len * 4).max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(bytes, ALIGN).expect("valid layout");
        // SAFETY: `layout` has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) } as *mut f32;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len, layout }
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `ptr` points to at least `len` initialised (zeroed or written) floats.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { dealloc(self.ptr as *mut u8, self.layout) }
    }
}

/// Floats in one 4 KiB-aligned slot holding `floats` floats.
pub fn padded_len(floats: usize) -> usize {
    (floats * 4).div_ceil(ALIGN) * ALIGN / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [1usize, 1024, 1025, 5000] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert!(b.as_slice().iter().all(|&v| v == 0.0));
            b.as_mut_slice()[len - 1] = 1.0;
            assert_eq!(b.as_slice()[len - 1], 1.0);
        }
        assert_eq!(padded_len(1), 1024);
        assert_eq!(padded_len(1024), 1024);
        assert_eq!(padded_len(1025), 2048);
    }
}
