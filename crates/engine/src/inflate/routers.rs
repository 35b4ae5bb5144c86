//! Routers for the pass-through layers that reuse experts over time as a real MoE layer does.
//! The small model's own routers reuse few of the previous token's experts (about 0.14 of them
//! on the shipped target, against about 0.43 measured on Qwen3-30B-A3B), and copying them to
//! the pass-through layers would make 40 of 48 layers as unfriendly to a cache as the trained
//! ones. A real layer's locality comes from routing on slowly varying context, so a
//! pass-through router adds to the small router it copies a random mix of the *slow features*
//! of its input — the directions along which the normalised residual changes least from one
//! token to the next relative to how much it varies (generalised eigenvectors of the
//! difference covariance against the covariance, the input's mean direction projected out so
//! that no expert is favoured on average) — scaled until, on the calibration prompts, an LRU
//! of a given size hits as often as asked or the previous-token overlap reaches a target
//! ([`Target`]). Fitting only; the tensors are [`super::target`]'s.

use crate::error::EngineError;
use crate::kernels::dot;
use crate::kernels::math::top_k;

/// Slow features kept per router.
pub const FEATURES: usize = 16;

/// One boundary's router inputs: sequences (one per prompt) of normalised residual rows.
pub struct Inputs {
    pub dim: usize,
    pub sequences: Vec<Vec<Vec<f32>>>,
}

/// What a pass-through router is fitted to reach on the calibration prompts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Target {
    /// The share of a token's experts the previous token also used.
    Overlap(f64),
    /// The hit rate of a per-layer LRU cache holding `slots` of the (small) experts, each
    /// prompt from an empty cache.
    LruHits { slots: usize, share: f64 },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Overlap(share) => write!(f, "previous-token overlap {share}"),
            Target::LruHits { slots, share } => {
                write!(f, "LRU hits {share} at {slots} slots of the small experts")
            }
        }
    }
}

/// A fitted router and what it achieves on the fitting inputs.
#[derive(Debug, Clone)]
pub struct Fitted {
    /// `[experts, dim]`.
    pub weights: Vec<f32>,
    pub scale: f64,
    /// The target's measure at the fit.
    pub reached: f64,
}

/// Every token's top-`k` experts under `router` (`[experts, dim]`), per sequence.
pub fn routes(router: &[f32], k: usize, inputs: &Inputs) -> Vec<Vec<Vec<u32>>> {
    inputs
        .sequences
        .iter()
        .map(|seq| {
            seq.iter()
                .map(|x| {
                    let logits: Vec<f32> =
                        router.chunks_exact(inputs.dim).map(|w| dot(w, x)).collect();
                    top_k(&logits, k).into_iter().map(|(e, _)| e).collect()
                })
                .collect()
        })
        .collect()
}

/// Hit rate of an LRU of `slots` experts over each sequence's routes (from empty).
pub fn lru_hits(routes: &[Vec<Vec<u32>>], slots: usize) -> f64 {
    let (mut hits, mut lookups) = (0usize, 0usize);
    for seq in routes {
        let mut lru: std::collections::VecDeque<u32> = std::collections::VecDeque::new();
        for t in seq {
            for &e in t {
                lookups += 1;
                if let Some(p) = lru.iter().position(|&x| x == e) {
                    hits += 1;
                    lru.remove(p);
                } else if lru.len() == slots {
                    lru.pop_front();
                }
                lru.push_back(e);
            }
        }
    }
    hits as f64 / lookups.max(1) as f64
}

/// Share of each token's experts the previous token of its sequence also had.
pub fn previous_overlap(routes: &[Vec<Vec<u32>>]) -> f64 {
    let (mut same, mut total) = (0usize, 0usize);
    for seq in routes {
        for w in seq.windows(2) {
            same += w[1].iter().filter(|e| w[0].contains(e)).count();
            total += w[1].len();
        }
    }
    same as f64 / total.max(1) as f64
}

impl Target {
    fn value(self) -> f64 {
        match self {
            Target::Overlap(v) | Target::LruHits { share: v, .. } => v,
        }
    }

    /// This target's measure of `routes`.
    fn measure(self, routes: &[Vec<Vec<u32>>]) -> f64 {
        match self {
            Target::Overlap(_) => previous_overlap(routes),
            Target::LruHits { slots, .. } => lru_hits(routes, slots),
        }
    }
}

