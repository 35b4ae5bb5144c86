//! The bench's numbers: per-run outcomes summed into tallies, tallies turned into the paper's
//! table per prompt set (tok/s, speedup over plain decoding, gain over cached EAGLE-3, nodes and
//! tokens per cycle, cycle time, copies and MB per token, selection time, losslessness), and
//! that table as terminal text, Markdown and JSON. It measures nothing itself.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use specfit_engine::experts::LayerStats;
use specfit_engine::policy::PolicyName;
use specfit_engine::DecodeStats;
use specfit_selector::calibrate::median;
use specfit_selector::json::CalibrationJson;

use super::plan::{Config, PromptSet, Slots};

/// What one decode of one prompt produced and cost (in a [`Tally`], summed over prompts, with
/// no tokens).
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub decode_seconds: f64,
    pub cycles: usize,
    /// Of `cycles`, plain steps (a drafting policy's bursts).
    pub plain_steps: usize,
    pub verified: usize,
    pub committed: usize,
    pub atlas_seconds: f64,
    /// Of `decode_seconds`, drafting (the engine's draft phase).
    pub draft_seconds: f64,
    /// Expert hits, copies, bytes, and the reads' own and waited-for time.
    pub copies: LayerStats,
}

impl Outcome {
    /// The outcome of one decode, plain or speculative.
    pub fn of(g: &DecodeStats) -> Outcome {
        Outcome {
            tokens: g.tokens.clone(),
            decode_seconds: g.decode_seconds,
            cycles: g.cycles,
            plain_steps: g.plain_steps,
            verified: g.verified_nodes,
            committed: g.committed,
            atlas_seconds: g.atlas_seconds,
            draft_seconds: g.draft_seconds,
            copies: g.copies,
        }
    }

    /// Adds `o`'s counts and times to these (not its tokens).
    fn accumulate(&mut self, o: &Outcome) {
        self.decode_seconds += o.decode_seconds;
        self.cycles += o.cycles;
        self.plain_steps += o.plain_steps;
        self.verified += o.verified;
        self.committed += o.committed;
        self.atlas_seconds += o.atlas_seconds;
        self.draft_seconds += o.draft_seconds;
        self.copies.add(&o.copies);
    }
}

/// Outcomes of one configuration on one prompt set, summed.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub prompts: usize,
    /// The outcomes' counts and times, summed.
    pub sum: Outcome,
    pub select_us: Vec<f64>,
    pub lossless: usize,
    /// Question ids whose output differed from plain decoding.
    pub mismatched: Vec<u64>,
    /// Decoded tokens and decode seconds of each round (`--rounds`).
    pub rounds: Vec<(usize, f64)>,
}

impl Tally {
    /// Adds the outcome of one prompt in `round`.
    pub fn add(&mut self, round: usize, o: &Outcome, select_us: &[f64], id: u64, same: bool) {
        let decoded = o.tokens.len().saturating_sub(1);
        self.prompts += 1;
        if self.rounds.len() <= round {
            self.rounds.resize(round + 1, (0, 0.0));
        }
        self.rounds[round].0 += decoded;
        self.rounds[round].1 += o.decode_seconds;
        self.sum.accumulate(o);
        self.select_us.extend_from_slice(select_us);
        if same {
            self.lossless += 1;
        } else {
            self.mismatched.push(id);
        }
    }

    /// Decoded tokens over every round.
    pub fn decoded(&self) -> usize {
        self.rounds.iter().map(|&(tokens, _)| tokens).sum()
    }

    /// Each round's decoded tokens per second.
    pub fn round_rates(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|&(tokens, seconds)| ratio(tokens as f64, seconds))
            .collect()
    }

    /// The median over the rounds of the decoded tokens per second (with one round, that
    /// round's rate).
    pub fn tokens_per_second(&self) -> f64 {
        median(&mut self.round_rates())
    }
}

/// `a`'s rate over `b`'s, round by round (the rounds both have).
fn paired(a: &Tally, b: &Tally) -> Vec<f64> {
    a.round_rates()
        .iter()
        .zip(b.round_rates())
        .map(|(&x, y)| ratio(x, y))
        .collect()
}

pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub label: String,
    pub policy: &'static str,
    pub routes: String,
    /// Slots per layer (0 = no cache: every expert copied every forward).
    pub slots: usize,
    pub beta_scale: f64,
    /// Expected experts read ahead of each verify forward.
    pub read_ahead: bool,
    /// Scored by the drafter's own probabilities instead of the target's acceptance.
    pub drafter_probs: bool,
    /// MoE layers each layer predicted and read ahead (0 = none).
    pub layers_ahead: usize,
    /// Plain decoding run a second time beside `ar` (`ar (again)`): its `speedup_vs_ar` is two
    /// identical decoders' ratio in this run.
    pub again: bool,
    /// The median over the rounds (`--rounds`), as `speedup_vs_ar` and `gain_vs_eagle3`.
    pub tok_s: f64,
    pub speedup_vs_ar: f64,
    /// Rounds measured; with more than one, the lowest and highest round's `speedup_vs_ar`.
    pub rounds: usize,
    pub speedup_range: Option<[f64; 2]>,
    /// tok/s over cached EAGLE-3's at the same slots, minus 1 (vanilla EAGLE-3 at 0 slots).
    pub gain_vs_eagle3: Option<f64>,
    pub nodes_per_cycle: f64,
    pub tokens_per_cycle: f64,
    /// Committed tokens decoded by plain steps (a drafting policy's bursts; 1 for `ar`), per
    /// committed token.
    pub plain_share: f64,
    pub cycle_ms: f64,
    pub copies_per_token: f64,
    pub mb_per_token: f64,
    /// Share of the decode time spent waiting for expert reads.
    pub copy_wait_share: f64,
    /// Mean duration of one expert read in µs (0 when nothing was read). It grows with the reads
    /// in flight at once, so only configurations that read alike compare (`ar` and
    /// `specfit-adaptive`, say).
    pub read_us: f64,
    pub select_us_median: Option<f64>,
    pub atlas_ms_per_cycle: f64,
    pub decoded_tokens: usize,
    pub decode_seconds: f64,
    pub prompts: usize,
    pub lossless_prompts: usize,
    pub mismatched_question_ids: Vec<u64>,
}

/// One prompt set's table.
#[derive(Debug, Clone, Serialize)]
pub struct SetReport {
    pub name: String,
    pub prompts: usize,
    pub question_ids: Vec<u64>,
    pub rows: Vec<Row>,
}

/// The calibration the SpecFit rows used.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationSummary {
    pub path: String,
    pub intercepts_ms: Vec<f64>,
    pub beta_ms: Option<f64>,
    pub beta_hit_ms: Option<f64>,
    pub beta_miss_ms: Option<f64>,
    /// The paper form's charge per verified row per cached token (0: not fitted).
    pub context_ms: f64,
    pub r2: f64,
    pub median_abs_err_ms: f64,
}

/// The whole bench report (report.json).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub format: &'static str,
    pub version: u32,
    pub machine: Machine,
    pub model: String,
    /// How the drafter kept its matrices (`--drafter-dtype`, resolved).
    pub drafter_dtype: &'static str,
    pub tier: String,
    pub experts_per_layer: usize,
    pub default_slots: usize,
    pub max_new_tokens: usize,
    pub max_nodes: usize,
    pub calibration: CalibrationSummary,
    /// Every policy's output equalled plain decoding's on every prompt.
    pub lossless: bool,
    pub seconds: f64,
    pub sets: Vec<SetReport>,
    /// The trace simulator's predictions beside the measurements (`--validate`).
    pub validation: Vec<super::validate::SetValidation>,
}

/// Where the bench ran.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub compute_threads: usize,
    pub os: &'static str,
    pub arch: &'static str,
}

/// What [`Report::new`] summarizes.
pub struct Inputs<'a> {
    pub sets: &'a [PromptSet],
    pub configs: &'a [Config],
    pub tallies: &'a [Vec<Tally>],
    pub model: &'a Path,
    pub drafter_dtype: &'static str,
    pub tier: &'a str,
    pub default_slots: usize,
    pub experts: usize,
    pub max_tokens: usize,
    pub max_nodes: usize,
    pub calibration: &'a CalibrationJson,
    pub calibration_path: &'a Path,
    pub validation: Vec<super::validate::SetValidation>,
    pub seconds: f64,
}

