//! `specfit bench`: the paper's experiment on this machine, on the shipped models and prompt
//! sets — plain decoding, vanilla and cached EAGLE-3, SpecFit and its variants, across cache
//! sizes — checking every policy's output against plain decoding token for token. This module
//! runs the measurements; `plan` says what to run, `report` turns tallies into tables and files,
//! `chart` draws them.

mod chart;
mod plan;
mod report;
pub(crate) mod validate;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use specfit_engine::policy::{verify_policy, PolicySpec};
use specfit_engine::spec::{Atlas, Routes, Speculation, Start};
use specfit_engine::{
    generate, CacheMode, DecodeOptions, Eagle3, ExpertCache, Prefix, Qwen3Moe, Tokenizer,
    VerifyPolicy,
};
use specfit_selector::json::CalibrationJson;

use crate::policy::{self, RouteChoice};
use crate::target::{StoreArg, TargetArgs};
use plan::{Config, PromptSet, Slots};
use report::{Outcome, Tally};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pair (its predictor runs the `specfit[predictor]` rows, skipped without the file).
    #[command(flatten)]
    pair: crate::paths::PairArgs,
    #[command(flatten)]
    drafter_dtype: crate::drafter::DrafterDtypeArg,
    /// Where routed experts rest (disk: the expert file, converted first when missing).
    #[arg(long, value_enum, default_value = "disk")]
    store: StoreArg,
    /// The default slots per MoE layer (default: a quarter of the experts); the sweep also runs
    /// 100%, half, a quarter and none.
    #[arg(long)]
    slots: Option<usize>,
    /// Use this cost calibration instead of measuring one. By default every run measures a
    /// fresh calibration first (about 25 s on the shipped model) and saves it as
    /// MODEL/specfit-calibration.TIER.json: this machine's speed drifts (other load, the disk),
    /// and both SpecFit's choices and the simulator check need today's costs.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Reuse MODEL/specfit-calibration.TIER.json when it exists instead of measuring.
    #[arg(long, conflicts_with = "calibration")]
    reuse_calibration: bool,
    /// Prompt sets: Spec-Bench category names (data/spec_bench/NAME.jsonl) or JSON Lines paths.
    #[arg(long, value_delimiter = ',', default_values_t = ["summarization".to_string(), "math_reasoning".to_string()])]
    prompts: Vec<String>,
    /// Prompts per set (default: 40 summarization, 80 math_reasoning, as in the paper; all of
    /// any other set).
    #[arg(long)]
    limit: Option<usize>,
    /// Most new tokens per prompt.
    #[arg(long, default_value_t = 28)]
    max_tokens: usize,
    /// Cut each prompt's user text to its first N tokens (the paper-scale run cuts the
    /// summarization articles to 512).
    #[arg(long, value_name = "N")]
    max_prompt_tokens: Option<usize>,
    /// Slot points of the sweep (0 = no cache) instead of 100%, half, a quarter and none; each
    /// point runs ar, eagle3, specfit and, with a predictor, specfit[predictor] and
    /// specfit+ahead[predictor].
    #[arg(long, value_delimiter = ',', value_name = "SLOTS")]
    sweep: Option<Vec<usize>>,
    /// Also run `ar` and SpecFit (on the route predictor's routes) reading N MoE layers ahead
    /// (`+layer-ahead` rows; see `generate --layers-ahead`) at the default slots and every
    /// point of --sweep; 0 leaves those rows out. Slot tiers only: with the experts used in
    /// place there is nothing to read.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=8))]
    layers_ahead: u8,
    /// Run each configuration over a whole prompt set in turn (prefixes made once and kept)
    /// instead of every configuration on each prompt in turn; automatic when all
    /// configurations' slots together need more than half of the available memory.
    #[arg(long)]
    one_at_a_time: bool,
    #[command(flatten)]
    nodes: crate::tree::MaxNodesArg,
    /// A short run: 8 prompts per set, at most 32 new tokens, the main policies at the default and no-cache
    /// points only.
    #[arg(long)]
    quick: bool,
    /// Validate the trace simulator on the first N prompts of each set (default: every prompt):
    /// probe this machine's costs on them between the runs, record their traces, replay them
    /// under each configuration with those costs and compare with the measured tok/s (0 = skip).
    #[arg(long)]
    validate: Option<usize>,
    /// Run only these rows (labels as in the table, e.g. `ar,specfit`; `ar` at the default
    /// slots always runs: it is the reference every output is checked against).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Run every prompt set this many times, each round from empty slots and fresh policies in
    /// a fresh order: tok/s and ×AR are then each row's median over the rounds (×AR from each
    /// round's own `ar`), with ×AR's range; the other columns sum every round. The simulator
    /// check's probes come from the first round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=9))]
    rounds: u8,
    /// Directory for report.json, report.md and chart.svg, and the simulator check's traces
    /// under traces/ (all written atomically).
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// Everything loaded once.
struct Setup {
    model: Qwen3Moe,
    drafter: Eagle3,
    /// The cache every configuration's cache is a sibling of (shares its store).
    base: ExpertCache,
    /// Exact routes for the rows that take them (`corrupt`: the corrupted-routes row), each
    /// made on first use: its routing cache maps the model a second time, which at paper scale
    /// on the disk tier takes half a minute, for rows that may not run.
    atlas: Option<Atlas>,
    corrupt: Option<Atlas>,
    model_path: PathBuf,
    predictor: Option<specfit_engine::predictor::RoutePredictor>,
    calibration: CalibrationJson,
    calibration_path: PathBuf,
    stop: Vec<u32>,
    sets: Vec<PromptSet>,
    configs: Vec<Config>,
    default_slots: usize,
    max_tokens: usize,
    max_nodes: usize,
}