/// Eigen-decomposition of a symmetric `n × n` matrix by cyclic Jacobi rotations: eigenvalues
/// and eigenvectors (column `k` of the returned row-major matrix), unsorted.
fn symmetric_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = a.to_vec();
    let mut v = vec![0.0f64; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..60 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j] * a[i * n + j])
            .sum();
        let scale: f64 = (0..n)
            .map(|i| a[i * n + i] * a[i * n + i])
            .sum::<f64>()
            .max(1e-300);
        if off <= 1e-22 * scale {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// The `count` slowest directions of the inputs (each `dim` long, unit variance along the
/// data), the mean direction projected out, each with its lag-1 autocorrelation ρ (1 − half
/// the mean squared step in whitened units).
pub fn slow_features(inputs: &Inputs, count: usize) -> Result<Vec<(Vec<f64>, f64)>, EngineError> {
    let n = inputs.dim;
    let rows: Vec<&Vec<f32>> = inputs.sequences.iter().flatten().collect();
    if rows.len() < 2 * n {
        return Err(EngineError::InflateShape {
            field: "router_prompts",
            value: rows.len(),
            reason: format!(
                "too few calibration tokens to fit routers over {n} dimensions (need {})",
                2 * n
            ),
        });
    }
    let mut mean = vec![0.0f64; n];
    for r in &rows {
        for (m, &x) in mean.iter_mut().zip(r.iter()) {
            *m += x as f64;
        }
    }
    mean.iter_mut().for_each(|m| *m /= rows.len() as f64);
    let norm = mean.iter().map(|m| m * m).sum::<f64>().sqrt().max(1e-30);
    let unit: Vec<f64> = mean.iter().map(|m| m / norm).collect();
    let project = |x: &[f32]| -> Vec<f64> {
        let dot: f64 = x.iter().zip(&unit).map(|(&a, b)| a as f64 * b).sum();
        x.iter()
            .zip(&unit)
            .map(|(&a, b)| a as f64 - dot * b)
            .collect()
    };
    let mut cov = vec![0.0f64; n * n];
    let mut diff = vec![0.0f64; n * n];
    let (mut count_c, mut count_d) = (0usize, 0usize);
    for seq in &inputs.sequences {
        let projected: Vec<Vec<f64>> = seq.iter().map(|x| project(x)).collect();
        for (t, x) in projected.iter().enumerate() {
            for i in 0..n {
                for j in 0..n {
                    cov[i * n + j] += x[i] * x[j];
                }
            }
            count_c += 1;
            if t > 0 {
                let d: Vec<f64> = x
                    .iter()
                    .zip(&projected[t - 1])
                    .map(|(a, b)| a - b)
                    .collect();
                for i in 0..n {
                    for j in 0..n {
                        diff[i * n + j] += d[i] * d[j];
                    }
                }
                count_d += 1;
            }
        }
    }
    cov.iter_mut().for_each(|c| *c /= count_c as f64);
    diff.iter_mut().for_each(|d| *d /= count_d.max(1) as f64);
    // Whiten: W = V Λ^{-1/2} over the eigenvalues that carry variance.
    let (lambda, v) = symmetric_eigen(&cov, n);
    let top = lambda.iter().cloned().fold(0.0f64, f64::max);
    let keep: Vec<usize> = (0..n).filter(|&k| lambda[k] > 1e-6 * top).collect();
    let m = keep.len();
    let w: Vec<f64> = (0..n)
        .flat_map(|i| keep.iter().map(move |&k| (i, k)))
        .map(|(i, k)| v[i * n + k] / lambda[k].sqrt())
        .collect(); // n × m
                    // D in whitened coordinates: Wᵀ D W (m × m).
    let mut dw = vec![0.0f64; m * m];
    let mut dwtmp = vec![0.0f64; n * m];
    for i in 0..n {
        for b in 0..m {
            dwtmp[i * m + b] = (0..n).map(|j| diff[i * n + j] * w[j * m + b]).sum();
        }
    }
    for a in 0..m {
        for b in 0..m {
            dw[a * m + b] = (0..n).map(|i| w[i * m + a] * dwtmp[i * m + b]).sum();
        }
    }
    let (sigma, u) = symmetric_eigen(&dw, m);
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| sigma[a].total_cmp(&sigma[b]));
    Ok(order
        .iter()
        .take(count.min(m))
        .map(|&k| {
            // Direction in input space: W u_k (its projection has unit variance).
            let dir = (0..n)
                .map(|i| (0..m).map(|b| w[i * m + b] * u[b * m + k]).sum())
                .collect();
            (dir, 1.0 - sigma[k] / 2.0)
        })
        .collect())
}

