//! Ancestor-closed subsets of a draft tree given only its parent links: the most probable one
//! taken greedily (vanilla EAGLE-3's top-K), when drafting deeper can no longer change it, and a
//! random one (calibration probes). The exact
//! SpecFit search is in `search`; these are the baselines and probes beside it, shared by the
//! selector, the engine and the simulator so that all three pick the same nodes.

use crate::synth::Rng;

/// The `k` most probable nodes, each taken only once its parent is (so the set stays
/// ancestor-closed), ties to the lower index; ascending. `parents[i] = None` for a child of the
/// root; parents come before their children.
pub fn top_k_closed(parents: &[Option<usize>], probs: &[f64], k: usize) -> Vec<usize> {
    let mut taken = vec![false; parents.len()];
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k {
        let next = (0..parents.len())
            .filter(|&i| !taken[i] && parents[i].is_none_or(|p| taken[p]))
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if probs[b] >= probs[i] => Some(b),
                _ => Some(i),
            });
        let Some(i) = next else { break };
        taken[i] = true;
        chosen.push(i);
    }
    chosen.sort_unstable();
    chosen
}

/// Whether drafting deeper can no longer change [`top_k_closed`]: it already holds `k` nodes and
/// none of them is less probable than the most probable node of the newest level (`newest`).
/// Every deeper node descends from a newest-level node, is no more probable than its parent (a
/// path probability is a product of factors ≤ 1) and gets a higher index, so it loses every
/// comparison the greedy makes (ties go to the lower index) and the top-`k` stays as it is.
pub fn top_k_settled(parents: &[Option<usize>], probs: &[f64], k: usize, newest: &[usize]) -> bool {
    let chosen = top_k_closed(parents, probs, k);
    if chosen.len() < k {
        return false;
    }
    let best_new = newest.iter().map(|&i| probs[i]).max_by(f64::total_cmp);
    best_new.is_none_or(|best| chosen.iter().all(|&i| probs[i] >= best))
}

/// A uniformly grown random ancestor-closed subset of (at most) `size` nodes: each step takes
/// one node, uniformly, among those not taken whose parent is (ascending index order, one
/// `rng.below` per step); ascending.
pub fn random_closed(parents: &[Option<usize>], size: usize, rng: &mut Rng) -> Vec<usize> {
    let mut taken = vec![false; parents.len()];
    let mut chosen = Vec::with_capacity(size);
    while chosen.len() < size {
        let frontier: Vec<usize> = (0..parents.len())
            .filter(|&i| !taken[i] && parents[i].is_none_or(|p| taken[p]))
            .collect();
        if frontier.is_empty() {
            break;
        }
        let i = frontier[rng.below(frontier.len())];
        taken[i] = true;
        chosen.push(i);
    }
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(parents: &[Option<usize>], set: &[usize]) -> bool {
        set.iter()
            .all(|&i| parents[i].is_none_or(|p| set.contains(&p)))
    }

    #[test]
    fn top_k_takes_the_most_probable_reachable_node_each_time_ties_to_the_lower_index() {
        // 0 (0.9) -> 2 (0.8); 1 (0.5); 3 (0.95) under 2.
        let parents = [None, None, Some(0), Some(2)];
        let probs = [0.9, 0.5, 0.8, 0.95];
        assert_eq!(top_k_closed(&parents, &probs, 1), vec![0]);
        assert_eq!(top_k_closed(&parents, &probs, 3), vec![0, 2, 3]);
        assert_eq!(top_k_closed(&parents, &probs, 9), vec![0, 1, 2, 3]);
        assert_eq!(top_k_closed(&[None, None], &[0.5, 0.5], 1), vec![0]);
    }

    /// A random draft tree grown level by level as EAGLE-2/3 grows it: each level expands the
    /// `b` best nodes of the previous one with `b` children of path probability parent × p,
    /// p ≤ 1 (coarse values so that ties happen). Returns parents, probs and depths.
    fn grown(levels: usize, b: usize, rng: &mut Rng) -> (Vec<Option<usize>>, Vec<f64>, Vec<usize>) {
        let (mut parents, mut probs, mut depths) = (Vec::new(), Vec::new(), Vec::new());
        let mut frontier: Vec<Option<usize>> = vec![None];
        for depth in 1..=levels {
            let mut next = Vec::new();
            for &parent in &frontier {
                let base = parent.map_or(1.0, |p| probs[p]);
                for _ in 0..b {
                    next.push(Some(parents.len()));
                    parents.push(parent);
                    probs.push(base * (1 + rng.below(8)) as f64 / 8.0);
                    depths.push(depth);
                }
            }
            next.sort_by(|a: &Option<usize>, c| {
                let (a, c) = (a.expect("a node"), c.expect("a node"));
                probs[c].total_cmp(&probs[a]).then(a.cmp(&c))
            });
            next.truncate(b);
            frontier = next;
        }
        (parents, probs, depths)
    }

    #[test]
    fn once_the_top_k_is_settled_no_deeper_level_changes_it() {
        let mut rng = Rng::new(7);
        let mut settled_early = 0;
        for case in 0..2000 {
            let (levels, b, k) = (1 + case % 6, 1 + case % 3, case % 9);
            let (parents, probs, depths) = grown(levels, b, &mut rng);
            let whole = top_k_closed(&parents, &probs, k);
            for level in 1..levels {
                let upto = depths.iter().take_while(|&&d| d <= level).count();
                let newest: Vec<usize> = (0..upto).filter(|&i| depths[i] == level).collect();
                if top_k_settled(&parents[..upto], &probs[..upto], k, &newest) {
                    assert_eq!(top_k_closed(&parents[..upto], &probs[..upto], k), whole);
                    settled_early += 1;
                }
            }
        }
        // The check is not vacuous: many trees settle before their last level.
        assert!(settled_early > 500, "{settled_early}");
    }

    #[test]
    fn a_top_k_missing_nodes_or_beaten_by_the_newest_level_is_not_settled() {
        // 0 (0.9), 1 (0.5); 2 (0.8) and 3 (0.1) under 0.
        let parents = [None, None, Some(0), Some(0)];
        let probs = [0.9, 0.5, 0.8, 0.1];
        assert!(!top_k_settled(&parents[..2], &probs[..2], 3, &[0, 1]));
        assert!(!top_k_settled(&parents, &probs, 3, &[2, 3]));
        assert!(top_k_settled(&parents, &probs, 2, &[2, 3]));
        assert!(top_k_settled(&parents, &probs, 0, &[2, 3]));
    }

    #[test]
    fn random_subsets_are_ancestor_closed_of_the_asked_size_and_seeded() {
        let parents = [None, Some(0), Some(0), Some(1), None, Some(4)];
        for size in 0..=7 {
            let a = random_closed(&parents, size, &mut Rng::new(size as u64));
            let b = random_closed(&parents, size, &mut Rng::new(size as u64));
            assert_eq!(a, b);
            assert_eq!(a.len(), size.min(parents.len()));
            assert!(closed(&parents, &a), "{a:?}");
        }
    }
}
