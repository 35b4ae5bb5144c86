//! What the x86 kernels of [`super`] share: an exact f16 load and the Q4_K/Q5_K scale unpacking.

use std::arch::x86_64::*;

/// The f16 at `p`, widened exactly (F16C).
///
/// # Safety
/// Two readable bytes at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 6-bit scales (bytes 0–7) and mins (bytes 8–15) of the eight groups of a Q4_K/Q5_K
/// block from its 12 packed bytes at `p` (ggml's `get_scale_min_k4`, all groups at once).
///
/// # Safety
/// 12 readable bytes at `p`.
#[inline(always)]
pub(super) unsafe fn k4_scales(p: *const u8) -> [u8; 16] {
    // SAFETY: the caller's contract.
    let u = unsafe {
        [
            std::ptr::read_unaligned(p as *const u32),
            std::ptr::read_unaligned(p.add(4) as *const u32),
            std::ptr::read_unaligned(p.add(8) as *const u32),
        ]
    };
    let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let words = [
        u[0] & k1,
        (u[2] & k2) | (((u[0] >> 6) & k3) << 4),
        u[1] & k1,
        ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}
