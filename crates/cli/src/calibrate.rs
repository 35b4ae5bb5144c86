//! `specfit calibrate`: measures probe forwards on the engine (random ancestor-closed subtrees of
//! pools drafted on calibration prompts, from the LRU cache state and from an emptied cache),
//! fits the cost model by NNLS and saves it next to the model; or, with `--probes`, fits probe
//! rows measured earlier (`specfit probe`). Prints the fit quality either way.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use specfit_engine::spec::{probe, ProbeCache, ProbePlan, TreeShape};
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe, Tokenizer};
use specfit_selector::json::{read_probes, CalibrationJson, DraftingJson};
use specfit_selector::{calibrate, Calibration, Probe};

use crate::files::{read_text, write_atomic};
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
    /// Probe forwards per prompt.
    #[arg(long, default_value_t = 32)]
    cycles: usize,
    /// Largest verified subtree (K).
    #[arg(long, default_value_t = 7)]
    max_nodes: usize,
}

/// The shape a calibration is valid for.
pub fn target_stamp(
    cfg: &specfit_engine::Qwen3MoeConfig,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("moe_layers".into(), cfg.moe_layers().len().into());
    m.insert("experts".into(), cfg.num_experts.into());
    m.insert("num_experts_per_tok".into(), cfg.num_experts_per_tok.into());
    m.insert("hidden_size".into(), cfg.hidden_size.into());
    m.insert("vocab_size".into(), cfg.vocab_size.into());
    m
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
            file.drafting = drafting;
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

/// Fits probe rows read from a file.
fn from_rows(probes: &Path, model: Option<&Path>) -> Result<CalibrationJson> {
    let text = read_text(probes)?;
    let rows = read_probes(&text).with_context(|| format!("{}", probes.display()))?;
    let cal = calibrate(&rows).with_context(|| format!("{}", probes.display()))?;
    print_fit(&cal);
    let mut file = CalibrationJson::new(&cal);
    if let Some(dir) = model {
        file.target = Some(target_stamp(&specfit_engine::Qwen3MoeConfig::load(dir)?));
    }
    Ok(file)
}

/// Loads what `args` names and measures; returns the calibration and its default path.
fn measure_from_args(args: &Args) -> Result<(CalibrationJson, PathBuf)> {
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
    let prompts = match &args.prompts {
        Some(path) => read_prompts(path, &tokenizer)?,
        None => default_prompts(&tokenizer)?,
    };
    let plan = Plan {
        cycles: args.cycles,
        max_nodes: args.max_nodes,
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
        prompts.extend(read_prompts(&path, tokenizer)?);
    }
    Ok(prompts)
}

/// Calibration prompts: a JSON Lines file with a "question" per line, rendered as chat.
pub fn read_prompts(path: &Path, tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>> {
    use crate::prompt::{chat_tokens, read_jsonl, user_turn};
    read_jsonl(path, usize::MAX, |v, at| {
        chat_tokens(tokenizer, user_turn(v, at)?, at)
    })
}

/// How much to probe.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub cycles: usize,
    pub max_nodes: usize,
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
    ensure!(plan.cycles > 0, "--cycles must be positive");
    // Prompt `i` probes with seed `i`, in every cache state.
    let probe_plan = |i: usize, cache: ProbeCache| ProbePlan {
        shape: TreeShape::default(),
        max_nodes: plan.max_nodes,
        cycles: plan.cycles,
        seed: i as u64,
        cache,
    };
    let mut rows = Vec::new();
    let mut engine_rows = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        for r in probe(
            model,
            drafter,
            cache,
            prompt,
            &probe_plan(i, ProbeCache::LruAndCleared),
        )? {
            engine_rows.push(r);
            rows.push(Probe {
                nodes: r.nodes,
                demand: r.demand,
                ms: r.ms,
                hits_misses: Some((r.hits, r.misses)),
            });
        }
    }
    let cal = calibrate(&rows)?;
    print_fit(&cal);
    let mut steps = Vec::new();
    for prompt in prompts {
        steps.extend(plain_steps(model, cache, prompt, 16)?);
    }
    // Plain steps with every expert copied (the no-cache end of the sweep) tell the per-layer
    // read latency apart from the per-copy cost.
    let mut cleared = cache.sibling(usize::MAX, specfit_engine::CacheMode::ClearEveryForward)?;
    for prompt in prompts.iter().skip(1).step_by(3) {
        steps.extend(plain_steps(model, &mut cleared, prompt, 16)?);
    }
    // For the replay model, also forwards with every expert resident (hits only), which tell
    // the per-hit cost apart from the node-count intercepts.
    let mut resident = cache.sibling(usize::MAX, specfit_engine::CacheMode::Lru)?;
    let mut replay_rows = engine_rows.clone();
    for (i, prompt) in prompts.iter().enumerate().filter(|(i, _)| i % 3 == 2) {
        // A first pass reads the prompt's experts in; the second's forwards are then (almost
        // all) all-resident, and only those are kept.
        let lru = probe_plan(i, ProbeCache::Lru);
        probe(model, drafter, &mut resident, prompt, &lru)?;
        let warm = probe(model, drafter, &mut resident, prompt, &lru)?;
        replay_rows.extend(warm.into_iter().filter(|r| r.misses == 0));
        steps.extend(
            plain_steps(model, &mut resident, prompt, 16)?
                .into_iter()
                .filter(|s| s.misses == 0),
        );
    }
    let mut file = CalibrationJson::new(&cal);
    file.replay = Some(replay_fit(&replay_rows, &steps, plan.max_nodes)?);
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
            steps.len(),
            p.r2,
            p.median_abs_err_ms,
            p.intercept,
            p.beta_hit,
            p.beta_miss,
            p.read_round_ms,
            p.context_ms
        );
    }
    let mut stamp = target_stamp(model.config());
    stamp.insert("tier".into(), crate::target::tier_key(cache).into());
    stamp.insert("slots".into(), cache.slots_per_layer().into());
    file.target = Some(stamp);
    file.drafting = Some(drafting_fit(&engine_rows)?);
    let d = file.drafting.as_ref().expect("just set");
    eprintln!(
        "drafting: {:.3} ms per drafted level (+{:.2e} ms per cached token), feeding the drafter {:.3} ms + {:.3} ms per committed token (+{:.2e} ms per cached token)",
        d.ms_per_level, d.level_context_ms, d.feed_ms, d.feed_ms_per_token, d.feed_context_ms
    );
    Ok(file)
}

