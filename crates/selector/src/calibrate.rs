//! Fits the cost model's coefficients from measured probe forwards.
//!
//! Each probe row is one verify forward: how many draft nodes it carried (`nodes`), how many
//! distinct (layer, expert) pairs it needed (`demand`), optionally how many of those were
//! resident (`hits`) and copied (`misses`), and the measured time (`ms`). The paper's form
//! `ms ≈ a[nodes] + β · demand` is linear in `(a[0..=K], β)`; it is fitted by non-negative least
//! squares so every coefficient is a valid cost. The intercepts are fitted as running sums
//! `a[n] = c_0 + … + c_n` of non-negative steps ([`node_columns`]): verifying one more node never
//! takes less fixed time, and free per-`n` intercepts, which share their variance with the
//! demand column, came out non-monotone on every machine measured (a 6-node verify "cheaper" than
//! a 1-node one), which the search then took at face value. When rows carry hits and misses, the
//! residency-aware form `a[nodes] + β_hit · hits + β_miss · misses` is fitted too. When the
//! rows were measured at different contexts (`context`, tokens cached before the root), both
//! forms get the term `γ · (nodes + 1) · context` too: every verified row attends to every
//! cached token, so at long contexts a node costs more than its experts. With one context per
//! node count the term cannot be told apart from the intercepts and is left out (`γ = 0`).
//! This module owns the fit and its quality report; measuring probes is the engine's job.

use crate::cost::{CostModel, ExpertCost};
use crate::error::Error;
use crate::nnls::{nnls_scaled, Matrix};

/// One measured verify forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// Draft nodes verified (0 = autoregressive step).
    pub nodes: usize,
    /// `Σ_l |U_l|` of the forward.
    pub demand: u64,
    /// Measured time in ms.
    pub ms: f64,
    /// Resident and copied experts, when measured.
    pub hits_misses: Option<(u64, u64)>,
    /// Tokens cached before the root (each verified row attends to them).
    pub context: u64,
}

/// Least spread of contexts (tokens) among the rows of one node count for the fit to separate
/// the context term from the intercepts ([`context_varies`]).
pub const CONTEXT_SPREAD: u64 = 64;

/// Whether the rows of some node count were measured at contexts at least [`CONTEXT_SPREAD`]
/// tokens apart: only then is the context column not a function of the node count, which the
/// intercept columns already span.
pub fn context_varies(probes: &[Probe]) -> bool {
    let max_nodes = probes.iter().map(|p| p.nodes).max().unwrap_or(0);
    let mut span = vec![(u64::MAX, 0u64); max_nodes + 1];
    for p in probes {
        let (lo, hi) = &mut span[p.nodes];
        (*lo, *hi) = ((*lo).min(p.context), (*hi).max(p.context));
    }
    span.iter()
        .any(|&(lo, hi)| lo <= hi && hi - lo >= CONTEXT_SPREAD)
}

/// One fitted cost form and how well it explains the probes.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The fitted cost model.
    pub cost: CostModel,
    /// Coefficient of determination over the probe rows.
    pub r2: f64,
    /// Median of `|predicted − measured|` in ms.
    pub median_abs_err_ms: f64,
    /// Rows fitted.
    pub rows: usize,
}

/// The result of a calibration: the paper's form, and the residency-aware form when the probes
/// carry hits and misses.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Largest node count seen (intercepts cover `0..=max_nodes`).
    pub max_nodes: usize,
    /// `a[n] + β · demand`.
    pub paper: Fit,
    /// `a[n] + β_hit · hits + β_miss · misses`.
    pub residency: Option<Fit>,
}

/// Validates the probe rows and fits both cost forms.
pub fn calibrate(probes: &[Probe]) -> Result<Calibration, Error> {
    let with_residency = check_probes(probes)?;
    let max_nodes = probes.iter().map(|p| p.nodes).max().unwrap_or(0);
    let paper = fit(probes, max_nodes, false)?;
    let residency = if with_residency {
        Some(fit(probes, max_nodes, true)?)
    } else {
        None
    };
    Ok(Calibration {
        max_nodes,
        paper,
        residency,
    })
}

/// Checks each row and the row set; returns whether rows carry hits and misses.
pub fn check_probe(row: usize, p: &Probe) -> Result<(), Error> {
    if !(p.ms.is_finite() && p.ms >= 0.0) {
        return Err(Error::BadProbe {
            row,
            field: "ms",
            value: p.ms,
        });
    }
    Ok(())
}

