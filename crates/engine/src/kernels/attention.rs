//! Attention over the KV cache, batch-invariant: `softmax(q·kᵀ / √D) · v` for every token and
//! query head of a forward, over the cache entries each token sees (GQA), tiled by KV head and
//! blocks of tokens and spread over the compute threads. Projections, norms and RoPE are the
//! model's ([`crate::model`]); the cache layout is [`crate::kv`]'s.

use super::packed::{self, PanelSrc, RowsIn, RowsOut};
use super::simd::{F32x16, LANES};
use super::{math, Isa};
use crate::kv::{KvCache, TILE};

/// Tokens per attention work item (one item = one KV head × a block of tokens).
const ATTEND_TOKENS: usize = 16;

/// `softmax(q·kᵀ / √D) · v` for every token and query head of a forward, over the keys each
/// token sees (GQA: query head `h` reads KV head `h / (Hq/Hkv)`).
///
/// Per KV head and block of tokens, the block's query rows are multiplied with every key tile
/// once (panel order: each score is one fused multiply-add chain over `D`), each row's visible
/// scores are gathered in cache order and turned into probabilities
/// ([`math::softmax_scaled`]), the hidden keys get probability 0, and the probabilities are
/// multiplied with the value rows (panel order: each output one chain over the keys in cache
/// order). A hidden key adds an exact `+0` to a chain, so a token's bits are those of the same
/// token decoded alone, whatever else shares the forward.
pub(crate) fn attend(
    q: &[f32],
    visible: &[Vec<usize>],
    kv: &KvCache,
    layer: usize,
    heads: usize,
) -> Vec<f32> {
    let t = visible.len();
    let d = kv.head_dim();
    let kv_heads = kv.row() / d;
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; t * heads * d];
    let blocks = t.div_ceil(ATTEND_TOKENS);
    let items = kv_heads * blocks;
    let target = crate::threads::SharedOut(out.as_mut_ptr());
    let one = |item: usize| {
        let (g, b) = (item / blocks, item % blocks);
        let tokens = b * ATTEND_TOKENS..((b + 1) * ATTEND_TOKENS).min(t);
        let shape = BlockShape {
            heads,
            d,
            group,
            scale,
        };
        let o = attend_block(q, visible, kv, layer, shape, g, tokens.clone());
        let hs = kv.head_stride();
        for (r, (i, hh)) in query_rows(tokens, group).enumerate() {
            let h = g * group + hh;
            // SAFETY: `out` has `t × heads × d` floats, and items write disjoint (token, head)
            // rows.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    o.as_ptr().add(r * hs),
                    target.get().add((i * heads + h) * d),
                    d,
                )
            };
        }
    };
    let pool = crate::threads::pool();
    let parts = pool.threads();
    if items < 2 || parts == 1 {
        (0..items).for_each(one);
    } else {
        pool.run(&|part| (part..items).step_by(parts).for_each(one));
    }
    out
}

/// The query rows of a block of tokens for one KV head: (token, head within the group).
fn query_rows(
    tokens: std::ops::Range<usize>,
    group: usize,
) -> impl Iterator<Item = (usize, usize)> {
    tokens.flat_map(move |i| (0..group).map(move |hh| (i, hh)))
}

/// The shape facts one attention block needs.
#[derive(Debug, Clone, Copy)]
struct BlockShape {
    heads: usize,
    d: usize,
    group: usize,
    scale: f32,
}

