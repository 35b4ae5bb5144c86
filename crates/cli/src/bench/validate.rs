//! Checks the trace simulator against the bench's own measurements: records traces (the full
//! draft pool with the target's routes at every greedy position) of the first prompts of each
//! set, replays them under each measured configuration with this machine's costs (verify cost,
//! drafting cost, per-layer LRU), and sets the predicted tok/s beside the measured tok/s of the
//! same prompts. The costs are calibration probes taken between the bench's runs ([`Probes`]):
//! this machine's speed drifts by tens of percent within minutes (the disk above all), so a
//! calibration measured before the runs predicts them only as well as the weather holds (the
//! check shows that replay too). It measures nothing itself beyond the traces and probes.

use anyhow::{Context, Result};
use serde::Serialize;
use specfit_engine::measure::{fit, CalibrationPlan, PoolWalk, Prober};
use specfit_engine::policy::{verify_policy, PolicySpec};
use specfit_engine::spec::{Atlas, TreeShape};
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe};
use specfit_selector::json::CalibrationJson;
use specfit_selector::VerifyPolicy;
use specfit_sim::oracle::simulate_oracle;
use specfit_sim::{simulate_many, SimConfig};
use specfit_trace::{TraceHeader, TraceStep};

use super::plan::Config;
use super::report::{ratio, Tally};
use crate::policy::RouteChoice;

/// One configuration's predicted and measured throughput on the validation prompts.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub label: String,
    pub slots: usize,
    pub measured_tok_s: f64,
    /// Replayed with the costs probed between the runs (else the start calibration's).
    pub simulated_tok_s: f64,
    /// simulated / measured − 1.
    pub error: f64,
    /// Replayed with the calibration measured before the runs (what drift costs the replay).
    pub simulated_at_start_tok_s: f64,
    /// Where a miss comes from, side by side: committed tokens per cycle and expert copies
    /// per committed token (a cycle is a speculative cycle or a plain step).
    pub measured_tokens_per_cycle: f64,
    pub simulated_tokens_per_cycle: f64,
    /// Committed tokens decoded by plain steps (a drafting policy's bursts), per committed
    /// token: where the never-lose rule decided differently.
    pub measured_plain_share: f64,
    pub simulated_plain_share: f64,
    pub measured_copies_per_token: f64,
    pub simulated_copies_per_token: f64,
    /// ms per cycle drafting, and the rest (verify forwards, feeding the drafter, selecting,
    /// plain steps), measured and simulated.
    pub measured_draft_ms_per_cycle: f64,
    pub simulated_draft_ms_per_cycle: f64,
    pub measured_rest_ms_per_cycle: f64,
    pub simulated_rest_ms_per_cycle: f64,
}

/// At one slot point, what a selector that knew which drafts the target takes would reach on
/// the validated prompts with the same costs (`specfit_sim::oracle`), beside plain decoding and
/// the fastest replayed configuration: how much of what the drafter offers the policies get.
#[derive(Debug, Clone, Serialize)]
pub struct Headroom {
    pub slots: usize,
    pub oracle_tok_s: f64,
    /// Plain decoding replayed with the same costs.
    pub ar_tok_s: f64,
    pub oracle_tokens_per_cycle: f64,
    /// The fastest replayed configuration at these slots and its simulated tok/s.
    pub best_label: String,
    pub best_tok_s: f64,
}

/// The validation of one prompt set.
#[derive(Debug, Clone, Serialize)]
pub struct SetValidation {
    pub name: String,
    pub prompts: usize,
    pub checks: Vec<Check>,
    pub headroom: Vec<Headroom>,
    /// Checks whose |error| ≤ 10% (the bar).
    pub within_10_percent: usize,
    /// Where the replay's costs came from: probes between the runs (how many verify forwards
    /// and plain steps), or why the start calibration stood in.
    pub costs: String,
}

/// Calibration probes of the validated prompts taken between the bench's runs, on caches of
/// their own (decoding caches at each slot point the configurations run, an emptied and an
/// all-resident one), fitted at the end into the costs the check replays with. Probing at every
/// slot point, not only the default one, puts the states the runs are in (a small cache
/// thrashed by a large verify reads through fewer slots than it needs) among the fitted rows.
pub struct Probes {
    caches: Vec<ExpertCache>,
    prober: Prober,
    probed: usize,
}