impl Report {
    pub fn new(i: Inputs<'_>) -> Report {
        let sets: Vec<SetReport> = i
            .sets
            .iter()
            .zip(i.tallies)
            .map(|(set, tallies)| SetReport {
                name: set.name.clone(),
                prompts: set.prompts.len(),
                question_ids: set.prompts.iter().map(|p| p.question_id).collect(),
                rows: rows(i.configs, tallies),
            })
            .collect();
        let lossless = sets
            .iter()
            .all(|s| s.rows.iter().all(|r| r.lossless_prompts == r.prompts));
        let c = i.calibration;
        Report {
            format: "specfit-bench",
            version: 1,
            machine: Machine {
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                compute_threads: specfit_engine::threads::pool().threads(),
                os: std::env::consts::OS,
                arch: std::env::consts::ARCH,
            },
            model: i.model.display().to_string(),
            drafter_dtype: i.drafter_dtype,
            tier: i.tier.to_string(),
            experts_per_layer: i.experts,
            default_slots: i.default_slots,
            max_new_tokens: i.max_tokens,
            max_nodes: i.max_nodes,
            calibration: CalibrationSummary {
                path: i.calibration_path.display().to_string(),
                intercepts_ms: c.cost.intercepts.clone(),
                beta_ms: c.cost.beta,
                beta_hit_ms: c.cost_residency.as_ref().and_then(|r| r.beta_hit),
                beta_miss_ms: c.cost_residency.as_ref().and_then(|r| r.beta_miss),
                context_ms: c.cost.context_ms.unwrap_or(0.0),
                r2: c.fit.r2,
                median_abs_err_ms: c.fit.median_abs_err_ms,
            },
            lossless,
            seconds: i.seconds,
            sets,
            validation: i.validation,
        }
    }

