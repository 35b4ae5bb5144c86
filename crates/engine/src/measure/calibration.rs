//! Measuring and fitting a cost calibration (`specfit calibrate`): timed verify probes and plain
//! steps on every prompt from the decoding cache, an emptied one and an all-resident one, then
//! the paper and residency forms, the replay model and the drafting costs fitted from them. It
//! prints nothing and writes no file.

use specfit_selector::json::{AcceptanceJson, CalibrationJson, DraftingJson};
use specfit_selector::{calibrate, Acceptance, Calibration, Probe};
use specfit_sim::fit::{drafting_fit, replay_fit, DraftRow, VerifyRow};

use super::{probe, PlainStep, ProbePlan, ProbeRow};
use crate::error::EngineError;
use crate::experts::{CacheMode, ExpertCache};
use crate::model::{DrafterDtype, Eagle3, Qwen3Moe};
use crate::spec::TreeShape;

/// How much to probe.
#[derive(Debug, Clone, Copy)]
pub struct CalibrationPlan {
    pub cycles: usize,
    pub max_nodes: usize,
    /// The drafted pools' shape.
    pub shape: TreeShape,
    /// Prompt `i` probes with seed `seed + i`.
    pub seed: u64,
}

/// Everything `specfit calibrate` measures, and what `specfit probe` writes: verify forwards from
/// the LRU and from emptied caches (every fit), all-resident verify forwards (the replay fit
/// only) and plain-decoding steps (the replay model's plain-step fit).
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub verify: Vec<ProbeRow>,
    pub resident: Vec<ProbeRow>,
    pub plain: Vec<VerifyRow>,
    /// Reads in flight the read rounds were counted with.
    pub read_width: usize,
    /// Why the all-resident probes were skipped, when they were (hits are then fitted from the
    /// cached probes alone).
    pub resident_skipped: Option<String>,
    /// How often the target took drafted children in the decoding cache's probes (`None`: not
    /// measured, as in rows read back from a probe file).
    pub acceptance: Option<Acceptance>,
    /// How the probing drafter kept its matrices (`None`: not known, as in rows read back from
    /// a probe file).
    pub drafter_dtype: Option<DrafterDtype>,
}

/// Measures probe forwards and plain steps on every prompt (prompt `i` probes with seed
/// `plan.seed + i`, in every cache state): [`Prober`] over `prompts` in order.
pub fn measure_rows(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    prompts: &[Vec<u32>],
    plan: &CalibrationPlan,
    memory_budget: u64,
) -> Result<Measured, EngineError> {
    let mut prober = Prober::new(cache, plan, memory_budget)?;
    for (i, prompt) in prompts.iter().enumerate() {
        prober.prompt(model, drafter, cache, i, prompt)?;
    }
    Ok(prober.finish())
}

/// Calibration probes one prompt at a time, so that they can be taken between other
/// measurements (the bench's simulator check probes between its runs, so that the costs it
/// replays with are those of the same minutes). Owns the emptied and all-resident caches; the
/// decoding cache is the caller's. One prefill per prompt and cache state: the plain steps
/// continue the probed sequence (at paper scale on the disk tier a prefill reads most of the
/// file, so a second one per prompt would double the time).
pub struct Prober {
    plan: CalibrationPlan,
    /// The no-cache end of the sweep: every other verify probe and plain step (those with every
    /// expert copied tell the per-layer read latency apart from the per-copy cost) run on a
    /// cache emptied before every forward. A few slots are enough (a larger verify reads in
    /// waves), and a full cache's worth again would double the memory of a large model.
    cleared: ExpertCache,
    /// Every expert in a slot (`None` when that does not fit the memory budget): forwards with
    /// hits only, which tell the per-hit cost apart from the node-count intercepts.
    resident: Option<ExpertCache>,
    measured: Measured,
}

