//! Predicted verify time of a subtree: `a[n] + β · Σ_l |U_l|` (the paper's form) or, given the
//! experts already resident, `a[n] + β_hit · hits + β_miss · misses` (residency-aware form),
//! plus, in either form, `γ · (n + 1) · c` for attention over the `c` cached tokens.
//!
//! `n` is the number of verified draft nodes, `U_l` the union of the experts the root and the
//! selected nodes route to in layer `l`; each of the `n + 1` verified rows attends to every cached
//! token, so at long contexts a node costs more than its experts. This module owns the formula
//! and the resident sets; it does not search and does not fit the coefficients (that is
//! `calibrate`).

use crate::bitset;
use crate::error::{Error, Owner};

/// How experts are charged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertCost {
    /// Every expert of the union costs `beta` ms (the paper's form).
    Uniform { beta: f64 },
    /// A resident expert costs `beta_hit` ms, a missing one `beta_miss` ms.
    Residency { beta_hit: f64, beta_miss: f64 },
}

/// Intercepts per verified-node count plus the per-expert charge and the per-row context
/// charge. Times are in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    intercepts: Vec<f64>,
    expert: ExpertCost,
    /// `γ`: ms per verified row (the root's included) per cached token.
    context_ms: f64,
}

fn check_beta(name: &'static str, value: f64) -> Result<f64, Error> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::BadBeta { name, value })
    }
}

impl CostModel {
    /// The paper's form: `a[n] + beta · demand`.
    pub fn paper(intercepts: Vec<f64>, beta: f64) -> Result<CostModel, Error> {
        CostModel::new(intercepts, ExpertCost::Uniform { beta })
    }

    /// The residency-aware form: `a[n] + beta_hit · hits + beta_miss · misses`.
    pub fn residency(
        intercepts: Vec<f64>,
        beta_hit: f64,
        beta_miss: f64,
    ) -> Result<CostModel, Error> {
        CostModel::new(
            intercepts,
            ExpertCost::Residency {
                beta_hit,
                beta_miss,
            },
        )
    }

    /// Validates intercepts (finite, ≥ 0) and the per-expert charge (finite, ≥ 0).
    pub fn new(intercepts: Vec<f64>, expert: ExpertCost) -> Result<CostModel, Error> {
        if let Some((index, &value)) = intercepts
            .iter()
            .enumerate()
            .find(|(_, a)| !(a.is_finite() && **a >= 0.0))
        {
            return Err(Error::BadIntercept { index, value });
        }
        match expert {
            ExpertCost::Uniform { beta } => {
                check_beta("beta", beta)?;
            }
            ExpertCost::Residency {
                beta_hit,
                beta_miss,
            } => {
                check_beta("beta_hit", beta_hit)?;
                check_beta("beta_miss", beta_miss)?;
            }
        }
        Ok(CostModel {
            intercepts,
            expert,
            context_ms: 0.0,
        })
    }

    /// The same model charging `context_ms` per verified row (the root's included) per cached
    /// token (finite, ≥ 0).
    pub fn with_context_ms(mut self, context_ms: f64) -> Result<CostModel, Error> {
        self.context_ms = check_beta("context_ms", context_ms)?;
        Ok(self)
    }

    /// `γ`: ms per verified row per cached token (0: the time does not depend on the context).
    pub fn context_ms(&self) -> f64 {
        self.context_ms
    }

    /// The model at `context` cached tokens: the context charge folded into the intercepts,
    /// `a[n] + γ · (n + 1) · context`, and no context charge left.
    pub fn at_context(&self, context: usize) -> CostModel {
        let mut at = CostModel {
            intercepts: Vec::with_capacity(self.intercepts.len()),
            expert: self.expert,
            context_ms: 0.0,
        };
        self.fold_context(context, &mut at);
        at
    }

    /// [`CostModel::at_context`] written into `out`, reusing its memory (the selector does
    /// this once per pool).
    pub(crate) fn fold_context(&self, context: usize, out: &mut CostModel) {
        let per_row = self.context_ms * context as f64;
        out.intercepts.clear();
        out.intercepts.extend(
            (self.intercepts.iter().enumerate()).map(|(n, a)| a + per_row * (n + 1) as f64),
        );
        out.expert = self.expert;
        out.context_ms = 0.0;
    }

    /// The intercepts `a[0..]`.
    pub fn intercepts(&self) -> &[f64] {
        &self.intercepts
    }

    /// The per-expert charge.
    pub fn expert(&self) -> ExpertCost {
        self.expert
    }

    /// Whether the charge depends on residency.
    pub fn is_residency(&self) -> bool {
        matches!(self.expert, ExpertCost::Residency { .. })
    }

    /// Checks that intercepts cover every node count up to `max_nodes`.
    pub fn check_covers(&self, max_nodes: usize) -> Result<(), Error> {
        if self.intercepts.len() < max_nodes + 1 {
            return Err(Error::TooFewIntercepts {
                got: self.intercepts.len(),
                max_nodes,
                need: max_nodes + 1,
            });
        }
        Ok(())
    }

