//! The AMX kernel of [`super`] (x86-64) for Q4_K and Q5_K products of several rows: 16 weight
//! rows at a time as the `A` tile of `tdpbusd` (unsigned bytes, one block's 256 elements per
//! row of a scratch buffer) against [`AMX_ROWS`] activation rows as the `B` tile (signed bytes,
//! in [`QuantActs`]' AMX layout), so every (output, activation row) gets its exact integer sums
//! in one tile lane. A block's scales do not fit a byte next to the weights (`sc · q` up to 945),
//! so `sc = 8 · hi + lo` with `hi, lo ≤ 7` and two products (`lo · q`, `hi · q`, at most 217)
//! give `S1 = S_lo + 8 · S_hi` exactly; the mins' sum `S2` is a third product with each element's
//! group min as its weight. The float steps then run per output on a vector of the rows, the
//! module docs' two roundings per block: the same bits as the reference.
//!
//! The instructions are written as inline assembly (the AMX intrinsics are not in stable Rust);
//! Linux hands out the tile state only on request ([`amx_ready`]).

use super::x86::k4_scales;
use super::QuantActs;
use std::arch::asm;
use std::arch::x86_64::*;

/// Activation rows per `B` tile (its 16 columns of 4 bytes); a product of fewer rows pads with
/// zeros.
pub(super) const AMX_ROWS: usize = 16;

/// Weight rows per `A` tile.
const OUTPUTS: usize = 16;

/// Whether the CPU has AMX-TILE and AMX-INT8 (and the AVX-512 the kernel's other steps use) and
/// Linux granted this process the tile state (asked once).
pub(super) fn amx_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        // `cpuid` leaf 7 exists on every x86-64 processor with AVX-512.
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        let vectors = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        if !(tile && int8 && vectors) {
            return false;
        }
        // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA (Linux 5.16+).
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        let granted = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        granted == 0
    })
}

/// The tile configuration: every tile 16 rows of 64 bytes (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn full() -> TileConfig {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        cfg
    }
}

/// One block of 16 weight rows prepared as `A` tiles: per row, 256 bytes each of `lo · q`,
/// `hi · q` and the group mins, and the row's `d` and `−dmin`.
#[repr(C, align(64))]
struct BlockTiles {
    lo: [[u8; 256]; OUTPUTS],
    hi: [[u8; 256]; OUTPUTS],
    mins: [[u8; 256]; OUTPUTS],
    d: [f32; OUTPUTS],
    dmin: [f32; OUTPUTS],
}

/// Writes block `b` of `row` (Q4_K, or with `FIVE` Q5_K) into slot `n` of `tiles`.
///
/// # Safety
/// The CPU has AVX-512 F/BW and F16C; block `b` lies inside `row`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn prepare<const FIVE: bool>(row: &[u8], b: usize, tiles: &mut BlockTiles, n: usize) {
    let block = if FIVE { 176 } else { 144 };
    let nibbles = if FIVE { 48 } else { 16 };
    let (mask, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
    // SAFETY: the caller's contract: every read is inside block `b`; every write inside slot
    // `n` of `tiles`.
    unsafe {
        let blk = row.as_ptr().add(block * b);
        tiles.d[n] = super::x86::half(blk);
        tiles.dmin[n] = -super::x86::half(blk.add(2));
        let sc = k4_scales(blk.add(4));
        let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
        for t in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(nibbles + 32 * t) as *const __m256i);
            let mut q = [
                _mm256_and_si256(raw, mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask),
            ];
            for (half, q) in q.iter_mut().enumerate() {
                let g = 2 * t + half;
                if FIVE {
                    let bit = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32));
                    *q = _mm256_or_si256(*q, _mm256_slli_epi16::<4>(_mm256_and_si256(bit, one)));
                }
                // Group g: elements 32g .. 32g + 32.
                let wide = _mm512_cvtepu8_epi16(*q);
                let scaled = |s: u8| {
                    _mm512_cvtepi16_epi8(_mm512_mullo_epi16(wide, _mm512_set1_epi16(s as i16)))
                };
                let at = 32 * g;
                _mm256_storeu_si256(
                    tiles.lo[n].as_mut_ptr().add(at) as *mut __m256i,
                    scaled(sc[g] & 7),
                );
                _mm256_storeu_si256(
                    tiles.hi[n].as_mut_ptr().add(at) as *mut __m256i,
                    scaled(sc[g] >> 3),
                );
                _mm256_storeu_si256(
                    tiles.mins[n].as_mut_ptr().add(at) as *mut __m256i,
                    _mm256_set1_epi8(sc[8 + g] as i8),
                );
            }
        }
    }
}

