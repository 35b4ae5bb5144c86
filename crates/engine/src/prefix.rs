//! A prompt prefilled once so that many decodes can start from it: the target's KV cache over
//! every prompt token but the last and, for speculative decoding, the drafter's KV cache over
//! the same positions. It owns only that prefill state; each decode (plain or speculative, in
//! [`crate::spec::Decoder`]) runs the last prompt token itself, through its own expert cache. Because the forward is batch-invariant, prefix + last token
//! gives bit for bit what one prefill forward over the whole prompt gives.

use crate::batch::{Batch, Logits};
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::kv::KvCache;
use crate::model::{Eagle3, Qwen3Moe};

/// The prefill state of `prompt[..n-1]` (see the module docs).
#[derive(Debug, Clone)]
pub struct Prefix {
    pub(crate) prompt_len: usize,
    /// The prompt's last token, which each decode runs itself.
    pub(crate) last: u32,
    /// Target cache over `prompt[..n-1]`.
    pub(crate) target_kv: KvCache,
    /// Drafter cache over the same positions (tokens shifted by one, target features), when a
    /// drafter was given.
    pub(crate) draft_kv: Option<KvCache>,
    /// The whole prompt, to find what a later prompt shares with it.
    tokens: Vec<u32>,
}

impl Prefix {
    /// Prefills `prompt` (all but its last token) through `cache`; with a drafter, also feeds
    /// the drafter the target's features of those positions.
    pub fn new(
        target: &Qwen3Moe,
        drafter: Option<&Eagle3>,
        cache: &mut ExpertCache,
        prompt: &[u32],
    ) -> Result<Prefix, EngineError> {
        let target_kv = target.new_kv_cache();
        let draft_kv = drafter.map(Eagle3::new_kv_cache);
        fill(target, drafter, cache, prompt, target_kv, draft_kv)
    }

    /// The prefix of `prompt`, reusing this prefix's caches over the positions the two prompts
    /// share (a chat's earlier turns, a common system prompt) and running only the rest: bit for
    /// bit the prefix [`Prefix::new`] makes, because every position's cache entries depend only
    /// on the tokens up to it. With a drafter, the last shared position is run again (the
    /// drafter's entry there pairs it with the next token, whose features this prefix did not
    /// keep). A drafter given to one and not the other makes a fresh prefix. Consumes this
    /// prefix, so its caches are truncated in place rather than copied.
    pub fn extend(
        self,
        target: &Qwen3Moe,
        drafter: Option<&Eagle3>,
        cache: &mut ExpertCache,
        prompt: &[u32],
    ) -> Result<Prefix, EngineError> {
        if drafter.is_some() != self.draft_kv.is_some() {
            return Prefix::new(target, drafter, cache, prompt);
        }
        let keep = self.reusable(prompt);
        let (mut target_kv, mut draft_kv) = (self.target_kv, self.draft_kv);
        target_kv.truncate(keep)?;
        if let Some(kv) = draft_kv.as_mut() {
            kv.truncate(keep)?;
        }
        fill(target, drafter, cache, prompt, target_kv, draft_kv)
    }

    /// Positions of `prompt`'s prefix that [`Prefix::extend`] takes from this one.
    pub fn reusable(&self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let cached = self.tokens.len().saturating_sub(1);
        let needed = prompt.len().saturating_sub(1);
        let shared = if self.draft_kv.is_some() {
            common.saturating_sub(1)
        } else {
            common
        };
        shared.min(cached).min(needed)
    }

    /// Length of the prompt this prefix was made from.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Whether both hold the same prompt with bit-identical caches.
    pub fn same_state(&self, other: &Prefix) -> bool {
        let drafts = match (&self.draft_kv, &other.draft_kv) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same_entries(b),
            _ => false,
        };
        self.tokens == other.tokens && self.target_kv.same_entries(&other.target_kv) && drafts
    }

    /// Whether the drafter's cache was prefilled too (needed for speculative decoding).
    pub fn has_drafter(&self) -> bool {
        self.draft_kv.is_some()
    }
}

/// Runs `prompt[..n-1]` after the positions the caches already hold (the target's with the
/// drafter's taps; the drafter's with the new positions' features, each paired with the next
/// token) and returns the prefix.
fn fill(
    target: &Qwen3Moe,
    drafter: Option<&Eagle3>,
    cache: &mut ExpertCache,
    prompt: &[u32],
    mut target_kv: KvCache,
    mut draft_kv: Option<KvCache>,
) -> Result<Prefix, EngineError> {
    let (&last, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
    let done = target_kv.len();
    let fresh = &head[done..];
    if !fresh.is_empty() {
        let taps = drafter.map_or(&[][..], Eagle3::taps);
        let batch = Batch::causal(fresh)
            .with_taps(taps)
            .with_logits(Logits::None);
        let out = target.forward(&batch, &mut target_kv, cache)?;
        if let (Some(drafter), Some(kv)) = (drafter, draft_kv.take()) {
            let h = target.config().hidden_size;
            let features = crate::spec::concat_taps(&out.taps, fresh.len(), h);
            // Drafter entry i reads token i+1 with the target's features of token i.
            let state = crate::spec::feed_drafter(
                target,
                drafter,
                kv,
                &prompt[done + 1..],
                &features,
                done,
            )?;
            draft_kv = Some(state.kv);
        }
    }
    Ok(Prefix {
        prompt_len: prompt.len(),
        last,
        target_kv,
        draft_kv,
        tokens: prompt.to_vec(),
    })
}
