//! How often the target takes a drafted child, against the drafter's probability for it and
//! whether the child is its parent's top child (the one the drafter gives the most): counts per
//! probability bin (measured by `specfit calibrate` and while decoding) and the monotone curves
//! that turn the drafter's edge probabilities into the path probabilities the selector scores. A
//! drafter whose probabilities are too low (or too high) otherwise makes SpecFit verify too
//! little (or too much); and at one probability a top child is taken far more often than a
//! runner-up (on the paper-scale pair's traces, children the drafter gives under 0.1: about half
//! of the top ones, 3–5% of the others), so the two get a curve each. It owns no decoding and no
//! file format.

use crate::error::Error;

/// Probability bins of width `1 / BINS`.
pub const BINS: usize = 20;

/// Pseudo-samples per bin at the bin's prior: with no data the curve over every child is the
/// drafter's probability itself, and a bin moves away from it as samples arrive; each class's
/// curve (top children, the others) starts from the curve over every child.
pub const PRIOR: f64 = 4.0;

/// Drafted and taken children per bin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Bins {
    drafted: [u64; BINS],
    taken: [u64; BINS],
}

impl Bins {
    fn record(&mut self, bin: usize, taken: bool) {
        self.drafted[bin] = self.drafted[bin].saturating_add(1);
        if taken {
            self.taken[bin] = self.taken[bin].saturating_add(1);
        }
    }

    fn samples(&self) -> u64 {
        self.drafted.iter().sum()
    }

    /// The taken share per bin with [`PRIOR`] pseudo-samples at `prior[bin]`, made
    /// non-decreasing by pool-adjacent-violators weighted by samples + prior.
    fn curve(&self, prior: &[f64; BINS]) -> [f64; BINS] {
        let mut rate = [0.0; BINS];
        let mut weight = [0.0; BINS];
        for bin in 0..BINS {
            weight[bin] = self.drafted[bin] as f64 + PRIOR;
            rate[bin] = (self.taken[bin] as f64 + PRIOR * prior[bin]) / weight[bin];
        }
        isotonic(&rate, &weight)
    }
}

/// A drafted child whose parent the target reached, as [`Acceptance::record`] counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChildTaken {
    /// The drafter's probability of the child given its parent.
    pub q: f64,
    /// Whether it is its parent's top child ([`top_children`]).
    pub top: bool,
    /// Whether the target took it.
    pub taken: bool,
}

/// Drafted children and the share of them the target took, per bin of the drafter's probability:
/// over every child, and over the top children among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acceptance {
    all: Bins,
    top: Bins,
}

impl Acceptance {
    /// No samples: its curves are the drafter's own probability.
    pub fn new() -> Acceptance {
        Acceptance::default()
    }

    /// Counts over every child read back (as [`Acceptance::counts`] gives them): `BINS` bins
    /// each, `taken ≤ drafted` in every bin; no top children counted (counts written before
    /// they were: both curves are then the one over every child).
    pub fn from_counts(drafted: &[u64], taken: &[u64]) -> Result<Acceptance, Error> {
        let mut a = Acceptance::new();
        a.all = bins(drafted, taken)?;
        Ok(a)
    }

    /// These counts with the top children's read back (as [`Acceptance::top_counts`] gives
    /// them): `BINS` bins each, `taken ≤ drafted` in every bin for the top children and for the
    /// others, and no more top children than children.
    pub fn with_top(mut self, drafted: &[u64], taken: &[u64]) -> Result<Acceptance, Error> {
        let top = bins(drafted, taken)?;
        for bin in 0..BINS {
            let (all_d, all_t) = (self.all.drafted[bin], self.all.taken[bin]);
            let (top_d, top_t) = (top.drafted[bin], top.taken[bin]);
            if top_d > all_d || top_t > all_t || all_t - top_t > all_d - top_d {
                return Err(Error::AcceptanceTopExceedsAll {
                    bin,
                    top_drafted: top_d,
                    top_taken: top_t,
                    drafted: all_d,
                    taken: all_t,
                });
            }
        }
        self.top = top;
        Ok(self)
    }

    /// Drafted and taken children per bin, over every child.
    pub fn counts(&self) -> (&[u64; BINS], &[u64; BINS]) {
        (&self.all.drafted, &self.all.taken)
    }

    /// Drafted and taken top children per bin.
    pub fn top_counts(&self) -> (&[u64; BINS], &[u64; BINS]) {
        (&self.top.drafted, &self.top.taken)
    }

    /// Children counted so far.
    pub fn samples(&self) -> u64 {
        self.all.samples()
    }

