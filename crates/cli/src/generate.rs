//! `specfit generate`: plain or speculative decoding on the offloaded engine, streaming text,
//! then tok/s, prefill time, the cycles of a speculative decode and the expert copies per token.

use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Result};
use specfit_engine::policy::{verify_policy, PolicyName, PolicySpec};
use specfit_engine::spec::{Routes, Speculation, Start, TokenSink};
use specfit_engine::{
    generate, DecodeOptions, DecodeStats, ExpertCache, Qwen3Moe, Sampling, TextDecoder, Tokenizer,
};

use crate::policy::{self, RouteChoice};
use crate::prompt::PromptArgs;
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Do not stop at end-of-sequence tokens (for timing a fixed number of tokens).
    #[arg(long)]
    ignore_eos: bool,
    /// Wrap the prompt in the checkpoint's chat template (ChatML).
    #[arg(long)]
    chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (with --temperature > 0).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decode speculatively with this EAGLE-3 drafter directory (alone: the shipped drafter);
    /// greedy or sampled, the output is the same as without.
    #[arg(long, num_args = 0..=1, value_name = "DIR")]
    drafter: Option<Option<std::path::PathBuf>>,
    #[command(flatten)]
    drafter_dtype: crate::drafter::DrafterDtypeArg,
    /// With --drafter: which draft nodes to verify each cycle.
    #[arg(long, value_parser = policy::parse_policy(), default_value = "eagle3", requires = "drafter")]
    policy: PolicyName,
    #[command(flatten)]
    tree: crate::tree::TreeArgs,
    /// Cost calibration for the specfit policies (default: the one `specfit calibrate` saved
    /// next to the model for this tier).
    #[arg(long)]
    calibration: Option<std::path::PathBuf>,
    /// λ of the specfit-lambda policy, in tokens per ms (default: the plain-decoding token rate
    /// the calibration predicts).
    #[arg(long)]
    lambda: Option<f64>,
    /// Route source of the specfit policies: `atlas`; `corrupt:P` (atlas routes with each expert
    /// replaced at random with probability P, the paper's degraded-predictor experiment); or
    /// `predictor:FILE` (a head from `specfit train-predictor`).
    #[arg(long, default_value = "atlas")]
    routes: String,
    /// Before each verify forward, start reading every layer's missing experts that the route
    /// source expects the chosen subtree to use, so that the layers' reads overlap (specfit
    /// policies; outputs are unchanged).
    #[arg(long)]
    read_ahead: bool,
    /// Teacher forcing, for benchmarks: feed these comma-separated ids, one per forward after
    /// the prefill, instead of the tokens chosen (as llama-bench feeds its tokens), so every run
    /// decodes the same sequence whatever the model chooses; the tokens printed are the ones
    /// chosen at each position. Needs at least --max-tokens − 1 ids; plain decoding only.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "IDS",
        conflicts_with = "drafter"
    )]
    feed_ids: Option<Vec<u32>>,
}

