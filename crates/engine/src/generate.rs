//! Plain autoregressive decoding on the offloaded engine: prefill, then one forward per token,
//! with the copy counters and timings a user of offloaded MoE decoding wants to see. Speculative
//! decoding builds on the same pieces but is not here.

use std::time::Instant;

use crate::batch::{Batch, Logits};
use crate::cancel::Cancel;
use crate::error::EngineError;
use crate::experts::{ExpertCache, LayerStats};
use crate::kv::KvCache;
use crate::model::Qwen3Moe;
use crate::prefix::Prefix;
use crate::sampling::Sampler;

/// Settings of one generation.
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Stop after emitting any of these (the stop token is included in the output).
    pub stop: Vec<u32>,
    /// Teacher forcing: when not empty, the forward after the i-th emitted token is fed `feed[i]`
    /// instead of that token, so a benchmark decodes one fixed sequence whatever the model
    /// chooses (as llama-bench feeds its tokens). The tokens reported are still the ones chosen
    /// at each position. Needs at least `max_tokens - 1` ids.
    pub feed: Vec<u32>,
    /// Raised by someone else: stop after the token just emitted.
    pub cancel: Cancel,
}

/// What a generation produced and what it cost.
#[derive(Debug, Clone, Default)]
pub struct GenerateReport {
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    /// Wall time of the decode forwards (after prefill).
    pub decode_seconds: f64,
    /// Copies during prefill and during decoding.
    pub prefill_copies: LayerStats,
    pub decode_copies: LayerStats,
}

impl GenerateReport {
    /// Decoded tokens per second (the first token comes from the prefill forward).
    pub fn tokens_per_second(&self) -> f64 {
        let decoded = self.tokens.len().saturating_sub(1);
        if self.decode_seconds > 0.0 {
            decoded as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// Generates after `prompt`, calling `on_token` with each new token as soon as it is chosen.
pub fn generate(
    model: &Qwen3Moe,
    experts: &mut ExpertCache,
    prompt: &[u32],
    sampler: &mut Sampler,
    options: &GenerateOptions,
    on_token: impl FnMut(u32),
) -> Result<GenerateReport, EngineError> {
    if options.max_tokens == 0 {
        return Ok(GenerateReport {
            prompt_tokens: prompt.len(),
            ..GenerateReport::default()
        });
    }
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    check_feed(options)?;
    decode(
        model,
        experts,
        model.new_kv_cache(),
        prompt,
        sampler,
        options,
        on_token,
    )
}

/// [`generate`] from a prompt prefilled once ([`Prefix::new`]): runs the last prompt token
/// through `experts`, then decodes. Gives bit for bit what `generate` on the whole prompt
/// gives; `prefill_seconds` and `prefill_copies` cover the last token only.
pub fn generate_from(
    model: &Qwen3Moe,
    experts: &mut ExpertCache,
    prefix: &Prefix,
    sampler: &mut Sampler,
    options: &GenerateOptions,
    on_token: impl FnMut(u32),
) -> Result<GenerateReport, EngineError> {
    if options.max_tokens == 0 {
        return Ok(GenerateReport {
            prompt_tokens: prefix.prompt_len,
            ..GenerateReport::default()
        });
    }
    check_feed(options)?;
    let kv = prefix.target_kv.clone();
    let mut report = decode(
        model,
        experts,
        kv,
        &[prefix.last],
        sampler,
        options,
        on_token,
    )?;
    report.prompt_tokens = prefix.prompt_len;
    Ok(report)
}

/// Refuses a teacher-forced decode with fewer fed ids than forwards after the prefill.
fn check_feed(options: &GenerateOptions) -> Result<(), EngineError> {
    let needed = options.max_tokens.saturating_sub(1);
    if options.feed.is_empty() || options.feed.len() >= needed {
        Ok(())
    } else {
        Err(EngineError::FeedTooShort {
            feed: options.feed.len(),
            needed,
        })
    }
}

/// Runs `fresh` (the prompt tokens not yet in `kv`) as the prefill forward, then one forward
/// per generated token.
fn decode(
    model: &Qwen3Moe,
    experts: &mut ExpertCache,
    mut kv: KvCache,
    fresh: &[u32],
    sampler: &mut Sampler,
    options: &GenerateOptions,
    mut on_token: impl FnMut(u32),
) -> Result<GenerateReport, EngineError> {
    let mut report = GenerateReport {
        prompt_tokens: fresh.len(),
        ..GenerateReport::default()
    };
    let start = Instant::now();
    let out = model.forward(
        &Batch {
            logits: Logits::Last,
            ..Batch::causal(fresh)
        },
        &mut kv,
        experts,
    )?;
    report.prefill_seconds = start.elapsed().as_secs_f64();
    report.prefill_copies = out.copies.total;
    let mut next = sampler.sample(out.row(0));
    let start = Instant::now();
    let before = experts.stats().clone();
    loop {
        report.tokens.push(next);
        on_token(next);
        let done = report.tokens.len() >= options.max_tokens || options.stop.contains(&next);
        if done || options.cancel.is_cancelled() {
            break;
        }
        let input = options
            .feed
            .get(report.tokens.len() - 1)
            .copied()
            .unwrap_or(next);
        let out = model.forward(&Batch::causal(&[input]), &mut kv, experts)?;
        next = sampler.sample(out.row(0));
    }
    report.decode_seconds = start.elapsed().as_secs_f64();
    report.decode_copies = experts.stats().since(&before).total;
    Ok(report)
}
