//! `specfit calibrate`: measures probe forwards on the engine (random ancestor-closed subtrees of
//! pools drafted on calibration prompts, from the LRU cache state and from an emptied cache),
//! fits the cost model by NNLS and saves it next to the model; or, with `--probes`, fits probe
//! rows measured earlier (`specfit probe`). Prints the fit quality either way.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use specfit_engine::measure::{probe, PlainStep, ProbePlan, ProbeRow};
use specfit_engine::policy::target_stamp;
use specfit_engine::spec::TreeShape;
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe, Tokenizer};
use specfit_selector::json::{
    read_probe_json, CalibrationJson, DraftingJson, ProbeJson, ProbeKind,
};
use specfit_selector::{calibrate, Calibration, Probe};
use specfit_sim::fit::{drafting_fit, replay_fit, DraftRow, PlainRow, VerifyRow};

use crate::files::{read_text, write_atomic};
use crate::prompt::read_prompts;
use crate::target::StoreArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Fit these probe rows (JSON Lines {"nodes", "demand", "ms"} + "hits", "misses"; `-` =
    /// stdin) instead of measuring; the calibration goes to stdout unless --out is given.
    #[arg(long)]
    probes: Option<PathBuf>,
    /// With --probes: drafting costs measured elsewhere, a JSON object {"ms_per_level",
    /// "feed_ms", "feed_ms_per_token"} (optionally "level_context_ms", "feed_context_ms"), stored
    /// as the calibration's `drafting` so that trace replay charges them.
    #[arg(long, requires = "probes")]
    drafting: Option<PathBuf>,
    /// Write the calibration here (atomically). Default when measuring:
    /// MODEL/specfit-calibration.TIER.json.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The target. When measuring, the default is the shipped target; with --probes it only
    /// stamps the calibration with the model's shape (using it on another target is refused).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where routed experts rest while measuring.
    #[arg(long, value_enum, default_value = "disk")]
    store: StoreArg,
    /// Slots per MoE layer while measuring (default: a quarter of the experts).
    #[arg(long)]
    slots: Option<usize>,
    /// EAGLE-3 drafter that drafts the probed pools (default: the shipped drafter).
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Calibration prompts, JSON Lines with a "question" field (default: the shipped GSM8K train
    /// questions and CNN/DM training articles, disjoint from the bench prompts).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Use only the first N calibration prompts (default: all). Each prompt costs a prefill:
    /// at paper scale on the disk tier one reads most of the file, so fewer prompts with more
    /// --cycles give as many probes in less time.
    #[arg(long, conflicts_with = "probes")]
    limit: Option<usize>,
    /// Probe forwards per prompt.
    #[arg(long, default_value_t = 32)]
    cycles: usize,
    /// Largest verified subtree (K).
    #[arg(long, default_value_t = 7)]
    max_nodes: usize,
}

/// The default slot count of a model: a quarter of its experts per layer (at least one) — on
/// the shipped target's disk tier, where waiting for expert copies then takes 30–60% of plain
/// decoding time (the regime the paper studies; it uses 48 of 128).
pub fn default_slots(cfg: &specfit_engine::Qwen3MoeConfig) -> usize {
    (cfg.num_experts / 4).max(1)
}

pub fn run(args: &Args) -> Result<()> {
    let (file, path) = match &args.probes {
        Some(probes) => {
            // Bad drafting costs are refused before any fitting is printed.
            let drafting = args.drafting.as_deref().map(read_drafting).transpose()?;
            let mut file = from_rows(probes, args.model.as_deref())?;
            // Drafting costs measured elsewhere replace any the rows gave.
            if drafting.is_some() {
                file.drafting = drafting;
            }
            (file, args.out.clone())
        }
        None => {
            let (file, default_path) = measure_from_args(args)?;
            (file, Some(args.out.clone().unwrap_or(default_path)))
        }
    };
    let mut json = serde_json::to_string_pretty(&file)?;
    json.push('\n');
    match &path {
        Some(path) => {
            write_atomic(path, json.as_bytes())?;
            eprintln!("calibration -> {}", path.display());
            Ok(())
        }
        None => {
            print!("{json}");
            Ok(())
        }
    }
}

/// Reads drafting costs (`--drafting`): every field finite and non-negative.
fn read_drafting(path: &Path) -> Result<DraftingJson> {
    let d: DraftingJson = serde_json::from_str(&read_text(path)?)
        .with_context(|| format!("{}: not a drafting-cost object", path.display()))?;
    for (name, v) in [
        ("ms_per_level", d.ms_per_level),
        ("feed_ms", d.feed_ms),
        ("feed_ms_per_token", d.feed_ms_per_token),
        ("level_context_ms", d.level_context_ms),
        ("feed_context_ms", d.feed_context_ms),
    ] {
        ensure!(
            v.is_finite() && v >= 0.0,
            "{}: {name} = {v} (a cost must be a finite number ≥ 0)",
            path.display()
        );
    }
    Ok(d)
}

/// Fits probe rows read from a file: every fit `specfit calibrate` makes when the file carries the
/// replay model's rows (as `specfit probe` writes them), else the paper and residency forms.
fn from_rows(probes: &Path, model: Option<&Path>) -> Result<CalibrationJson> {
    let text = read_text(probes)?;
    let at = || format!("{}", probes.display());
    let all = read_probe_json(&text).with_context(at)?;
    let mut file = match measured_from(&all) {
        Some(measured) => fit_rows(&measured, 0).with_context(at)?,
        None => {
            let rows: Vec<Probe> = all
                .into_iter()
                .filter(|(kind, _, _)| *kind == ProbeKind::Verify)
                .map(|(_, _, probe)| probe)
                .collect();
            let cal = calibrate(&rows).with_context(at)?;
            print_fit(&cal);
            CalibrationJson::new(&cal)
        }
    };
    if let Some(dir) = model {
        file.target = Some(target_stamp(&specfit_engine::Qwen3MoeConfig::load(dir)?));
    }
    Ok(file)
}

/// Loads what `args` names and measures; returns the calibration and its default path.
fn measure_from_args(args: &Args) -> Result<(CalibrationJson, PathBuf)> {
    ensure!(args.limit != Some(0), "--limit must be positive");
    let model_dir = args.model.clone().unwrap_or_else(crate::paths::target);
    let cfg = specfit_engine::Qwen3MoeConfig::load(&model_dir)?;
    let target = crate::target::TargetArgs {
        model: model_dir.clone(),
        store: args.store,
        experts: None,
        slots: Some(args.slots.unwrap_or_else(|| default_slots(&cfg))),
        clear_cache: false,
        weights: None,
    };
    let (model, mut cache) = target.load()?;
    let drafter_dir = args.drafter.clone().unwrap_or_else(crate::paths::drafter);
    let drafter = Eagle3::load(&drafter_dir, model.config())?;
    let tokenizer = Tokenizer::load(&model_dir)?;
    let limit = args.limit.unwrap_or(usize::MAX);
    let mut prompts = match &args.prompts {
        Some(path) => read_prompts(path, &tokenizer, limit)?,
        None => default_prompts(&tokenizer)?,
    };
    prompts.truncate(limit);
    let plan = Plan {
        cycles: args.cycles,
        max_nodes: args.max_nodes,
        shape: TreeShape::default(),
        seed: 0,
    };
    let file = measure(&model, &drafter, &mut cache, &prompts, &plan)?;
    Ok((
        file,
        crate::paths::calibration(&model_dir, crate::target::tier_key(&cache)),
    ))
}

/// The shipped calibration prompts: 24 GSM8K train questions and 6 CNN/DM training articles (short
/// and long contexts), all disjoint from the bench prompts.
pub fn default_prompts(tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>> {
    let mut prompts = Vec::new();
    for file in ["gsm8k_train.jsonl", "cnn_dm_train.jsonl"] {
        let path = crate::paths::shipped(&format!("data/calibration/{file}"));
        prompts.extend(read_prompts(&path, tokenizer, usize::MAX)?);
    }
    Ok(prompts)
}

/// How much to probe.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
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
    pub plain: Vec<PlainRow>,
    /// Reads in flight the read rounds were counted with.
    pub read_width: usize,
}

/// Measures probe forwards and plain steps on every prompt (prompt `i` probes with seed
/// `plan.seed + i`, in every cache state). One prefill per prompt and cache state: the plain
/// steps continue the probed sequence (at paper scale on the disk tier a prefill reads most of
/// the file, so a second one per prompt would double the time).
pub fn measure_rows(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    prompts: &[Vec<u32>],
    plan: &Plan,
) -> Result<Measured> {
    ensure!(plan.cycles > 0, "--cycles must be positive");
    let probe_plan = |i: usize| ProbePlan {
        shape: plan.shape,
        max_nodes: plan.max_nodes,
        cycles: plan.cycles,
        plain: PLAIN_STEPS,
        seed: plan.seed + i as u64,
    };
    let mut m = Measured {
        read_width: specfit_engine::experts::reads_in_flight(),
        ..Measured::default()
    };
    // The no-cache end of the sweep: every other verify probe and plain step (those with every
    // expert copied tell the per-layer read latency apart from the per-copy cost) run on a
    // cache emptied before every forward. A few slots are enough (a larger verify reads in
    // waves), and a full cache's worth again would double the memory of a large model.
    let mut cleared = cache.sibling(
        cache.slots_per_layer().min(16),
        specfit_engine::CacheMode::ClearEveryForward,
    )?;
    for (i, prompt) in prompts.iter().enumerate() {
        let rows = probe(
            model,
            drafter,
            cache,
            Some(&mut cleared),
            prompt,
            &probe_plan(i),
        )?;
        m.verify.extend(rows.verify);
        m.plain.extend(rows.plain.iter().map(plain_row));
    }
    // For the replay model, also forwards with every expert resident (hits only), which tell
    // the per-hit cost apart from the node-count intercepts.
    let every = cache.arena_bytes(usize::MAX);
    if every > crate::target::memory_budget() {
        eprintln!(
            "all-resident probes skipped (every expert in slots needs {:.1} GB, more than half of the available memory): hits are then fitted from the cached probes alone",
            every as f64 / 1e9
        );
        return Ok(m);
    }
    let mut resident = match cache.sibling(usize::MAX, specfit_engine::CacheMode::Lru) {
        Ok(c) => c,
        Err(e @ specfit_engine::EngineError::SlotMemory { .. }) => {
            eprintln!("all-resident probes skipped ({e}): hits are then fitted from the cached probes alone");
            return Ok(m);
        }
        Err(e) => return Err(e.into()),
    };
    for (i, prompt) in prompts.iter().enumerate().filter(|(i, _)| i % 3 == 2) {
        // A first pass reads the prompt's experts in; the second's forwards are then (almost
        // all) all-resident, and only those are kept.
        let lru = probe_plan(i);
        probe(model, drafter, &mut resident, None, prompt, &lru)?;
        let warm = probe(model, drafter, &mut resident, None, prompt, &lru)?;
        m.resident
            .extend(warm.verify.into_iter().filter(|r| r.misses == 0));
        m.plain
            .extend(warm.plain.iter().filter(|s| s.misses == 0).map(plain_row));
    }
    Ok(m)
}

/// Plain steps timed after each prompt's probe cycles (half of them on the emptied cache).
const PLAIN_STEPS: usize = 16;

/// Fits measured rows: the paper and residency forms on the verify rows, the replay model on
/// verify, resident and plain rows, and the drafting costs; prints each fit's quality.
pub fn fit_rows(m: &Measured, max_nodes: usize) -> Result<CalibrationJson> {
    let rows: Vec<Probe> = m
        .verify
        .iter()
        .map(|r| Probe {
            nodes: r.nodes,
            demand: r.demand,
            ms: r.ms,
            hits_misses: Some((r.hits, r.misses)),
        })
        .collect();
    let cal = calibrate(&rows)?;
    print_fit(&cal);
    let mut file = CalibrationJson::new(&cal);
    let replay_rows: Vec<VerifyRow> = m.verify.iter().chain(&m.resident).map(verify_row).collect();
    file.replay = Some(replay_fit(&replay_rows, &m.plain, max_nodes, m.read_width)?);
    let r = file.replay.as_ref().expect("just set");
    eprintln!(
        "replay model, {} verify probes: R² = {:.4}, median |error| = {:.3} ms; a[0] {:.3} ms, hit {:.4} ms, miss {:.4} ms, {:.3} ms per read round, attention {:.2e} ms per token per cached token",
        replay_rows.len(),
        r.r2,
        r.median_abs_err_ms,
        r.intercepts[0],
        r.beta_hit,
        r.beta_miss,
        r.read_round_ms,
        r.context_ms
    );
    if let Some(p) = &r.plain {
        eprintln!(
            "replay model, {} plain steps: R² = {:.4}, median |error| = {:.3} ms; step {:.3} ms, hit {:.4} ms, miss {:.4} ms, {:.3} ms per read round, attention {:.2e} ms per cached token",
            m.plain.len(),
            p.r2,
            p.median_abs_err_ms,
            p.intercept,
            p.beta_hit,
            p.beta_miss,
            p.read_round_ms,
            p.context_ms
        );
    }
    file.drafting = Some(drafting_fit(
        &m.verify.iter().map(draft_row).collect::<Vec<_>>(),
    )?);
    let d = file.drafting.as_ref().expect("just set");
    eprintln!(
        "drafting: {:.3} ms per drafted level (+{:.2e} ms per cached token), feeding the drafter {:.3} ms + {:.3} ms per committed token (+{:.2e} ms per cached token)",
        d.ms_per_level, d.level_context_ms, d.feed_ms, d.feed_ms_per_token, d.feed_context_ms
    );
    Ok(file)
}

/// Measures probe forwards on every prompt, fits the cost model and prints the fit quality;
/// the result is stamped with the model's shape, tier and slot count.
pub fn measure(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    prompts: &[Vec<u32>],
    plan: &Plan,
) -> Result<CalibrationJson> {
    let measured = measure_rows(model, drafter, cache, prompts, plan)?;
    let mut file = fit_rows(&measured, plan.max_nodes)?;
    let mut stamp = target_stamp(model.config());
    stamp.insert("tier".into(), crate::target::tier_key(cache).into());
    stamp.insert("slots".into(), cache.slots_per_layer().into());
    file.target = Some(stamp);
    Ok(file)
}

/// Measures a calibration with the shipped calibration prompts on a sibling of `base` (same tier
/// and slots; `base` itself is untouched) and saves it atomically at `path`.
pub fn measure_and_save(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    base: &ExpertCache,
    tokenizer: &Tokenizer,
    max_nodes: usize,
    path: &Path,
) -> Result<CalibrationJson> {
    let prompts = default_prompts(tokenizer)?;
    let mut cache = base.sibling(base.slots_per_layer(), specfit_engine::CacheMode::Lru)?;
    let plan = Plan {
        cycles: 32,
        max_nodes,
        shape: TreeShape::default(),
        seed: 0,
    };
    let cal = measure(model, drafter, &mut cache, &prompts, &plan)?;
    let json = serde_json::to_string_pretty(&cal)? + "\n";
    write_atomic(path, json.as_bytes())?;
    eprintln!("calibration -> {}", path.display());
    Ok(cal)
}

/// `m` as JSON Lines: `specfit probe`'s output and `specfit calibrate --probes`'s input. Every
/// row carries the cost fits' columns (`nodes`, `demand`, `ms`, `hits`, `misses`) plus what the
/// replay and drafting fits need; `kind` marks resident verify forwards and plain steps.
pub fn rows_jsonl(m: &Measured) -> String {
    let verify = |r: &ProbeRow, kind: &str| {
        serde_json::json!({
            "kind": kind, "nodes": r.nodes, "demand": r.demand, "ms": r.ms, "hits": r.hits,
            "misses": r.misses, "read_rounds": r.read_rounds, "read_width": m.read_width,
            "context": r.context, "draft_forwards": r.draft_forwards, "draft_ms": r.draft_ms,
            "fed": r.fed, "feed_ms": r.feed_ms,
        })
    };
    let plain = |p: &PlainRow| {
        serde_json::json!({
            "kind": "plain", "nodes": 0, "demand": p.hits + p.misses, "ms": p.ms, "hits": p.hits,
            "misses": p.misses, "read_rounds": p.read_rounds, "read_width": m.read_width,
            "context": p.context,
        })
    };
    let rows = m
        .verify
        .iter()
        .map(|r| verify(r, "verify"))
        .chain(m.resident.iter().map(|r| verify(r, "resident")))
        .chain(m.plain.iter().map(plain));
    rows.map(|r| format!("{r}\n")).collect()
}

/// The measured rows of a probe file when every row carries what the replay fit needs and
/// there are plain steps (files written by `specfit probe`); `None` otherwise.
fn measured_from(rows: &[(ProbeKind, ProbeJson, Probe)]) -> Option<Measured> {
    let mut m = Measured::default();
    for (kind, r, _) in rows {
        let (read_rounds, context, read_width) = (r.read_rounds?, r.context?, r.read_width?);
        m.read_width = read_width;
        let (hits, misses) = (r.hits?, r.misses?);
        match kind {
            ProbeKind::Plain => m.plain.push(PlainRow {
                hits,
                misses,
                read_rounds,
                context,
                ms: r.ms,
            }),
            ProbeKind::Verify | ProbeKind::Resident => {
                let row = ProbeRow {
                    nodes: r.nodes,
                    demand: r.demand,
                    hits,
                    misses,
                    read_rounds,
                    ms: r.ms,
                    draft_forwards: r.draft_forwards?,
                    draft_ms: r.draft_ms?,
                    fed: r.fed?,
                    feed_ms: r.feed_ms?,
                    context,
                };
                match kind {
                    ProbeKind::Verify => m.verify.push(row),
                    _ => m.resident.push(row),
                }
            }
        }
    }
    (!m.plain.is_empty() && !m.verify.is_empty()).then_some(m)
}

/// An engine probe row as the replay fit reads it.
fn verify_row(r: &ProbeRow) -> VerifyRow {
    VerifyRow {
        nodes: r.nodes,
        hits: r.hits,
        misses: r.misses,
        read_rounds: r.read_rounds,
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

fn print_fit(cal: &Calibration) {
    eprintln!(
        "{} probe rows, K = {}: paper form R² = {:.4}, median |error| = {:.3} ms",
        cal.paper.rows, cal.max_nodes, cal.paper.r2, cal.paper.median_abs_err_ms
    );
    if let Some(f) = &cal.residency {
        eprintln!(
            "residency form R² = {:.4}, median |error| = {:.3} ms",
            f.r2, f.median_abs_err_ms
        );
    }
}

/// A plain step as the replay fit reads it.
fn plain_row(s: &PlainStep) -> PlainRow {
    PlainRow {
        hits: s.hits,
        misses: s.misses,
        read_rounds: s.read_rounds,
        context: s.context,
        ms: s.ms,
    }
}