/// Drafting costs from probe rows by NNLS: each drafted level past the first costs
/// `ms_per_level + level_context_ms · c`, and feeding `t` committed tokens back costs
/// `feed_ms + (feed_ms_per_token + feed_context_ms · c) · t` (`c` tokens cached).
pub fn drafting_fit(rows: &[specfit_engine::spec::ProbeRow]) -> Result<DraftingJson> {
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
    let (level, _) = nnls_fit(&levels)?;
    let (feed, _) = nnls_fit(&feeds)?;
    Ok(DraftingJson {
        ms_per_level: level[0],
        level_context_ms: level[1],
        feed_ms: feed[0],
        feed_ms_per_token: feed[1],
        feed_context_ms: feed[2],
    })
}

/// A least-squares fit with non-negative coefficients of `ms ≈ row · x` and its quality (R²,
/// median absolute error), by [`specfit_selector::nnls::nnls_scaled`]. Timing noise on a
/// shared machine is one-sided (a preempted forward is only ever slower), so rows measured more
/// than 5 median absolute errors above their prediction are dropped once and the fit repeated;
/// the quality is reported on every row.
pub fn nnls_fit(rows: &[(Vec<f64>, f64)]) -> Result<(Vec<f64>, (f64, f64))> {
    let cols = rows.first().map_or(0, |r| r.0.len());
    ensure!(
        rows.len() > cols && cols > 0,
        "too few measurements ({}) to fit {cols} costs",
        rows.len()
    );
    let solve = |keep: &[bool]| -> Result<Vec<f64>> {
        let kept: Vec<&(Vec<f64>, f64)> = rows
            .iter()
            .zip(keep)
            .filter(|(_, &k)| k)
            .map(|(r, _)| r)
            .collect();
        let a: Vec<f64> = kept.iter().flat_map(|r| r.0.iter().copied()).collect();
        let b: Vec<f64> = kept.iter().map(|r| r.1).collect();
        Ok(specfit_selector::nnls::nnls_scaled(
            specfit_selector::nnls::Matrix {
                data: &a,
                rows: b.len(),
                cols,
            },
            &b,
        )?)
    };
    let predict = |x: &[f64]| -> Vec<f64> {
        rows.iter()
            .map(|r| r.0.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let measured: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let mut x = solve(&vec![true; rows.len()])?;
    let (_, median) = specfit_selector::calibrate::quality(&measured, &predict(&x));
    let keep: Vec<bool> = measured
        .iter()
        .zip(predict(&x))
        .map(|(m, p)| m - p <= 5.0 * median)
        .collect();
    if keep.iter().filter(|&&k| k).count() > cols {
        x = solve(&keep)?;
    }
    let quality = specfit_selector::calibrate::quality(&measured, &predict(&x));
    Ok((x, quality))
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

/// One timed plain-decoding forward.
#[derive(Debug, Clone, Copy)]
pub struct PlainStep {
    pub hits: u64,
    pub misses: u64,
    /// Read rounds ([`specfit_engine::CopyStats::read_rounds`]).
    pub read_rounds: usize,
    pub context: usize,
    pub ms: f64,
}

/// Prefills `prompt`, then times `n` greedy one-token forwards through `cache`.
fn plain_steps(
    model: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<PlainStep>> {
    use specfit_engine::{Batch, Logits};
    let mut kv = model.new_kv_cache();
    let batch = Batch {
        logits: Logits::Last,
        ..Batch::causal(prompt)
    };
    let mut next = model.forward(&batch, &mut kv, cache)?.argmax(0);
    let mut steps = Vec::with_capacity(n);
    for _ in 0..n {
        let context = kv.len();
        let t = std::time::Instant::now();
        let out = model.forward(&Batch::causal(&[next]), &mut kv, cache)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        next = out.argmax(0);
        steps.push(PlainStep {
            hits: out.copies.total.hits,
            misses: out.copies.total.misses,
            read_rounds: out.copies.read_rounds(cache.read_width()),
            context,
            ms,
        });
    }
    Ok(steps)
}

/// The replay model (see `ReplayJson`): verify probes fitted by NNLS on one-hot node counts,
/// hits, misses, read rounds (per layer ⌈misses / reads in flight⌉, summed) and (verified tokens ×
/// cached tokens); plain steps fitted apart on 1, hits, misses, read rounds and cached tokens.
pub fn replay_fit(
    probes: &[specfit_engine::spec::ProbeRow],
    steps: &[PlainStep],
    max_nodes: usize,
) -> Result<specfit_selector::json::ReplayJson> {
    let k = max_nodes.max(probes.iter().map(|p| p.nodes).max().unwrap_or(0));
    let verify: Vec<(Vec<f64>, f64)> = probes
        .iter()
        .map(|p| {
            let mut row = vec![0.0; k + 5];
            row[p.nodes] = 1.0;
            row[k + 1] = p.hits as f64;
            row[k + 2] = p.misses as f64;
            row[k + 3] = p.read_rounds as f64;
            row[k + 4] = ((p.nodes + 1) * p.context) as f64;
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
            ];
            (row, s.ms)
        })
        .collect();
    let (x, (r2, median_abs_err_ms)) = nnls_fit(&verify)?;
    let (y, (plain_r2, plain_median)) = nnls_fit(&plain)?;
    Ok(specfit_selector::json::ReplayJson {
        intercepts: x[..=k].to_vec(),
        ar_intercept: y[0],
        beta_hit: x[k + 1],
        beta_miss: x[k + 2],
        read_round_ms: x[k + 3],
        read_width: specfit_engine::experts::reads_in_flight(),
        context_ms: x[k + 4],
        r2,
        median_abs_err_ms,
        plain: Some(specfit_selector::json::PlainJson {
            intercept: y[0],
            beta_hit: y[1],
            beta_miss: y[2],
            read_round_ms: y[3],
            context_ms: y[4],
            r2: plain_r2,
            median_abs_err_ms: plain_median,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specfit_engine::spec::ProbeRow;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * (1.0 + b.abs())
    }

    /// Probe rows and plain steps generated exactly by known coefficients, over a spread of node
    /// counts, hits, misses, read rounds, contexts and drafting work.
    fn synthetic() -> (Vec<ProbeRow>, Vec<PlainStep>) {
        let mut probes = Vec::new();
        let mut steps = Vec::new();
        for i in 0..240usize {
            let nodes = i % 8;
            let (hits, misses) = ((i * 7 % 23) as u64, (i * 5 % 17) as u64);
            let read_rounds = (misses as usize).min(8).max(usize::from(misses > 0))
                - (i % 2).min(misses as usize / 9);
            let context = 20 + (i * 37 % 900);
            let ms = 0.5
                + 0.2 * nodes as f64
                + 0.01 * hits as f64
                + 0.06 * misses as f64
                + 0.08 * read_rounds as f64
                + 0.001 * ((nodes + 1) * context) as f64;
            let (forwards, fed) = (i % 5, 1 + i % 4);
            probes.push(ProbeRow {
                nodes,
                demand: hits + misses,
                hits,
                misses,
                read_rounds,
                ms,
                draft_forwards: forwards,
                draft_ms: forwards as f64 * (0.4 + 2e-4 * context as f64),
                fed,
                feed_ms: 0.13 + fed as f64 * (0.04 + 1e-4 * context as f64),
                context,
            });
            steps.push(PlainStep {
                hits,
                misses,
                read_rounds,
                context,
                ms: 0.3
                    + 0.005 * hits as f64
                    + 0.05 * misses as f64
                    + 0.07 * read_rounds as f64
                    + 0.0012 * context as f64,
            });
        }
        (probes, steps)
    }

    #[test]
    fn the_replay_fit_recovers_the_coefficients_that_generated_the_rows() {
        let (probes, steps) = synthetic();
        let r = replay_fit(&probes, &steps, 7).unwrap();
        for (n, a) in r.intercepts.iter().enumerate() {
            assert!(close(*a, 0.5 + 0.2 * n as f64), "a[{n}] = {a}");
        }
        assert!(close(r.beta_hit, 0.01) && close(r.beta_miss, 0.06), "{r:?}");
        assert!(
            close(r.read_round_ms, 0.08) && close(r.context_ms, 0.001),
            "{r:?}"
        );
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
        assert!(r.r2 > 0.999999 && p.r2 > 0.999999);
    }

    #[test]
    fn the_drafting_fit_recovers_level_and_feed_costs_with_their_context_terms() {
        let (probes, _) = synthetic();
        let d = drafting_fit(&probes).unwrap();
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
        let (x, (r2, _)) = nnls_fit(&noisy).unwrap();
        assert!(close(x[0], 0.5) && close(x[1], 0.1), "{x:?}");
        // The quality is still reported over every row, the outlier included.
        assert!(r2 < 0.5, "{r2}");
    }

    #[test]
    fn too_few_measurements_are_refused() {
        let rows = vec![(vec![1.0, 2.0], 1.0), (vec![1.0, 3.0], 2.0)];
        assert!(nnls_fit(&rows).is_err());
        assert!(nnls_fit(&[]).is_err());
    }
}
