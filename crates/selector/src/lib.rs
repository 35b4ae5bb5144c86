//! SpecFit's selection core: which part of a speculative draft pool to verify, when to stop
//! drafting, and how to fit the cost model that drives both.
//!
//! A draft *pool* is a tree under the last committed token (the root). Each draft node has a
//! path probability `P` and, for every MoE layer, the set of experts the target routes it to.
//! Verifying an ancestor-closed subtree `S` costs one target forward whose expert copies depend
//! on the *union* of the experts of the root and of `S`. SpecFit picks
//!
//! ```text
//! argmax_S (1 + Σ_{i∈S} P_i) / (a[|S|] + β · Σ_layers |U_l(S)|),   |S| ≤ K
//! ```
//!
//! exactly, by branch and bound over every ancestor-closed subtree ([`Selector`]); stops drafting
//! when the winner takes no node of the newest level ([`stop_rule`]); and fits `a[·]` and `β`
//! by non-negative least squares on measured forwards ([`calibrate()`]).
//!
//! The crate depends on `std` and `thiserror` only; the JSON interchange format is behind the
//! `json` feature.
//!
//! # Example
//!
//! ```
//! use specfit_selector::{CostModel, Objective, PoolBuilder, Selector};
//!
//! // One MoE layer of 8 experts. The root routes to {0, 1}.
//! let mut pool = PoolBuilder::new(1, 8)?;
//! pool.root_routes(&[vec![0, 1]])?;
//! let a = pool.push(None, 0.9, &[vec![0, 1]])?;    // likely, needs nothing new
//! pool.push(Some(a), 0.6, &[vec![0, 2]])?;          // fairly likely, one new expert
//! pool.push(None, 0.05, &[vec![5, 6]])?;            // unlikely, two new experts
//! let pool = pool.build();
//!
//! let cost = CostModel::paper(vec![10.0, 10.5, 11.0, 11.5], 2.0)?;
//! let mut selector = Selector::new(cost, 3, Objective::Ratio)?;
//! let pick = selector.select(&pool, None)?;
//! assert_eq!(pick.nodes, vec![0, 1]);
//! assert_eq!(pick.demand, 3);                        // experts 0, 1, 2
//! # Ok::<(), specfit_selector::Error>(())
//! ```

pub mod acceptance;
mod bitset;
pub mod calibrate;
pub mod cost;
mod error;
#[cfg(feature = "json")]
pub mod json;
pub mod nnls;
pub mod objective;
pub mod policy;
pub mod pool;
pub mod search;
pub mod stop;
pub mod subtree;
pub mod synth;

#[cfg(test)]
mod tests;

pub use acceptance::{top_children, Acceptance, AcceptanceCurve, ChildTaken};
pub use bitset::{words_for, MAX_EXPERTS, MAX_LAYERS};
pub use calibrate::{calibrate, Calibration, Fit, Probe};
pub use cost::{CostModel, ExpertCost, ResidentSet};
pub use error::{Error, Owner};
pub use objective::Objective;
pub use policy::{
    Bursts, Choice, Decision, VerifyPolicy, CYCLE_WINDOW, FIRST_PLAIN_STEPS, MAX_BURST,
    MAX_LOSING_BURST, MAX_LOSING_BURST_FAR, NOISE_ERRORS, PLAIN_FRESH_MAX_TOKENS,
    PLAIN_FRESH_STEPS, PLAIN_FRESH_TOKENS, PROBE_SHARE, RECENT_CYCLES, REFRESH_STEPS, SURE_CYCLES,
    UNSURE_BURST, WIN_MARGIN,
};
pub use pool::{NodeSpec, Pool, PoolBuilder, PoolSpec, MAX_POOL_NODES};
pub use search::{count_subtrees, top_k, SearchStats, Selection, Selector, MAX_SELECT, MAX_VISITS};
pub use stop::{stop_rule, StopDecision};
