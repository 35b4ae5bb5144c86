//! The attention KV cache: per layer, the post-RoPE keys and the values of every token seen so
//! far, in cache order (not necessarily position order: a verified tree sits in it until
//! [`KvCache::compact`] keeps only the accepted path). It does not compute attention.

use crate::error::EngineError;

/// Tokens per key tile.
pub(crate) const TILE: usize = crate::kernels::packed::PANEL;

/// Keys and values of all layers.
///
/// Keys are stored in tiles of 16 tokens, K-major per KV head (`[tile][kv_head][head_dim][16]`),
/// so attention reads them as panels ([`crate::kernels::packed`]): one tile row feeds the
/// scores of 16 keys at once. Values are stored per token (`[token][kv_head][head_dim padded
/// to 16]`), which is already the panel layout for `probabilities · V`.
#[derive(Debug, Clone)]
pub struct KvCache {
    kv_heads: usize,
    head_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    /// Tokens pushed to each layer in the forward now running, not yet committed.
    pending: Vec<usize>,
}

impl KvCache {
    /// An empty cache for `layers` layers of `kv_heads` heads of `head_dim`.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> KvCache {
        KvCache {
            kv_heads,
            head_dim,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            len: 0,
            pending: vec![0; layers],
        }
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Floats per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Floats per token per layer (`kv_heads × head_dim`).
    pub fn row(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `head_dim` rounded up to whole panels: the stride of one head in a value row.
    pub(crate) fn head_stride(&self) -> usize {
        self.head_dim.div_ceil(TILE) * TILE
    }

    /// Floats per value row.
    pub(crate) fn value_row(&self) -> usize {
        self.kv_heads * self.head_stride()
    }

    /// Floats per key tile (all heads).
    pub(crate) fn tile_floats(&self) -> usize {
        self.kv_heads * self.head_dim * TILE
    }

    /// Key tiles of `layer` (see the type docs); covers every pushed token.
    pub(crate) fn key_tiles(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Value rows of `layer` (see the type docs); covers every pushed token.
    pub(crate) fn value_rows(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Whether both caches hold the same tokens with bit-identical keys and values (whatever
    /// stale floats lie past their length in a partly used key tile).
    pub fn same_entries(&self, other: &KvCache) -> bool {
        let shape = (self.keys.len(), self.kv_heads, self.head_dim, self.len);
        if shape != (other.keys.len(), other.kv_heads, other.head_dim, other.len) {
            return false;
        }
        (0..self.keys.len()).all(|l| {
            (0..self.len).all(|t| {
                (0..self.kv_heads).all(|h| {
                    (0..self.head_dim).all(|d| {
                        self.key(l, t, h, d).to_bits() == other.key(l, t, h, d).to_bits()
                            && self.value(l, t, h, d).to_bits() == other.value(l, t, h, d).to_bits()
                    })
                })
            })
        })
    }

    /// Key `d` of head `h` of token `t` in `layer`.
    pub fn key(&self, layer: usize, t: usize, h: usize, d: usize) -> f32 {
        self.keys[layer][self.key_index(t, h, d)]
    }

    /// Value `d` of head `h` of token `t` in `layer`.
    pub fn value(&self, layer: usize, t: usize, h: usize, d: usize) -> f32 {
        self.values[layer][t * self.value_row() + h * self.head_stride() + d]
    }

    fn key_index(&self, t: usize, h: usize, d: usize) -> usize {
        (t / TILE) * self.tile_floats() + (h * self.head_dim + d) * TILE + t % TILE
    }

    /// Appends the keys and values of new tokens (`t × kv_heads·head_dim` each) to `layer`
    /// (the forward does this layer by layer, then calls [`KvCache::commit`]).
    pub(crate) fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let row = self.row();
        let t = k.len() / row;
        let first = self.len + self.pending[layer];
        let tiles = (first + t).div_ceil(TILE);
        let tile_floats = self.tile_floats();
        if self.keys[layer].len() < tiles * tile_floats {
            self.keys[layer].resize(tiles * tile_floats, 0.0);
        }
        let (hs, d) = (self.head_stride(), self.head_dim);
        for i in 0..t {
            for h in 0..self.kv_heads {
                for c in 0..d {
                    let at = self.key_index(first + i, h, c);
                    self.keys[layer][at] = k[i * row + h * d + c];
                }
            }
        }
        let values = &mut self.values[layer];
        values.truncate(first * self.kv_heads * hs);
        for i in 0..t {
            for h in 0..self.kv_heads {
                values.extend_from_slice(&v[i * row + h * d..i * row + (h + 1) * d]);
                values.resize(values.len() + hs - d, 0.0);
            }
        }
        self.pending[layer] += t;
    }

    /// Records that every layer now holds `added` more tokens.
    pub(crate) fn commit(&mut self, added: usize) {
        debug_assert!(self.pending.iter().all(|&p| p == added));
        self.len += added;
        self.pending.iter_mut().for_each(|p| *p = 0);
    }

    /// Drops every token from `len` on.
    pub fn truncate(&mut self, len: usize) -> Result<(), EngineError> {
        if len > self.len {
            return Err(EngineError::BadCacheEdit {
                reason: format!("cannot truncate {} tokens to {len}", self.len),
            });
        }
        self.keep_first(len);
        Ok(())
    }

    /// Keeps the first `len` tokens of every layer (forgetting anything pushed and not
    /// committed).
    fn keep_first(&mut self, len: usize) {
        let (tile_floats, vrow) = (self.tile_floats(), self.value_row());
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(len.div_ceil(TILE) * tile_floats);
            v.truncate(len * vrow);
        }
        self.pending.iter_mut().for_each(|p| *p = 0);
        self.len = len;
    }

    /// Keeps the tokens `[0, from)` and, after them, the tokens `keep` (strictly increasing cache
    /// indices ≥ `from`), in that order; drops the rest. Used after verification to keep the
    /// accepted path of a tree.
    pub fn compact(&mut self, from: usize, keep: &[usize]) -> Result<(), EngineError> {
        let ok = from <= self.len
            && keep.windows(2).all(|w| w[0] < w[1])
            && keep.first().is_none_or(|&k| k >= from)
            && keep.last().is_none_or(|&k| k < self.len);
        if !ok {
            return Err(EngineError::BadCacheEdit {
                reason: format!(
                    "compact(from {from}, keep {keep:?}) on {} tokens: need increasing indices in {from}..{}",
                    self.len, self.len
                ),
            });
        }
        let (vrow, heads, d) = (self.value_row(), self.kv_heads, self.head_dim);
        for layer in 0..self.keys.len() {
            for (slot, &src) in keep.iter().enumerate() {
                let dst = from + slot;
                if dst == src {
                    continue;
                }
                for h in 0..heads {
                    for c in 0..d {
                        let (a, b) = (self.key_index(src, h, c), self.key_index(dst, h, c));
                        self.keys[layer][b] = self.keys[layer][a];
                    }
                }
                self.values[layer].copy_within(src * vrow..(src + 1) * vrow, dst * vrow);
            }
        }
        self.keep_first(from + keep.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive model: per layer, one `(key row, value row)` per token, in cache order.
    type Naive = Vec<Vec<(Vec<f32>, Vec<f32>)>>;

    fn check(kv: &KvCache, naive: &Naive, heads: usize, d: usize) {
        assert_eq!(kv.len(), naive[0].len());
        for (layer, rows) in naive.iter().enumerate() {
            for (t, (k, v)) in rows.iter().enumerate() {
                for h in 0..heads {
                    for c in 0..d {
                        assert_eq!(kv.key(layer, t, h, c), k[h * d + c], "key l{layer} t{t}");
                        assert_eq!(
                            kv.value(layer, t, h, c),
                            v[h * d + c],
                            "value l{layer} t{t}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pushes_truncations_and_compactions_keep_every_key_and_value_where_a_plain_list_would() {
        let (layers, heads, d) = (2, 3, 5); // head_dim not a multiple of 16: padded value rows
        let mut kv = KvCache::new(layers, heads, d);
        let mut naive: Naive = vec![Vec::new(); layers];
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) as usize
        };
        let mut stamp = 0.0f32;
        for _ in 0..200 {
            match next() % 4 {
                // A forward of 1..=20 tokens (crossing tile boundaries).
                0 | 1 => {
                    let t = 1 + next() % 20;
                    for (layer, rows) in naive.iter_mut().enumerate() {
                        let mut k = Vec::new();
                        let mut v = Vec::new();
                        for _ in 0..t {
                            let kr: Vec<f32> = (0..heads * d).map(|i| stamp + i as f32).collect();
                            let vr: Vec<f32> = kr.iter().map(|x| -x).collect();
                            stamp += 1000.0;
                            k.extend(&kr);
                            v.extend(&vr);
                            rows.push((kr, vr));
                        }
                        kv.push(layer, &k, &v);
                    }
                    kv.commit(t);
                }
                2 => {
                    let len = next() % (kv.len() + 1);
                    kv.truncate(len).unwrap();
                    naive.iter_mut().for_each(|r| r.truncate(len));
                }
                _ => {
                    let from = next() % (kv.len() + 1);
                    let keep: Vec<usize> = (from..kv.len()).filter(|_| next() % 2 == 0).collect();
                    kv.compact(from, &keep).unwrap();
                    for rows in naive.iter_mut() {
                        let kept: Vec<_> = keep.iter().map(|&i| rows[i].clone()).collect();
                        rows.truncate(from);
                        rows.extend(kept);
                    }
                }
            }
            check(&kv, &naive, heads, d);
        }
    }

    #[test]
    fn bad_edits_are_errors_and_leave_the_cache_as_it_was() {
        let mut kv = KvCache::new(1, 1, 4);
        kv.push(0, &[1.0; 12], &[2.0; 12]);
        kv.commit(3);
        let refused =
            |r: Result<(), EngineError>| matches!(r, Err(EngineError::BadCacheEdit { .. }));
        assert!(refused(kv.truncate(4)));
        assert!(refused(kv.compact(1, &[2, 1])));
        assert!(refused(kv.compact(2, &[1])));
        assert!(refused(kv.compact(0, &[3])));
        assert_eq!(kv.len(), 3);
        assert_eq!(kv.key(0, 2, 0, 3), 1.0);
    }
}
