//! Ancestor-closed subsets of a draft tree given only its parent links: the most probable one
//! taken greedily (vanilla EAGLE-3's top-K) and a random one (calibration probes). The exact
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
