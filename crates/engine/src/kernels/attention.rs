//! Attention over the KV cache, batch-invariant: `softmax(q·kᵀ / √D) · v` for every token and
//! query head of a forward, over the cache entries each token sees (GQA), tiled by KV head and
//! blocks of tokens and spread over the compute threads. Projections, norms and RoPE are the
//! model's ([`crate::model`]); the cache layout is [`crate::kv`]'s.

use super::packed::{self, PanelSrc, RowsIn, RowsOut};
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
        let p_rows = RowsIn::of(&scores, keys16, nq, keys);
        let value_panels = PanelSrc::F32 {
            base: values.as_ptr().add(g * hs),
            ldb: kv.value_row(),
            pstride: TILE,
        };
        let out = RowsOut::of(&mut o, hs);
        packed::gemm_raw(isa, p_rows, value_panels, 0..hs / TILE, out)
    };
    o
}

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

    /// A cache of `cached` committed tokens plus `fresh` pushed ones (1 layer, 2 KV heads of 8).
    fn cache(cached: usize, fresh: usize, s: &mut u64) -> KvCache {
        let mut kv = KvCache::new(1, 2, 8);
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
                let got = attend(&q, &visible, &kv, 0, heads);
                assert_eq!(
                    bits(&got),
                    bits(&oracle(&q, &visible, &kv, heads)),
                    "cached {cached}, fresh {fresh}"
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
}
