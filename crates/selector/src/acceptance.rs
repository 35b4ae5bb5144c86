//! How often the target takes a drafted child, against the drafter's probability for it: counts
//! per probability bin (measured by `specfit calibrate` and while decoding) and the monotone
//! curve that turns the drafter's edge probabilities into the path probabilities the selector
//! scores. A drafter whose probabilities are too low (or too high) otherwise makes SpecFit verify
//! too little (or too much). It owns no decoding and no file format.

use crate::error::Error;

/// Probability bins of width `1 / BINS`.
pub const BINS: usize = 20;

/// Pseudo-samples per bin at the bin's own probability: with no data the curve is the drafter's
/// probability itself, and a bin moves away from it as samples arrive.
pub const PRIOR: f64 = 4.0;

/// Drafted children and the share of them the target took, per bin of the drafter's probability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acceptance {
    drafted: [u64; BINS],
    taken: [u64; BINS],
}

impl Acceptance {
    /// No samples: its curve is the drafter's own probability.
    pub fn new() -> Acceptance {
        Acceptance::default()
    }

    /// Counts read back (as [`Acceptance::counts`] gives them): `BINS` bins each, `taken ≤
    /// drafted` in every bin.
    pub fn from_counts(drafted: &[u64], taken: &[u64]) -> Result<Acceptance, Error> {
        for got in [drafted.len(), taken.len()] {
            if got != BINS {
                return Err(Error::AcceptanceBins {
                    got,
                    expected: BINS,
                });
            }
        }
        let mut a = Acceptance::new();
        for (bin, (&d, &t)) in drafted.iter().zip(taken).enumerate() {
            if t > d {
                return Err(Error::AcceptanceTakenExceedsDrafted {
                    bin,
                    taken: t,
                    drafted: d,
                });
            }
            a.drafted[bin] = d;
            a.taken[bin] = t;
        }
        Ok(a)
    }

    /// Drafted and taken children per bin.
    pub fn counts(&self) -> (&[u64; BINS], &[u64; BINS]) {
        (&self.drafted, &self.taken)
    }

    /// Children counted so far.
    pub fn samples(&self) -> u64 {
        self.drafted.iter().sum()
    }

    /// Counts one drafted child of probability `q` (given its parent) and whether the target took
    /// it. A probability outside `[0, 1]` (or NaN) counts in the nearest end bin.
    pub fn record(&mut self, q: f64, taken: bool) {
        let bin = bin_of(q);
        self.drafted[bin] = self.drafted[bin].saturating_add(1);
        if taken {
            self.taken[bin] = self.taken[bin].saturating_add(1);
        }
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &Acceptance) {
        for bin in 0..BINS {
            self.drafted[bin] = self.drafted[bin].saturating_add(other.drafted[bin]);
            self.taken[bin] = self.taken[bin].saturating_add(other.taken[bin]);
        }
    }

    /// The curve: per bin the taken share with [`PRIOR`] pseudo-samples at the bin's centre,
    /// made non-decreasing by pool-adjacent-violators weighted by samples + prior.
    pub fn curve(&self) -> AcceptanceCurve {
        let mut rate = [0.0; BINS];
        let mut weight = [0.0; BINS];
        for bin in 0..BINS {
            let n = self.drafted[bin] as f64;
            weight[bin] = n + PRIOR;
            rate[bin] = (self.taken[bin] as f64 + PRIOR * centre(bin)) / weight[bin];
        }
        AcceptanceCurve {
            at_centres: isotonic(&rate, &weight),
        }
    }
}

/// The probability the target takes a child the drafter gives probability `q`: linear between
/// the bins' centres, flat beyond the first and last, non-decreasing, in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceCurve {
    at_centres: [f64; BINS],
}

impl AcceptanceCurve {
    /// The drafter's probability unchanged (between the first and last centres).
    pub fn identity() -> AcceptanceCurve {
        Acceptance::new().curve()
    }

    /// The curve at `q` (NaN reads as 0).
    pub fn at(&self, q: f64) -> f64 {
        let q = if q.is_nan() { 0.0 } else { q };
        let x = q * BINS as f64 - 0.5;
        if x <= 0.0 {
            return self.at_centres[0];
        }
        let lo = x.floor() as usize;
        if lo >= BINS - 1 {
            return self.at_centres[BINS - 1];
        }
        let t = x - lo as f64;
        self.at_centres[lo] + t * (self.at_centres[lo + 1] - self.at_centres[lo])
    }

    /// Path probabilities of a pool whose node `i` has parent `parents[i]` (listed before it)
    /// and drafter probability `edge[i]` given that parent: the product of the curve along the
    /// path.
    pub fn path_probs(&self, parents: &[Option<usize>], edge: &[f64]) -> Vec<f64> {
        let mut out: Vec<f64> = Vec::with_capacity(parents.len());
        for (i, (&parent, &q)) in parents.iter().zip(edge).enumerate() {
            let above = match parent {
                Some(p) if p < i => out[p],
                _ => 1.0,
            };
            out.push(above * self.at(q));
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
            samples in prop::collection::vec((0.0f64..1.0, any::<bool>()), 0..400),
        ) {
            let mut a = Acceptance::new();
            for &(q, taken) in &samples {
                a.record(q, taken);
            }
            let c = a.curve();
            let mut last = 0.0;
            for i in 0..=100 {
                let v = c.at(i as f64 / 100.0);
                prop_assert!((0.0..=1.0).contains(&v));
                prop_assert!(v >= last - 1e-12);
                last = v;
            }
        }
    }

    #[test]
    fn with_no_samples_the_curve_is_the_drafters_probability() {
        let c = AcceptanceCurve::identity();
        for q in [0.1, 0.33, 0.5, 0.77, 0.9] {
            assert!((c.at(q) - q).abs() < 1e-12, "{q}: {}", c.at(q));
        }
        assert_eq!(c.at(0.0), centre(0));
        assert_eq!(c.at(1.0), centre(BINS - 1));
    }

    #[test]
    fn many_samples_pull_the_curve_to_the_measured_share() {
        // A drafter that says 0.25 where the target takes 60%.
        let mut a = Acceptance::new();
        for i in 0..1000 {
            a.record(0.25, i % 5 < 3);
        }
        let c = a.curve();
        assert!((c.at(0.275) - 0.6).abs() < 0.01, "{}", c.at(0.275));
        // Bins above it cannot fall below it.
        assert!(c.at(0.3) >= c.at(0.275));
        assert_eq!(a.samples(), 1000);
    }

    #[test]
    fn path_probabilities_multiply_the_curve_down_each_path() {
        let mut a = Acceptance::new();
        for _ in 0..400 {
            a.record(0.525, true);
        }
        let c = a.curve();
        let p = c.path_probs(&[None, Some(0), Some(1), None], &[0.525, 0.525, 0.1, 0.1]);
        let (half, tenth) = (c.at(0.525), c.at(0.1));
        assert_eq!(p, vec![half, half * half, half * half * tenth, tenth]);
        assert!(half > 0.95);
    }

    #[test]
    fn counts_round_trip_and_bad_counts_are_refused() {
        let mut a = Acceptance::new();
        a.record(0.42, true);
        a.record(0.42, false);
        a.record(f64::NAN, false);
        a.record(7.0, true);
        let (d, t) = a.counts();
        assert_eq!(Acceptance::from_counts(d, t).unwrap(), a);
        assert_eq!((d[0], d[8], t[8], d[BINS - 1]), (1, 2, 1, 1));
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
}