    /// Predicted time (ms) of verifying `nodes` draft nodes whose union holds `hits` resident
    /// and `misses` non-resident experts, with no token cached (see [`CostModel::at_context`]).
    /// Under the uniform form only `hits + misses` matters.
    ///
    /// This is the one place the formula is evaluated (on the model at the pool's context, its
    /// charge folded into the intercepts by [`CostModel::at_context`]), so the search, its
    /// oracle and the reports agree to the last bit. It is monotone in `hits` and `misses`,
    /// which the search's bound relies on.
    #[inline]
    pub fn time_ms(&self, nodes: usize, hits: u32, misses: u32) -> f64 {
        let a = self.intercepts[nodes];
        match self.expert {
            ExpertCost::Uniform { beta } => a + beta * (hits + misses) as f64,
            ExpertCost::Residency {
                beta_hit,
                beta_miss,
            } => a + (beta_hit * hits as f64 + beta_miss * misses as f64),
        }
    }
}

/// The experts resident (cached in fast memory) per layer, as a flat bitset like a pool's routes.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidentSet {
    layers: usize,
    experts: usize,
    bits: Vec<u64>,
}

impl ResidentSet {
    /// Builds the set from one expert id list per layer.
    pub fn new<R: AsRef<[u32]>>(
        layers: usize,
        experts: usize,
        per_layer: &[R],
    ) -> Result<ResidentSet, Error> {
        bitset::check_shape(layers, experts)?;
        let mut bits = vec![0; bitset::words_for(layers, experts)];
        bitset::fill_routes(&mut bits, Owner::Resident, layers, experts, per_layer)?;
        Ok(ResidentSet {
            layers,
            experts,
            bits,
        })
    }

    /// No expert resident.
    pub fn empty(layers: usize, experts: usize) -> ResidentSet {
        ResidentSet {
            layers,
            experts,
            bits: vec![0; bitset::words_for(layers, experts)],
        }
    }

    /// Every expert resident.
    pub fn full(layers: usize, experts: usize) -> ResidentSet {
        let mut set = ResidentSet::empty(layers, experts);
        let total = layers * experts;
        for bit in 0..total {
            set.bits[bit / 64] |= 1 << (bit % 64);
        }
        set
    }

    /// The flat bitset.
    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    /// Checks that the set has the pool's shape.
    pub fn check_shape(&self, layers: usize, experts: usize) -> Result<(), Error> {
        if (self.layers, self.experts) != (layers, experts) {
            return Err(Error::ResidentShapeMismatch {
                got_layers: self.layers,
                got_experts: self.experts,
                layers,
                experts,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_residency_form_equals_the_paper_form_when_hit_and_miss_cost_the_same() {
        let a = vec![10.0, 12.5, 13.0];
        let paper = CostModel::paper(a.clone(), 0.211).unwrap();
        let res = CostModel::residency(a, 0.211, 0.211).unwrap();
        for (n, h, m) in [(0, 0, 40), (1, 20, 30), (2, 64, 0)] {
            let (p, r) = (paper.time_ms(n, h, m), res.time_ms(n, h, m));
            assert!((p - r).abs() <= 1e-12 * p, "{p} vs {r}");
        }
    }

    #[test]
    fn negative_or_non_finite_coefficients_are_rejected() {
        assert_eq!(
            CostModel::paper(vec![1.0, -2.0], 0.1).unwrap_err(),
            Error::BadIntercept {
                index: 1,
                value: -2.0
            }
        );
        assert_eq!(
            CostModel::paper(vec![1.0], -0.5).unwrap_err().to_string(),
            "cost.beta = -0.5: must be finite and >= 0"
        );
        let e = CostModel::residency(vec![1.0], 0.1, f64::NAN)
            .unwrap_err()
            .to_string();
        assert!(e.contains("beta_miss = NaN"), "{e}");
        let e = CostModel::paper(vec![f64::INFINITY], 0.1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("intercepts[0] = inf"), "{e}");
    }

    #[test]
    fn each_verified_row_pays_the_context_charge_once_per_cached_token() {
        let cost = CostModel::paper(vec![10.0, 12.0, 13.0], 0.5)
            .unwrap()
            .with_context_ms(0.002)
            .unwrap();
        // 1 000 cached tokens: 2 ms per row; two nodes and the root are three rows.
        let at = cost.at_context(1000);
        assert_eq!(at.intercepts(), [12.0, 16.0, 19.0]);
        assert_eq!(at.context_ms(), 0.0);
        assert_eq!(at.time_ms(2, 0, 10), 19.0 + 5.0);
        // No context, or no charge: the intercepts as given.
        assert_eq!(cost.at_context(0).intercepts(), [10.0, 12.0, 13.0]);
        let plain = CostModel::paper(vec![10.0, 12.0, 13.0], 0.5).unwrap();
        assert_eq!(plain.at_context(5000), plain);
        let e = plain.with_context_ms(-1e-3).unwrap_err().to_string();
        assert!(e.contains("context_ms = -0.001"), "{e}");
    }

    #[test]
    fn intercepts_must_cover_the_node_budget() {
        let cost = CostModel::paper(vec![1.0; 7], 0.1).unwrap();
        assert!(cost.check_covers(6).is_ok());
        assert_eq!(
            cost.check_covers(7).unwrap_err().to_string(),
            "cost.intercepts has 7 entries; max_nodes = 7 needs at least 8"
        );
    }

    #[test]
    fn full_and_empty_resident_sets_cover_all_or_no_bits() {
        assert_eq!(bitset::count(ResidentSet::full(3, 100).bits()), 300);
        assert_eq!(bitset::count(ResidentSet::empty(3, 100).bits()), 0);
        let r = ResidentSet::new(2, 4, &[vec![1u32], vec![]]).unwrap();
        assert!(r.check_shape(2, 4).is_ok());
        let e = r.check_shape(2, 5).unwrap_err().to_string();
        assert!(e.contains("5"), "{e}");
    }
}
