//! Activation blocks quantized with AVX-512 (x86-64): [`super`]'s `quantize_q8_0` and
//! `quantize_q8_k` on whole vectors, the same operations in the same IEEE arithmetic, so the same
//! integers and scales. Blocks holding a non-finite value, or so small that the inverse scale
//! overflows, are left to the scalar functions (`None`), whose saturating conversions of
//! infinities these do not copy. Not the products (the other modules).

use std::arch::x86_64::*;

/// Whether the running CPU has what these need (AVX-512 F and F16C; cached).
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c"))
}

/// [`q8_k_block`] for a block of 256, [`q8_0_block`] otherwise (32).
///
/// # Safety
/// [`available`] said yes.
pub(super) unsafe fn block(x: &[f32], q: &mut [i8]) -> Option<f32> {
    // SAFETY: the caller's contract.
    unsafe {
        if x.len() == 256 {
            q8_k_block(x, q)
        } else {
            q8_0_block(x, q)
        }
    }
}

/// Whether every lane of `v` is finite.
#[inline]
#[target_feature(enable = "avx512f")]
fn finite(v: __m512) -> bool {
    _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(f32::INFINITY)) == 0xFFFF
}

/// `y.round()` (halves away from zero) per lane, exactly: the nearest integer, ties to even,
/// moved away from zero where `y` was a half (then `y ± 0.5` is an integer, exact).
#[inline]
#[target_feature(enable = "avx512f")]
fn round_half_away(y: __m512) -> __m512 {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
    let tie =
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5));
    let sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(i32::MIN));
    let half = _mm512_castsi512_ps(_mm512_or_si512(
        sign,
        _mm512_castps_si512(_mm512_set1_ps(0.5)),
    ));
    _mm512_mask_blend_ps(tie, t, _mm512_add_ps(y, half))
}

/// The integers of `r` (whole numbers within ±128) as 16 bytes at `q`.
///
/// # Safety
/// 16 writable bytes at `q`; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_bytes(r: __m512, q: *mut i8) {
    // SAFETY: the caller's contract.
    unsafe {
        _mm_storeu_si128(
            q as *mut __m128i,
            _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)),
        )
    };
}

/// `quantize_q8_0` on one block of 32 (`x`, `q` 32 long): `d = amax / 127` kept as f16,
/// `q = round(x / d)` with halves away from zero; `None` (nothing written) if a value or
/// `1 / d` is not finite.
///
/// # Safety
/// [`available`] said yes.
#[target_feature(enable = "avx512f,f16c")]
unsafe fn q8_0_block(x: &[f32], q: &mut [i8]) -> Option<f32> {
    assert!(x.len() == 32 && q.len() == 32);
    // SAFETY: 32 floats and 32 bytes (asserted).
    unsafe {
        let v = [
            _mm512_loadu_ps(x.as_ptr()),
            _mm512_loadu_ps(x.as_ptr().add(16)),
        ];
        if !(finite(v[0]) && finite(v[1])) {
            return None;
        }
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        if !id.is_finite() {
            // A subnormal `d`: `x / d` may be infinite, where the vector conversion differs.
            return None;
        }
        let id = _mm512_set1_ps(id);
        for (h, v) in v.into_iter().enumerate() {
            store_bytes(
                round_half_away(_mm512_mul_ps(v, id)),
                q.as_mut_ptr().add(16 * h),
            );
        }
        let d16 = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
        Some(_mm_cvtss_f32(_mm_cvtph_ps(d16)))
    }
}

/// `quantize_q8_k` on one block of 256 (`x`, `q` 256 long): `iscale = −127 / max` with `max`
/// the first element of the largest magnitude, `q = min(round_ties_even(iscale · x), 127)`,
/// returns `1 / iscale` (0 for an all-zero block); `None` (nothing written) if a value or
/// `iscale` is not finite.
///
/// # Safety
/// [`available`] said yes.
#[target_feature(enable = "avx512f,f16c")]
unsafe fn q8_k_block(x: &[f32], q: &mut [i8]) -> Option<f32> {
    assert!(x.len() == 256 && q.len() == 256);
    // SAFETY: 256 floats and 256 bytes (asserted).
    unsafe {
        let v: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(x.as_ptr().add(16 * i)));
        if !v.iter().all(|&v| finite(v)) {
            return None;
        }
        let m = v.iter().fold(_mm512_setzero_ps(), |m, &v| {
            _mm512_max_ps(m, _mm512_abs_ps(v))
        });
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            q.fill(0);
            return Some(0.0);
        }
        let at = v
            .iter()
            .enumerate()
            .find_map(|(i, &v)| {
                let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(amax));
                (hit != 0).then(|| 16 * i + hit.trailing_zeros() as usize)
            })
            .expect("amax is an element's magnitude");
        let iscale = -127.0 / x[at];
        if !iscale.is_finite() {
            return None;
        }
        let s = _mm512_set1_ps(iscale);
        for (i, v) in v.into_iter().enumerate() {
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(s, v),
            );
            store_bytes(
                _mm512_min_ps(t, _mm512_set1_ps(127.0)),
                q.as_mut_ptr().add(16 * i),
            );
        }
        Some(1.0 / iscale)
    }
}
