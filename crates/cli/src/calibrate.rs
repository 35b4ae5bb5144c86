//! `specfit calibrate`: measures probe forwards on the engine (random ancestor-closed subtrees of
//! pools drafted on calibration prompts, from the LRU cache state and from an emptied cache),
//! fits the cost model by NNLS and saves it next to the model; or, with `--probes`, fits probe
//! rows measured earlier (`specfit probe`). Prints the fit quality either way.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use specfit_engine::measure::{fit, measure_rows, CalibrationPlan, Measured, ProbeRow};
use specfit_engine::policy::target_stamp;
use specfit_engine::spec::TreeShape;
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe, Tokenizer};
use specfit_selector::json::{
    read_probe_json, CalibrationJson, DraftingJson, ProbeJson, ProbeKind,
};
use specfit_selector::{calibrate, Calibration, Probe};
use specfit_sim::fit::VerifyRow;

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
    #[command(flatten)]
    drafter_dtype: crate::drafter::DrafterDtypeArg,
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
    #[command(flatten)]
    nodes: crate::tree::MaxNodesArg,
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
        // The probes price reads as a forward waits for them: nothing read ahead.
        layers_ahead: Some(0),
    };
    let (model, mut cache) = target.load()?;
    let drafter_dir = args.drafter.clone().unwrap_or_else(crate::paths::drafter);
    let drafter = args.drafter_dtype.load(&drafter_dir, &model)?;
    let tokenizer = Tokenizer::load(&model_dir)?;
    let limit = args.limit.unwrap_or(usize::MAX);
    let mut prompts = match &args.prompts {
        Some(path) => read_prompts(path, &tokenizer, limit)?,
        None => calibration_prompts(&tokenizer)?,
    };
    prompts.truncate(limit);
    let plan = CalibrationPlan {
        cycles: args.cycles,
        max_nodes: args.nodes.max_nodes,
        shape: TreeShape::default(),
        seed: 0,
    };
    let measured = measure(&model, &drafter, &mut cache, &prompts, &plan)?;
    let file = stamped_fit(&measured, &model, &cache, plan.max_nodes)?;
    Ok((
        file,
        crate::paths::calibration(&model_dir, specfit_engine::policy::tier_key(&cache)),
    ))
}