impl Prober {
    /// Caches for probing beside `cache` (the decoding cache: its tier, store and slots).
    pub fn new(
        cache: &ExpertCache,
        plan: &CalibrationPlan,
        memory_budget: u64,
    ) -> Result<Prober, EngineError> {
        if plan.cycles == 0 {
            return Err(EngineError::NoProbeCycles);
        }
        let mut measured = Measured {
            read_width: crate::experts::reads_in_flight(),
            ..Measured::default()
        };
        let cleared = cache.sibling(cache.slots_per_layer().min(16), CacheMode::NoCache)?;
        let every = cache.arena_bytes(usize::MAX);
        let resident = if every > memory_budget {
            measured.resident_skipped = Some(format!(
                "every expert in slots needs {:.1} GB, more than the memory budget",
                every as f64 / 1e9
            ));
            None
        } else {
            match cache.sibling(usize::MAX, CacheMode::Lru) {
                Ok(c) => Some(c),
                Err(e @ EngineError::SlotMemory { .. }) => {
                    measured.resident_skipped = Some(e.to_string());
                    None
                }
                Err(e) => return Err(e),
            }
        };
        Ok(Prober {
            plan: *plan,
            cleared,
            resident,
            measured,
        })
    }

    /// Probes `prompt` (the `i`-th, seed `plan.seed + i`) on `cache` and the emptied cache, and
    /// on every third prompt all-resident too.
    pub fn prompt(
        &mut self,
        model: &Qwen3Moe,
        drafter: &Eagle3,
        cache: &mut ExpertCache,
        i: usize,
        prompt: &[u32],
    ) -> Result<(), EngineError> {
        let plan = ProbePlan {
            shape: self.plan.shape,
            max_nodes: self.plan.max_nodes,
            cycles: self.plan.cycles,
            plain: PLAIN_STEPS,
            seed: self.plan.seed + i as u64,
        };
        let m = &mut self.measured;
        m.drafter_dtype = Some(drafter.dtype());
        let rows = probe(
            model,
            drafter,
            cache,
            Some(&mut self.cleared),
            prompt,
            &plan,
        )?;
        m.verify.extend(rows.verify);
        m.plain.extend(rows.plain.iter().map(plain_row));
        m.acceptance
            .get_or_insert_with(Acceptance::new)
            .merge(&rows.acceptance);
        if let (Some(resident), 2) = (self.resident.as_mut(), i % 3) {
            // A first pass reads the prompt's experts in; the second's forwards are then
            // (almost all) all-resident, and only those are kept.
            probe(model, drafter, resident, None, prompt, &plan)?;
            let warm = probe(model, drafter, resident, None, prompt, &plan)?;
            m.resident
                .extend(warm.verify.into_iter().filter(|r| r.misses == 0));
            m.plain
                .extend(warm.plain.iter().filter(|s| s.misses == 0).map(plain_row));
        }
        Ok(())
    }

    /// Moves the emptied and all-resident caches' slots to fresh memory
    /// ([`ExpertCache::relocate`]), as `specfit bench` moves every configuration's before each
    /// prompt: probes taken to predict those runs then sample arenas as the runs do, rather than
    /// one arena, fast or slow, for the whole set.
    pub fn relocate(&mut self) {
        self.cleared.relocate();
        if let Some(r) = self.resident.as_mut() {
            r.relocate();
        }
    }

    /// Everything measured so far.
    pub fn finish(self) -> Measured {
        self.measured
    }
}

/// Calibration prompts in the order to probe them: `long` (long contexts) spread evenly among
/// `short`, each after its share of the short ones. A prompt's probes run back to back, so long
/// prompts probed one after another would share one stretch of the machine's speed, and a slow
/// spell there would be fitted as the cost of attention over their contexts.
pub fn spread<T>(short: Vec<T>, long: Vec<T>) -> Vec<T> {
    let (s, l) = (short.len(), long.len());
    let mut out = Vec::with_capacity(s + l);
    let mut long = long.into_iter().enumerate().peekable();
    for (i, p) in short.into_iter().enumerate() {
        out.push(p);
        // Long prompt j goes right after the first ⌈(j + 1) · s / l⌉ short ones.
        while let Some((_, q)) = long.next_if(|&(j, _)| (j + 1) * s <= (i + 1) * l) {
            out.push(q);
        }
    }
    out.extend(long.map(|(_, q)| q));
    out
}

