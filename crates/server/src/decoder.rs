//! The engine behind the server: the target with its expert cache and, for speculative policies,
//! the EAGLE-3 drafter with its verify policy and route source, decoding one request at a time.
//! Each request extends the previous request's prefill over the prompt positions they share (a
//! chat's earlier turns, a common system prompt), which changes no output bit. Token ids in,
//! token ids out; it knows nothing of HTTP, text or queues.

use specfit_engine::predictor::RoutePredictor;
use specfit_engine::spec::{Atlas, Routes, Start, TokenSink, TreeShape};
use specfit_engine::{
    generate, Cancel, DecodeOptions, Eagle3, EngineError, ExpertCache, Prefix, Qwen3Moe,
    Qwen3MoeConfig, Sampling, VerifyPolicy,
};

/// One decode: the prompt's ids and how to continue it.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Token ids that end the decode (emitted, then stop).
    pub stop: Vec<u32>,
}

/// What one request's decode did and cost (the `specfit` extension object of a response).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RequestStats {
    pub prompt_tokens: usize,
    /// Prompt positions taken from the previous request's prefill (the prompt cache).
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Draft–verify cycles (plain decoding: one per decoded token after the first).
    pub cycles: usize,
    /// Draft nodes verified, summed over cycles.
    pub verified_nodes: usize,
    /// Tokens committed by the cycles (accepted drafts + bonus tokens).
    pub committed: usize,
    /// Expert copies (slot misses) and their bytes, prefill included.
    pub expert_copies: u64,
    pub expert_bytes: u64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

impl RequestStats {
    /// Tokens decoded per second after the first (which the prompt's forward produces).
    pub fn decode_tokens_per_second(&self) -> f64 {
        specfit_engine::spec::decode_rate(self.completion_tokens, self.decode_seconds)
    }

    /// Tokens committed per draft–verify cycle (0 without cycles).
    pub fn tokens_per_cycle(&self) -> f64 {
        specfit_engine::spec::per_cycle(self.committed, self.cycles)
    }
}

/// Where the speculative policies get draft-node routes.
pub enum DraftRoutes {
    /// Policies that need none (`eagle3`).
    None,
    /// The target's routers on the pool with every expert resident (exact, costs RAM).
    Atlas(Box<Atlas>),
    /// A linear head on the drafter's hidden state (`specfit train-predictor`).
    Predictor(Box<RoutePredictor>),
}

/// The drafter side of a speculative policy.
pub struct Speculation {
    pub drafter: Eagle3,
    pub policy: VerifyPolicy,
    pub routes: DraftRoutes,
    pub shape: TreeShape,
    pub read_ahead: bool,
}

/// The engine a server decodes with.
pub struct EngineDecoder {
    model: Qwen3Moe,
    cache: ExpertCache,
    speculation: Option<Speculation>,
    policy: String,
    /// The previous request's prefill, which the next one extends over the positions their
    /// prompts share (None when prompt caching is off).
    prompt_cache: Option<Prefix>,
    reuse_prompts: bool,
}

impl EngineDecoder {
    /// `speculation: None` decodes plainly; `policy` names the decoding in responses and metrics.
    pub fn new(
        model: Qwen3Moe,
        cache: ExpertCache,
        speculation: Option<Speculation>,
        policy: impl Into<String>,
    ) -> EngineDecoder {
        EngineDecoder {
            model,
            cache,
            speculation,
            policy: policy.into(),
            prompt_cache: None,
            reuse_prompts: true,
        }
    }

    /// Whether each request reuses the previous request's prefill over the prompt positions
    /// they share (on by default; outputs are the same either way, bit for bit).
    pub fn reuse_prompts(mut self, on: bool) -> EngineDecoder {
        self.reuse_prompts = on;
        self
    }

    pub fn config(&self) -> &Qwen3MoeConfig {
        self.model.config()
    }

    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Positions a decode needs beyond its prompt and output: the draft tree's levels below the
    /// last committed token.
    pub fn tree_positions(&self) -> usize {
        self.speculation.as_ref().map_or(0, |s| s.shape.levels)
    }

    /// Decodes `request`, handing each new token to `sink` as soon as it is committed, until
    /// `max_tokens`, a stop token, or `cancel` (checked after every token or cycle).
    pub fn decode(
        &mut self,
        request: &DecodeRequest,
        cancel: &Cancel,
        sink: TokenSink,
    ) -> Result<RequestStats, EngineError> {
        let started = std::time::Instant::now();
        let before = self.cache.stats().clone();
        let (prefix, cached) = self.prefill(&request.prompt)?;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let prefill = self.cache.stats().since(&before).total;
        let decoded = self.decode_from(&prefix, request, cancel, sink);
        if self.reuse_prompts {
            self.prompt_cache = Some(prefix);
        }
        let mut stats = decoded?;
        stats.prompt_tokens = request.prompt.len();
        stats.cached_prompt_tokens = cached;
        stats.prefill_seconds += prefill_seconds;
        stats.expert_copies += prefill.misses;
        stats.expert_bytes += prefill.bytes_copied;
        Ok(stats)
    }

    /// The prefill of all but the prompt's last token, extending the previous request's where
    /// the prompts agree; and how many positions were reused.
    fn prefill(&mut self, prompt: &[u32]) -> Result<(Prefix, usize), EngineError> {
        let drafter = self.speculation.as_ref().map(|s| &s.drafter);
        match self.prompt_cache.take().filter(|_| self.reuse_prompts) {
            Some(old) => {
                let cached = if old.has_drafter() == drafter.is_some() {
                    old.reusable(prompt)
                } else {
                    0
                };
                let prefix = old.extend(&self.model, drafter, &mut self.cache, prompt)?;
                Ok((prefix, cached))
            }
            None => Ok((
                Prefix::new(&self.model, drafter, &mut self.cache, prompt)?,
                0,
            )),
        }
    }

    /// Runs the prompt's last token and decodes (`prefill_seconds` and the copies cover that
    /// last token and the decode).
    fn decode_from(
        &mut self,
        prefix: &Prefix,
        request: &DecodeRequest,
        cancel: &Cancel,
        sink: TokenSink,
    ) -> Result<RequestStats, EngineError> {
        let mut options = DecodeOptions {
            max_tokens: request.max_tokens,
            stop: request.stop.clone(),
            sampling: request.sampling,
            seed: request.seed,
            on_token: Some(sink),
            cancel: cancel.clone(),
            ..DecodeOptions::default()
        };
        let speculation = self.speculation.as_mut().map(|spec| {
            options.shape = spec.shape;
            options.read_ahead = spec.read_ahead;
            specfit_engine::Speculation {
                drafter: &spec.drafter,
                policy: &mut spec.policy,
                routes: match &mut spec.routes {
                    DraftRoutes::None => Routes::None,
                    DraftRoutes::Atlas(a) => Routes::Atlas(a),
                    DraftRoutes::Predictor(p) => Routes::Predictor(p),
                },
            }
        });
        let start = Start::Prefix(prefix);
        let r = generate(&self.model, &mut self.cache, speculation, start, &options)?;
        Ok(RequestStats {
            completion_tokens: r.tokens.len(),
            cycles: r.cycles,
            verified_nodes: r.verified_nodes,
            committed: r.committed,
            expert_copies: r.prefill_copies.misses + r.copies.misses,
            expert_bytes: r.prefill_copies.bytes_copied + r.copies.bytes_copied,
            prefill_seconds: r.prefill_seconds,
            decode_seconds: r.decode_seconds,
            ..RequestStats::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_can_move_to_the_decoding_thread() {
        fn send<T: Send>() {}
        send::<EngineDecoder>();
    }
}