    /// Counts one drafted child of probability `q` (given its parent), whether it is its
    /// parent's top child ([`top_children`]) and whether the target took it. A probability
    /// outside `[0, 1]` (or NaN) counts in the nearest end bin.
    pub fn record(&mut self, q: f64, top: bool, taken: bool) {
        let bin = bin_of(q);
        self.all.record(bin, taken);
        if top {
            self.top.record(bin, taken);
        }
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &Acceptance) {
        for (mine, theirs) in [(&mut self.all, &other.all), (&mut self.top, &other.top)] {
            for bin in 0..BINS {
                mine.drafted[bin] = mine.drafted[bin].saturating_add(theirs.drafted[bin]);
                mine.taken[bin] = mine.taken[bin].saturating_add(theirs.taken[bin]);
            }
        }
    }

    /// The curves. Over every child: per bin the taken share with [`PRIOR`] pseudo-samples at
    /// the bin's centre, made non-decreasing (pool-adjacent-violators weighted by samples +
    /// prior). Top children and the others: the same with the prior at that first curve's
    /// value; without top children counted, both are the first curve.
    pub fn curve(&self) -> AcceptanceCurve {
        let centres: [f64; BINS] = std::array::from_fn(centre);
        let all = self.all.curve(&centres);
        if self.top.samples() == 0 {
            return AcceptanceCurve {
                top: all,
                other: all,
            };
        }
        let mut other = Bins::default();
        for bin in 0..BINS {
            other.drafted[bin] = self.all.drafted[bin] - self.top.drafted[bin];
            other.taken[bin] = self.all.taken[bin] - self.top.taken[bin];
        }
        AcceptanceCurve {
            top: self.top.curve(&all),
            other: other.curve(&all),
        }
    }
}

/// `BINS` counts each, `taken ≤ drafted` in every bin.
fn bins(drafted: &[u64], taken: &[u64]) -> Result<Bins, Error> {
    for got in [drafted.len(), taken.len()] {
        if got != BINS {
            return Err(Error::AcceptanceBins {
                got,
                expected: BINS,
            });
        }
    }
    let mut b = Bins::default();
    for (bin, (&d, &t)) in drafted.iter().zip(taken).enumerate() {
        if t > d {
            return Err(Error::AcceptanceTakenExceedsDrafted {
                bin,
                taken: t,
                drafted: d,
            });
        }
        b.drafted[bin] = d;
        b.taken[bin] = t;
    }
    Ok(b)
}

/// Which nodes of a pool are their parent's top child: node `i` (parent `parents[i]`, drafter
/// probability `edge[i]` given it) is when no sibling has a larger probability, nor the same one
/// at a smaller index.
pub fn top_children(parents: &[Option<usize>], edge: &[f64]) -> Vec<bool> {
    // Per parent (slot 0: the root, `p + 1`: node `p`), the index of its best child so far.
    let mut best: Vec<Option<usize>> = vec![None; parents.len() + 1];
    for (i, (&parent, &q)) in parents.iter().zip(edge).enumerate() {
        let slot = parent.map_or(0, |p| (p + 1).min(parents.len()));
        match best[slot] {
            Some(b) if edge[b] >= q || q.is_nan() => {}
            _ => best[slot] = Some(i),
        }
    }
    let mut top = vec![false; parents.len()];
    for b in best.into_iter().flatten() {
        top[b] = true;
    }
    top
}

/// The probability the target takes a child the drafter gives probability `q`, for top
/// children and for the others: linear between the bins' centres, flat beyond the first and
/// last, non-decreasing, in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceCurve {
    top: [f64; BINS],
    other: [f64; BINS],
}

impl AcceptanceCurve {
    /// The drafter's probability unchanged (between the first and last centres), for every child.
    pub fn identity() -> AcceptanceCurve {
        Acceptance::new().curve()
    }

    /// The curve at `q` (NaN reads as 0) for a top child (`top`) or another.
    pub fn at(&self, q: f64, top: bool) -> f64 {
        let at_centres = if top { &self.top } else { &self.other };
        let q = if q.is_nan() { 0.0 } else { q };
        let x = q * BINS as f64 - 0.5;
        if x <= 0.0 {
            return at_centres[0];
        }
        let lo = x.floor() as usize;
        if lo >= BINS - 1 {
            return at_centres[BINS - 1];
        }
        let t = x - lo as f64;
        at_centres[lo] + t * (at_centres[lo + 1] - at_centres[lo])
    }

    /// Path probabilities of a pool whose node `i` has parent `parents[i]` (listed before it)
    /// and drafter probability `edge[i]` given that parent: the product of the curve along the
    /// path, each node read on its class's curve ([`top_children`]).
    pub fn path_probs(&self, parents: &[Option<usize>], edge: &[f64]) -> Vec<f64> {
        let top = top_children(parents, edge);
        let mut out: Vec<f64> = Vec::with_capacity(parents.len());
        for (i, (&parent, &q)) in parents.iter().zip(edge).enumerate() {
            let above = match parent {
                Some(p) if p < i => out[p],
                _ => 1.0,
            };
            out.push(above * self.at(q, top[i]));
        }
        out
    }
}