/// Plain steps timed after each prompt's probe cycles (half of them on the emptied cache).
const PLAIN_STEPS: usize = 16;

/// Fits measured rows: the paper and residency forms on the verify rows, the replay model on
/// verify, resident and plain rows, and the drafting costs. Returns the calibration file and the
/// cost fits' quality.
pub fn fit(m: &Measured, max_nodes: usize) -> Result<(CalibrationJson, Calibration), EngineError> {
    let rows: Vec<Probe> = m
        .verify
        .iter()
        .map(|r| Probe {
            nodes: r.nodes,
            demand: r.demand,
            ms: r.ms,
            hits_misses: Some((r.hits, r.misses)),
            context: r.context as u64,
        })
        .collect();
    let cal = calibrate(&rows)?;
    let mut file = CalibrationJson::new(&cal);
    let replay_rows: Vec<VerifyRow> = m.verify.iter().chain(&m.resident).map(verify_row).collect();
    file.replay =
        Some(replay_fit(&replay_rows, &m.plain, max_nodes, m.read_width).map_err(fit_error)?);
    let drafting: Vec<DraftRow> = m.verify.iter().map(draft_row).collect();
    file.drafting = Some(DraftingJson {
        drafter_dtype: m.drafter_dtype.map(|d| d.name().to_string()),
        ..drafting_fit(&drafting).map_err(fit_error)?
    });
    file.acceptance = m.acceptance.as_ref().map(AcceptanceJson::new);
    Ok((file, cal))
}

/// An engine probe row as the replay fit reads it.
pub fn verify_row(r: &ProbeRow) -> VerifyRow {
    VerifyRow {
        nodes: r.nodes,
        hits: r.hits,
        misses: r.misses,
        read_rounds: r.read_rounds,
        slot_waits: r.slot_waits,
        context: r.context,
        ms: r.ms,
    }
}

/// An engine probe row's drafting as the drafting fit reads it.
fn draft_row(r: &ProbeRow) -> DraftRow {
    DraftRow {
        draft_forwards: r.draft_forwards,
        draft_ms: r.draft_ms,
        fed: r.fed,
        feed_ms: r.feed_ms,
        context: r.context,
    }
}

/// A plain step as the replay fit reads it.
pub fn plain_row(s: &PlainStep) -> VerifyRow {
    VerifyRow {
        nodes: 0,
        hits: s.hits,
        misses: s.misses,
        read_rounds: s.read_rounds,
        slot_waits: s.slot_waits,
        context: s.context,
        ms: s.ms,
    }
}

/// A fit that failed on the measured rows.
fn fit_error(e: specfit_sim::SimError) -> EngineError {
    EngineError::Fit {
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn long_prompts_are_spread_evenly_among_the_short_ones() {
        // 24 short and 6 long: one long after every 4 short, as the shipped calibration probes.
        let short: Vec<u32> = (0..24).collect();
        let long: Vec<u32> = (100..106).collect();
        let order = spread(short, long);
        assert_eq!(order.len(), 30);
        let at: Vec<usize> = (100..106)
            .map(|q| order.iter().position(|&p| p == q).unwrap())
            .collect();
        assert_eq!(at, [4, 9, 14, 19, 24, 29]);
        assert_eq!(order[..4], [0, 1, 2, 3]);
        // Uneven counts, and either side empty.
        assert_eq!(spread(vec![1, 2, 3], vec![9, 8]), [1, 2, 9, 3, 8]);
        assert_eq!(spread(Vec::new(), vec![9, 8]), [9, 8]);
        assert_eq!(spread(vec![1, 2], Vec::new()), [1, 2]);
    }
}
