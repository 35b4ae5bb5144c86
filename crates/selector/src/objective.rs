//! What a selection maximises, and the exact arithmetic of its reward.
//!
//! The reward of a subtree `S` is the expected number of committed tokens, `1 + Σ_{i∈S} P_i`
//! (the bonus token plus each node's path probability). Probabilities are quantised to multiples
//! of 2⁻⁴⁴ (≈ 5.7·10⁻¹⁴) and summed as integers, so a subtree's reward does not depend on the
//! order its nodes were added: the search and its brute-force oracle compute bit-identical
//! objective values, and ties are real ties. This module does not search and does not price time.

use crate::error::Error;

/// Probabilities are summed in units of 2^-REWARD_BITS.
pub const REWARD_BITS: u32 = 44;
const REWARD_SCALE: f64 = (1u64 << REWARD_BITS) as f64;

/// The rule that picks the verified subtree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// Maximise `reward / time` (the paper's rule: committed tokens per millisecond).
    Ratio,
    /// Maximise `reward − λ · time` (the throughput-optimal rule for a given λ in tokens/ms).
    Lambda { lambda: f64 },
    /// The `max_nodes` most probable nodes, ties by index (vanilla EAGLE-3's choice).
    TopK,
    /// The whole pool.
    All,
    /// No draft node (autoregressive decoding).
    None,
}

impl Objective {
    /// `Lambda`, validated (finite, ≥ 0).
    pub fn lambda(lambda: f64) -> Result<Objective, Error> {
        if lambda.is_finite() && lambda >= 0.0 {
            Ok(Objective::Lambda { lambda })
        } else {
            Err(Error::BadLambda { lambda })
        }
    }

    /// Parses the interchange names `ratio`, `topk`, `all`, `none` and `lambda:X`.
    pub fn parse(text: &str) -> Result<Objective, Error> {
        match text {
            "ratio" => Ok(Objective::Ratio),
            "topk" => Ok(Objective::TopK),
            "all" => Ok(Objective::All),
            "none" => Ok(Objective::None),
            _ => match text.strip_prefix("lambda:").map(str::parse::<f64>) {
                Some(Ok(lambda)) => Objective::lambda(lambda),
                _ => Err(Error::UnknownObjective {
                    got: text.to_string(),
                }),
            },
        }
    }

    /// Whether this objective is optimised by the exact search (else it is a fixed baseline).
    pub fn is_searched(&self) -> bool {
        matches!(self, Objective::Ratio | Objective::Lambda { .. })
    }

    /// The objective value of a subtree with this reward and predicted time. Baselines report
    /// the ratio so that their choices can be compared with SpecFit's on the same scale.
    #[inline]
    pub fn score(&self, reward: f64, time_ms: f64) -> f64 {
        match *self {
            Objective::Lambda { lambda } => reward - lambda * time_ms,
            _ => reward / time_ms,
        }
    }
}

/// A probability in reward units.
#[inline]
pub(crate) fn quantize(prob: f64) -> u64 {
    (prob * REWARD_SCALE).round() as u64
}

/// The reward `1 + Σ P` of a subtree whose quantised probabilities sum to `sum`.
#[inline]
pub(crate) fn reward(sum: u64) -> f64 {
    ((1u64 << REWARD_BITS) + sum) as f64 / REWARD_SCALE
}

/// `1 + Σ P` summed in plain `f64` in the order given (what selections report).
pub fn plain_reward(probs: impl IntoIterator<Item = f64>) -> f64 {
    probs.into_iter().fold(1.0, |acc, p| acc + p)
}

/// The reward of a set of probabilities, summed exactly (order-independent).
pub fn reward_of(probs: impl IntoIterator<Item = f64>) -> f64 {
    reward(probs.into_iter().map(quantize).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_do_not_depend_on_summation_order() {
        let p = [0.1, 0.7, 0.2, 0.30000000000000004, 1e-9];
        let forward = reward_of(p);
        let backward = reward_of(p.iter().rev().copied());
        assert_eq!(forward.to_bits(), backward.to_bits());
        assert!((forward - (1.0 + p.iter().sum::<f64>())).abs() < 1e-12);
    }

    #[test]
    fn objective_names_parse_and_bad_lambdas_are_rejected() {
        assert_eq!(Objective::parse("ratio").unwrap(), Objective::Ratio);
        assert_eq!(
            Objective::parse("lambda:0.5").unwrap(),
            Objective::Lambda { lambda: 0.5 }
        );
        assert!(matches!(
            Objective::parse("lambda:-1"),
            Err(Error::BadLambda { .. })
        ));
        assert!(matches!(
            Objective::parse("lambda:NaN"),
            Err(Error::BadLambda { .. })
        ));
        assert!(matches!(
            Objective::parse("best"),
            Err(Error::UnknownObjective { .. })
        ));
    }

    #[test]
    fn the_lambda_rule_trades_reward_against_time() {
        let o = Objective::lambda(0.01).unwrap();
        assert_eq!(o.score(2.0, 100.0), 1.0);
        assert_eq!(Objective::Ratio.score(2.0, 100.0), 0.02);
    }
}
