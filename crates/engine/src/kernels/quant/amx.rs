//! The AMX kernel of [`super`] (x86-64) for Q4_K and Q5_K products of several rows: 16 weight
//! rows at a time as the `A` tile of `tdpbusd` (unsigned bytes, one block's 256 elements per
//! row of a scratch buffer) against [`AMX_ROWS`] activation rows as the `B` tile (signed bytes,
//! in [`QuantActs`]' AMX layout), so every (output, activation row) gets its exact integer sums
//! in one tile lane. A block's scales do not fit a byte next to the weights (`sc · q` up to 945),
//! so `sc = 8 · hi + lo` with `hi, lo ≤ 7` and two products (`lo · q`, `hi · q`, at most 217)
//! give `S1 = S_lo + 8 · S_hi` exactly; the mins' sum `S2` is a third product with each element's
//! group min as its weight. The float steps then run per output on a vector of the rows, the
//! module docs' two roundings per block into the block's lane: the same bits as the reference.
//!
//! The instructions are written as inline assembly (the AMX intrinsics are not in stable Rust);
//! Linux hands out the tile state only on request ([`amx_ready`]).

use super::x86::{k4_scales, prefetch_part, q4_k_block_bytes};
use super::{QuantActs, BLOCK_LANES};
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
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512vnni")
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

/// One block of 16 weight rows prepared as `A` tiles: per row, 256 bytes each of `lo · q` and
/// `hi · q`, the group mins widened to 16 bits (for `vpdpwssd`), and the row's `d` and `−dmin`.
#[repr(C, align(64))]
struct BlockTiles {
    lo: [[u8; 256]; OUTPUTS],
    hi: [[u8; 256]; OUTPUTS],
    mins: [[i16; 8]; OUTPUTS],
    d: [f32; OUTPUTS],
    dmin: [f32; OUTPUTS],
}

/// `s · i` at `16 · s + i` for `s` of `0..8` and `i` of `0..16`: looked up by `vpermi2b` with
/// `16 · s + q` as the index, the weights' 4 low bits times a split scale in one instruction.
#[repr(C, align(64))]
struct Times([u8; 128]);

static TIMES: Times = {
    let mut t = [0u8; 128];
    let mut at = 0;
    while at < 128 {
        t[at] = ((at / 16) * (at % 16)) as u8;
        at += 1;
    }
    Times(t)
};

/// Per 64-element chunk `c` of a block: the group of each byte (`2c` for the first 32, `2c + 1`
/// for the rest), for `vpermb` to spread the groups' scales.
#[repr(C, align(64))]
struct ChunkBytes([[u8; 64]; 4]);

static GROUP_OF: ChunkBytes = {
    let mut t = [[0u8; 64]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 64 {
            t[c][i] = (2 * c + i / 32) as u8;
            i += 1;
        }
        c += 1;
    }
    ChunkBytes(t)
};

/// Per chunk `c`: each byte's group as a bit (Q5_K's fifth bit of element `i` of group `g` is
/// bit `g` of `qh[i]`).
static BIT_OF: ChunkBytes = {
    let mut t = [[0u8; 64]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 64 {
            t[c][i] = 1 << (2 * c + i / 32);
            i += 1;
        }
        c += 1;
    }
    ChunkBytes(t)
};