/// One decode's outcome and the selector's time per cycle (µs).
type Run = (Outcome, Vec<f64>);

/// One configuration's live state: its own cache and verify policy.
struct Runner {
    cache: ExpertCache,
    policy: VerifyPolicy,
}

pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let mut s = setup(args)?;
    let rounds = usize::from(args.rounds);
    let total: usize =
        s.sets.iter().map(|set| set.prompts.len()).sum::<usize>() * s.configs.len() * rounds;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {pos}/{len} runs, ETA {eta} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // A cache of every expert for the prefills when its slots fit in memory; else (a model
    // larger than memory on the disk tier) as few slots as the smallest configuration has: a
    // forward copies each expert it needs once however few slots there are.
    let smallest = s
        .configs
        .iter()
        .map(|c| slots_of(c).0)
        .min()
        .unwrap_or(usize::MAX);
    let prefill_slots = if s.base.arena_bytes(usize::MAX) <= crate::target::memory_budget() {
        usize::MAX
    } else {
        smallest.min(16)
    };
    // Made on first use (and again after being freed, see below).
    let mut prefill_cache: Option<ExpertCache> = None;
    // Every configuration keeps its own slots across a set's prompts. When they do not all fit
    // in memory at once, each configuration runs over the whole set in turn (the prompts'
    // prefixes are made once and kept), its slots freed before the next one's.
    let memory: u64 = s
        .configs
        .iter()
        .map(|c| s.base.arena_bytes(slots_of(c).0))
        .sum();
    let one_at_a_time = args.one_at_a_time || memory > crate::target::memory_budget();
    if one_at_a_time && !args.one_at_a_time {
        eprintln!(
            "the {} configurations' slots need {:.1} GB together, more than half of this machine's available memory: each configuration runs over a whole set in turn",
            s.configs.len(),
            memory as f64 / 1e9
        );
    }
    let mut tallies: Vec<Vec<Tally>> = Vec::new();
    let sets = std::mem::take(&mut s.sets);
    let configs = std::mem::take(&mut s.configs);
    let mut validation = Vec::new();
    for (set_index, set) in sets.iter().enumerate() {
        let n = configs.len();
        let validated = args.validate.unwrap_or(usize::MAX).min(set.prompts.len());
        let validated_prompts: Vec<&[u32]> = set.prompts[..validated]
            .iter()
            .map(|p| &p.tokens[..])
            .collect();
        // The simulator check's costs, probed between the runs.
        let mut probes = match validated {
            0 => None,
            v => Some(validate::Probes::new(
                &s.base,
                &probe_slots(
                    configs.iter().map(|c| c.slots),
                    s.default_slots,
                    s.model.config().num_experts,
                ),
                v,
                s.max_nodes,
            )?),
        };
        // outcomes[round][prompt][config]
        let mut outcomes: Vec<Vec<Vec<Option<Run>>>> = Vec::new();
        // One at a time: the prompts' prefixes are made once for every round and kept.
        let prefixes = match one_at_a_time {
            true => {
                let cache = prefill(&mut prefill_cache, &s.base, prefill_slots)?;
                let prefixes = set
                    .prompts
                    .iter()
                    .map(|prompt| {
                        bar.set_message(format!("{} #{}: prefill", set.name, prompt.question_id));
                        Ok(Prefix::new(
                            &s.model,
                            Some(&s.drafter),
                            cache,
                            &prompt.tokens,
                        )?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                // Its slots are freed before any configuration's are filled.
                prefill_cache = None;
                prefixes
            }
            false => Vec::new(),
        };
        for round in 0..rounds {
            let mut these: Vec<Vec<Option<Run>>> = set
                .prompts
                .iter()
                .map(|_| (0..n).map(|_| None).collect())
                .collect();
            // Probes are taken in the first round only.
            let mut probes = probes.as_mut().filter(|_| round == 0);
            if one_at_a_time {
                // Configurations in a seeded random order per set and round (see below).
                for i in run_order(n, round_seed(1000 + set_index as u64, round)) {
                    let mut runner = runner(&s, &configs[i])?;
                    for (p, prefix) in prefixes.iter().enumerate() {
                        bar.set_message(format!(
                            "{} #{} {}",
                            set.name, set.prompts[p].question_id, configs[i].label
                        ));
                        these[p][i] = Some(run_one(&mut s, &configs[i], &mut runner, prefix)?);
                        bar.inc(1);
                    }
                    if let Some(p) = probes.as_mut() {
                        bar.set_message(format!("{}: probing costs", set.name));
                        p.take(&s.model, &s.drafter, &validated_prompts)?;
                    }
                }
            } else {
                // Each set (and each round) is a fresh session: every configuration starts from
                // empty slots (so a set's figures do not depend on which set ran before, and the
                // simulator starts cold too).
                let mut runners = configs
                    .iter()
                    .map(|c| runner(&s, c))
                    .collect::<Result<Vec<_>>>()?;
                for (index, prompt) in set.prompts.iter().enumerate() {
                    bar.set_message(format!("{} #{}", set.name, prompt.question_id));
                    let cache = prefill(&mut prefill_cache, &s.base, prefill_slots)?;
                    let prefix = Prefix::new(&s.model, Some(&s.drafter), cache, &prompt.tokens)?;
                    // Configurations run in a fresh seeded random order per prompt, so that
                    // none always runs first after the prefill or always after the same other
                    // configuration: what one leaves behind (the disk's queue and rate limiter,
                    // processor caches) would otherwise bias the next (BENCHMARKS.md).
                    for i in run_order(n, round_seed(index as u64, round)) {
                        let runner = &mut runners[i];
                        // Each run reads and computes from freshly placed slot memory: on a
                        // virtual machine the speed of an arena can depend on where it landed,
                        // and an arena kept for the whole run would bias its configuration
                        // throughout. Outside the timer; equal-sized arenas rotate among the
                        // configurations.
                        runner.cache.relocate();
                        these[index][i] = Some(run_one(&mut s, &configs[i], runner, &prefix)?);
                        bar.inc(1);
                    }
                    if let (Some(p), true) = (probes.as_mut(), index < validated) {
                        p.take(&s.model, &s.drafter, &validated_prompts)?;
                    }
                }
            }
            outcomes.push(these);
        }
        // Every output is checked against `ar`'s (config 0) in the same round.
        let mut row = vec![Tally::default(); n];
        // The same tallies over the prompts the simulator is checked on.
        let mut checked = vec![Tally::default(); n];
        let mut lengths = Vec::new();
        for (round, per_prompt) in outcomes.into_iter().enumerate() {
            for (index, (prompt, per_config)) in set.prompts.iter().zip(per_prompt).enumerate() {
                let per_config: Vec<Run> = per_config.into_iter().flatten().collect();
                let reference = per_config[0].0.tokens.clone();
                for (i, (outcome, select_us)) in per_config.iter().enumerate() {
                    let same = outcome.tokens == reference;
                    row[i].add(round, outcome, select_us, prompt.question_id, same);
                    if index < validated {
                        checked[i].add(round, outcome, select_us, prompt.question_id, same);
                    }
                }
                if round == 0 && index < validated {
                    // The forwards decoding ran after the prefill's token: the positions to
                    // replay.
                    lengths.push(reference.len().saturating_sub(1));
                }
            }
        }
        if let Some(probes) = probes {
            bar.set_message(format!(
                "{}: recording traces for the simulator check",
                set.name
            ));
            let prompts: Vec<(&[u32], usize)> = set
                .prompts
                .iter()
                .zip(&lengths)
                .map(|(p, &n)| (&p.tokens[..], n))
                .collect();
            let cache = prefill(&mut prefill_cache, &s.base, prefill_slots)?;
            let atlas = atlas(&mut s.atlas, &s.model_path, &s.base, &RouteChoice::Atlas)?;
            let traces = validate::traces(&s.model, &s.drafter, cache, atlas, &prompts)?;
            let header = specfit_engine::measure::trace_header(&s.model);
            save_traces(&args.out, set, &header, &traces, &args.pair)?;
            let machine = validate::Machine {
                header,
                calibration: &s.calibration,
                model: &s.model,
                max_nodes: s.max_nodes,
            };
            let costs = probes.fit(s.max_nodes);
            validation.push(validate::check(
                &set.name, &traces, &configs, &checked, &machine, costs,
            )?);
        }
        tallies.push(row);
    }
    bar.finish_and_clear();
    let report = report::Report::new(report::Inputs {
        sets: &sets,
        configs: &configs,
        tallies: &tallies,
        model: &args.pair.model,
        drafter_dtype: s.drafter.dtype().name(),
        tier: specfit_engine::policy::tier_key(&s.base),
        default_slots: s.default_slots,
        experts: s.model.config().num_experts,
        max_tokens: s.max_tokens,
        max_nodes: s.max_nodes,
        calibration: &s.calibration,
        calibration_path: &s.calibration_path,
        validation,
        seconds: started.elapsed().as_secs_f64(),
    });
    print!("{}", report.terminal());
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json = serde_json::to_string_pretty(&report)? + "\n";
    crate::files::write_atomic(&args.out.join("report.json"), json.as_bytes())?;
    crate::files::write_atomic(&args.out.join("report.md"), report.markdown().as_bytes())?;
    let svg = chart::svg(&report)?;
    crate::files::write_atomic(&args.out.join("chart.svg"), svg.as_bytes())?;
    eprintln!(
        "wrote {0}/report.json, {0}/report.md, {0}/chart.svg in {1:.0} s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    if !report.lossless {
        bail!("some policy's output differed from plain decoding (see the report)");
    }
    Ok(())
}

/// The slot points the simulator check probes at: every cached configuration's `slots` below
/// `experts` (the prober's all-resident cache covers a full one), the default slots first.
fn probe_slots(
    slots: impl IntoIterator<Item = Slots>,
    default: usize,
    experts: usize,
) -> Vec<usize> {
    let mut points = vec![default];
    for s in slots {
        if let Slots::Count(n) = s {
            if n > 0 && n < experts && !points.contains(&n) {
                points.push(n);
            }
        }
    }
    points
}

/// The seed of `round`'s order from the first round's `seed` (the same seed in the first round,
/// so one round runs in the order it always did).
fn round_seed(seed: u64, round: usize) -> u64 {
    seed + ((round as u64) << 32)
}

/// The order in which prompt `seed`'s `n` configurations run: a seeded random permutation.
fn run_order(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = specfit_selector::synth::Rng::new(0x5eed_0000 + seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

/// Loads the model, drafter, routes, calibration (measuring it first when missing), prompt
/// sets and configurations.
fn setup(args: &Args) -> Result<Setup> {
    ensure!(args.max_tokens > 0, "--max-tokens must be positive");
    ensure!(args.nodes.max_nodes > 0, "--max-nodes must be positive");
    ensure!(
        args.max_prompt_tokens != Some(0),
        "--max-prompt-tokens must be positive"
    );
    let cfg = specfit_engine::Qwen3MoeConfig::load(&args.pair.model)?;
    ensure!(
        args.slots != Some(0),
        "bench --slots 0: the default slot count must be positive (no cache is a sweep point: --sweep 0,…)"
    );
    let mut default_slots = crate::target::slots_or_default(&cfg, args.slots)?;
    if in_place(args) {
        // Every expert is used where it rests in the mapped file: all of them resident.
        default_slots = cfg.num_experts;
    }
    if let Some(path) = args.calibration.as_ref().filter(|p| !p.exists()) {
        bail!("--calibration {} does not exist", path.display());
    }
    let tokenizer = Tokenizer::load(&args.pair.model)?;
    let limit = |name: &str| {
        let paper = plan::DEFAULT_SETS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(usize::MAX, |&(_, n)| n);
        match (args.quick, args.limit) {
            (_, Some(l)) => l,
            (true, None) => paper.min(8),
            (false, None) => paper,
        }
    };
    let sets = args
        .prompts
        .iter()
        .map(|name| {
            let path = if name.ends_with(".jsonl") {
                PathBuf::from(name)
            } else {
                crate::paths::shipped(&format!("data/spec_bench/{name}.jsonl"))
            };
            let label = path
                .file_stem()
                .map_or(name.clone(), |s| s.to_string_lossy().into());
            plan::read_set(
                &label,
                &path,
                limit(name),
                args.max_prompt_tokens,
                &tokenizer,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // The rows, checked before anything slow (converting the experts, calibrating).
    let mut configs = plan::configs(&plan::Sweep {
        experts: cfg.num_experts,
        default_slots,
        predictor: args
            .pair
            .predictor
            .exists()
            .then(|| args.pair.predictor.clone()),
        quick: args.quick,
        layers_ahead: if in_place(args) {
            0
        } else {
            args.layers_ahead.into()
        },
        points: sweep_points(args, &cfg, default_slots)?,
    });
    if let Some(only) = &args.only {
        let known: Vec<&str> = configs.iter().map(|c| c.label.as_str()).collect();
        if let Some(bad) = only.iter().find(|l| !known.contains(&l.as_str())) {
            bail!(
                "--only {bad:?}: not a row of this run (rows: {})",
                known.join(", ")
            );
        }
        let reference = configs[0].clone();
        configs.retain(|c| only.contains(&c.label));
        if configs.first() != Some(&reference) {
            configs.insert(0, reference);
        }
    }
    // The base cache (prefills, calibration) reads nothing ahead; each row says what it reads.
    let mut target = TargetArgs::prepared(&args.pair.model, args.store, default_slots, None)?;
    target.layers_ahead = Some(0);
    let (model, base) = target.load()?;
    let drafter = args.drafter_dtype.load(&args.pair.drafter, &model)?;
    let mut stop = crate::target::eos_tokens(&args.pair.model, model.config())?;
    stop.extend(tokenizer.token_id("<|im_end|>"));
    let predictor = if args.pair.predictor.exists() {
        Some(policy::load_predictor(
            &args.pair.predictor,
            &model,
            &drafter,
        )?)
    } else {
        eprintln!(
            "no route predictor at {}: the specfit[predictor] row is skipped",
            args.pair.predictor.display()
        );
        None
    };
    // Measured last: every argument is checked before the 25 s of probe forwards.
    let (calibration, calibration_path) = calibration(args, &model, &drafter, &base, &tokenizer)?;
    Ok(Setup {
        model,
        drafter,
        base,
        atlas: None,
        corrupt: None,
        model_path: args.pair.model.clone(),
        predictor,
        calibration,
        calibration_path,
        stop,
        sets,
        configs,
        default_slots,
        max_tokens: if args.quick {
            args.max_tokens.min(32)
        } else {
            args.max_tokens
        },
        max_nodes: args.nodes.max_nodes,
    })
}

/// Whether the experts are used in place (a GGUF file mapped in RAM): no slots, no copies.
fn in_place(args: &Args) -> bool {
    args.store == StoreArg::Ram && specfit_engine::gguf::is_gguf(&args.pair.model)
}

/// `--sweep` as slot points, each checked against the model.
fn sweep_points(
    args: &Args,
    cfg: &specfit_engine::Qwen3MoeConfig,
    default_slots: usize,
) -> Result<Option<Vec<Slots>>> {
    let Some(points) = &args.sweep else {
        // A GGUF file in RAM is used in place: there are no slots to sweep.
        if in_place(args) {
            return Ok(Some(vec![Slots::Count(default_slots)]));
        }
        return Ok(None);
    };
    ensure!(!points.is_empty(), "--sweep needs at least one slot count");
    points
        .iter()
        .map(|&n| match n {
            0 => Ok(Slots::None),
            n if n <= cfg.num_experts => Ok(Slots::Count(n)),
            n => bail!(
                "--sweep {n}: the model has {} experts per layer",
                cfg.num_experts
            ),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The calibration: `--calibration`, else the one saved next to the model for this tier, else
/// measured now (and saved there).
fn calibration(
    args: &Args,
    model: &Qwen3Moe,
    drafter: &Eagle3,
    base: &ExpertCache,
    tokenizer: &Tokenizer,
) -> Result<(CalibrationJson, PathBuf)> {
    if let Some(path) = &args.calibration {
        // (A missing --calibration file was refused in `setup`.)
        return Ok((
            crate::policy::calibration(path, model, drafter, base)?,
            path.clone(),
        ));
    }
    let path = crate::paths::calibration(&args.pair.model, specfit_engine::policy::tier_key(base));
    if args.reuse_calibration && path.exists() {
        return Ok((
            crate::policy::calibration(&path, model, drafter, base)?,
            path,
        ));
    }
    eprintln!(
        "measuring this machine's costs first (probe forwards; --reuse-calibration skips this)"
    );
    let cal = crate::calibrate::measure_and_save(
        model,
        drafter,
        base,
        tokenizer,
        args.nodes.max_nodes,
        &path,
    )?;
    Ok((cal, path))
}

/// Writes the simulator check's traces of `set` as `OUT/traces/SET-QUESTION_ID.jsonl` (each
/// atomically; `specfit simulate --trace` replays them with other costs, e.g. another tier's
/// calibration).
fn save_traces(
    out: &Path,
    set: &PromptSet,
    header: &specfit_trace::TraceHeader,
    traces: &[Vec<specfit_trace::TraceStep>],
    pair: &crate::paths::PairArgs,
) -> Result<()> {
    let dir = out.join("traces");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut header = header.clone();
    let meta = &mut header.meta;
    meta.insert("model".into(), pair.model.display().to_string().into());
    meta.insert("drafter".into(), pair.drafter.display().to_string().into());
    meta.insert("set".into(), set.name.clone().into());
    for (prompt, steps) in set.prompts.iter().zip(traces) {
        header
            .meta
            .insert("question_id".into(), prompt.question_id.into());
        header
            .meta
            .insert("prompt".into(), serde_json::json!(prompt.tokens));
        let mut bytes = Vec::new();
        specfit_trace::write(&mut bytes, &header, steps)?;
        let name = format!("{}-{}.jsonl", set.name, prompt.question_id);
        crate::files::write_atomic(&dir.join(name), &bytes)?;
    }
    Ok(())
}

/// The prefill cache, made again (with `slots`) when it was freed.
fn prefill<'a>(
    cache: &'a mut Option<ExpertCache>,
    base: &ExpertCache,
    slots: usize,
) -> Result<&'a mut ExpertCache> {
    Ok(match cache {
        Some(c) => c,
        empty => empty.insert(base.sibling(slots, CacheMode::Lru)?),
    })
}

/// The atlas in `slot`, made on first use over a routing cache of `model` (with `route`'s
/// corruption, seed 0, when it names one).
fn atlas<'a>(
    slot: &'a mut Option<Atlas>,
    model: &std::path::Path,
    base: &ExpertCache,
    route: &RouteChoice,
) -> Result<&'a mut Atlas> {
    Ok(match slot {
        Some(a) => a,
        empty => empty.insert(policy::atlas_for(
            Atlas::new(routing_cache(model, base)?),
            route,
            0,
        )),
    })
}

/// A cache holding every expert, for routing draft pools outside the clock: a sibling of the
/// base cache when its slots fit in memory, else (a GGUF file larger than that) the file mapped
/// in place, as `--store ram` maps it.
fn routing_cache(model: &std::path::Path, base: &ExpertCache) -> Result<ExpertCache> {
    if base.arena_bytes(usize::MAX) <= crate::target::memory_budget()
        || !specfit_engine::gguf::is_gguf(model)
    {
        return Ok(base.sibling(usize::MAX, CacheMode::Lru)?);
    }
    let (_, cache) = specfit_engine::load_target(
        model,
        &specfit_engine::Tier::Ram,
        usize::MAX,
        CacheMode::Lru,
        None,
    )?;
    Ok(cache)
}

/// The slots of configuration `c`'s cache.
fn slots_of(c: &Config) -> (usize, CacheMode) {
    match c.slots {
        Slots::None => (usize::MAX, CacheMode::NoCache),
        Slots::Count(n) => (n, CacheMode::Lru),
    }
}

/// A configuration's cache (a sibling of the base cache) and verify policy.
fn runner(s: &Setup, c: &Config) -> Result<Runner> {
    let (slots, mode) = slots_of(c);
    let spec = PolicySpec {
        name: c.policy,
        max_nodes: s.max_nodes,
        lambda: None,
        beta_scale: c.beta_scale,
        drafter_probs: c.drafter_probs,
        calibration: Some(&s.calibration),
    };
    let mut cache = s.base.sibling(slots, mode)?;
    cache.set_layers_ahead(c.layers_ahead);
    Ok(Runner {
        cache,
        policy: verify_policy(&spec, s.model.config())?,
    })
}

/// Decodes one prompt under one configuration: its outcome and the selector's times of its
/// cycles.
fn run_one(s: &mut Setup, c: &Config, r: &mut Runner, prefix: &Prefix) -> Result<Run> {
    let options = DecodeOptions {
        max_tokens: s.max_tokens,
        stop: s.stop.clone(),
        read_ahead: c.read_ahead,
        ..DecodeOptions::default()
    };
    let routes = match (&c.routes, c.policy.needs_routes()) {
        (_, false) => Routes::None,
        (RouteChoice::Atlas, true) => {
            Routes::Atlas(atlas(&mut s.atlas, &s.model_path, &s.base, &c.routes)?)
        }
        (RouteChoice::Corrupt(_), true) => {
            Routes::Atlas(atlas(&mut s.corrupt, &s.model_path, &s.base, &c.routes)?)
        }
        (RouteChoice::Predictor(_), true) => match &s.predictor {
            Some(p) => Routes::Predictor(p),
            None => bail!("no route predictor loaded"),
        },
    };
    let speculation = Speculation {
        drafter: &s.drafter,
        policy: &mut r.policy,
        routes,
    };
    let start = Start::Prefix(prefix);
    let g = generate(&s.model, &mut r.cache, Some(speculation), start, &options)?;
    Ok((Outcome::of(&g), g.select_us))
}

#[cfg(test)]
mod tests {
    use super::plan::Slots;
    use super::{probe_slots, run_order};

    #[test]
    fn the_check_probes_at_each_cached_slot_point_once_default_first() {
        let points = [16, 64, 8, 16, 4].map(Slots::Count).into_iter();
        // 64 of 64 is the prober's all-resident cache; no cache is its emptied one.
        assert_eq!(
            probe_slots(points.chain([Slots::None]), 16, 64),
            vec![16, 8, 4]
        );
        assert_eq!(probe_slots([], 16, 64), vec![16]);
    }

    #[test]
    fn every_prompt_runs_each_configuration_once_in_its_own_order() {
        for seed in 0..50 {
            let mut order = run_order(21, seed);
            order.sort_unstable();
            assert_eq!(order, (0..21).collect::<Vec<_>>());
        }
        assert_eq!(run_order(21, 3), run_order(21, 3));
    }

    #[test]
    fn the_reference_configuration_follows_many_different_ones() {
        // A fixed cyclic order would run `ar` (config 0) right after the same config every time.
        let mut before_ar = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let order = run_order(21, seed);
            let at = order.iter().position(|&c| c == 0).unwrap();
            if at > 0 {
                before_ar.insert(order[at - 1]);
            }
        }
        assert!(before_ar.len() >= 10, "{before_ar:?}");
    }
}