fn check_probes(probes: &[Probe]) -> Result<bool, Error> {
    if probes.is_empty() {
        return Err(Error::NoProbes);
    }
    for (row, p) in probes.iter().enumerate() {
        check_probe(row, p)?;
    }
    let with = probes[0].hits_misses.is_some();
    if let Some(row) = probes.iter().position(|p| p.hits_misses.is_some() != with) {
        return Err(Error::MixedResidency { row });
    }
    let max_nodes = probes.iter().map(|p| p.nodes).max().unwrap_or(0);
    let mut seen = vec![false; max_nodes + 1];
    for p in probes {
        seen[p.nodes] = true;
    }
    if let Some(nodes) = seen.iter().position(|s| !s) {
        return Err(Error::MissingNodeCount { nodes, max_nodes });
    }
    Ok(with)
}

/// Sets the intercept columns of a row with `nodes` verified nodes: a 1 in columns `0..=nodes`,
/// so that the fitted coefficients `c` are the steps of non-decreasing intercepts
/// ([`intercepts_from_steps`]).
pub fn node_columns(row: &mut [f64], nodes: usize) {
    row[..=nodes].fill(1.0);
}

/// The intercepts `a[n] = c_0 + … + c_n` from fitted steps `c` (see [`node_columns`]).
pub fn intercepts_from_steps(steps: &[f64]) -> Vec<f64> {
    steps
        .iter()
        .scan(0.0, |sum, c| {
            *sum += c;
            Some(*sum)
        })
        .collect()
}

/// Fits one form: intercept columns ([`node_columns`]), then `demand` or `hits, misses`.
fn fit(probes: &[Probe], max_nodes: usize, residency: bool) -> Result<Fit, Error> {
    let counts = if residency { 2 } else { 1 };
    let context = context_varies(probes);
    let cols = max_nodes + 1 + counts + usize::from(context);
    let mut data = vec![0.0; probes.len() * cols];
    for (r, p) in probes.iter().enumerate() {
        let row = &mut data[r * cols..(r + 1) * cols];
        node_columns(row, p.nodes);
        match (residency, p.hits_misses) {
            (true, Some((h, m))) => {
                row[max_nodes + 1] = h as f64;
                row[max_nodes + 2] = m as f64;
            }
            _ => row[max_nodes + 1] = p.demand as f64,
        }
        if context {
            row[cols - 1] = ((p.nodes + 1) as u64).saturating_mul(p.context) as f64;
        }
    }
    let b: Vec<f64> = probes.iter().map(|p| p.ms).collect();
    let x = nnls_scaled(
        Matrix {
            data: &data,
            rows: probes.len(),
            cols,
        },
        &b,
    )?;
    let intercepts = intercepts_from_steps(&x[..=max_nodes]);
    let expert = if residency {
        ExpertCost::Residency {
            beta_hit: x[max_nodes + 1],
            beta_miss: x[max_nodes + 2],
        }
    } else {
        ExpertCost::Uniform {
            beta: x[max_nodes + 1],
        }
    };
    let gamma = if context { x[cols - 1] } else { 0.0 };
    let cost = CostModel::new(intercepts, expert)?.with_context_ms(gamma)?;
    let predicted: Vec<f64> = probes
        .iter()
        .map(|p| {
            let at = cost.at_context(usize::try_from(p.context).unwrap_or(usize::MAX));
            match p.hits_misses {
                Some((h, m)) if residency => at.time_ms(p.nodes, h as u32, m as u32),
                _ => at.time_ms(p.nodes, 0, p.demand as u32),
            }
        })
        .collect();
    let (r2, median_abs_err_ms) = quality(&b, &predicted);
    Ok(Fit {
        cost,
        r2,
        median_abs_err_ms,
        rows: probes.len(),
    })
}