/// One KV head `g` × a block of tokens: the block's `tokens × group` output rows, each
/// `head_stride` wide (the first `D` values are the output).
fn attend_block(
    q: &[f32],
    visible: &[Vec<usize>],
    kv: &KvCache,
    layer: usize,
    s: BlockShape,
    g: usize,
    tokens: std::ops::Range<usize>,
) -> Vec<f32> {
    let (d, isa) = (s.d, Isa::detected());
    let nq = tokens.len() * s.group;
    // Keys the block reads: up to the last one any of its tokens sees.
    let keys = tokens
        .clone()
        .map(|i| visible[i].last().map_or(0, |&j| j + 1))
        .max()
        .unwrap_or(0);
    let keys16 = keys.div_ceil(TILE) * TILE;
    let mut qg = vec![0.0f32; nq * d]; // nq × D
    for (r, (i, hh)) in query_rows(tokens.clone(), s.group).enumerate() {
        let h = g * s.group + hh;
        qg[r * d..(r + 1) * d]
            .copy_from_slice(&q[(i * s.heads + h) * d..(i * s.heads + h + 1) * d]);
    }
    // Scores: nq × keys16, one chain over D per score.
    let mut scores = vec![0.0f32; nq * keys16];
    let tiles = kv.key_tiles(layer);
    debug_assert!(tiles.len() >= keys16 / TILE * kv.tile_floats());
    // SAFETY: `qg` is nq × D; key tile `p` of head `g` is D rows of 16 at
    // `g·D·16 + p·tile_floats` inside `tiles`, which covers every pushed token; `scores` has
    // keys16 columns per row.
    unsafe {
        let q_rows = RowsIn::of(&qg, d, nq, d);
        let key_panels = PanelSrc::F32 {
            base: tiles.as_ptr().add(g * d * TILE),
            ldb: TILE,
            pstride: kv.tile_floats(),
        };
        let out = RowsOut::of(&mut scores, keys16);
        packed::gemm_raw(isa, q_rows, key_panels, 0..keys16 / TILE, out)
    };
    // Probabilities over each row's visible keys, in cache order; 0 for the others.
    let mut seen = Vec::new();
    for (r, (i, _)) in query_rows(tokens, s.group).enumerate() {
        let vis = &visible[i];
        let row = &mut scores[r * keys16..(r + 1) * keys16];
        let n = vis.len();
        if n > 0 && vis[n - 1] + 1 == n {
            math::softmax_scaled(&mut row[..n], s.scale);
            row[n..].fill(0.0);
        } else {
            seen.clear();
            seen.extend(vis.iter().map(|&j| row[j]));
            math::softmax_scaled(&mut seen, s.scale);
            row.fill(0.0);
            for (&j, &p) in vis.iter().zip(&seen) {
                row[j] = p;
            }
        }
    }
    // Outputs: nq × head_stride, one chain over the keys per value.
    let hs = kv.head_stride();
    let mut o = vec![0.0f32; nq * hs];
    let values = kv.value_rows(layer);
    debug_assert!(values.len() >= keys * kv.value_row());
    // SAFETY: `scores` is nq × keys16 (keys ≤ keys16); value row `j` of head `g` holds
    // head_stride floats at `j·value_row + g·head_stride` for every `j < keys`; `o` is
    // nq × head_stride.
    unsafe {
        let weights = Weights {
            p: scores.as_ptr(),
            ldp: keys16,
            rows: nq,
            keys,
        };
        let v = values.as_ptr().add(g * hs);
        dispatch!(isa, weigh(weights, v, kv.value_row(), hs, o.as_mut_ptr()))
    };
    o
}

/// Probability rows for [`weigh`]: row `r`'s weight of key `j` at `p + r·ldp + j`.
#[derive(Debug, Clone, Copy)]
struct Weights {
    p: *const f32,
    ldp: usize,
    rows: usize,
    keys: usize,
}

/// Keys per pass of [`weigh`]: their value rows (64 KiB at 128 floats) stay in L1/L2 while
/// every block of output rows runs over them.
const WEIGH_KEYS: usize = 128;

/// Keys ahead whose value rows the first block of output rows of a pass asks for (the later
/// blocks find them in the caches).
const AHEAD_KEYS: usize = 16;

/// Output rows per register block of [`weigh`], and columns (in 16-lane values) per block, for
/// `regs` registers and a head `width` values wide: as many columns as leave room for two rows
/// (each row `cols` accumulators, plus the key's `cols` values and one broadcast weight), then
/// as many rows (up to 4) as fit. AVX-512 at 128-wide heads: 2 rows × 8.
const fn weigh_block(regs: usize, width: usize) -> (usize, usize) {
    let mut cols = width;
    while cols > 1 && 2 * cols + cols + 1 > regs {
        cols -= 1;
    }
    let mut rows = 4;
    while rows > 1 && rows * cols + cols + 1 > regs {
        rows -= 1;
    }
    (rows, cols)
}