/// The router `small + s · A F` (`small` is `[experts, dim]`; A a seeded random mix of the
/// slow `features` of `inputs`, [`slow_features`]), with `s` the smallest scale (by bisection)
/// whose measure on `inputs` reaches `target` (the largest tried when none does; 0 when the
/// small router already does).
pub fn fit(
    small: &[f32],
    k: usize,
    inputs: &Inputs,
    features: &[(Vec<f64>, f64)],
    target: Target,
    seed: u64,
) -> Fitted {
    let n = inputs.dim;
    let experts = small.len() / n;
    let mut rng = specfit_gguf::quant::Rng::new(seed);
    // Each feature weighs ρ⁴: the slowest count fully, features that change every token not
    // at all.
    let mut slow = vec![0.0f32; experts * n];
    for e in 0..experts {
        let mix: Vec<f64> = features
            .iter()
            .map(|(_, rho)| rng.normal() as f64 * rho.max(0.0).powi(4))
            .collect();
        for i in 0..n {
            slow[e * n + i] = features
                .iter()
                .zip(&mix)
                .map(|((f, _), a)| a * f[i])
                .sum::<f64>() as f32;
        }
    }
    let with = |s: f64| -> Vec<f32> {
        small
            .iter()
            .zip(&slow)
            .map(|(&a, &b)| a + (s as f32) * b)
            .collect()
    };
    let at = |s: f64| target.measure(&routes(&with(s), k, inputs));
    let goal = target.value();
    let (mut lo, mut hi) = (0.0f64, 64.0f64);
    if at(0.0) >= goal {
        hi = 0.0;
    } else if at(hi) >= goal {
        for _ in 0..20 {
            let mid = 0.5 * (lo + hi);
            if at(mid) >= goal {
                hi = mid;
            } else {
                lo = mid;
            }
        }
    }
    let weights = with(hi);
    let reached = target.measure(&routes(&weights, k, inputs));
    Fitted {
        weights,
        scale: hi,
        reached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jacobi_recovers_the_eigenpairs_of_a_symmetric_matrix() {
        // A = Q diag(3, 1, 0.5) Qᵀ for a rotation Q.
        let (c, s) = (0.6f64, 0.8f64);
        let q = [c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0];
        let d = [3.0, 1.0, 0.5];
        let mut a = [0.0f64; 9];
        for i in 0..3 {
            for j in 0..3 {
                a[i * 3 + j] = (0..3).map(|k| q[i * 3 + k] * d[k] * q[j * 3 + k]).sum();
            }
        }
        let (lambda, v) = symmetric_eigen(&a, 3);
        let mut sorted = lambda.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        for (got, want) in sorted.iter().zip(d) {
            assert!((got - want).abs() < 1e-12, "{lambda:?}");
        }
        // A v = λ v for every pair.
        for k in 0..3 {
            for i in 0..3 {
                let av: f64 = (0..3).map(|j| a[i * 3 + j] * v[j * 3 + k]).sum();
                assert!((av - lambda[k] * v[i * 3 + k]).abs() < 1e-12);
            }
        }
    }

    /// Sequences whose dims 0..2 drift slowly (about zero) and the others jump every token.
    fn drifting(n: usize) -> Inputs {
        let mut rng = specfit_gguf::quant::Rng::new(3);
        let sequences = (0..8)
            .map(|_| {
                let mut slow = [0.3 * rng.normal(), 0.3 * rng.normal()];
                (0..200)
                    .map(|_| {
                        slow[0] += 0.05 * rng.normal();
                        slow[1] += 0.05 * rng.normal();
                        // Dim 2 carries the data's mean (projected out by the fit).
                        (0..n)
                            .map(|i| match i {
                                0 | 1 => slow[i],
                                2 => 3.0 + rng.normal(),
                                _ => rng.normal(),
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Inputs { dim: n, sequences }
    }

    #[test]
    fn the_slowest_features_are_the_drifting_dimensions() {
        let inputs = drifting(12);
        let f = slow_features(&inputs, 2).unwrap();
        for (dir, rho) in &f {
            assert!(*rho > 0.9, "{rho}");
            let on_slow: f64 = dir[..2].iter().map(|x| x * x).sum();
            let total: f64 = dir.iter().map(|x| x * x).sum();
            assert!(on_slow / total > 0.95, "{dir:?}");
        }
    }

    #[test]
    fn a_fitted_router_reaches_the_overlap_target_that_the_small_router_misses() {
        let inputs = drifting(12);
        let mut rng = specfit_gguf::quant::Rng::new(9);
        // A router that only reads the jumping dimensions: little reuse.
        let small: Vec<f32> = (0..16 * 12)
            .map(|i| if i % 12 < 2 { 0.0 } else { rng.normal() })
            .collect();
        let before = previous_overlap(&routes(&small, 2, &inputs));
        let features = slow_features(&inputs, FEATURES).unwrap();
        let fitted = fit(&small, 2, &inputs, &features, Target::Overlap(0.5), 1);
        assert!(before < 0.3, "{before}");
        assert!(
            fitted.reached >= 0.5 && fitted.reached < 0.65,
            "{}",
            fitted.reached
        );
        assert!(fitted.scale > 0.0);
        let lru = fit(
            &small,
            2,
            &inputs,
            &features,
            Target::LruHits {
                slots: 4,
                share: 0.6,
            },
            1,
        );
        assert!(lru.reached >= 0.6 && lru.reached < 0.7, "{}", lru.reached);
        let r = routes(&lru.weights, 2, &inputs);
        assert!((lru_hits(&r, 4) - lru.reached).abs() < 1e-12);
    }
}
