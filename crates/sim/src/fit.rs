//! Fits of the replay machine from measured forwards: the verify and plain-step cost models
//! (`ReplayJson`) and the drafting costs (`DraftingJson`), by trimmed non-negative least squares
//! ([`specfit_selector::calibrate::fit_trimmed`]). Measuring the rows is the engine's job
//! (`specfit_engine::spec::probe`, `specfit calibrate`); this module only fits them.

use specfit_selector::calibrate::{fit_trimmed, intercepts_from_steps, median, node_columns};
use specfit_selector::json::{DraftingJson, PlainJson, ReplayJson, MAX_NOISE};

use crate::SimError;

/// One measured target forward: a verify, or a plain-decoding step (`nodes` = 0, fitted apart).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerifyRow {
    /// Draft nodes verified (the root comes on top).
    pub nodes: usize,
    pub hits: u64,
    pub misses: u64,
    /// Per layer `⌈misses / reads in flight⌉`, summed.
    pub read_rounds: usize,
    /// Reads that could start only once a slot was freed by an expert computed.
    pub slot_waits: u64,
    /// Tokens already cached (every verified token attends to them).
    pub context: usize,
    pub ms: f64,
}

/// One cycle's drafting: the drafter forwards past the first level and the feeding of the
/// committed tokens, with their times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftRow {
    pub draft_forwards: usize,
    pub draft_ms: f64,
    pub fed: usize,
    pub feed_ms: f64,
    pub context: usize,
}

/// The replay model (see `ReplayJson`): verify probes fitted on non-decreasing node-count
/// intercepts ([`node_columns`]), hits, misses, read rounds, reads that waited for a slot and
/// (verified tokens × cached tokens); plain steps fitted apart on 1, hits, misses, read rounds,
/// slot waits and cached tokens. `read_width` is the reads in flight the rounds
/// were counted with.
pub fn replay_fit(
    probes: &[VerifyRow],
    steps: &[VerifyRow],
    max_nodes: usize,
    read_width: usize,
) -> Result<ReplayJson, SimError> {
    let k = max_nodes.max(probes.iter().map(|p| p.nodes).max().unwrap_or(0));
    let verify: Vec<(Vec<f64>, f64)> = probes
        .iter()
        .map(|p| {
            let mut row = vec![0.0; k + 6];
            node_columns(&mut row, p.nodes);
            row[k + 1] = p.hits as f64;
            row[k + 2] = p.misses as f64;
            row[k + 3] = p.read_rounds as f64;
            row[k + 4] = ((p.nodes + 1) * p.context) as f64;
            row[k + 5] = p.slot_waits as f64;
            (row, p.ms)
        })
        .collect();
    let plain: Vec<(Vec<f64>, f64)> = steps
        .iter()
        .map(|s| {
            let row = vec![
                1.0,
                s.hits as f64,
                s.misses as f64,
                s.read_rounds as f64,
                s.context as f64,
                s.slot_waits as f64,
            ];
            (row, s.ms)
        })
        .collect();
    let (x, (r2, median_abs_err_ms)) = fit_trimmed(&verify)?;
    let (y, (plain_r2, plain_median)) = fit_trimmed(&plain)?;
    let noise = log_spread(
        verify
            .iter()
            .map(|r| (r, &x[..]))
            .chain(plain.iter().map(|r| (r, &y[..]))),
    );
    Ok(ReplayJson {
        noise,
        intercepts: intercepts_from_steps(&x[..=k]),
        ar_intercept: y[0],
        beta_hit: x[k + 1],
        beta_miss: x[k + 2],
        read_round_ms: x[k + 3],
        read_width,
        context_ms: x[k + 4],
        slot_wait_ms: x[k + 5],
        r2,
        median_abs_err_ms,
        plain: Some(PlainJson {
            intercept: y[0],
            beta_hit: y[1],
            beta_miss: y[2],
            read_round_ms: y[3],
            context_ms: y[4],
            slot_wait_ms: y[5],
            r2: plain_r2,
            median_abs_err_ms: plain_median,
        }),
    })
}

