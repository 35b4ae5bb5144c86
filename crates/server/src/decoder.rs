//! The engine behind the server: the target with its expert cache and, for speculative policies,
//! the EAGLE-3 drafter with its verify rule and route source, decoding one request at a time.
//! Token ids in, token ids out; it knows nothing of HTTP, text or queues.

use specfit_engine::predictor::RoutePredictor;
use specfit_engine::spec::{
    generate_spec, Atlas, Routes, SpecOptions, SpecRule, TokenSink, TreeShape,
};
use specfit_engine::{
    generate, Cancel, Eagle3, EngineError, ExpertCache, GenerateOptions, Qwen3Moe, Qwen3MoeConfig,
    Sampler, Sampling,
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

/// What one decode did and cost (the `specfit` extension object of a response).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DecodeStats {
    pub prompt_tokens: usize,
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
    pub rule: Box<dyn SpecRule + Send>,
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
        }
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
    ) -> Result<DecodeStats, EngineError> {
        let Some(spec) = self.speculation.as_mut() else {
            let options = GenerateOptions {
                max_tokens: request.max_tokens,
                stop: request.stop.clone(),
                cancel: cancel.clone(),
            };
            let mut sampler = Sampler::new(request.sampling, request.seed);
            let r = generate(
                &self.model,
                &mut self.cache,
                &request.prompt,
                &mut sampler,
                &options,
                |t| (sink.0)(t),
            )?;
            let decoded = r.tokens.len().saturating_sub(1);
            return Ok(DecodeStats {
                prompt_tokens: request.prompt.len(),
                completion_tokens: r.tokens.len(),
                cycles: decoded,
                verified_nodes: 0,
                committed: decoded,
                expert_copies: r.prefill_copies.misses + r.decode_copies.misses,
                expert_bytes: r.prefill_copies.bytes_copied + r.decode_copies.bytes_copied,
                prefill_seconds: r.prefill_seconds,
                decode_seconds: r.decode_seconds,
            });
        };
        let options = SpecOptions {
            shape: spec.shape,
            max_tokens: request.max_tokens,
            stop: request.stop.clone(),
            sampling: request.sampling,
            seed: request.seed,
            on_token: Some(sink),
            read_ahead: spec.read_ahead,
            cancel: cancel.clone(),
        };
        let routes = match &mut spec.routes {
            DraftRoutes::None => Routes::None,
            DraftRoutes::Atlas(a) => Routes::Atlas(a),
            DraftRoutes::Predictor(p) => Routes::Predictor(p),
        };
        let r = generate_spec(
            &self.model,
            &spec.drafter,
            &mut self.cache,
            routes,
            &request.prompt,
            spec.rule.as_mut(),
            &options,
        )?;
        Ok(DecodeStats {
            prompt_tokens: request.prompt.len(),
            completion_tokens: r.tokens.len(),
            cycles: r.cycles,
            verified_nodes: r.verified_nodes,
            committed: r.committed,
            expert_copies: r.prefill_copies.misses + r.copies.misses,
            expert_bytes: r.prefill_copies.bytes_copied + r.copies.bytes_copied,
            prefill_seconds: r.prefill_seconds,
            decode_seconds: r.decode_seconds,
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
