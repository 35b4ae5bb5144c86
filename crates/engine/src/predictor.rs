//! The route predictor: a linear head from what the drafter knows about a draft node — the
//! drafter hidden state that proposed it and the embedding of its token — to a score for every
//! (MoE layer, expert); the top-k per layer are the predicted routes. Fitted in closed form by
//! ridge regression on routes recorded from the target (one-hot expert indicators as targets),
//! saved as safetensors. It predicts; it does not decide what to verify.
//!
//! Legend: D = features (drafter hidden + target hidden), L = MoE layers, E = experts.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::kernels::math::top_k;
use crate::kernels::packed::PackedMatrix;
use crate::kernels::WeightView;

/// One training example: features and the true routes per MoE layer.
pub type RouteSample = (Vec<f32>, Vec<Vec<u32>>);

/// A head's shape: `layers` MoE layers of `experts` experts, `num_experts_per_tok` predicted per
/// layer, from features of width `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub layers: usize,
    pub experts: usize,
    pub num_experts_per_tok: usize,
    pub dim: usize,
}

impl HeadShape {
    /// The head of `target`'s routing fed by a drafter of hidden width `drafter_hidden`: its
    /// features are the drafter's hidden state beside the token's target embedding.
    pub fn for_pair(target: &Qwen3MoeConfig, drafter_hidden: usize) -> HeadShape {
        HeadShape {
            layers: target.moe_layers().len(),
            experts: target.num_experts,
            num_experts_per_tok: target.num_experts_per_tok,
            dim: drafter_hidden + target.hidden_size,
        }
    }
}

/// The fitted head.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePredictor {
    layers: usize,
    experts: usize,
    num_experts_per_tok: usize,
    dim: usize,
    /// `[L·E, D]` weights and `[L·E]` bias.
    w: Vec<f32>,
    b: Vec<f32>,
    /// `w` in the kernels' panel order, for scoring many nodes in one product.
    packed: PackedMatrix,
}

/// Features of a draft node: its proposing hidden state followed by its token's embedding.
pub fn features(hidden: &[f32], embed: WeightView<'_>, token: u32, embed_dim: usize) -> Vec<f32> {
    let row = embed.slice(token as usize * embed_dim..(token as usize + 1) * embed_dim);
    hidden
        .iter()
        .copied()
        .chain((0..embed_dim).map(|c| row.get(c)))
        .collect()
}

fn bad(reason: String) -> EngineError {
    EngineError::ExpertStore {
        reason: format!("route predictor: {reason}"),
    }
}

impl RoutePredictor {
    /// Fits `[w | b]` minimising `‖X w + b − Y‖² + ridge · ‖w‖²` with `Y` the one-hot routes.
    /// Every sample's features must be `shape.dim` wide and its routes `shape.layers` long.
    pub fn fit(
        samples: &[RouteSample],
        shape: HeadShape,
        ridge: f64,
    ) -> Result<RoutePredictor, EngineError> {
        if samples.is_empty() {
            return Err(bad("no training samples".into()));
        }
        let HeadShape {
            layers,
            experts,
            dim,
            ..
        } = shape;
        let (d1, outs) = (dim + 1, layers * experts);
        // Normal equations with a constant feature for the bias: A = XᵀX + ridge·I, B = XᵀY.
        let mut a = vec![0.0f64; d1 * d1];
        let mut b = vec![0.0f64; d1 * outs];
        for (x, routes) in samples {
            if x.len() != dim || routes.len() != layers {
                return Err(bad("samples of different shapes".into()));
            }
            let xe: Vec<f64> = x.iter().map(|&v| v as f64).chain([1.0]).collect();
            for i in 0..d1 {
                for j in 0..=i {
                    a[i * d1 + j] += xe[i] * xe[j];
                }
            }
            for (l, experts_l) in routes.iter().enumerate() {
                for &e in experts_l {
                    let o = l * experts + e as usize;
                    for i in 0..d1 {
                        b[i * outs + o] += xe[i];
                    }
                }
            }
        }
        for i in 0..d1 {
            for j in 0..i {
                a[j * d1 + i] = a[i * d1 + j];
            }
            if i < dim {
                a[i * d1 + i] += ridge;
            }
        }
        let sol = cholesky_solve(&mut a, d1, &b, outs)
            .ok_or_else(|| bad("the normal equations are singular; raise the ridge".into()))?;
        let mut w = vec![0.0f32; outs * dim];
        let mut bias = vec![0.0f32; outs];
        for o in 0..outs {
            for i in 0..dim {
                w[o * dim + i] = sol[i * outs + o] as f32;
            }
            bias[o] = sol[dim * outs + o] as f32;
        }
        Ok(RoutePredictor::new(shape, w, bias))
    }