/// Writes block `b` of `row` (Q4_K, or with `FIVE` Q5_K) into slot `n` of `tiles`: per 64-element
/// chunk, the 4 low bits of each weight and its group's split scale (times 16) index
/// [`TIMES`]; Q5_K's fifth bit adds `16 · s` where it is set. Two 64-byte stores per chunk.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VBMI and F16C; block `b` lies inside `row`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c")]
unsafe fn prepare<const FIVE: bool>(row: &[u8], b: usize, tiles: &mut BlockTiles, n: usize) {
    let block = q4_k_block_bytes(FIVE);
    let nibbles = if FIVE { 48 } else { 16 };
    // SAFETY: the caller's contract: every read is inside block `b` or the static tables; every
    // write inside slot `n` of `tiles`.
    unsafe {
        let blk = row.as_ptr().add(block * b);
        tiles.d[n] = super::x86::half(blk);
        tiles.dmin[n] = -super::x86::half(blk.add(2));
        let sc = k4_scales(blk.add(4));
        let scales = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
        _mm_storeu_si128(
            tiles.mins[n].as_mut_ptr() as *mut __m128i,
            _mm_cvtepu8_epi16(_mm_srli_si128::<8>(scales)),
        );
        // `16 · lo` and `16 · hi` per group (bytes 0–7; no bit crosses a byte).
        let lo16 = _mm_slli_epi16::<4>(_mm_and_si128(scales, _mm_set1_epi8(7)));
        let hi16 = _mm_slli_epi16::<1>(_mm_and_si128(scales, _mm_set1_epi8(0x38)));
        let (lo16, hi16) = (_mm512_castsi128_si512(lo16), _mm512_castsi128_si512(hi16));
        let times = (
            _mm512_load_si512(TIMES.0.as_ptr() as *const _),
            _mm512_load_si512(TIMES.0.as_ptr().add(64) as *const _),
        );
        let mask = _mm512_set1_epi8(0x0F);
        let qh = if FIVE {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16) as *const __m256i))
        } else {
            _mm512_setzero_si512()
        };
        for c in 0..4 {
            // Groups 2c and 2c + 1: the low and the high nibbles of the same 32 bytes.
            let raw = _mm256_loadu_si256(blk.add(nibbles + 32 * c) as *const __m256i);
            let both =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(raw), _mm256_srli_epi16::<4>(raw));
            let q = _mm512_and_si512(both, mask);
            let group = _mm512_load_si512(GROUP_OF.0[c].as_ptr() as *const _);
            let s_lo = _mm512_permutexvar_epi8(group, lo16);
            let s_hi = _mm512_permutexvar_epi8(group, hi16);
            let mut lo = _mm512_permutex2var_epi8(times.0, _mm512_or_si512(q, s_lo), times.1);
            let mut hi = _mm512_permutex2var_epi8(times.0, _mm512_or_si512(q, s_hi), times.1);
            if FIVE {
                let bit = _mm512_load_si512(BIT_OF.0[c].as_ptr() as *const _);
                let set = _mm512_test_epi8_mask(qh, bit);
                lo = _mm512_mask_add_epi8(lo, set, lo, s_lo);
                hi = _mm512_mask_add_epi8(hi, set, hi, s_hi);
            }
            _mm512_store_si512(tiles.lo[n].as_mut_ptr().add(64 * c) as *mut _, lo);
            _mm512_store_si512(tiles.hi[n].as_mut_ptr().add(64 * c) as *mut _, hi);
        }
    }
}

/// What a run of [`q4_k`] calls on one thread reuses: the tile configuration (loaded once; the
/// tiles are released when it drops) and the prepared blocks.
pub(super) struct Scratch {
    /// Block `b` in `b % 4`: the step of block `b` multiplies its tiles, prepares block
    /// `b + 2`'s and finishes block `b - 1`'s float steps (which read its scales).
    buffers: [Box<BlockTiles>; 4],
    sums: Box<[[[i32; AMX_ROWS]; OUTPUTS]; 2]>,
}

