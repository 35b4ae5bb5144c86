//! `specfit generate`: plain decoding on the offloaded engine, streaming text, then tok/s,
//! prefill time and the expert copies per token.

use std::io::Write;

use anyhow::{ensure, Result};
use specfit_engine::{generate, GenerateOptions, GenerationConfig, Sampler, Sampling, Tokenizer};

use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// The prompt text.
    #[arg(
        long,
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids (no tokenizer needed; output is printed as ids).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
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
    let tokenizer = match args.prompt {
        Some(_) => Some(Tokenizer::load(&args.target.model)?),
        None => None,
    };
    let (model, mut cache) = args.target.load()?;
    let prompt = match (&tokenizer, &args.prompt, &args.prompt_ids) {
        (Some(tok), Some(text), _) => {
            let text = if args.chat {
                tok.chat_prompt(text)?
            } else {
                text.clone()
            };
            tok.encode(&text)?
        }
        (_, _, Some(ids)) => ids.clone(),
        _ => unreachable!("clap requires --prompt or --prompt-ids"),
    };
    ensure!(!prompt.is_empty(), "the prompt encodes to no tokens");
    let mut stop = GenerationConfig::load(&args.target.model)?
        .eos_token_id
        .or(model.config().eos_token_id.clone())
        .map(|t| t.to_vec())
        .unwrap_or_default();
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
    let rule = if args.temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::TopP {
            temperature: args.temperature,
            top_p: args.top_p,
        }
    };
    let mut sampler = Sampler::new(rule, args.seed);
    let options = GenerateOptions {
        max_tokens: args.max_tokens,
        stop,
    };
    let mut out = std::io::stdout().lock();
    let mut ids = Vec::new();
    let mut shown = 0;
    let mut stream_error = None;
    let report = generate(&model, &mut cache, &prompt, &mut sampler, &options, |tok| {
        ids.push(tok);
        let Some(tokenizer) = &tokenizer else {
            let _ = write!(out, "{}{tok}", if ids.len() > 1 { "," } else { "" });
            let _ = out.flush();
            return;
        };
        match tokenizer.decode(&ids) {
            Ok(text) if text.len() > shown && text.is_char_boundary(shown) => {
                let _ = write!(out, "{}", &text[shown..]);
                let _ = out.flush();
                shown = text.len();
            }
            Ok(_) => {}
            Err(e) => stream_error = Some(e),
        }
    })?;
    writeln!(out)?;
    out.flush()?;
    drop(out);
    if let Some(e) = stream_error {
        return Err(e.into());
    }
    let d = &report.decode_copies;
    let decoded = report.tokens.len().saturating_sub(1).max(1) as f64;
    eprintln!(
        "{} tokens, {:.2} tok/s decode; prefill {} tokens in {:.1} ms",
        report.tokens.len(),
        report.tokens_per_second(),
        report.prompt_tokens,
        report.prefill_seconds * 1e3
    );
    eprintln!(
        "experts ({}, {} slots/layer{}): per decoded token {:.1} hits, {:.1} misses, {:.2} MiB copied; waiting for copies took {:.0}% of decode time",
        cache.tier(),
        cache.slots_per_layer(),
        if args.target.clear_cache { ", cleared every forward" } else { "" },
        d.hits as f64 / decoded,
        d.misses as f64 / decoded,
        d.bytes_copied as f64 / decoded / (1 << 20) as f64,
        if report.decode_seconds > 0.0 { 100.0 * d.wait_seconds / report.decode_seconds } else { 0.0 }
    );
    if d.copy_seconds > 0.0 {
        eprintln!(
            "expert reads: {:.0} MiB/s per read, {:.1} ms of reads and {:.1} ms of waiting per decoded token",
            d.bytes_copied as f64 / d.copy_seconds / (1 << 20) as f64,
            1e3 * d.copy_seconds / decoded,
            1e3 * d.wait_seconds / decoded
        );
    }
    Ok(())
}
