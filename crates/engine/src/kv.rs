//! The attention KV cache: per layer, the post-RoPE keys and the values of every token seen so
//! far, in cache order (not necessarily position order: a verified tree sits in it until
//! [`KvCache::compact`] keeps only the accepted path). It does not compute attention.

use crate::error::EngineError;

/// Keys and values of all layers. Row `t` of a layer is `kv_heads × head_dim` floats.
#[derive(Debug, Clone)]
pub struct KvCache {
    row: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers of `row` floats per token.
    pub fn new(layers: usize, row: usize) -> KvCache {
        KvCache {
            row,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            len: 0,
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

    /// Floats per token per layer.
    pub fn row(&self) -> usize {
        self.row
    }

    /// Keys of `layer` (`len × row`).
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Values of `layer` (`len × row`).
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Appends the keys and values of new tokens to `layer` (the forward does this layer by
    /// layer, then calls [`KvCache::commit`]).
    pub(crate) fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        self.keys[layer].extend_from_slice(k);
        self.values[layer].extend_from_slice(v);
    }

    /// Records that every layer now holds `added` more tokens.
    pub(crate) fn commit(&mut self, added: usize) {
        self.len += added;
        debug_assert!(self.keys.iter().all(|k| k.len() == self.len * self.row));
    }

    /// Drops every token from `len` on.
    pub fn truncate(&mut self, len: usize) -> Result<(), EngineError> {
        if len > self.len {
            return Err(EngineError::BadCacheEdit {
                reason: format!("cannot truncate {} tokens to {len}", self.len),
            });
        }
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(len * self.row);
            v.truncate(len * self.row);
        }
        self.len = len;
        Ok(())
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
        let row = self.row;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for (slot, &src) in keep.iter().enumerate() {
                let dst = from + slot;
                if dst != src {
                    buf.copy_within(src * row..(src + 1) * row, dst * row);
                }
            }
            buf.truncate((from + keep.len()) * row);
        }
        self.len = from + keep.len();
        Ok(())
    }
}
