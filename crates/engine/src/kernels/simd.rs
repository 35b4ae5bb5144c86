//! Sixteen f32 lanes as one value, implemented once per instruction set: AVX-512 (one `zmm`),
//! AVX2 + FMA (two `ymm`) and portable (`[f32; 16]` with `f32::mul_add`). Every operation is
//! lane-wise and correctly rounded, so the three give identical bits; the kernels are written
//! once against [`F32x16`] and compiled per instruction set. It owns no algorithm.

// Index loops over the 16 lanes read best as written.
#![allow(clippy::needless_range_loop)]

/// Lanes.
pub const LANES: usize = 16;

/// Sixteen f32 lanes.
///
/// # Safety
/// The methods use instructions of the implementing type's instruction set: call them only from
/// code compiled for it, on a CPU that has it.
pub unsafe trait F32x16: Copy {
    /// Values of this type the register file holds at once.
    const REGS: usize;
    /// All lanes `+0`.
    unsafe fn zero() -> Self;
    /// All lanes `v`.
    unsafe fn splat(v: f32) -> Self;
    /// 16 consecutive f32 from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// 16 consecutive bf16 bit patterns from `p`, widened exactly.
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `a · b + c`, rounded once (fused multiply-add).
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `a · b`.
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// `if a > b { a } else { b }` per lane.
    unsafe fn max(a: Self, b: Self) -> Self;
    /// Stores the 16 lanes at `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
}

/// A storage element that loads as 16 f32 lanes.
pub trait Elem: Copy + Default {
    /// 16 consecutive elements from `p`, as f32.
    ///
    /// # Safety
    /// As [`F32x16`], and `p` must point to 16 readable elements.
    unsafe fn load16<V: F32x16>(p: *const Self) -> V;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load16<V: F32x16>(p: *const f32) -> V {
        unsafe { V::load(p) }
    }
}

impl Elem for u16 {
    #[inline(always)]
    unsafe fn load16<V: F32x16>(p: *const u16) -> V {
        unsafe { V::load_bf16(p) }
    }
}

/// The pairwise sum of 16 lanes: `l + 8`, then `l + 4`, `l + 2`, `l + 1` (the end of the row
/// order; see the kernels' module docs).
#[inline(always)]
pub fn tree(a: &[f32; LANES]) -> f32 {
    let mut s8 = [0.0f32; 8];
    for l in 0..8 {
        s8[l] = a[l] + a[l + 8];
    }
    let mut s4 = [0.0f32; 4];
    for l in 0..4 {
        s4[l] = s8[l] + s8[l + 4];
    }
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// 16 elements from `p` of which only the first `n` exist; the rest load as zeros.
///
/// # Safety
/// As [`Elem::load16`] for `n` elements.
#[inline(always)]
pub unsafe fn load_partial<V: F32x16, T: Elem>(p: *const T, n: usize) -> V {
    let mut buf = [T::default(); LANES];
    // SAFETY: `n ≤ 16` readable elements.
    unsafe {
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n.min(LANES));
        T::load16::<V>(buf.as_ptr())
    }
}

/// The 16 lanes as an array.
#[inline(always)]
pub fn lanes<V: F32x16>(v: V) -> [f32; LANES] {
    let mut out = [0.0f32; LANES];
    // SAFETY: `out` has 16 floats; `v` exists, so its instruction set is in use.
    unsafe { v.store(out.as_mut_ptr()) };
    out
}

/// The portable implementation.
#[derive(Clone, Copy)]
pub struct Portable([f32; LANES]);

// SAFETY: plain Rust, valid everywhere.
unsafe impl F32x16 for Portable {
    const REGS: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Portable([v; LANES])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        let mut out = [0.0f32; LANES];
        // SAFETY: the caller vouches for 16 floats at `p`.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), LANES) };
        Portable(out)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self {
        let mut out = [0.0f32; LANES];
        for (l, o) in out.iter_mut().enumerate() {
            // SAFETY: the caller vouches for 16 elements at `p`.
            *o = super::bf16_to_f32(unsafe { *p.add(l) });
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        let mut out = [0.0f32; LANES];
        for l in 0..LANES {
            out[l] = a.0[l].mul_add(b.0[l], c.0[l]);
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        let mut out = [0.0f32; LANES];
        for l in 0..LANES {
            out[l] = a.0[l] * b.0[l];
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        let mut out = [0.0f32; LANES];
        for l in 0..LANES {
            out[l] = if a.0[l] > b.0[l] { a.0[l] } else { b.0[l] };
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller vouches for room for 16 floats at `p`.
        unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr(), p, LANES) };
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{F32x16, LANES};
    use std::arch::x86_64::*;

    /// Two AVX registers: lanes 0–7 and 8–15.
    #[derive(Clone, Copy)]
    pub struct Avx2(__m256, __m256);

    // SAFETY: every method is compiled for AVX2 + FMA; callers run it only where detected.
    unsafe impl F32x16 for Avx2 {
        const REGS: usize = 8;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn zero() -> Self {
            Avx2(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn splat(v: f32) -> Self {
            Avx2(_mm256_set1_ps(v), _mm256_set1_ps(v))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { Avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load_bf16(p: *const u16) -> Self {
            unsafe {
                let lo = _mm_loadu_si128(p as *const __m128i);
                let hi = _mm_loadu_si128(p.add(8) as *const __m128i);
                Avx2(
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(lo))),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(hi))),
                )
            }
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Avx2(
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn max(a: Self, b: Self) -> Self {
            // MAXPS(a, b) = a > b ? a : b (the second operand on ties and NaN).
            Avx2(_mm256_max_ps(a.0, b.0), _mm256_max_ps(a.1, b.1))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn store(self, p: *mut f32) {
            unsafe {
                _mm256_storeu_ps(p, self.0);
                _mm256_storeu_ps(p.add(LANES / 2), self.1);
            }
        }
    }

    /// One AVX-512 register.
    #[derive(Clone, Copy)]
    pub struct Avx512(__m512);

    // SAFETY: every method is compiled for AVX-512; callers run it only where detected.
    unsafe impl F32x16 for Avx512 {
        const REGS: usize = 32;
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn zero() -> Self {
            Avx512(_mm512_setzero_ps())
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn splat(v: f32) -> Self {
            Avx512(_mm512_set1_ps(v))
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { Avx512(_mm512_loadu_ps(p)) }
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn load_bf16(p: *const u16) -> Self {
            unsafe {
                let h = _mm256_loadu_si256(p as *const __m256i);
                Avx512(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(
                    _mm512_cvtepu16_epi32(h),
                )))
            }
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Avx512(_mm512_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx512(_mm512_mul_ps(a.0, b.0))
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn max(a: Self, b: Self) -> Self {
            // VMAXPS(a, b) = a > b ? a : b (the second operand on ties and NaN).
            Avx512(_mm512_max_ps(a.0, b.0))
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
    }
}