/// The shipped calibration prompts: 24 GSM8K train questions and 6 CNN/DM training articles (short
/// and long contexts), all disjoint from the bench prompts, in file order.
pub fn default_prompts(tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>> {
    let (short, long) = shipped_prompts(tokenizer)?;
    Ok([short, long].concat())
}

/// The shipped calibration prompts in the order calibration probes them: the articles spread
/// among the questions ([`specfit_engine::measure::spread`]; `--limit 5` takes 4 and 1).
pub fn calibration_prompts(tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>> {
    let (short, long) = shipped_prompts(tokenizer)?;
    Ok(specfit_engine::measure::spread(short, long))
}

/// Tokenized prompts, one token list each.
type Prompts = Vec<Vec<u32>>;

/// The shipped GSM8K questions and CNN/DM articles.
fn shipped_prompts(tokenizer: &Tokenizer) -> Result<(Prompts, Prompts)> {
    let read = |file: &str| {
        let path = crate::paths::shipped(&format!("data/calibration/{file}"));
        read_prompts(&path, tokenizer, usize::MAX)
    };
    Ok((read("gsm8k_train.jsonl")?, read("cnn_dm_train.jsonl")?))
}

/// Fits measured rows ([`specfit_engine::measure::fit`]) and prints each fit's quality.
pub fn fit_rows(m: &Measured, max_nodes: usize) -> Result<CalibrationJson> {
    let (file, cal) = fit(m, max_nodes)?;
    print_fit(&cal);
    let r = file.replay.as_ref().expect("fitted");
    eprintln!(
        "replay model, {} verify probes: R² = {:.4}, median |error| = {:.3} ms; a[0] {:.3} ms, hit {:.4} ms, miss {:.4} ms, {:.3} ms per read round, {:.4} ms per read waiting for a slot, attention {:.2e} ms per token per cached token",
        m.verify.len() + m.resident.len(),
        r.r2,
        r.median_abs_err_ms,
        r.intercepts[0],
        r.beta_hit,
        r.beta_miss,
        r.read_round_ms,
        r.slot_wait_ms,
        r.context_ms
    );
    if let Some(p) = &r.plain {
        eprintln!(
            "replay model, {} plain steps: R² = {:.4}, median |error| = {:.3} ms; step {:.3} ms, hit {:.4} ms, miss {:.4} ms, {:.3} ms per read round, {:.4} ms per read waiting for a slot, attention {:.2e} ms per cached token",
            m.plain.len(),
            p.r2,
            p.median_abs_err_ms,
            p.intercept,
            p.beta_hit,
            p.beta_miss,
            p.read_round_ms,
            p.slot_wait_ms,
            p.context_ms
        );
    }
    eprintln!(
        "timing noise around the replay model: {:.3} (robust standard deviation of ln(measured / fitted))",
        r.noise
    );
    let d = file.drafting.as_ref().expect("fitted");
    eprintln!(
        "drafting ({} drafter matrices): {:.3} ms per drafted level (+{:.2e} ms per cached token), feeding the drafter {:.3} ms + {:.3} ms per committed token (+{:.2e} ms per cached token)",
        specfit_engine::policy::calibration_drafter_dtype(&file),
        d.ms_per_level, d.level_context_ms, d.feed_ms, d.feed_ms_per_token, d.feed_context_ms
    );
    if let Some(a) = &file.acceptance {
        let counts = a.to_counts()?;
        let curve = counts.curve();
        let at = |top| [0.1, 0.25, 0.5, 0.75].map(|q| format!("{:.2}", curve.at(q, top)));
        eprintln!(
            "acceptance: {} drafted children of reached nodes ({} of them their parent's top child); the target takes a child the drafter gives 0.1 / 0.25 / 0.5 / 0.75 about {} of the time when it is the top child, {} when not",
            counts.samples(),
            counts.top_counts().0.iter().sum::<u64>(),
            at(true).join(" / "),
            at(false).join(" / ")
        );
    }
    Ok(file)
}

/// Measures probe forwards and plain steps on every prompt within this machine's memory budget
/// ([`specfit_engine::measure::measure_rows`]), saying so when the all-resident probes are skipped.
pub fn measure(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    prompts: &[Vec<u32>],
    plan: &CalibrationPlan,
) -> Result<Measured> {
    let budget = crate::target::memory_budget();
    let measured = measure_rows(model, drafter, cache, prompts, plan, budget)?;
    if let Some(why) = &measured.resident_skipped {
        eprintln!("all-resident probes skipped ({why}): hits are then fitted from the cached probes alone");
    }
    Ok(measured)
}

/// Fits the cost model to `measured` and prints the fit quality; the result is stamped with the
/// model's shape and `cache`'s tier and slot count (the cache the rows were measured on).
pub fn stamped_fit(
    measured: &Measured,
    model: &Qwen3Moe,
    cache: &ExpertCache,
    max_nodes: usize,
) -> Result<CalibrationJson> {
    let mut file = fit_rows(measured, max_nodes)?;
    let mut stamp = target_stamp(model.config());
    stamp.insert(
        "tier".into(),
        specfit_engine::policy::tier_key(cache).into(),
    );
    stamp.insert("slots".into(), cache.slots_per_layer().into());
    stamp.insert("in_place".into(), cache.in_place().into());
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
    let prompts = calibration_prompts(tokenizer)?;
    let mut cache = base.sibling(base.slots_per_layer(), specfit_engine::CacheMode::Lru)?;
    let plan = CalibrationPlan {
        cycles: 32,
        max_nodes,
        shape: TreeShape::default(),
        seed: 0,
    };
    let measured = measure(model, drafter, &mut cache, &prompts, &plan)?;
    let cal = stamped_fit(&measured, model, &cache, max_nodes)?;
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
            "slot_waits": r.slot_waits,
            "context": r.context, "draft_forwards": r.draft_forwards, "draft_ms": r.draft_ms,
            "fed": r.fed, "feed_ms": r.feed_ms,
        })
    };
    let plain = |p: &VerifyRow| {
        serde_json::json!({
            "kind": "plain", "nodes": 0, "demand": p.hits + p.misses, "ms": p.ms, "hits": p.hits,
            "misses": p.misses, "read_rounds": p.read_rounds, "read_width": m.read_width,
            "slot_waits": p.slot_waits,
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
        let slot_waits = r.slot_waits.unwrap_or(0);
        match kind {
            ProbeKind::Plain => m.plain.push(VerifyRow {
                nodes: 0,
                hits,
                misses,
                read_rounds,
                slot_waits,
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
                    slot_waits,
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

fn print_fit(cal: &Calibration) {
    eprintln!(
        "{} probe rows, K = {}: paper form R² = {:.4}, median |error| = {:.3} ms, {}",
        cal.paper.rows,
        cal.max_nodes,
        cal.paper.r2,
        cal.paper.median_abs_err_ms,
        context_charge(&cal.paper.cost)
    );
    if let Some(f) = &cal.residency {
        eprintln!(
            "residency form R² = {:.4}, median |error| = {:.3} ms, {}",
            f.r2,
            f.median_abs_err_ms,
            context_charge(&f.cost)
        );
    }
}

/// How a fitted form charges attention over the context, in words.
fn context_charge(cost: &specfit_selector::CostModel) -> String {
    let g = cost.context_ms();
    if g > 0.0 {
        format!("attention {g:.2e} ms per verified row per cached token")
    } else {
        "no context charge".into()
    }
}