/// The robust standard deviation (1.4826 × the median absolute deviation) of ln(measured /
/// fitted) over rows with both positive, each row with its fit's coefficients, at most
/// [`MAX_NOISE`] (what a calibration file may hold; a fit that misses by more than that is no
/// model of the machine's noise either); 0 with fewer than two such rows.
fn log_spread<'a>(rows: impl Iterator<Item = (&'a (Vec<f64>, f64), &'a [f64])>) -> f64 {
    let mut logs: Vec<f64> = rows
        .filter_map(|((row, ms), x)| {
            let fitted: f64 = row.iter().zip(x).map(|(a, b)| a * b).sum();
            (fitted > 0.0 && *ms > 0.0).then(|| (ms / fitted).ln())
        })
        .collect();
    if logs.len() < 2 {
        return 0.0;
    }
    let center = median(&mut logs);
    let mut deviations: Vec<f64> = logs.iter().map(|l| (l - center).abs()).collect();
    (1.4826 * median(&mut deviations)).min(MAX_NOISE)
}

/// Drafting costs: each drafted level past the first costs `ms_per_level + level_context_ms · c`,
/// and feeding `t` committed tokens back costs `feed_ms + (feed_ms_per_token + feed_context_ms ·
/// c) · t` (`c` tokens cached).
pub fn drafting_fit(rows: &[DraftRow]) -> Result<DraftingJson, SimError> {
    let levels: Vec<(Vec<f64>, f64)> = rows
        .iter()
        .filter(|r| r.draft_forwards > 0)
        .map(|r| {
            let f = r.draft_forwards as f64;
            (vec![f, f * r.context as f64], r.draft_ms)
        })
        .collect();
    let feeds: Vec<(Vec<f64>, f64)> = rows
        .iter()
        .map(|r| {
            let t = r.fed as f64;
            (vec![1.0, t, t * r.context as f64], r.feed_ms)
        })
        .collect();
    let (level, _) = fit_trimmed(&levels)?;
    let (feed, _) = fit_trimmed(&feeds)?;
    Ok(DraftingJson {
        ms_per_level: level[0],
        level_context_ms: level[1],
        feed_ms: feed[0],
        feed_ms_per_token: feed[1],
        feed_context_ms: feed[2],
        drafter_dtype: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specfit_selector::calibrate::fit_trimmed;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * (1.0 + b.abs())
    }

    /// Probe rows and plain steps generated exactly by known coefficients, over a spread of node
    /// counts, hits, misses, read rounds, contexts and drafting work.
    fn synthetic() -> (Vec<VerifyRow>, Vec<VerifyRow>, Vec<DraftRow>) {
        let (mut probes, mut steps, mut drafts) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..240usize {
            let nodes = i % 8;
            let (hits, misses) = ((i * 7 % 23) as u64, (i * 5 % 17) as u64);
            let read_rounds = (misses as usize).min(8).max(usize::from(misses > 0))
                - (i % 2).min(misses as usize / 9);
            let context = 20 + (i * 37 % 900);
            let slot_waits = (i * 11 % 7) as u64;
            let ms = 0.5
                + 0.2 * nodes as f64
                + 0.01 * hits as f64
                + 0.06 * misses as f64
                + 0.08 * read_rounds as f64
                + 0.03 * slot_waits as f64
                + 0.001 * ((nodes + 1) * context) as f64;
            let (forwards, fed) = (i % 5, 1 + i % 4);
            probes.push(VerifyRow {
                nodes,
                hits,
                misses,
                read_rounds,
                slot_waits,
                context,
                ms,
            });
            drafts.push(DraftRow {
                draft_forwards: forwards,
                draft_ms: forwards as f64 * (0.4 + 2e-4 * context as f64),
                fed,
                feed_ms: 0.13 + fed as f64 * (0.04 + 1e-4 * context as f64),
                context,
            });
            steps.push(VerifyRow {
                nodes: 0,
                hits,
                misses,
                read_rounds,
                slot_waits,
                context,
                ms: 0.3
                    + 0.005 * hits as f64
                    + 0.05 * misses as f64
                    + 0.07 * read_rounds as f64
                    + 0.02 * slot_waits as f64
                    + 0.0012 * context as f64,
            });
        }
        (probes, steps, drafts)
    }

    #[test]
    fn the_replay_fit_recovers_the_coefficients_that_generated_the_rows() {
        let (probes, steps, _) = synthetic();
        let r = replay_fit(&probes, &steps, 7, 8).unwrap();
        for (n, a) in r.intercepts.iter().enumerate() {
            assert!(close(*a, 0.5 + 0.2 * n as f64), "a[{n}] = {a}");
        }
        assert!(close(r.beta_hit, 0.01) && close(r.beta_miss, 0.06), "{r:?}");
        assert!(
            close(r.read_round_ms, 0.08) && close(r.context_ms, 0.001),
            "{r:?}"
        );
        assert!(close(r.slot_wait_ms, 0.03), "{r:?}");
        let p = r.plain.unwrap();
        assert!(close(p.intercept, 0.3) && close(p.beta_hit, 0.005), "{p:?}");
        assert!(
            close(p.beta_miss, 0.05) && close(p.read_round_ms, 0.07),
            "{p:?}"
        );
        assert!(
            close(p.context_ms, 0.0012) && close(r.ar_intercept, 0.3),
            "{p:?}"
        );
        assert!(close(p.slot_wait_ms, 0.02), "{p:?}");
        assert!(r.r2 > 0.999999 && p.r2 > 0.999999);
    }

    #[test]
    fn the_drafting_fit_recovers_level_and_feed_costs_with_their_context_terms() {
        let (_, _, drafts) = synthetic();
        let d = drafting_fit(&drafts).unwrap();
        assert!(
            close(d.ms_per_level, 0.4) && close(d.level_context_ms, 2e-4),
            "{d:?}"
        );
        assert!(
            close(d.feed_ms, 0.13) && close(d.feed_ms_per_token, 0.04),
            "{d:?}"
        );
        assert!(close(d.feed_context_ms, 1e-4), "{d:?}");
    }

    #[test]
    fn a_preempted_measurement_does_not_move_the_fit() {
        let rows: Vec<(Vec<f64>, f64)> = (0..60)
            .map(|i| {
                let x = (i % 13) as f64;
                (vec![1.0, x], 0.5 + 0.1 * x)
            })
            .collect();
        let mut noisy = rows.clone();
        noisy[17].1 += 40.0; // the thread was descheduled for 40 ms
        let (x, (r2, _)) = fit_trimmed(&noisy).unwrap();
        assert!(close(x[0], 0.5) && close(x[1], 0.1), "{x:?}");
        // The quality is still reported over every row, the outlier included.
        assert!(r2 < 0.5, "{r2}");
    }

    #[test]
    fn too_few_measurements_are_refused() {
        let rows = vec![(vec![1.0, 2.0], 1.0), (vec![1.0, 3.0], 2.0)];
        let e = fit_trimmed(&rows).unwrap_err().to_string();
        assert!(e.contains("2"), "{e}");
        let e = fit_trimmed(&[]).unwrap_err().to_string();
        assert!(e.contains("0"), "{e}");
    }

    #[test]
    fn the_timing_noise_is_the_robust_spread_of_the_log_ratios() {
        // Rows measured 10% above and below a 2 ms fit, alternately, one exact and one
        // preempted: the median absolute deviation of the log ratios is ln 1.1, the outlier
        // moves nothing.
        let x = [2.0];
        let mut rows: Vec<(Vec<f64>, f64)> = (0..9)
            .map(|i| (vec![1.0], if i % 2 == 0 { 2.2 } else { 2.0 / 1.1 }))
            .collect();
        rows.push((vec![1.0], 2.0));
        rows.push((vec![1.0], 50.0));
        let spread = log_spread(rows.iter().map(|r| (r, &x[..])));
        assert!(close(spread, 1.4826 * 1.1f64.ln()), "{spread}");
        // Exact rows: none; rows without a positive fit or time are left out.
        let exact = [(vec![1.0], 2.0), (vec![1.0], 2.0), (vec![0.0], 0.0)];
        assert_eq!(log_spread(exact.iter().map(|r| (r, &x[..]))), 0.0);
        assert_eq!(log_spread(exact[2..].iter().map(|r| (r, &x[..]))), 0.0);
        // A fit that misses by factors of e⁵ records the most a calibration file may hold.
        let wild: Vec<(Vec<f64>, f64)> = (0..8)
            .map(|i| {
                (
                    vec![1.0],
                    2.0 * (if i % 2 == 0 { 5.0f64 } else { -5.0 }).exp(),
                )
            })
            .collect();
        assert_eq!(log_spread(wild.iter().map(|r| (r, &x[..]))), MAX_NOISE);
    }
}
