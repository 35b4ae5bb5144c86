//! What one forward takes (tokens, their positions, who attends to whom, which hidden states and
//! logits to return) and what it gives back. Plain data; the model file does the work.

use crate::error::EngineError;
use crate::experts::CopyStats;

/// Which earlier tokens each new token attends to. Every new token always sees every token
/// already in the KV cache.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// New token `i` sees new tokens `0..=i` (prefill, plain decoding).
    Causal,
    /// A draft tree: new token `i` sees itself and its ancestors; `parents[i]` is the parent's
    /// index among the new tokens (`None` = its parent is the last cached token).
    Tree(&'a [Option<usize>]),
    /// Row `i` (length `cached + new`) says which cached and new tokens token `i` sees; it must
    /// see itself.
    Explicit(&'a [Vec<bool>]),
}

/// Which rows of logits to compute.
#[derive(Debug, Clone, Copy)]
pub enum Logits<'a> {
    All,
    Last,
    Rows(&'a [usize]),
    None,
}

impl Logits<'_> {
    /// The rows of a `t`-token forward that get logits, ascending as given (rows past the
    /// forward are dropped).
    pub fn rows(&self, t: usize) -> Vec<usize> {
        match self {
            Logits::All => (0..t).collect(),
            Logits::Last => (t.saturating_sub(1)..t).collect(),
            Logits::Rows(r) => r.iter().copied().filter(|&i| i < t).collect(),
            Logits::None => Vec::new(),
        }
    }
}

/// One forward's input.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    /// RoPE positions; `None` = consecutive after the cached tokens.
    pub positions: Option<&'a [usize]>,
    pub mask: Mask<'a>,
    /// Layers whose *input* residual stream to return (EAGLE-3 reads 2, L/2, L−3).
    pub taps: &'a [usize],
    pub logits: Logits<'a>,
}

impl<'a> Batch<'a> {
    /// A causal batch of `tokens` at consecutive positions, logits for every row.
    pub fn causal(tokens: &'a [u32]) -> Batch<'a> {
        Batch {
            tokens,
            positions: None,
            mask: Mask::Causal,
            taps: &[],
            logits: Logits::All,
        }
    }

    /// The same batch returning logits for `logits` only.
    pub fn with_logits(self, logits: Logits<'a>) -> Batch<'a> {
        Batch { logits, ..self }
    }

    /// The same batch also returning the input residual of layers `taps`.
    pub fn with_taps(self, taps: &'a [usize]) -> Batch<'a> {
        Batch { taps, ..self }
    }

    /// The same batch at RoPE `positions`.
    pub fn with_positions(self, positions: &'a [usize]) -> Batch<'a> {
        Batch {
            positions: Some(positions),
            ..self
        }
    }

    /// The same batch attending as `mask` says.
    pub fn with_mask(self, mask: Mask<'a>) -> Batch<'a> {
        Batch { mask, ..self }
    }
}

/// One forward's output.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `rows × vocab` logits for the rows in `logit_rows`.
    pub logits: Vec<f32>,
    pub logit_rows: Vec<usize>,
    pub vocab: usize,
    /// Per layer: `None` for dense layers, else each token's experts in top-k order.
    pub routes: Vec<Option<Vec<Vec<u32>>>>,
    /// Per requested tap: `tokens × hidden` residual stream entering that layer.
    pub taps: Vec<Vec<f32>>,
    /// Expert copies made by this forward.
    pub copies: CopyStats,
}

impl ForwardOutput {
    /// Logits of output row `r` (an index into `logit_rows`).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.logits[r * self.vocab..(r + 1) * self.vocab]
    }

    /// `Σ_layers |∪ experts routed by this forward's tokens|`: the distinct (layer, expert)
    /// pairs the forward needed.
    pub fn demand(&self) -> u64 {
        self.routes
            .iter()
            .flatten()
            .map(|layer| {
                let mut all: Vec<u32> = layer.iter().flatten().copied().collect();
                all.sort_unstable();
                all.dedup();
                all.len() as u64
            })
            .sum()
    }

    /// Argmax (lowest index on ties) of output row `r`.
    pub fn argmax(&self, r: usize) -> u32 {
        crate::sampling::argmax(self.row(r))
    }
}

/// Positions of `t` new tokens after `cached` ones: the given ones (checked to be `t`), or
/// consecutive.
pub(crate) fn resolve_positions(
    given: Option<&[usize]>,
    cached: usize,
    t: usize,
) -> Result<Vec<usize>, EngineError> {
    match given {
        Some(p) if p.len() != t => Err(EngineError::PositionCount {
            tokens: t,
            positions: p.len(),
        }),
        Some(p) => Ok(p.to_vec()),
        None => Ok((cached..cached + t).collect()),
    }
}

impl Mask<'_> {
    /// For each of `new` tokens, the cache indices it attends to, ascending (new token `i` has
    /// cache index `cached + i`).
    pub fn visible(&self, cached: usize, new: usize) -> Result<Vec<Vec<usize>>, EngineError> {
        let bad = |reason: String| EngineError::BadMask { reason };
        match *self {
            Mask::Causal => Ok((0..new).map(|i| (0..=cached + i).collect()).collect()),
            Mask::Tree(parents) => {
                if parents.len() != new {
                    return Err(bad(format!("{} parents for {new} tokens", parents.len())));
                }
                let mut out: Vec<Vec<usize>> = Vec::with_capacity(new);
                for (i, p) in parents.iter().enumerate() {
                    let mut seen: Vec<usize> = match *p {
                        None => (0..cached).collect(),
                        Some(q) if q < i => out[q].clone(),
                        Some(q) => {
                            return Err(bad(format!(
                                "token {i} has parent {q}, not an earlier token"
                            )))
                        }
                    };
                    seen.push(cached + i);
                    out.push(seen);
                }
                Ok(out)
            }
            Mask::Explicit(rows) => {
                if rows.len() != new {
                    return Err(bad(format!("{} mask rows for {new} tokens", rows.len())));
                }
                rows.iter()
                    .enumerate()
                    .map(|(i, row)| {
                        if row.len() != cached + new {
                            return Err(bad(format!(
                                "row {i} has {} entries, expected {}",
                                row.len(),
                                cached + new
                            )));
                        }
                        if !row[cached + i] {
                            return Err(bad(format!("token {i} must attend to itself")));
                        }
                        Ok(row
                            .iter()
                            .enumerate()
                            .filter(|(_, &v)| v)
                            .map(|(j, _)| j)
                            .collect())
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_token_sees_the_cache_its_ancestors_and_itself() {
        let parents = [None, Some(0), None, Some(1)];
        let v = Mask::Tree(&parents).visible(2, 4).unwrap();
        assert_eq!(v[0], vec![0, 1, 2]);
        assert_eq!(v[1], vec![0, 1, 2, 3]);
        assert_eq!(v[2], vec![0, 1, 4]);
        assert_eq!(v[3], vec![0, 1, 2, 3, 5]);
    }

    #[test]
    fn malformed_masks_are_rejected() {
        let bad = |m: Mask<'_>, cached, new, why: &str| match m.visible(cached, new) {
            Err(EngineError::BadMask { reason }) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{other:?}"),
        };
        bad(Mask::Tree(&[Some(0)]), 0, 1, "not an earlier token");
        bad(Mask::Tree(&[None]), 0, 2, "1 parents for 2 tokens");
        bad(
            Mask::Explicit(&[vec![true, false]]),
            1,
            1,
            "attend to itself",
        );
        bad(
            Mask::Explicit(&[vec![true]]),
            1,
            1,
            "row 0 has 1 entries, expected 2",
        );
    }
}