/// `Q4_K` (or, with `FIVE`, `Q5_K`) products of 16 weight rows `rows[j]` (`j` of `0..16`) against
/// every activation row, added to `acc` (`acts.amx_groups · 16 · 16` floats: activation row `m`
/// of group `G`'s product with weight row `j` at `(16 · G + j) · 16 + m`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C and [`amx_ready`] said yes; every row is whole blocks of
/// the type, as many as `acts` was quantized for; `acts` has its AMX layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn q4_k<const FIVE: bool>(
    rows: &[&[u8]; OUTPUTS],
    acts: &QuantActs,
    acc: &mut [f32],
) {
    let block = if FIVE { 176 } else { 144 };
    let blocks = rows[0].len() / block;
    let groups = acts.amx_groups();
    let cfg = TileConfig::full();
    let blank = || {
        Box::new(BlockTiles {
            lo: [[0; 256]; OUTPUTS],
            hi: [[0; 256]; OUTPUTS],
            mins: [[0; 256]; OUTPUTS],
            d: [0.0; OUTPUTS],
            dmin: [0.0; OUTPUTS],
        })
    };
    // Each block is prepared one block ahead, so that the tile loads read stores that have
    // left for the cache.
    let mut buffers = [blank(), blank()];
    let mut sums = [[[0i32; AMX_ROWS]; OUTPUTS]; 3];
    // SAFETY (whole body): the tiles are configured before use and released after; every tile
    // load reads 16 rows of 64 bytes inside `tiles` or the AMX layout of `acts`; every store
    // writes 16 rows of 64 bytes inside `sums`.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) &cfg as *const TileConfig, options(nostack));
        for (n, row) in rows.iter().enumerate() {
            prepare::<FIVE>(row, 0, &mut buffers[0], n);
        }
        for b in 0..blocks {
            let [even, odd] = &mut buffers;
            let (tiles, next) = if b % 2 == 0 { (even, odd) } else { (odd, even) };
            if b + 1 < blocks {
                for (n, row) in rows.iter().enumerate() {
                    prepare::<FIVE>(row, b + 1, next, n);
                }
            }
            for group in 0..groups {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    options(nostack)
                );
                for c in 0..4 {
                    let act = acts.amx_block(group, b, c);
                    asm!(
                        "tileloadd tmm3, [{act} + {sixty_four}]",
                        "tileloadd tmm4, [{lo} + {stride}]",
                        "tdpbusd tmm0, tmm4, tmm3",
                        "tileloadd tmm5, [{hi} + {stride}]",
                        "tdpbusd tmm1, tmm5, tmm3",
                        "tileloadd tmm6, [{mins} + {stride}]",
                        "tdpbusd tmm2, tmm6, tmm3",
                        act = in(reg) act,
                        sixty_four = in(reg) 64usize,
                        lo = in(reg) tiles.lo.as_ptr().cast::<u8>().add(64 * c),
                        hi = in(reg) tiles.hi.as_ptr().cast::<u8>().add(64 * c),
                        mins = in(reg) tiles.mins.as_ptr().cast::<u8>().add(64 * c),
                        stride = in(reg) 256usize,
                        options(nostack),
                    );
                }
                asm!(
                    "tilestored [{lo} + {sixty_four}], tmm0",
                    "tilestored [{hi} + {sixty_four}], tmm1",
                    "tilestored [{mins} + {sixty_four}], tmm2",
                    lo = in(reg) sums[0].as_mut_ptr(),
                    hi = in(reg) sums[1].as_mut_ptr(),
                    mins = in(reg) sums[2].as_mut_ptr(),
                    sixty_four = in(reg) 64usize,
                    options(nostack),
                );
                let da = _mm512_loadu_ps(acts.amx_d(group, b));
                for n in 0..OUTPUTS {
                    let load =
                        |s: &[i32; AMX_ROWS]| _mm512_loadu_si512(s.as_ptr() as *const __m512i);
                    let (lo, hi, mins) = (load(&sums[0][n]), load(&sums[1][n]), load(&sums[2][n]));
                    let s1 = _mm512_add_epi32(lo, _mm512_slli_epi32::<3>(hi));
                    let at = acc[(OUTPUTS * group + n) * AMX_ROWS..][..AMX_ROWS].as_mut_ptr();
                    let dd = _mm512_mul_ps(_mm512_set1_ps(tiles.d[n]), da);
                    let v = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s1), _mm512_loadu_ps(at));
                    let dm = _mm512_mul_ps(_mm512_set1_ps(tiles.dmin[n]), da);
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(mins), v));
                }
            }
        }
        asm!("tilerelease", options(nostack));
    }
}