/// `out[r·width + c] = Σ_j p[r][j] · v[j·ldv + c]` for every row of `w` and column `c < width`
/// (a multiple of 16): each output one fused multiply-add chain over the keys in order from
/// `+0`, as the panel product computes it, but reading each key's value row whole and once per
/// block of output rows, in passes of [`WEIGH_KEYS`] keys (partial sums kept in `out` between
/// passes, exactly), instead of 16 columns of every key per panel pass.
///
/// # Safety
/// `w` holds its rows; `v` has `w.keys` rows of `width` floats at stride `ldv`; `out` has
/// `w.rows × width` floats.
#[inline(always)]
unsafe fn weigh_with<V: F32x16>(
    w: Weights,
    v: *const f32,
    ldv: usize,
    width: usize,
    out: *mut f32,
) {
    let lanes = width / LANES;
    let (rb, cb) = weigh_block(V::REGS, lanes);
    // SAFETY (whole body): every access stays inside the operands the caller vouches for.
    unsafe {
        let mut k0 = 0;
        while k0 < w.keys {
            let k1 = (k0 + WEIGH_KEYS).min(w.keys);
            let mut r0 = 0;
            while r0 < w.rows {
                let rows = rb.min(w.rows - r0);
                let mut c0 = 0;
                while c0 < lanes {
                    let cols = cb.min(lanes - c0);
                    macro_rules! go {
                        ($r:literal, $c:literal) => {
                            weigh_block_run::<V, $r, $c>(w, r0, c0, k0..k1, v, ldv, width, out)
                        };
                    }
                    match (rows, cols) {
                        (2, 8) => go!(2, 8),
                        (1, 8) => go!(1, 8),
                        (4, 4) => go!(4, 4),
                        (3, 4) => go!(3, 4),
                        (2, 4) => go!(2, 4),
                        (1, 4) => go!(1, 4),
                        (2, 2) => go!(2, 2),
                        (1, 2) => go!(1, 2),
                        (4, 1) => go!(4, 1),
                        (3, 1) => go!(3, 1),
                        (2, 1) => go!(2, 1),
                        (1, 1) => go!(1, 1),
                        (r, c) => weigh_block_dyn::<V>(
                            w,
                            r0..r0 + r,
                            c0..c0 + c,
                            k0..k1,
                            v,
                            ldv,
                            width,
                            out,
                        ),
                    }
                    c0 += cols;
                }
                r0 += rows;
            }
            k0 = k1;
        }
    }
}