    /// Feature width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn new(shape: HeadShape, w: Vec<f32>, b: Vec<f32>) -> RoutePredictor {
        let packed =
            PackedMatrix::pack(WeightView::F32(&w), shape.layers * shape.experts, shape.dim);
        RoutePredictor {
            layers: shape.layers,
            experts: shape.experts,
            num_experts_per_tok: shape.num_experts_per_tok,
            dim: shape.dim,
            w,
            b,
            packed,
        }
    }

    /// Predicted routes (the `num_experts_per_tok` best-scoring experts per layer, best first, ties to the
    /// lower id).
    pub fn predict(&self, x: &[f32]) -> Vec<Vec<u32>> {
        self.predict_rows(x, 1).pop().expect("one row")
    }

    /// [`RoutePredictor::predict`] for `rows` feature rows `xs` (`rows × D`), scored in one
    /// matrix product; each row's routes are what it gets alone.
    pub fn predict_rows(&self, xs: &[f32], rows: usize) -> Vec<Vec<Vec<u32>>> {
        let outs = self.layers * self.experts;
        let mut scores = vec![0.0f32; rows * outs];
        self.packed.gemm(xs, rows, &mut scores);
        scores
            .chunks_exact_mut(outs)
            .map(|row| {
                row.iter_mut().zip(&self.b).for_each(|(s, &b)| *s += b);
                row.chunks_exact(self.experts)
                    .map(|layer| {
                        top_k(layer, self.num_experts_per_tok)
                            .into_iter()
                            .map(|(e, _)| e)
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    /// Per layer, the fraction of true experts found in the predicted top-k.
    pub fn accuracy(&self, samples: &[RouteSample]) -> Vec<f64> {
        let mut hit = vec![0usize; self.layers];
        let mut total = vec![0usize; self.layers];
        for (x, routes) in samples {
            for (l, (pred, truth)) in self.predict(x).iter().zip(routes).enumerate() {
                hit[l] += truth.iter().filter(|e| pred.contains(e)).count();
                total[l] += truth.len();
            }
        }
        hit.iter()
            .zip(&total)
            .map(|(&h, &t)| if t > 0 { h as f64 / t as f64 } else { 0.0 })
            .collect()
    }

    /// A head from its parts: its shape, weights `[L·E, D]` and bias `[L·E]` (lengths as the
    /// shape says).
    pub fn from_parts(shape: HeadShape, w: Vec<f32>, b: Vec<f32>) -> RoutePredictor {
        RoutePredictor::new(shape, w, b)
    }

    /// The weights `[L·E, D]` and bias `[L·E]`.
    pub fn weights(&self) -> (&[f32], &[f32]) {
        (&self.w, &self.b)
    }

    /// Writes `weight` [L·E, D] and `bias` [L·E] (f32) with the shape in the metadata.
    pub fn save(&self, path: &Path) -> Result<(), EngineError> {
        let wb: Vec<u8> = self.w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bb: Vec<u8> = self.b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let outs = self.layers * self.experts;
        let views = [
            (
                "weight",
                TensorView::new(Dtype::F32, vec![outs, self.dim], &wb)
                    .map_err(|e| bad(e.to_string()))?,
            ),
            (
                "bias",
                TensorView::new(Dtype::F32, vec![outs], &bb).map_err(|e| bad(e.to_string()))?,
            ),
        ];
        let meta: HashMap<String, String> = [
            ("format".to_string(), "specfit-route-predictor".to_string()),
            ("layers".to_string(), self.layers.to_string()),
            ("experts".to_string(), self.experts.to_string()),
            // The file's key for experts per token (kept for the files already written).
            ("top_k".to_string(), self.num_experts_per_tok.to_string()),
        ]
        .into();
        let tmp = path.with_extension("tmp");
        safetensors::serialize_to_file(views, Some(meta), &tmp).map_err(|e| bad(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(EngineError::io(path))
    }

    /// Reads a predictor and checks it against the target's shape and the feature width.
    pub fn load(path: &Path, shape: HeadShape) -> Result<RoutePredictor, EngineError> {
        let HeadShape {
            layers,
            experts,
            dim,
            ..
        } = shape;
        let bytes = std::fs::read(path).map_err(EngineError::io(path))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            EngineError::Safetensors {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        let outs = layers * experts;
        let take = |name: &str, shape: Vec<usize>| -> Result<Vec<f32>, EngineError> {
            let t = st
                .tensor(name)
                .map_err(|e| bad(format!("{}: {name}: {e}", path.display())))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape.as_slice() {
                return Err(bad(format!(
                    "{}: {name} is {:?} {:?}, this target and drafter need F32 {shape:?}",
                    path.display(),
                    t.dtype(),
                    t.shape()
                )));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let w = take("weight", vec![outs, dim])?;
        let b = take("bias", vec![outs])?;
        Ok(RoutePredictor::new(shape, w, b))
    }
}

/// Solves `A X = B` for symmetric positive definite `A` (n × n, overwritten by its Cholesky
/// factor) and `B` (n × m). `None` when `A` is not positive definite.
fn cholesky_solve(a: &mut [f64], n: usize, b: &[f64], m: usize) -> Option<Vec<f64>> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d <= 0.0 {
            return None;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    let mut x = b.to_vec();
    for c in 0..m {
        for i in 0..n {
            let mut s = x[i * m + c];
            for k in 0..i {
                s -= a[i * n + k] * x[k * m + c];
            }
            x[i * m + c] = s / a[i * n + i];
        }
        for i in (0..n).rev() {
            let mut s = x[i * m + c];
            for k in i + 1..n {
                s -= a[k * n + i] * x[k * m + c];
            }
            x[i * m + c] = s / a[i * n + i];
        }
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linearly_separable_routing_is_learned_well() {
        // Expert e of layer 0 fires when feature e is the largest; layer 1 mirrors it.
        let mut rng = specfit_selector::synth::Rng::new(1);
        let samples: Vec<RouteSample> = (0..400)
            .map(|_| {
                let x: Vec<f32> = (0..4).map(|_| rng.unit() as f32).collect();
                let best = (0..4).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap() as u32;
                (x, vec![vec![best], vec![3 - best]])
            })
            .collect();
        let shape = |layers| HeadShape {
            layers,
            experts: 4,
            num_experts_per_tok: 1,
            dim: 4,
        };
        let p = RoutePredictor::fit(&samples[..300], shape(2), 1e-6).unwrap();
        let acc = p.accuracy(&samples[300..]);
        assert!(acc.iter().all(|&a| a > 0.7), "{acc:?}");
        let dir = std::env::temp_dir().join(format!("specfit-predictor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.safetensors");
        p.save(&path).unwrap();
        assert_eq!(RoutePredictor::load(&path, shape(2)).unwrap(), p);
        let e = RoutePredictor::load(&path, shape(3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("3"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn routes_scored_in_a_batch_are_each_rows_routes_alone_and_the_naive_top_k() {
        let mut rng = specfit_selector::synth::Rng::new(7);
        let (layers, experts, num_experts_per_tok, dim) = (3, 20, 4, 37);
        let w: Vec<f32> = (0..layers * experts * dim)
            .map(|_| rng.unit() as f32 - 0.5)
            .collect();
        let b: Vec<f32> = (0..layers * experts).map(|_| rng.unit() as f32).collect();
        let p = RoutePredictor::new(
            HeadShape {
                layers,
                experts,
                num_experts_per_tok,
                dim,
            },
            w.clone(),
            b.clone(),
        );
        let rows = 19;
        let xs: Vec<f32> = (0..rows * dim).map(|_| rng.unit() as f32 - 0.5).collect();
        let batch = p.predict_rows(&xs, rows);
        for (r, routes) in batch.iter().enumerate() {
            let x = &xs[r * dim..(r + 1) * dim];
            assert_eq!(routes, &p.predict(x), "row {r}");
            for (l, got) in routes.iter().enumerate() {
                let mut naive: Vec<(u32, f64)> = (0..experts)
                    .map(|e| {
                        let o = l * experts + e;
                        let dot: f64 = (0..dim).map(|i| x[i] as f64 * w[o * dim + i] as f64).sum();
                        (e as u32, dot + b[o] as f64)
                    })
                    .collect();
                naive.sort_by(|a, b| b.1.total_cmp(&a.1));
                let want: Vec<u32> = naive
                    .iter()
                    .take(num_experts_per_tok)
                    .map(|&(e, _)| e)
                    .collect();
                assert_eq!(got, &want, "row {r} layer {l}");
            }
        }
    }

    #[test]
    fn cholesky_solves_a_small_system() {
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let x = cholesky_solve(&mut a, 2, &[2.0, 1.0], 1).unwrap();
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12);
        assert!(cholesky_solve(&mut [0.0, 0.0, 0.0, 0.0], 2, &[1.0, 1.0], 1).is_none());
    }
}