impl Scratch {
    /// Configures this thread's tiles.
    ///
    /// # Safety
    /// [`amx_ready`] said yes.
    pub(super) unsafe fn new() -> Scratch {
        let blank = || {
            Box::new(BlockTiles {
                lo: [[0; 256]; OUTPUTS],
                hi: [[0; 256]; OUTPUTS],
                mins: [[0; 8]; OUTPUTS],
                d: [0.0; OUTPUTS],
                dmin: [0.0; OUTPUTS],
            })
        };
        let cfg = TileConfig::full();
        // SAFETY: the caller's contract (the CPU has AMX and Linux granted its state).
        unsafe { asm!("ldtilecfg [{0}]", in(reg) &cfg as *const TileConfig, options(nostack)) };
        Scratch {
            buffers: [blank(), blank(), blank(), blank()],
            sums: Box::new([[[0; AMX_ROWS]; OUTPUTS]; 2]),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: `new` configured the tiles, so the CPU has AMX.
        unsafe { asm!("tilerelease", options(nostack)) };
    }
}

/// `Q4_K` (or, with `FIVE`, `Q5_K`) products of 16 weight rows `rows[j]` (`j` of `0..16`) against
/// every activation row, added to `acc`: [`BLOCK_LANES`] planes of `acts.amx_groups · 16 · 16`
/// floats, block `b` into plane `b mod 8` (the module docs' lanes; activation row `m` of group
/// `G`'s product with weight row `j` at `(16 · G + j) · 16 + m` of each plane). `ahead` (the next
/// call's rows) is read ahead a part per block.
///
/// # Safety
/// The CPU has what [`amx_ready`] checks and it said yes; `scratch` was made on this thread;
/// every row is whole blocks of the type, as many as `acts` was quantized for; `acts` has its
/// AMX layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q4_k<const FIVE: bool>(
    rows: &[&[u8]; OUTPUTS],
    ahead: &[u8],
    acts: &QuantActs,
    acc: &mut [f32],
    scratch: &mut Scratch,
) {
    let block = q4_k_block_bytes(FIVE);
    let blocks = rows[0].len() / block;
    let groups = acts.amx_groups();
    let plane = OUTPUTS * groups * AMX_ROWS;
    assert_eq!(
        acc.len(),
        BLOCK_LANES * plane,
        "acc is not the lanes' planes"
    );
    let Scratch { buffers, sums } = scratch;
    let steps = blocks * groups;
    // SAFETY (whole body): the tiles are configured before use and released after; every tile
    // load reads 16 rows of 64 bytes inside a buffer or the AMX layout of `acts`; every store
    // writes 16 rows of 64 bytes inside `sums`; `prepare`'s contract holds (the CPU's features
    // as checked by `amx_ready`, blocks inside the rows).
    unsafe {
        for (b, tiles) in buffers.iter_mut().enumerate().take(blocks.min(2)) {
            for (n, row) in rows.iter().enumerate() {
                prepare::<FIVE>(row, b, tiles, n);
            }
        }
        for s in 0..=steps {
            let (b, group) = (s / groups, s % groups);
            if s > 0 {
                store_sums((s - 1) % 2, sums);
            }
            if s < steps {
                let tiles = &buffers[b % 4];
                multiply(s % 2, acts, group, b, &tiles.lo, &tiles.hi);
                if group == 0 {
                    // The read-ahead is spread over the block's rows, a few lines each.
                    let next = &mut buffers[(b + 2) % 4];
                    for (n, row) in rows.iter().enumerate() {
                        prefetch_part::<_MM_HINT_T1>(ahead, OUTPUTS * b + n, OUTPUTS * blocks);
                        if b + 2 < blocks {
                            prepare::<FIVE>(row, b + 2, next, n);
                        }
                    }
                }
            }
            if s > 0 {
                let (b, group) = ((s - 1) / groups, (s - 1) % groups);
                let lane = &mut acc[(b % BLOCK_LANES) * plane..][..plane];
                finish(sums, &buffers[b % 4], acts, group, b, lane);
            }
        }
    }
}

/// Queues the tile products of row group `group`'s block `b` against the prepared `lo` and `hi`
/// tiles into accumulator pair `pair` (tiles 0 and 1, or 6 and 7).
///
/// # Safety
/// The tiles are configured as [`TileConfig::full`]; `acts` has its AMX layout with `group` and
/// `b` inside it.
#[inline(always)]
unsafe fn multiply(
    pair: usize,
    acts: &QuantActs,
    group: usize,
    b: usize,
    lo: &[[u8; 256]; OUTPUTS],
    hi: &[[u8; 256]; OUTPUTS],
) {
    // SAFETY: the caller's contract; every load reads 16 rows of 64 bytes inside `lo`, `hi` or
    // the AMX layout of `acts`.
    unsafe {
        if pair == 0 {
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack));
        } else {
            asm!("tilezero tmm6", "tilezero tmm7", options(nostack));
        }
        for c in 0..4 {
            let act = acts.amx_block(group, b, c);
            let lo = lo.as_ptr().cast::<u8>().add(64 * c);
            let hi = hi.as_ptr().cast::<u8>().add(64 * c);
            // The tile registers are part of the instruction text: one block per pair.
            macro_rules! queue {
                ($act:literal, $lo:literal, $hi:literal) => {
                    asm!(
                        concat!("tileloadd ", $act, ", [{act} + {sixty_four}]"),
                        "tileloadd tmm4, [{lo} + {stride}]",
                        concat!("tdpbusd ", $lo, ", tmm4, ", $act),
                        "tileloadd tmm5, [{hi} + {stride}]",
                        concat!("tdpbusd ", $hi, ", tmm5, ", $act),
                        act = in(reg) act, lo = in(reg) lo, hi = in(reg) hi,
                        sixty_four = in(reg) 64usize, stride = in(reg) 256usize,
                        options(nostack),
                    )
                };
            }
            if pair == 0 {
                queue!("tmm2", "tmm0", "tmm1");
            } else {
                queue!("tmm3", "tmm6", "tmm7");
            }
        }
    }
}