impl Probes {
    /// Probes for `prompts` validated prompts beside `base`'s store, one decoding cache per
    /// entry of `slot_points` (the first always, the rest as memory allows): enough cycles per prompt that the fit has a few
    /// hundred verify rows (8 to 32 per prompt).
    pub fn new(
        base: &ExpertCache,
        slot_points: &[usize],
        prompts: usize,
        max_nodes: usize,
    ) -> Result<Probes> {
        let plan = CalibrationPlan {
            cycles: (PROBE_ROWS / prompts.max(1)).clamp(8, 32),
            max_nodes,
            shape: TreeShape::default(),
            seed: 0,
        };
        // The first point always; the others while all of them together take at most a quarter
        // of the memory budget (a model larger than memory runs one configuration at a time,
        // and the probes' caches live beside it).
        let budget = crate::target::memory_budget() / 4;
        let mut bytes = 0u64;
        let points: Vec<usize> = slot_points
            .iter()
            .copied()
            .enumerate()
            .take_while(|&(i, n)| {
                bytes = bytes.saturating_add(base.arena_bytes(n));
                i == 0 || bytes <= budget
            })
            .map(|(_, n)| n)
            .collect();
        let caches = points
            .iter()
            .map(|&n| Ok(base.sibling(n, specfit_engine::CacheMode::Lru)?))
            .collect::<Result<Vec<_>>>()?;
        let first = caches.first().context("no slot point to probe at")?;
        let prober = Prober::new(first, &plan, crate::target::memory_budget())?;
        Ok(Probes {
            caches,
            prober,
            probed: 0,
        })
    }

    /// Probes the next of the validated `prompts` (round robin) on the next decoding cache
    /// (round robin over the slot points).
    pub fn take(&mut self, model: &Qwen3Moe, drafter: &Eagle3, prompts: &[&[u32]]) -> Result<()> {
        let i = self.probed;
        let prompt = *prompts
            .get(i % prompts.len().max(1))
            .context("no validated prompt to probe")?;
        let points = self.caches.len();
        let cache = &mut self.caches[i % points];
        // Fresh slot memory, as every run gets (`runner.cache.relocate()`), outside the timers.
        cache.relocate();
        self.prober.relocate();
        self.prober.prompt(model, drafter, cache, i, prompt)?;
        self.probed += 1;
        Ok(())
    }

    /// The costs fitted from the probes (`Err`: why they could not be, in words).
    pub fn fit(self, max_nodes: usize) -> std::result::Result<(CalibrationJson, String), String> {
        let m = self.prober.finish();
        let said = format!(
            "probed between the runs: {} verify forwards and {} plain steps on {} prompts",
            m.verify.len() + m.resident.len(),
            m.plain.len(),
            self.probed
        );
        match fit(&m, max_nodes) {
            Ok((file, _)) => {
                let said = match &file.replay {
                    Some(r) => format!(
                        "{said} (verify a[0] {:.3} ms, a[K] {:.3} ms, miss {:.4} ms, read round {:.3} ms, read waiting for a slot {:.4} ms; plain step {:.3} ms; timing noise {:.2})",
                        r.intercepts.first().copied().unwrap_or(0.0),
                        r.intercepts.last().copied().unwrap_or(0.0),
                        r.beta_miss,
                        r.read_round_ms,
                        r.slot_wait_ms,
                        r.plain.as_ref().map_or(r.ar_intercept, |p| p.intercept),
                        r.noise
                    ),
                    None => said,
                };
                Ok((file, said))
            }
            Err(e) => Err(format!(
                "the calibration measured before the runs ({said}, not enough to fit: {e})"
            )),
        }
    }
}

/// Verify rows the probes aim at over all validated prompts.
const PROBE_ROWS: usize = 256;

/// Records one trace per prompt: `positions[i]` greedy positions of `prompts[i]`.
pub fn traces(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    atlas: &mut Atlas,
    prompts: &[(&[u32], usize)],
) -> Result<Vec<Vec<TraceStep>>> {
    let mut walk = PoolWalk {
        target: model,
        drafter,
        cache,
        atlas,
        shape: TreeShape::default(),
    };
    prompts
        .iter()
        .map(|&(p, positions)| Ok(walk.record(p, positions)?))
        .collect()
}

/// What the simulator needs besides the traces.
pub struct Machine<'a> {
    pub header: TraceHeader,
    pub calibration: &'a CalibrationJson,
    pub model: &'a Qwen3Moe,
    pub max_nodes: usize,
}

/// The simulator's policy for a configuration (`None` for route sources the trace does not
/// hold: corrupted or predicted routes; and for `ar (again)`, which `ar` already stands for).
fn sim_policy(c: &Config, m: &Machine<'_>) -> Result<Option<VerifyPolicy>> {
    // The trace holds atlas routes only, and the simulator reads nothing ahead.
    if (c.policy.needs_routes() && c.routes != RouteChoice::Atlas)
        || c.read_ahead
        || c.layers_ahead > 0
        || c.again
    {
        return Ok(None);
    }
    let spec = PolicySpec {
        name: c.policy,
        max_nodes: m.max_nodes,
        lambda: None,
        beta_scale: c.beta_scale,
        drafter_probs: c.drafter_probs,
        calibration: Some(m.calibration),
    };
    Ok(Some(verify_policy(&spec, m.model.config())?))
}