/// A least-squares fit with non-negative coefficients of `ms ≈ row · x`, with its quality (R²,
/// median absolute error), by [`crate::nnls::nnls_scaled`]. Timing noise on a shared machine is
/// one-sided (a preempted forward is only ever slower), so rows measured more than 5 median
/// absolute errors above their prediction are dropped once and the fit repeated; the quality is
/// reported on every row. Rows are `(coefficients' multipliers, measured ms)`.
pub fn fit_trimmed(rows: &[(Vec<f64>, f64)]) -> Result<(Vec<f64>, (f64, f64)), Error> {
    let cols = rows.first().map_or(0, |r| r.0.len());
    if rows.len() <= cols || cols == 0 {
        return Err(Error::TooFewMeasurements {
            rows: rows.len(),
            coefficients: cols,
        });
    }
    let solve = |keep: &[bool]| -> Result<Vec<f64>, Error> {
        let kept: Vec<&(Vec<f64>, f64)> = rows
            .iter()
            .zip(keep)
            .filter(|(_, &k)| k)
            .map(|(r, _)| r)
            .collect();
        let a: Vec<f64> = kept.iter().flat_map(|r| r.0.iter().copied()).collect();
        let b: Vec<f64> = kept.iter().map(|r| r.1).collect();
        nnls_scaled(
            Matrix {
                data: &a,
                rows: b.len(),
                cols,
            },
            &b,
        )
    };
    let predict = |x: &[f64]| -> Vec<f64> {
        rows.iter()
            .map(|r| r.0.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let measured: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let mut x = solve(&vec![true; rows.len()])?;
    let (_, median) = quality(&measured, &predict(&x));
    let keep: Vec<bool> = measured
        .iter()
        .zip(predict(&x))
        .map(|(m, p)| m - p <= 5.0 * median)
        .collect();
    if keep.iter().filter(|&&k| k).count() > cols {
        x = solve(&keep)?;
    }
    let fit = quality(&measured, &predict(&x));
    Ok((x, fit))
}

/// R² and the median absolute error of predictions against measurements (the fit quality
/// every cost fit reports).
pub fn quality(measured: &[f64], predicted: &[f64]) -> (f64, f64) {
    let mean = measured.iter().sum::<f64>() / measured.len() as f64;
    let ss_tot: f64 = measured.iter().map(|y| (y - mean).powi(2)).sum();
    let ss_res: f64 = measured
        .iter()
        .zip(predicted)
        .map(|(y, p)| (y - p).powi(2))
        .sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else if ss_res == 0.0 {
        1.0
    } else {
        0.0
    };
    let mut errors: Vec<f64> = measured
        .iter()
        .zip(predicted)
        .map(|(y, p)| (y - p).abs())
        .collect();
    (r2, median(&mut errors))
}

/// The middle value of `v` (the mean of the two middle ones for an even count; 0 when empty),
/// reordering it.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two_and_zero_for_none() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    fn probes(a: &[f64], beta: f64, noise: f64) -> Vec<Probe> {
        let mut seed = 9u64;
        let mut rows = Vec::new();
        for rep in 0..20u64 {
            for (n, &an) in a.iter().enumerate() {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = ((seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * noise;
                let demand = 40 + 13 * n as u64 + 7 * rep;
                let ms = an + beta * demand as f64 + jitter;
                rows.push(Probe {
                    nodes: n,
                    demand,
                    ms,
                    hits_misses: None,
                    context: 0,
                });
            }
        }
        rows
    }

    #[test]
    fn noiseless_probes_recover_the_generating_coefficients() {
        let a = [20.0, 21.0, 21.5, 23.0];
        let cal = calibrate(&probes(&a, 0.211, 0.0)).unwrap();
        assert_eq!(cal.max_nodes, 3);
        let ExpertCost::Uniform { beta } = cal.paper.cost.expert() else {
            panic!()
        };
        assert!((beta - 0.211).abs() < 1e-9, "{beta}");
        for (got, want) in cal.paper.cost.intercepts().iter().zip(a) {
            assert!((got - want).abs() < 1e-7, "{got} vs {want}");
        }
        assert!(cal.paper.r2 > 0.999_999_9 && cal.paper.median_abs_err_ms < 1e-7);
        assert!(cal.residency.is_none());
    }

    #[test]
    fn rows_at_different_contexts_give_the_per_row_context_charge() {
        // ms = a[n] + β · demand + γ · (n + 1) · context, contexts from 40 to 1 940 tokens.
        let (a, beta, gamma) = ([20.0, 21.0, 21.5, 23.0], 0.211, 0.004);
        let mut rows = probes(&a, beta, 0.0);
        for (i, r) in rows.iter_mut().enumerate() {
            r.context = 40 + 100 * (i as u64 % 20);
            r.ms += gamma * (r.nodes + 1) as f64 * r.context as f64;
        }
        assert!(context_varies(&rows));
        let cal = calibrate(&rows).unwrap();
        let got = cal.paper.cost.context_ms();
        assert!((got - gamma).abs() < 1e-9, "{got}");
        for (got, want) in cal.paper.cost.intercepts().iter().zip(a) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        assert!(cal.paper.median_abs_err_ms < 1e-6, "{:?}", cal.paper);
        // Without the column the same rows fit worse: the fit did use it.
        let flat: Vec<Probe> = rows.iter().map(|r| Probe { context: 0, ..*r }).collect();
        let without = calibrate(&flat).unwrap();
        assert_eq!(without.paper.cost.context_ms(), 0.0);
        assert!(without.paper.median_abs_err_ms > 1.0, "{:?}", without.paper);
    }

    #[test]
    fn one_context_per_node_count_leaves_the_context_charge_out() {
        // Each node count measured at its own context: the charge is a function of the count,
        // which the intercepts already are; contexts closer than CONTEXT_SPREAD count as one.
        let mut rows = probes(&[20.0, 21.0, 21.5], 0.2, 0.0);
        for r in rows.iter_mut() {
            r.context = 100 * r.nodes as u64 + r.demand % 2 * (CONTEXT_SPREAD - 1);
        }
        assert!(!context_varies(&rows));
        let cal = calibrate(&rows).unwrap();
        assert_eq!(cal.paper.cost.context_ms(), 0.0);
        // One row CONTEXT_SPREAD tokens past its count's others (at 0 and 63) is enough.
        assert_eq!((rows[0].nodes, rows[0].context), (0, 0));
        rows[0].context = CONTEXT_SPREAD;
        assert!(context_varies(&rows));
    }

    #[test]
    fn fitted_intercepts_never_fall_as_nodes_are_added() {
        // Measured times whose per-node means dip at n = 2 (noise shared with demand): the fit
        // keeps a[2] ≥ a[1] and matches a free fit where that fit is already monotone.
        let rows: Vec<Probe> = (0..60u64)
            .map(|i| {
                let n = (i % 4) as usize;
                let demand = 30 + 11 * n as u64 + i % 7;
                let dip = if n == 2 { -3.0 } else { 0.0 };
                Probe {
                    nodes: n,
                    demand,
                    ms: 10.0 + n as f64 + dip + 0.1 * demand as f64,
                    hits_misses: None,
                    context: 0,
                }
            })
            .collect();
        let cal = calibrate(&rows).unwrap();
        let a = cal.paper.cost.intercepts();
        assert!(a.windows(2).all(|w| w[1] >= w[0]), "{a:?}");
        assert!(a[2] < a[3], "{a:?}");
    }

    #[test]
    fn running_sums_of_steps_give_the_intercepts() {
        assert_eq!(intercepts_from_steps(&[2.0, 0.0, 0.5]), vec![2.0, 2.0, 2.5]);
        let mut row = [0.0; 5];
        node_columns(&mut row, 2);
        assert_eq!(row, [1.0, 1.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn fitted_coefficients_are_never_negative() {
        // Times that fall with demand would need β < 0: NNLS pins it at zero instead.
        let rows: Vec<Probe> = (0..10)
            .map(|i| Probe {
                nodes: i % 2,
                demand: 100 + i as u64,
                ms: 50.0 - i as f64,
                hits_misses: None,
                context: 0,
            })
            .collect();
        let cal = calibrate(&rows).unwrap();
        assert_eq!(cal.paper.cost.expert(), ExpertCost::Uniform { beta: 0.0 });
        assert!(cal.paper.cost.intercepts().iter().all(|&a| a >= 0.0));
    }

    #[test]
    fn hit_and_miss_costs_are_fitted_separately() {
        let rows: Vec<Probe> = (0..40u64)
            .map(|i| {
                let (h, m) = (10 + i * 3 % 17, 5 + i * 7 % 23);
                let n = (i % 3) as usize;
                let ms = [5.0, 6.0, 7.0][n] + 0.05 * h as f64 + 0.4 * m as f64;
                Probe {
                    nodes: n,
                    demand: h + m,
                    ms,
                    hits_misses: Some((h, m)),
                    context: 0,
                }
            })
            .collect();
        let fit = calibrate(&rows).unwrap().residency.unwrap();
        let ExpertCost::Residency {
            beta_hit,
            beta_miss,
        } = fit.cost.expert()
        else {
            panic!()
        };
        assert!((beta_hit - 0.05).abs() < 1e-9 && (beta_miss - 0.4).abs() < 1e-9);
    }

    #[test]
    fn probe_sets_with_gaps_or_bad_values_are_rejected() {
        assert_eq!(calibrate(&[]).unwrap_err(), Error::NoProbes);
        let gap = [
            Probe {
                nodes: 0,
                demand: 1,
                ms: 1.0,
                hits_misses: None,
                context: 0,
            },
            Probe {
                nodes: 2,
                demand: 1,
                ms: 1.0,
                hits_misses: None,
                context: 0,
            },
        ];
        assert_eq!(
            calibrate(&gap).unwrap_err(),
            Error::MissingNodeCount {
                nodes: 1,
                max_nodes: 2
            }
        );
        let nan = [Probe {
            nodes: 0,
            demand: 1,
            ms: f64::NAN,
            hits_misses: None,
            context: 0,
        }];
        assert!(matches!(
            calibrate(&nan).unwrap_err(),
            Error::BadProbe {
                row: 0,
                field: "ms",
                ..
            }
        ));
        let mixed = [
            Probe {
                nodes: 0,
                demand: 1,
                ms: 1.0,
                hits_misses: Some((1, 0)),
                context: 0,
            },
            Probe {
                nodes: 0,
                demand: 1,
                ms: 1.0,
                hits_misses: None,
                context: 0,
            },
        ];
        assert_eq!(
            calibrate(&mixed).unwrap_err(),
            Error::MixedResidency { row: 1 }
        );
    }
}