    /// The tables as aligned text.
    pub fn terminal(&self) -> String {
        let mut out = String::new();
        for set in &self.sets {
            let _ = writeln!(
                out,
                "\n{} ({} prompts, ≤ {} new tokens, {} tier, default {} of {} slots/layer, {} drafter)",
                set.name,
                set.prompts,
                self.max_new_tokens,
                self.tier,
                self.default_slots,
                self.experts_per_layer,
                self.drafter_dtype
            );
            let table = table(&set.rows);
            let widths: Vec<usize> = (0..table[0].len())
                .map(|c| {
                    table
                        .iter()
                        .map(|r| r[c].chars().count())
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for (n, row) in table.iter().enumerate() {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(c, (cell, &w))| {
                        let pad = w - cell.chars().count();
                        if c == 0 {
                            format!("{cell}{}", " ".repeat(pad))
                        } else {
                            format!("{}{cell}", " ".repeat(pad))
                        }
                    })
                    .collect();
                let _ = writeln!(out, "{}", line.join("  "));
                if n == 0 {
                    let _ = writeln!(
                        out,
                        "{}",
                        "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1))
                    );
                }
            }
        }
        for v in &self.validation {
            let _ = writeln!(
                out,
                "\nsimulator check, {} (first {} prompts): replayed traces vs measured tok/s",
                v.name, v.prompts
            );
            let _ = writeln!(out, "  costs {}", v.costs);
            for [label, slots, measured, simulated, error, at_start, tokens, plain, copies, phases] in
                checks(v)
            {
                let _ = writeln!(
                    out,
                    "  {label:<18} {slots:>3} slots  measured {measured:>8}  simulated {simulated:>8}  error {error:>7}  (start calibration {at_start:>7})  tok/cycle {tokens:>11}  plain/tok {plain:>11}  copies/tok {copies:>11}  draft | rest ms/cycle {phases}"
                );
            }
            let (within, of) = (v.within_10_percent, v.checks.len());
            let _ = writeln!(out, "  within 10%: {within} of {of}");
            for [slots, oracle, x_ar, tokens, best] in headroom(v) {
                let _ = writeln!(
                    out,
                    "  oracle {slots:>3} slots  simulated {oracle:>8}  {x_ar} ar  tok/cycle {tokens}  fastest replayed: {best}"
                );
            }
        }
        let _ = writeln!(
            out,
            "\nlossless: {} ({:.0} s)",
            self.lossless_words(),
            self.seconds
        );
        out
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# specfit bench\n");
        let _ = writeln!(
            out,
            "Model `{}` (drafter matrices {}), experts on the {} tier, default {} of {} slots per layer, ≤ {} new tokens per prompt, K = {}; {} CPUs, {} compute threads ({} {}). Calibration `{}` (R² {:.3}, median error {:.3} ms; attention {:.2e} ms per verified row per cached token). Run time {:.0} s.\n",
            self.model,
            self.drafter_dtype,
            self.tier,
            self.default_slots,
            self.experts_per_layer,
            self.max_new_tokens,
            self.max_nodes,
            self.machine.cpus,
            self.machine.compute_threads,
            self.machine.os,
            self.machine.arch,
            self.calibration.path,
            self.calibration.r2,
            self.calibration.median_abs_err_ms,
            self.calibration.context_ms,
            self.seconds
        );
        let _ = writeln!(out, "**Lossless:** {}.\n", self.lossless_words());
        for set in &self.sets {
            let ids = &set.question_ids;
            let _ = writeln!(
                out,
                "## {} ({} prompts, question_id {}–{})\n",
                set.name,
                set.prompts,
                ids.first().copied().unwrap_or(0),
                ids.last().copied().unwrap_or(0)
            );
            let table = table(&set.rows);
            for (n, row) in table.iter().enumerate() {
                let _ = writeln!(out, "| {} |", row.join(" | "));
                if n == 0 {
                    let _ = writeln!(out, "|{}", " --- |".repeat(row.len()));
                }
            }
            let _ = writeln!(out);
        }
        for v in &self.validation {
            let _ = writeln!(
                out,
                "## Simulator check: {} (first {} prompts)\n\nTraces of these prompts (`specfit record`'s format) replayed by `specfit-sim` with this machine's costs (verify cost, drafting cost, per-layer LRU), against the tok/s measured on the same prompts. Costs {}; the error with the calibration measured before the runs is beside it.\n",
                v.name, v.prompts, v.costs
            );
            let _ = writeln!(
                out,
                "| policy | slots | measured tok/s | simulated tok/s | error | error, start calibration | tok/cyc measured / simulated | plain steps per token measured / simulated | copies/tok measured / simulated | ms/cycle drafting · rest, measured / simulated |"
            );
            let _ = writeln!(
                out,
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
            );
            for cells in checks(v) {
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            let (within, of) = (v.within_10_percent, v.checks.len());
            let _ = writeln!(out, "\nWithin 10%: {within} of {of} configurations.\n");
            if v.headroom.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "Headroom: the same traces replayed with the same costs by an oracle that knows which drafts the target takes (it verifies the prefix of the accepted chain, or none, that commits fastest at the slots' state; `specfit_sim::oracle`), beside plain decoding and the fastest replayed configuration.\n"
            );
            let _ = writeln!(
                out,
                "| slots | oracle tok/s (simulated) | oracle ×AR (simulated) | oracle tok/cycle | fastest replayed configuration (×AR) |"
            );
            let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
            for cells in headroom(v) {
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "Slots 0 = no cache (every routed expert copied every forward); `eagle3 (vanilla)` is EAGLE-3 there. ×AR and vs EAGLE-3 compare with `ar` and cached `eagle3` at the same slots; `ar (again)` is plain decoding run a second time beside `ar`, so its ×AR shows how far two identical decoders' ratio strays in this run. With several rounds (`--rounds`), tok/s, ×AR and vs EAGLE-3 are medians over the rounds (each round from empty slots, ×AR against that round's `ar`), ×AR's lowest and highest round in brackets; the other columns and the prompt counts sum every round. Copies and MB are per committed token; wait % is the share of decode time spent waiting for expert reads and read µs the mean time of one read (longer when more reads are in flight at once); selection is the median time of one subtree search. Atlas routes are computed outside the timer."
        );
        out
    }
}

impl Report {
    /// Whether every output equalled plain decoding's, in words.
    fn lossless_words(&self) -> &'static str {
        if self.lossless {
            "every policy's output equals plain decoding's, token for token, on every prompt"
        } else {
            "NO — some outputs differ from plain decoding (see `mismatched_question_ids` in report.json)"
        }
    }
}

/// The headroom cells per slot point: slots, the oracle's simulated tok/s, its ratio to plain
/// decoding's, its tokens per cycle, and the fastest replayed configuration with its ratio.
fn headroom(v: &super::validate::SetValidation) -> Vec<[String; 5]> {
    v.headroom
        .iter()
        .map(|h| {
            let x = |tok_s: f64| format!("{:.2}×", ratio(tok_s, h.ar_tok_s));
            [
                h.slots.to_string(),
                format!("{:.1}", h.oracle_tok_s),
                x(h.oracle_tok_s),
                format!("{:.2}", h.oracle_tokens_per_cycle),
                format!("{} ({})", h.best_label, x(h.best_tok_s)),
            ]
        })
        .collect()
}

/// The simulator check's cells per configuration: policy, slots, measured and simulated tok/s,
/// error.
fn checks(v: &super::validate::SetValidation) -> Vec<[String; 10]> {
    v.checks
        .iter()
        .map(|c| {
            [
                c.label.clone(),
                c.slots.to_string(),
                format!("{:.1}", c.measured_tok_s),
                format!("{:.1}", c.simulated_tok_s),
                format!("{:+.1}%", 100.0 * c.error),
                format!(
                    "{:+.1}%",
                    100.0
                        * (c.simulated_at_start_tok_s / c.measured_tok_s.max(f64::MIN_POSITIVE)
                            - 1.0)
                ),
                format!(
                    "{:.2} / {:.2}",
                    c.measured_tokens_per_cycle, c.simulated_tokens_per_cycle
                ),
                format!(
                    "{:.2} / {:.2}",
                    c.measured_plain_share, c.simulated_plain_share
                ),
                format!(
                    "{:.1} / {:.1}",
                    c.measured_copies_per_token, c.simulated_copies_per_token
                ),
                format!(
                    "{:.2} · {:.2} / {:.2} · {:.2}",
                    c.measured_draft_ms_per_cycle,
                    c.measured_rest_ms_per_cycle,
                    c.simulated_draft_ms_per_cycle,
                    c.simulated_rest_ms_per_cycle
                ),
            ]
        })
        .collect()
}

/// A decode rate: two decimals below 10 tok/s (paper-scale rates are about 1 tok/s), else one.
fn tok_s(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

/// Header + one line per row, default slots first, then the sweep by slots (most first).
fn table(rows: &[Row]) -> Vec<Vec<String>> {
    let mut t = vec![[
        "policy",
        "slots",
        "tok/s",
        "×AR",
        "vs EAGLE-3",
        "nodes/cyc",
        "tok/cyc",
        "cycle ms",
        "copies/tok",
        "MB/tok",
        "wait %",
        "read µs",
        "select µs",
        "lossless",
    ]
    .map(String::from)
    .to_vec()];
    for r in rows {
        t.push(vec![
            r.label.clone(),
            r.slots.to_string(),
            tok_s(r.tok_s),
            match r.speedup_range {
                Some([lo, hi]) => format!("{:.2} ({lo:.2}–{hi:.2})", r.speedup_vs_ar),
                None => format!("{:.2}", r.speedup_vs_ar),
            },
            r.gain_vs_eagle3
                .map_or("–".into(), |g| format!("{:+.1}%", 100.0 * g)),
            format!("{:.2}", r.nodes_per_cycle),
            format!("{:.2}", r.tokens_per_cycle),
            format!("{:.2}", r.cycle_ms),
            format!("{:.1}", r.copies_per_token),
            format!("{:.3}", r.mb_per_token),
            format!("{:.0}", 100.0 * r.copy_wait_share),
            format!("{:.0}", r.read_us),
            r.select_us_median.map_or("–".into(), |u| format!("{u:.1}")),
            format!("{}/{}", r.lossless_prompts, r.prompts),
        ]);
    }
    t
}

/// The rows of one set, in the order described at [`table`].
fn rows(configs: &[Config], tallies: &[Tally]) -> Vec<Row> {
    let default = configs.first().map(|c| c.slots);
    let find = |policy: PolicyName, slots: Slots| {
        configs
            .iter()
            .zip(tallies)
            .find(|(c, _)| c.policy == policy && c.slots == slots && c.is_plain())
            .map(|(_, t)| t)
    };
    let mut order: Vec<usize> = (0..configs.len()).collect();
    order.sort_by_key(|&i| {
        let s = configs[i].slots;
        (Some(s) != default, std::cmp::Reverse(s.number()), i)
    });
    order
        .into_iter()
        .map(|i| {
            let (c, t) = (&configs[i], &tallies[i]);
            let tok_s = t.tokens_per_second();
            let ar = find(PolicyName::Ar, c.slots);
            let mut vs_ar = ar.map_or(Vec::new(), |ar| paired(t, ar));
            // The reference itself has no range.
            let reference = ar.is_some_and(|ar| std::ptr::eq(ar, t));
            let eagle = find(PolicyName::Eagle3, c.slots).filter(|e| e.tokens_per_second() > 0.0);
            let range = vs_ar.iter().fold([f64::INFINITY, 0.0f64], |[lo, hi], &x| {
                [lo.min(x), hi.max(x)]
            });
            let mut us = t.select_us.clone();
            us.sort_by(f64::total_cmp);
            let cycles = t.sum.cycles as f64;
            Row {
                label: c.label.clone(),
                policy: c.policy.name(),
                routes: c.routes.label(),
                slots: c.slots.number(),
                beta_scale: c.beta_scale,
                read_ahead: c.read_ahead,
                drafter_probs: c.drafter_probs,
                layers_ahead: c.layers_ahead,
                again: c.again,
                tok_s,
                speedup_vs_ar: median(&mut vs_ar),
                rounds: t.rounds.len(),
                speedup_range: (vs_ar.len() > 1 && !reference).then_some(range),
                gain_vs_eagle3: eagle.map(|e| median(&mut paired(t, e)) - 1.0),
                nodes_per_cycle: ratio(t.sum.verified as f64, cycles),
                tokens_per_cycle: ratio(t.sum.committed as f64, cycles),
                plain_share: ratio(t.sum.plain_steps as f64, t.sum.committed as f64),
                cycle_ms: 1e3 * ratio(t.sum.decode_seconds, cycles),
                copies_per_token: ratio(t.sum.copies.misses as f64, t.decoded() as f64),
                mb_per_token: ratio(t.sum.copies.bytes_copied as f64, t.decoded() as f64) / 1e6,
                copy_wait_share: ratio(t.sum.copies.wait_seconds, t.sum.decode_seconds),
                read_us: 1e6 * ratio(t.sum.copies.copy_seconds, t.sum.copies.misses as f64),
                select_us_median: us.get(us.len() / 2).copied(),
                atlas_ms_per_cycle: 1e3 * ratio(t.sum.atlas_seconds, cycles),
                decoded_tokens: t.decoded(),
                decode_seconds: t.sum.decode_seconds,
                prompts: t.prompts,
                lossless_prompts: t.lossless,
                mismatched_question_ids: t.mismatched.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::validate::{Headroom, SetValidation};

    /// A report with no runs whose validation covers one set with `headroom`.
    fn validated(headroom: Vec<Headroom>) -> Report {
        Report {
            format: "specfit-bench",
            version: 1,
            machine: Machine {
                cpus: 2,
                compute_threads: 2,
                os: "linux",
                arch: "x86_64",
            },
            model: "m".into(),
            drafter_dtype: "native",
            tier: "disk".into(),
            experts_per_layer: 64,
            default_slots: 16,
            max_new_tokens: 28,
            max_nodes: 7,
            calibration: CalibrationSummary {
                path: "c".into(),
                intercepts_ms: vec![1.0],
                beta_ms: Some(0.1),
                beta_hit_ms: None,
                beta_miss_ms: None,
                context_ms: 1e-4,
                r2: 0.9,
                median_abs_err_ms: 0.1,
            },
            lossless: true,
            seconds: 1.0,
            sets: Vec::new(),
            validation: vec![SetValidation {
                name: "summarization".into(),
                prompts: 2,
                checks: Vec::new(),
                headroom,
                within_10_percent: 0,
                costs: "probed".into(),
            }],
        }
    }

    /// A tally of one prompt per round decoding 100 tokens at each of `rates` (tok/s).
    fn rounds_at(rates: &[f64]) -> Tally {
        let mut t = Tally::default();
        for (round, &rate) in rates.iter().enumerate() {
            let o = Outcome {
                tokens: vec![0; 101],
                decode_seconds: 100.0 / rate,
                ..Outcome::default()
            };
            t.add(round, &o, &[], 1, true);
        }
        t
    }

    #[test]
    fn a_tallys_rate_is_the_median_of_its_rounds_rates() {
        assert_eq!(rounds_at(&[100.0, 300.0, 200.0]).tokens_per_second(), 200.0);
        assert_eq!(rounds_at(&[100.0, 300.0]).tokens_per_second(), 200.0);
        assert_eq!(rounds_at(&[50.0]).tokens_per_second(), 50.0);
        assert_eq!(Tally::default().tokens_per_second(), 0.0);
        // Counts sum every round.
        let t = rounds_at(&[100.0, 300.0, 200.0]);
        assert_eq!((t.prompts, t.decoded(), t.lossless), (3, 300, 3));
    }

    #[test]
    fn ratios_pair_each_round_with_that_rounds_ar_and_report_their_median_and_range() {
        let configs = crate::bench::plan::configs(&crate::bench::plan::Sweep {
            experts: 64,
            default_slots: 8,
            predictor: None,
            quick: true,
            points: None,
            layers_ahead: 0,
        });
        let labels: Vec<&str> = configs.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels[..4], ["ar", "eagle3 (vanilla)", "eagle3", "specfit"]);
        // ar, eagle3 (vanilla), eagle3, specfit at 8 slots; ar, specfit at none.
        let mut tallies = vec![
            rounds_at(&[100.0, 200.0, 100.0]),
            rounds_at(&[50.0, 50.0, 50.0]),
            rounds_at(&[100.0, 100.0, 100.0]),
            rounds_at(&[110.0, 180.0, 95.0]),
            rounds_at(&[10.0, 10.0, 10.0]),
            rounds_at(&[10.0, 10.0, 10.0]),
        ];
        let rows = rows(&configs, &tallies);
        let specfit = rows.iter().find(|r| r.label == "specfit" && r.slots == 8);
        let specfit = specfit.expect("a specfit row");
        // Round by round 1.1, 0.9, 0.95 against ar; 1.1, 1.8, 0.95 against eagle3.
        assert!((specfit.speedup_vs_ar - 0.95).abs() < 1e-12);
        let [lo, hi] = specfit.speedup_range.expect("three rounds");
        assert!((lo - 0.9).abs() < 1e-12 && (hi - 1.1).abs() < 1e-12);
        assert!((specfit.gain_vs_eagle3.expect("cached eagle3") - 0.1).abs() < 1e-12);
        assert_eq!((specfit.tok_s, specfit.rounds), (110.0, 3));
        let ar = rows.iter().find(|r| r.label == "ar" && r.slots == 8);
        assert_eq!(ar.expect("the reference").speedup_range, None);
        // One round: the ratio of the two rates, no range.
        for t in &mut tallies {
            t.rounds.truncate(1);
        }
        let rows = super::rows(&configs, &tallies);
        let specfit = rows.iter().find(|r| r.label == "specfit" && r.slots == 8);
        let specfit = specfit.expect("a specfit row");
        assert!((specfit.speedup_vs_ar - 1.1).abs() < 1e-12);
        assert_eq!(specfit.speedup_range, None);
    }

    #[test]
    fn the_headroom_table_is_written_only_for_sets_that_have_one() {
        assert!(!validated(Vec::new()).markdown().contains("Headroom"));
        let row = Headroom {
            slots: 16,
            oracle_tok_s: 150.0,
            ar_tok_s: 100.0,
            oracle_tokens_per_cycle: 2.5,
            best_label: "specfit".into(),
            best_tok_s: 110.0,
        };
        let md = validated(vec![row]).markdown();
        assert!(md.contains("Headroom:"), "{md}");
        assert!(md.contains("| 16 |"), "{md}");
        assert!(
            md.contains("attention 1.00e-4 ms per verified row per cached token"),
            "{md}"
        );
    }
}