/// Replays every trace under every configuration and compares with `measured` (the tallies of
/// the same prompts).
pub fn check(
    name: &str,
    traces: &[Vec<TraceStep>],
    configs: &[Config],
    measured: &[Tally],
    m: &Machine<'_>,
    probed: std::result::Result<(CalibrationJson, String), String>,
) -> Result<SetValidation> {
    let at_start = specfit_sim::machine::from_calibration(m.calibration)?;
    let (machine, costs) = match &probed {
        // The probes' fit carries no target stamp: the experts are used in place (or not) as
        // the start calibration's were.
        Ok((file, said)) => (
            SimConfig {
                in_place: at_start.in_place,
                ..specfit_sim::machine::from_calibration(file)?
            },
            said.clone(),
        ),
        Err(why) => (at_start.clone(), why.clone()),
    };
    let mut checks = Vec::new();
    for (c, t) in configs.iter().zip(measured) {
        let Some(policy) = sim_policy(c, m)? else {
            continue;
        };
        let slots = c.slots.number();
        // The bench's caches carry over from prompt to prompt; so do the simulator's.
        let replay = |machine: &SimConfig| {
            let config = SimConfig {
                slots,
                ..machine.clone()
            };
            simulate_many(&m.header, traces, &policy, &config)
        };
        let r = replay(&machine)?;
        let committed = r.committed;
        let simulated = r.tokens_per_second();
        let simulated_at_start = replay(&at_start)?.tokens_per_second();
        let measured = t.tokens_per_second();
        let (cycles, sim_cycles) = (t.sum.cycles as f64, (r.cycles + r.plain_steps) as f64);
        checks.push(Check {
            measured_tokens_per_cycle: ratio(t.sum.committed as f64, cycles),
            simulated_tokens_per_cycle: ratio(committed as f64, sim_cycles),
            measured_plain_share: ratio(t.sum.plain_steps as f64, t.sum.committed as f64),
            // A plain policy's replayed steps are its cycles.
            simulated_plain_share: match policy.drafts() {
                true => ratio(r.plain_steps as f64, committed as f64),
                false => ratio(r.cycles as f64, committed as f64),
            },
            measured_copies_per_token: ratio(t.sum.copies.misses as f64, t.sum.committed as f64),
            simulated_copies_per_token: ratio(r.misses as f64, committed as f64),
            measured_draft_ms_per_cycle: ratio(1e3 * t.sum.draft_seconds, cycles),
            simulated_draft_ms_per_cycle: ratio(r.draft_ms, sim_cycles),
            measured_rest_ms_per_cycle: ratio(
                1e3 * (t.sum.decode_seconds - t.sum.draft_seconds),
                cycles,
            ),
            simulated_rest_ms_per_cycle: ratio(r.time_ms - r.draft_ms, sim_cycles),
            label: c.label.clone(),
            slots: c.slots.number(),
            measured_tok_s: measured,
            simulated_tok_s: simulated,
            simulated_at_start_tok_s: simulated_at_start,
            error: if measured > 0.0 {
                simulated / measured - 1.0
            } else {
                0.0
            },
        });
    }
    let headroom = headroom(traces, &checks, m, &machine)?;
    Ok(SetValidation {
        name: name.to_string(),
        prompts: traces.len(),
        within_10_percent: checks.iter().filter(|c| c.error.abs() <= 0.10).count(),
        checks,
        headroom,
        costs,
    })
}

/// The oracle and plain decoding replayed at each slot point of `checks`, beside the fastest
/// of them there.
fn headroom(
    traces: &[Vec<TraceStep>],
    checks: &[Check],
    m: &Machine<'_>,
    machine: &SimConfig,
) -> Result<Vec<Headroom>> {
    let mut points: Vec<usize> = checks.iter().map(|c| c.slots).collect();
    points.sort_unstable();
    points.dedup();
    points
        .into_iter()
        .map(|slots| {
            let config = SimConfig {
                slots,
                ..machine.clone()
            };
            let oracle = simulate_oracle(&m.header, traces, m.max_nodes, &config)?;
            let ar = simulate_many(&m.header, traces, &VerifyPolicy::plain(), &config)?;
            let best = checks
                .iter()
                .filter(|c| c.slots == slots)
                .max_by(|a, b| a.simulated_tok_s.total_cmp(&b.simulated_tok_s))
                .expect("a slot point of the checks");
            Ok(Headroom {
                slots,
                oracle_tok_s: oracle.tokens_per_second(),
                ar_tok_s: ar.tokens_per_second(),
                oracle_tokens_per_cycle: ratio(
                    oracle.committed as f64,
                    (oracle.cycles + oracle.plain_steps) as f64,
                ),
                best_label: best.label.clone(),
                best_tok_s: best.simulated_tok_s,
            })
        })
        .collect()
}