/// Stores accumulator pair `pair` into `sums` (`lo` products, then `hi`).
///
/// # Safety
/// The tiles are configured as [`TileConfig::full`].
#[inline(always)]
unsafe fn store_sums(pair: usize, sums: &mut [[[i32; AMX_ROWS]; OUTPUTS]; 2]) {
    let (lo, hi) = (sums[0].as_mut_ptr(), sums[1].as_mut_ptr());
    // SAFETY: each store writes 16 rows of 64 bytes, one `sums[_]` each.
    unsafe {
        if pair == 0 {
            asm!(
                "tilestored [{lo} + {sixty_four}], tmm0",
                "tilestored [{hi} + {sixty_four}], tmm1",
                lo = in(reg) lo, hi = in(reg) hi, sixty_four = in(reg) 64usize,
                options(nostack),
            );
        } else {
            asm!(
                "tilestored [{lo} + {sixty_four}], tmm6",
                "tilestored [{hi} + {sixty_four}], tmm7",
                lo = in(reg) lo, hi = in(reg) hi, sixty_four = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

/// The float steps of row group `group`'s block `b` from its integer `sums` (`S1 = lo + 8 · hi`;
/// `S2` from the group sums and `tiles`' mins), added to `acc` (block `b`'s plane) as [`q4_k`]
/// lays it out.
///
/// # Safety
/// The CPU has AVX-512 F/VNNI and FMA; `acts` has its AMX layout with `group` and `b` inside it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn finish(
    sums: &[[[i32; AMX_ROWS]; OUTPUTS]; 2],
    tiles: &BlockTiles,
    acts: &QuantActs,
    group: usize,
    b: usize,
    acc: &mut [f32],
) {
    // SAFETY: the caller's contract; every load is inside `sums`, `tiles`, `acc` or the AMX
    // layout of `acts`.
    unsafe {
        let da = _mm512_loadu_ps(acts.amx_d(group, b));
        // Lane m: activation row m's sums of groups 2p and 2p + 1 (16 bits each).
        let bsums = acts.amx_bsums(group, b);
        let bsums: [__m512i; 4] =
            std::array::from_fn(|p| _mm512_loadu_si512(bsums.add(32 * p) as *const _));
        let acc = &mut acc[OUTPUTS * group * AMX_ROWS..][..OUTPUTS * AMX_ROWS];
        for n in 0..OUTPUTS {
            let load = |s: &[i32; AMX_ROWS]| _mm512_loadu_si512(s.as_ptr() as *const __m512i);
            let (lo, hi) = (load(&sums[0][n]), load(&sums[1][n]));
            let s1 = _mm512_add_epi32(lo, _mm512_slli_epi32::<3>(hi));
            // S2 = Σ_g m[g] · Σ_{i∈g} a[i], two groups per `vpdpwssd`.
            let mins = tiles.mins[n].as_ptr() as *const i32;
            let mut s2 = _mm512_setzero_si512();
            for (p, &sum) in bsums.iter().enumerate() {
                let pair = _mm512_set1_epi32(std::ptr::read_unaligned(mins.add(p)));
                s2 = _mm512_dpwssd_epi32(s2, sum, pair);
            }
            let at = acc[n * AMX_ROWS..][..AMX_ROWS].as_mut_ptr();
            let dd = _mm512_mul_ps(_mm512_set1_ps(tiles.d[n]), da);
            let v = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s1), _mm512_loadu_ps(at));
            let dm = _mm512_mul_ps(_mm512_set1_ps(tiles.dmin[n]), da);
            _mm512_storeu_ps(at, _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(s2), v));
        }
    }
}