/// One register block of [`weigh_with`]: output rows `r0..r0+R`, 16-lane columns
/// `c0..c0+C`, keys `keys` (from `+0` at key 0, else from the partial sums in `out`).
///
/// # Safety
/// As [`weigh_with`], the block inside its operands.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn weigh_block_run<V: F32x16, const R: usize, const C: usize>(
    w: Weights,
    r0: usize,
    c0: usize,
    keys: std::ops::Range<usize>,
    v: *const f32,
    ldv: usize,
    width: usize,
    out: *mut f32,
) {
    // SAFETY (whole body): the caller's contract.
    unsafe {
        let at = |r: usize, c: usize| out.add((r0 + r) * width + (c0 + c) * LANES);
        let mut acc = [[V::zero(); C]; R];
        if keys.start > 0 {
            for r in 0..R {
                for c in 0..C {
                    acc[r][c] = V::load(at(r, c));
                }
            }
        }
        let ahead = r0 == 0;
        for j in keys {
            let row = v.add(j * ldv + c0 * LANES);
            if ahead {
                for c in 0..C {
                    packed::prefetch(row.wrapping_add(AHEAD_KEYS * ldv + c * LANES));
                }
            }
            let mut vv = [V::zero(); C];
            for c in 0..C {
                vv[c] = V::load(row.add(c * LANES));
            }
            for r in 0..R {
                let p = V::splat(*w.p.add((r0 + r) * w.ldp + j));
                for c in 0..C {
                    acc[r][c] = V::fma(p, vv[c], acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                acc[r][c].store(at(r, c));
            }
        }
    }
}

/// [`weigh_block_run`] for block shapes without a monomorphised version (one output value at a
/// time: the same chains).
///
/// # Safety
/// As [`weigh_block_run`].
#[allow(clippy::too_many_arguments)]
unsafe fn weigh_block_dyn<V: F32x16>(
    w: Weights,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    v: *const f32,
    ldv: usize,
    width: usize,
    out: *mut f32,
) {
    for r in rows {
        for c in cols.clone() {
            // SAFETY: the caller's contract.
            unsafe { weigh_block_run::<V, 1, 1>(w, r, c, keys.clone(), v, ldv, width, out) };
        }
    }
}

macro_rules! weigh_variant {
    ($m:ident, $v:ty, $($feat:literal)?) => {
        mod $m {
            use super::*;
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn weigh(
                w: Weights, v: *const f32, ldv: usize, width: usize, out: *mut f32,
            ) {
                unsafe { weigh_with::<$v>(w, v, ldv, width, out) }
            }
        }
    };
}

per_isa!(weigh_variant);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::{bits, lcg};

    /// The definition, one output at a time: each visible score one chain over `D`, the
    /// probabilities of the visible scores, each output one chain over every key in cache
    /// order with probability 0 for the hidden ones.
    fn oracle(q: &[f32], visible: &[Vec<usize>], kv: &KvCache, heads: usize) -> Vec<f32> {
        let d = kv.head_dim();
        let group = heads / (kv.row() / d);
        let keys = visible.iter().flatten().max().map_or(0, |&j| j + 1);
        let mut out = vec![0.0f32; visible.len() * heads * d];
        for (i, vis) in visible.iter().enumerate() {
            for h in 0..heads {
                let g = h / group;
                let qi = &q[(i * heads + h) * d..(i * heads + h + 1) * d];
                let mut p: Vec<f32> = vis
                    .iter()
                    .map(|&j| {
                        let mut acc = 0.0f32;
                        for (c, &x) in qi.iter().enumerate() {
                            acc = x.mul_add(kv.key(0, j, g, c), acc);
                        }
                        acc
                    })
                    .collect();
                math::softmax_scaled(&mut p, 1.0 / (d as f32).sqrt());
                let mut prob = vec![0.0f32; keys];
                for (&j, &pj) in vis.iter().zip(&p) {
                    prob[j] = pj;
                }
                for c in 0..d {
                    let mut acc = 0.0f32;
                    for (j, &pj) in prob.iter().enumerate() {
                        acc = pj.mul_add(kv.value(0, j, g, c), acc);
                    }
                    out[(i * heads + h) * d + c] = acc;
                }
            }
        }
        out
    }

    /// Asserts that [`attend`] gives the oracle's bits for `visible` (`what` names the case).
    fn assert_oracle_bits(
        q: &[f32],
        visible: &[Vec<usize>],
        kv: &KvCache,
        heads: usize,
        what: &str,
    ) {
        let got = attend(q, visible, kv, 0, heads);
        assert_eq!(bits(&got), bits(&oracle(q, visible, kv, heads)), "{what}");
    }

    /// A cache of `cached` committed tokens plus `fresh` pushed ones (1 layer, 2 KV heads of 8).
    fn cache(cached: usize, fresh: usize, s: &mut u64) -> KvCache {
        cache_of(2, 8, cached, fresh, s)
    }

    /// [`cache`] with `kv_heads` KV heads of `d`.
    fn cache_of(kv_heads: usize, d: usize, cached: usize, fresh: usize, s: &mut u64) -> KvCache {
        let mut kv = KvCache::new(1, kv_heads, d);
        let row = kv.row();
        for (n, commit) in [(cached, true), (fresh, false)] {
            let k: Vec<f32> = (0..n * row).map(|_| lcg(s)).collect();
            let v: Vec<f32> = (0..n * row).map(|_| lcg(s)).collect();
            kv.push(0, &k, &v);
            if commit {
                kv.commit(n);
            }
        }
        kv
    }

    #[test]
    fn every_token_gets_the_one_chain_definition_over_the_keys_it_sees() {
        let mut s = 31;
        for (cached, fresh) in [(0usize, 1usize), (5, 3), (17, 20), (40, 33)] {
            let kv = cache(cached, fresh, &mut s);
            let heads = 4;
            let q: Vec<f32> = (0..fresh * heads * 8).map(|_| lcg(&mut s)).collect();
            // Causal rows, then a tree: every other fresh token skips its predecessor.
            let causal: Vec<Vec<usize>> = (0..fresh).map(|i| (0..=cached + i).collect()).collect();
            let tree: Vec<Vec<usize>> = (0..fresh)
                .map(|i| {
                    let mut v: Vec<usize> = (0..cached).collect();
                    v.extend(
                        (0..=i)
                            .filter(|&j| j == i || (i - j) % 2 == 0)
                            .map(|j| cached + j),
                    );
                    v
                })
                .collect();
            for visible in [causal, tree] {
                assert_oracle_bits(
                    &q,
                    &visible,
                    &kv,
                    heads,
                    &format!("cached {cached}, fresh {fresh}"),
                );
            }
        }
    }

    #[test]
    fn a_token_gets_the_same_bits_alone_and_beside_others() {
        let mut s = 32;
        let (cached, fresh, heads) = (30, 24, 4);
        let kv = cache(cached, fresh, &mut s);
        let q: Vec<f32> = (0..fresh * heads * 8).map(|_| lcg(&mut s)).collect();
        let visible: Vec<Vec<usize>> = (0..fresh).map(|i| (0..=cached + i).collect()).collect();
        let all = attend(&q, &visible, &kv, 0, heads);
        let width = heads * 8;
        for i in [0, 7, 16, 23] {
            let alone = attend(
                &q[i * width..(i + 1) * width],
                &visible[i..=i],
                &kv,
                0,
                heads,
            );
            assert_eq!(
                bits(&alone),
                bits(&all[i * width..(i + 1) * width]),
                "token {i}"
            );
        }
    }

    #[test]
    fn long_contexts_and_full_width_heads_keep_the_one_chain_definition() {
        // Keys past several passes of the value product (not a whole number of them), heads of
        // 128 (a whole register block of columns) and 64, an odd number of query rows per KV head.
        let mut s = 33;
        for (d, cached) in [(128usize, 2 * WEIGH_KEYS + 45), (64, WEIGH_KEYS + 1)] {
            let (fresh, heads) = (5, 6);
            let kv = cache_of(2, d, cached, fresh, &mut s);
            let q: Vec<f32> = (0..fresh * heads * d).map(|_| lcg(&mut s)).collect();
            let causal: Vec<Vec<usize>> = (0..fresh).map(|i| (0..=cached + i).collect()).collect();
            let mut tree = causal.clone();
            tree[3].retain(|&j| j != cached + 2);
            for visible in [causal, tree] {
                assert_oracle_bits(&q, &visible, &kv, heads, &format!("d {d}, cached {cached}"));
            }
        }
    }

    /// A measurement, not a check (ignored by default): one token's attention over `CTX`
    /// (default 1,200) cached tokens in each of 48 layers of Qwen3-30B-A3B's shape (32 query
    /// heads, 4 KV heads of 128), fastest of 20, beside the KV bytes it reads:
    /// `CTX=1200 SPECFIT_THREADS=2 cargo test --release -p specfit-engine --lib
    /// prints_the_time_of_attention -- --ignored --nocapture` (`T` query tokens, default 1).
    #[test]
    #[ignore]
    fn prints_the_time_of_attention_over_a_paper_scale_cache() {
        let (layers, kvh, d, heads) = (48usize, 4usize, 128usize, 32usize);
        let ctx: usize = std::env::var("CTX").map_or(1200, |v| v.parse().unwrap());
        let t: usize = std::env::var("T").map_or(1, |v| v.parse().unwrap());
        let mut kv = KvCache::new(layers, kvh, d);
        let row = kv.row();
        let mut s = 5u64;
        let k: Vec<f32> = (0..ctx * row).map(|_| lcg(&mut s)).collect();
        let v: Vec<f32> = (0..ctx * row).map(|_| lcg(&mut s)).collect();
        for l in 0..layers {
            kv.push(l, &k, &v);
        }
        kv.commit(ctx);
        let q: Vec<f32> = (0..t * heads * d).map(|_| lcg(&mut s)).collect();
        let visible: Vec<Vec<usize>> = (0..t).map(|_| (0..ctx).collect()).collect();
        let mut best = f64::MAX;
        for _ in 0..20 {
            let start = std::time::Instant::now();
            for l in 0..layers {
                std::hint::black_box(attend(&q, &visible, &kv, l, heads));
            }
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
        }
        let mb = (layers * ctx * row * 2 * 4) as f64 / 1e6;
        eprintln!(
            "ctx {ctx} T {t}: {best:.2} ms for 48 layers ({mb:.0} MB of KV, {:.1} GB/s)",
            mb / best
        );
    }
}