fn bin_of(q: f64) -> usize {
    if q.is_nan() || q <= 0.0 {
        return 0;
    }
    ((q * BINS as f64) as usize).min(BINS - 1)
}

fn centre(bin: usize) -> f64 {
    (bin as f64 + 0.5) / BINS as f64
}

/// Weighted least-squares non-decreasing fit of `values` (pool adjacent violators): adjacent
/// blocks whose means fall are merged into their weighted mean until none do.
fn isotonic<const N: usize>(values: &[f64; N], weights: &[f64; N]) -> [f64; N] {
    // Blocks as (mean, weight, length), each merged with its left neighbour while below it.
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(N);
    for (&v, &w) in values.iter().zip(weights) {
        blocks.push((v, w, 1));
        while blocks.len() > 1 {
            let (m2, w2, n2) = blocks[blocks.len() - 1];
            let (m1, w1, n1) = blocks[blocks.len() - 2];
            if m1 <= m2 {
                break;
            }
            blocks.truncate(blocks.len() - 2);
            blocks.push(((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2));
        }
    }
    let mut out = [0.0; N];
    let mut at = 0;
    for (mean, _, n) in blocks {
        out[at..at + n].iter_mut().for_each(|o| *o = mean);
        at += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The isotonic fit by its closed form: at `i`, `max_{j ≤ i} min_{k ≥ i}` of the weighted
    /// mean of `j..=k`.
    fn naive_isotonic(values: &[f64], weights: &[f64]) -> Vec<f64> {
        let n = values.len();
        let mean = |j: usize, k: usize| {
            let w: f64 = weights[j..=k].iter().sum();
            values[j..=k]
                .iter()
                .zip(&weights[j..=k])
                .map(|(v, w)| v * w)
                .sum::<f64>()
                / w
        };
        (0..n)
            .map(|i| {
                (0..=i)
                    .map(|j| (i..n).map(|k| mean(j, k)).fold(f64::INFINITY, f64::min))
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn pool_adjacent_violators_equals_the_closed_form(
            values in prop::array::uniform8(0.0f64..1.0),
            weights in prop::array::uniform8(0.1f64..10.0),
        ) {
            let fast = isotonic(&values, &weights);
            let slow = naive_isotonic(&values, &weights);
            for (a, b) in fast.iter().zip(&slow) {
                prop_assert!((a - b).abs() < 1e-12, "{fast:?} against {slow:?}");
            }
        }

        #[test]
        fn the_curve_is_non_decreasing_and_a_probability(
            samples in prop::collection::vec((0.0f64..1.0, any::<bool>(), any::<bool>()), 0..400),
        ) {
            let mut a = Acceptance::new();
            for &(q, top, taken) in &samples {
                a.record(q, top, taken);
            }
            let c = a.curve();
            for top in [true, false] {
                let mut last = 0.0;
                for i in 0..=100 {
                    let v = c.at(i as f64 / 100.0, top);
                    prop_assert!((0.0..=1.0).contains(&v));
                    prop_assert!(v >= last - 1e-12);
                    last = v;
                }
            }
        }
    }

    #[test]
    fn with_no_samples_the_curve_is_the_drafters_probability() {
        let c = AcceptanceCurve::identity();
        for top in [true, false] {
            for q in [0.1, 0.33, 0.5, 0.77, 0.9] {
                assert!((c.at(q, top) - q).abs() < 1e-12, "{q}: {}", c.at(q, top));
            }
            assert_eq!(c.at(0.0, top), centre(0));
            assert_eq!(c.at(1.0, top), centre(BINS - 1));
        }
    }

    #[test]
    fn many_samples_pull_the_curve_to_the_measured_share() {
        // A drafter that says 0.25 where the target takes 60%.
        let mut a = Acceptance::new();
        for i in 0..1000 {
            a.record(0.25, false, i % 5 < 3);
        }
        let c = a.curve();
        assert!(
            (c.at(0.275, false) - 0.6).abs() < 0.01,
            "{}",
            c.at(0.275, false)
        );
        // Bins above it cannot fall below it.
        assert!(c.at(0.3, false) >= c.at(0.275, false));
        assert_eq!(a.samples(), 1000);
    }

    #[test]
    fn path_probabilities_multiply_the_curve_down_each_path() {
        let mut a = Acceptance::new();
        for _ in 0..400 {
            a.record(0.525, true, true);
        }
        let c = a.curve();
        // Node 3 is the root's runner-up; each other node its parent's only child.
        let p = c.path_probs(&[None, Some(0), Some(1), None], &[0.525, 0.525, 0.1, 0.1]);
        let (half, tenth) = (c.at(0.525, true), c.at(0.1, true));
        assert_eq!(
            p,
            vec![half, half * half, half * half * tenth, c.at(0.1, false)]
        );
        assert!(half > 0.95);
    }

    #[test]
    fn counts_round_trip_and_bad_counts_are_refused() {
        let mut a = Acceptance::new();
        a.record(0.42, true, true);
        a.record(0.42, false, false);
        a.record(f64::NAN, false, false);
        a.record(7.0, true, true);
        let (d, t) = a.counts();
        let (top_d, top_t) = a.top_counts();
        let back = Acceptance::from_counts(d, t).unwrap();
        assert_eq!(back.with_top(top_d, top_t).unwrap(), a);
        assert_eq!((d[0], d[8], t[8], d[BINS - 1]), (1, 2, 1, 1));
        assert_eq!((top_d[8], top_t[8], top_d[0]), (1, 1, 0));
        assert_eq!(
            Acceptance::from_counts(&[1; 3], &[0; 3]).unwrap_err(),
            Error::AcceptanceBins {
                got: 3,
                expected: BINS
            }
        );
        let mut taken = [0u64; BINS];
        taken[4] = 2;
        assert_eq!(
            Acceptance::from_counts(&[1; BINS], &taken).unwrap_err(),
            Error::AcceptanceTakenExceedsDrafted {
                bin: 4,
                taken: 2,
                drafted: 1
            }
        );
        let mut b = a.clone();
        b.merge(&a);
        assert_eq!(b.samples(), 2 * a.samples());
    }

    #[test]
    fn a_top_child_is_the_most_probable_of_its_parents_children_ties_to_the_first() {
        let parents = [None, None, Some(0), Some(0), Some(1), None, Some(0)];
        let edge = [0.3, 0.5, 0.4, 0.4, 0.2, 0.1, f64::NAN];
        let top = top_children(&parents, &edge);
        assert_eq!(top, vec![false, true, true, false, true, false, false]);
        assert_eq!(top_children(&[], &[]), Vec::<bool>::new());
    }

    #[test]
    fn top_children_and_the_others_get_their_own_curves_at_one_probability() {
        // At 0.03 the target takes half the top children and one other child in twenty.
        let mut a = Acceptance::new();
        for i in 0..2000 {
            a.record(0.03, true, i % 2 == 0);
            a.record(0.03, false, i % 20 == 0);
        }
        let c = a.curve();
        assert!(
            (c.at(0.025, true) - 0.5).abs() < 0.01,
            "{}",
            c.at(0.025, true)
        );
        assert!(
            (c.at(0.025, false) - 0.05).abs() < 0.01,
            "{}",
            c.at(0.025, false)
        );
        // Without the split both would read the mixture, 0.275.
        let pooled = Acceptance::from_counts(a.counts().0, a.counts().1)
            .unwrap()
            .curve();
        assert_eq!(pooled.at(0.025, true), pooled.at(0.025, false));
        assert!((pooled.at(0.025, true) - 0.275).abs() < 0.01);
    }

    #[test]
    fn a_class_with_few_samples_starts_from_the_curve_over_every_child() {
        let mut a = Acceptance::new();
        for i in 0..1000 {
            a.record(0.625, false, i % 10 < 9);
        }
        a.record(0.625, true, false);
        let c = a.curve();
        // One top child not taken moves its bin a fifth of the way from 0.9 towards 0.
        let want = PRIOR * 0.9 / (1.0 + PRIOR);
        assert!(
            (c.at(0.625, true) - want).abs() < 0.01,
            "{} {want}",
            c.at(0.625, true)
        );
    }

    #[test]
    fn top_counts_that_do_not_fit_inside_the_counts_are_refused() {
        let mut drafted = [0u64; BINS];
        let mut taken = [0u64; BINS];
        drafted[3] = 2;
        taken[3] = 2;
        let a = Acceptance::from_counts(&drafted, &taken).unwrap();
        let mut top_d = [0u64; BINS];
        let top_t = [0u64; BINS];
        top_d[3] = 1;
        // One top child not taken leaves one other child taken twice.
        assert_eq!(
            a.clone().with_top(&top_d, &top_t).unwrap_err(),
            Error::AcceptanceTopExceedsAll {
                bin: 3,
                top_drafted: 1,
                top_taken: 0,
                drafted: 2,
                taken: 2
            }
        );
        top_d[3] = 3;
        assert!(a.clone().with_top(&top_d, &top_t).is_err());
        assert!(a.with_top(&[0; 3], &[0; 3]).is_err());
    }
}