/// The ids of --feed-ids, checked against the vocabulary and --max-tokens.
fn feed_ids(args: &Args, cfg: &specfit_engine::Qwen3MoeConfig) -> Result<Vec<u32>> {
    let Some(ids) = &args.feed_ids else {
        return Ok(Vec::new());
    };
    if let Some((i, id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= cfg.vocab_size)
    {
        anyhow::bail!(
            "--feed-ids: id {id} (number {}) is outside the vocabulary (vocab_size = {})",
            i + 1,
            cfg.vocab_size
        );
    }
    let needed = args.max_tokens.saturating_sub(1);
    ensure!(
        ids.len() >= needed,
        "--feed-ids gives {} ids; --max-tokens {} needs {needed} (one per forward after the prefill)",
        ids.len(),
        args.max_tokens
    );
    Ok(ids.clone())
}

/// Refuses a decode that would run past the model's positions (`max_position_embeddings`): the
/// prompt, the generated tokens and, with a drafter, the draft tree below the last one. Checked
/// here, before any calibration or atlas is built, as well as in the engine.
fn check_context(cfg: &specfit_engine::Qwen3MoeConfig, prompt: usize, args: &Args) -> Result<()> {
    let tree = if args.drafter.is_some() && args.policy != PolicyName::Ar {
        args.tree.levels
    } else {
        0
    };
    specfit_engine::spec::check_context(cfg, prompt, args.max_tokens, tree)?;
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(
        args.temperature.is_finite() && args.temperature >= 0.0,
        "--temperature {} must be >= 0",
        args.temperature
    );
    ensure!(
        args.top_p > 0.0 && args.top_p <= 1.0,
        "--top-p {} must be in (0, 1]",
        args.top_p
    );
    ensure!(
        !args.read_ahead || (args.drafter.is_some() && args.policy.needs_routes()),
        "--read-ahead needs --drafter and a specfit policy (it reads ahead on the policy's routes)"
    );
    let tokenizer = args.prompt.tokenizer(&args.target.model)?;
    let (model, mut cache) = args.target.load()?;
    let prompt = args.prompt.tokens(tokenizer.as_ref(), args.chat)?;
    check_context(model.config(), prompt.len(), args)?;
    let mut stop = crate::target::eos_tokens(&args.target.model, model.config())?;
    if let Some(end) = tokenizer
        .as_ref()
        .and_then(|t| t.token_id("<|im_end|>"))
        .filter(|_| args.chat)
    {
        stop.push(end);
    }
    if args.ignore_eos {
        stop.clear();
    }
    let printer = Arc::new(Mutex::new(Printer::new(tokenizer)));
    let sink = {
        let printer = printer.clone();
        move |tok| printer.lock().unwrap_or_else(|e| e.into_inner()).token(tok)
    };
    let options = DecodeOptions {
        max_tokens: args.max_tokens,
        stop,
        sampling: Sampling::from_temperature(args.temperature, args.top_p),
        seed: args.seed,
        on_token: Some(TokenSink(Arc::new(sink))),
        feed: feed_ids(args, model.config())?,
        shape: args.tree.shape()?,
        read_ahead: args.read_ahead,
        ..DecodeOptions::default()
    };
    let stats = match &args.drafter {
        Some(dir) if args.policy != PolicyName::Ar => {
            let dir = dir.clone().unwrap_or_else(crate::paths::drafter);
            speculate(args, &dir, &model, &mut cache, &prompt, &options)?
        }
        _ => generate(&model, &mut cache, None, Start::Prompt(&prompt), &options)?,
    };
    printer.lock().unwrap_or_else(|e| e.into_inner()).finish()?;
    summary(&stats, &cache, args.target.no_cache());
    Ok(())
}

/// EAGLE-3 tree decoding under `--policy`, on `--routes`.
fn speculate(
    args: &Args,
    dir: &std::path::Path,
    model: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    options: &DecodeOptions,
) -> Result<DecodeStats> {
    let drafter = args.drafter_dtype.load(dir, model)?;
    // A SpecFit policy reads --calibration, else the one `specfit calibrate` saved next to the model.
    let saved =
        crate::paths::calibration(&args.target.model, specfit_engine::policy::tier_key(cache));
    let calibration = match &args.calibration {
        Some(path) => Some(crate::policy::calibration(path, model, &drafter, cache)?),
        None if args.policy.needs_routes() && saved.exists() => {
            Some(crate::policy::calibration(&saved, model, &drafter, cache)?)
        }
        None if args.policy.needs_routes() => anyhow::bail!(
            "--policy {} needs --calibration FILE, or a calibration saved at {} (run `specfit calibrate`)",
            args.policy.name(),
            saved.display()
        ),
        None => None,
    };
    let max_nodes = args.tree.nodes.max_nodes;
    let spec = PolicySpec::command(args.policy, max_nodes, args.lambda, calibration.as_ref());
    let mut policy = verify_policy(&spec, model.config())?;
    let route = RouteChoice::parse(&args.routes)?;
    let predictor = match &route {
        RouteChoice::Predictor(path) if args.policy.needs_routes() => {
            Some(policy::load_predictor(path, model, &drafter)?)
        }
        _ => None,
    };
    // The atlas routes the pool with all experts resident, in RAM, outside the timer.
    let mut atlas = match &route {
        RouteChoice::Atlas | RouteChoice::Corrupt(_) if args.policy.needs_routes() => {
            Some(policy::atlas_for(args.target.atlas()?, &route, args.seed))
        }
        _ => None,
    };
    let routes = match (atlas.as_mut(), predictor.as_ref()) {
        (Some(a), _) => Routes::Atlas(a),
        (None, Some(p)) => Routes::Predictor(p),
        (None, None) => Routes::None,
    };
    let speculation = Speculation {
        drafter: &drafter,
        policy: &mut policy,
        routes,
    };
    Ok(generate(
        model,
        cache,
        Some(speculation),
        Start::Prompt(prompt),
        options,
    )?)
}

/// Prints tok/s and prefill time, the cycles of a speculative decode, and the expert copies per
/// decoded token.
fn summary(s: &DecodeStats, cache: &ExpertCache, cleared: bool) {
    eprintln!(
        "{} tokens, {:.2} tok/s decode; prefill {} tokens in {:.1} ms",
        s.tokens.len(),
        s.tokens_per_second(),
        s.prompt_tokens,
        s.prefill_seconds * 1e3
    );
    let cycles = s.cycles.max(1) as f64;
    if s.plain_steps < s.cycles {
        eprintln!(
            "{} cycles ({} of them plain steps): {:.2} draft nodes verified and {:.2} tokens committed per cycle; cycle {:.2} ms = draft {:.2} ({:.2} levels) + select {:.3} + verify {:.2}",
            s.cycles,
            s.plain_steps,
            s.verified_nodes as f64 / cycles,
            s.tokens_per_cycle(),
            1e3 * s.decode_seconds / cycles,
            1e3 * s.draft_seconds / cycles,
            s.drafted_levels as f64 / cycles,
            1e3 * s.select_seconds / cycles,
            1e3 * s.verify_seconds / cycles
        );
        eprintln!(
            "draft tokens accepted per cycle (0, 1, 2, …): {:?}",
            s.accept_counts
        );
    }
    let mut us = s.select_us.clone();
    if !us.is_empty() {
        us.sort_by(f64::total_cmp);
        eprintln!(
            "{} subtree searches: selection median {:.2} µs (max {:.2} µs)",
            us.len(),
            us[us.len() / 2],
            us[us.len() - 1]
        );
    }
    if s.atlas_seconds > 0.0 {
        eprintln!(
            "atlas routing of the draft pools (outside the timer): {:.1} ms per cycle",
            1e3 * s.atlas_seconds / cycles
        );
    }
    let c = &s.copies;
    let decoded = s.tokens.len().saturating_sub(1).max(1) as f64;
    eprintln!(
        "experts ({}, {} slots/layer{}): per decoded token {:.1} hits, {:.1} misses, {:.2} MiB copied; waiting for copies took {:.0}% of decode time",
        cache.tier(),
        cache.slots_per_layer(),
        if cleared { ", cleared every forward" } else { "" },
        c.hits as f64 / decoded,
        c.misses as f64 / decoded,
        c.bytes_copied as f64 / decoded / (1 << 20) as f64,
        if s.decode_seconds > 0.0 { 100.0 * c.wait_seconds / s.decode_seconds } else { 0.0 }
    );
    if c.copy_seconds > 0.0 {
        eprintln!(
            "expert reads: {:.0} MiB/s per read, {:.1} ms of reads and {:.1} ms of waiting per decoded token",
            c.bytes_copied as f64 / c.copy_seconds / (1 << 20) as f64,
            1e3 * c.copy_seconds / decoded,
            1e3 * c.wait_seconds / decoded
        );
    }
    if c.predicted > 0 {
        let per_layer: Vec<String> = cache
            .stats()
            .per_layer
            .iter()
            .map(|l| {
                format!(
                    "{:.0}/{:.0}",
                    100.0 * l.predicted_right as f64 / l.predicted.max(1) as f64,
                    100.0 * l.predicted_right as f64 / l.predicted_needed.max(1) as f64
                )
            })
            .collect();
        eprintln!(
            "layer-ahead routes: precision {:.1}%, recall {:.1}%; per layer precision/recall %: {}",
            100.0 * c.predicted_right as f64 / c.predicted as f64,
            100.0 * c.predicted_right as f64 / c.predicted_needed.max(1) as f64,
            per_layer.join(" ")
        );
    }
    if c.read_ahead > 0 {
        eprintln!(
            "read-ahead: {:.1} of the misses per decoded token were read ahead, {:.0}% of them used",
            c.read_ahead as f64 / decoded,
            100.0 * c.ahead_used as f64 / c.read_ahead as f64
        );
    }
}

/// Prints committed tokens as they arrive: decoded text when there is a tokenizer (whole
/// characters only, decoded incrementally by [`TextDecoder`]), else comma-separated ids.
struct Printer {
    tokenizer: Option<Tokenizer>,
    text: TextDecoder,
    printed: usize,
    error: Option<specfit_engine::EngineError>,
}

impl Printer {
    fn new(tokenizer: Option<Tokenizer>) -> Printer {
        Printer {
            tokenizer,
            text: TextDecoder::new(),
            printed: 0,
            error: None,
        }
    }

    /// Prints one token (its text as soon as its characters are whole).
    fn token(&mut self, tok: u32) {
        let mut out = std::io::stdout().lock();
        match &self.tokenizer {
            None => {
                let _ = write!(out, "{}{tok}", if self.printed > 0 { "," } else { "" });
            }
            Some(t) => match self.text.push(t, tok) {
                Ok(text) => {
                    let _ = write!(out, "{text}");
                }
                Err(e) => {
                    self.error.get_or_insert(e);
                }
            },
        }
        self.printed += 1;
        let _ = out.flush();
    }

    /// Prints the rest of the text and a new line; the first decoding error, if any.
    fn finish(&mut self) -> Result<()> {
        let mut out = std::io::stdout().lock();
        if let (Some(t), None) = (&self.tokenizer, &self.error) {
            let text = self.text.finish(t)?;
            write!(out, "{text}")?;
        }
        writeln!(out)?;
        out.flush()?;
        match self.error.take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
