//! A prompt prefilled once so that many decodes can start from it: the target's KV cache over
//! every prompt token but the last and, for speculative decoding, the drafter's KV cache over
//! the same positions. It owns only that prefill state; each decode (plain in
//! [`crate::generate`], speculative in [`crate::spec`]) runs the last prompt token itself,
//! through its own expert cache. Because the forward is batch-invariant, prefix + last token
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
}

impl Prefix {
    /// Prefills `prompt` (all but its last token) through `experts`; with a drafter, also feeds
    /// the drafter the target's features of those positions.
    pub fn new(
        target: &Qwen3Moe,
        drafter: Option<&Eagle3>,
        experts: &mut ExpertCache,
        prompt: &[u32],
    ) -> Result<Prefix, EngineError> {
        let (&last, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
        let mut target_kv = target.new_kv_cache();
        let mut draft_kv = drafter.map(Eagle3::new_kv_cache);
        if !head.is_empty() {
            let taps = drafter.map_or(&[][..], Eagle3::taps);
            let batch = Batch {
                taps,
                logits: Logits::None,
                ..Batch::causal(head)
            };
            let out = target.forward(&batch, &mut target_kv, experts)?;
            if let (Some(drafter), Some(kv)) = (drafter, draft_kv.take()) {
                let h = target.config().hidden_size;
                let features = crate::spec::concat_taps(&out.taps, head.len(), h);
                // Drafter entry i reads token i+1 with the target's features of token i.
                let state =
                    crate::spec::feed_drafter(target, drafter, kv, &prompt[1..], &features, 0)?;
                draft_kv = Some(state.kv);
            }
        }
        Ok(Prefix {
            prompt_len: prompt.len(),
            last,
            target_kv,
            draft_kv,
        })
    }

    /// Length of the prompt this prefix was made from.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Whether the drafter's cache was prefilled too (needed for speculative decoding).
    pub fn has_drafter(&self) -> bool {
        self.draft_kv.is_some()
    }
}
