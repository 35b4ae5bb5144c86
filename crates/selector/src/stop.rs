//! The draft-stop rule: after each drafted level, rerun the selection on the pool so far; keep
//! drafting only while the winning subtree takes a node of the newest level. Deeper nodes have no
//! larger path probability than their newest-level ancestors, so when the winner ignores that
//! level, drafting further mostly spends drafter time on nodes that will not be verified (a
//! heuristic, as in the paper, not a guarantee). This module does not draft or search by itself.

use crate::cost::ResidentSet;
use crate::error::Error;
use crate::pool::Pool;
use crate::search::{Selection, Selector};

/// What the stop rule decided after a drafted level.
#[derive(Debug, Clone, PartialEq)]
pub struct StopDecision {
    /// The newest drafted level (the pool's maximum depth; 0 for an empty pool).
    pub newest_level: usize,
    /// Whether the winning subtree takes at least one node of the newest level.
    pub takes_newest_level: bool,
    /// The winning subtree on the pool so far (what would be verified if drafting stopped now).
    pub selection: Selection,
}

impl StopDecision {
    /// Whether to draft another level.
    pub fn keep_drafting(&self) -> bool {
        self.takes_newest_level
    }
}

/// Applies the stop rule to `pool`, the pool after its newest drafted level.
pub fn stop_rule(
    selector: &mut Selector,
    pool: &Pool,
    resident: Option<&ResidentSet>,
) -> Result<StopDecision, Error> {
    let selection = selector.select(pool, resident)?;
    Ok(decide(pool, selection))
}

/// The decision for an already computed selection on `pool`.
pub fn decide(pool: &Pool, selection: Selection) -> StopDecision {
    let newest_level = pool.max_depth();
    let takes_newest_level = newest_level > 0
        && selection
            .nodes
            .iter()
            .any(|&i| pool.depth(i) == newest_level);
    StopDecision {
        newest_level,
        takes_newest_level,
        selection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use crate::objective::Objective;
    use crate::pool::PoolBuilder;

    fn selector(beta: f64) -> Selector {
        Selector::new(
            CostModel::paper(vec![10.0; 8], beta).unwrap(),
            7,
            Objective::Ratio,
        )
        .unwrap()
    }

    /// A two-level chain: 0.9 on expert 1, then `second` on expert 2.
    fn chain(second: f64) -> Pool {
        let mut b = PoolBuilder::new(1, 16).unwrap();
        let a = b.push(None, 0.9, &[[1u32]]).unwrap();
        b.push(Some(a), second, &[[2u32]]).unwrap();
        b.build()
    }

    #[test]
    fn drafting_continues_while_the_newest_level_is_worth_verifying() {
        let d = stop_rule(&mut selector(0.01), &chain(0.8), None).unwrap();
        assert_eq!(d.newest_level, 2);
        assert!(d.keep_drafting());
        assert_eq!(d.selection.nodes, vec![0, 1]);
    }

    #[test]
    fn drafting_stops_when_the_newest_level_costs_more_than_it_brings() {
        // The level-2 node is improbable and needs an expert of its own at a high price.
        let d = stop_rule(&mut selector(5.0), &chain(0.01), None).unwrap();
        assert!(!d.keep_drafting());
        assert_eq!(d.selection.nodes, vec![0]);
    }

    #[test]
    fn an_empty_pool_never_asks_for_more_drafting() {
        let pool = PoolBuilder::new(1, 4).unwrap().build();
        let d = stop_rule(&mut selector(0.1), &pool, None).unwrap();
        assert_eq!((d.newest_level, d.takes_newest_level), (0, false));
    }
}
