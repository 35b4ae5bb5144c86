//! Teacher-forced plain decoding (`DecodeOptions.feed`): each forward after the prefill is fed
//! the next given id instead of the token chosen, and the token chosen at each position is what
//! one causal forward over prompt + fed ids chooses there — the fixed-sequence decode the peer
//! benchmarks run on random-weight models.

mod common;
use common::*;

use specfit_engine::spec::Start;
use specfit_engine::{
    generate, Batch, CacheMode, DecodeOptions, EngineError, ExpertCache, Qwen3Moe, Sampler,
    Sampling,
};

const PROMPT: &[u32] = &[1, 243, 56, 119, 188, 74, 255, 15];
const FEED: &[u32] = &[9, 9, 31, 4, 77, 12, 200, 3, 3, 150, 64];

/// Greedy decoding of PROMPT fed `feed`, through a fresh sibling of `all` with `slots` slots.
fn fed(
    target: &Qwen3Moe,
    all: &ExpertCache,
    slots: usize,
    feed: &[u32],
    max_tokens: usize,
) -> Vec<u32> {
    let mut cache = all.sibling(slots, CacheMode::Lru).unwrap();
    let options = DecodeOptions {
        max_tokens,
        feed: feed.to_vec(),
        ..Default::default()
    };
    generate(target, &mut cache, None, Start::Prompt(PROMPT), &options)
        .unwrap()
        .tokens
}

#[test]
fn each_token_chosen_under_teacher_forcing_is_the_argmax_of_one_forward_over_the_fed_sequence() {
    let (target, mut all) = fixture_target(usize::MAX);
    let sequence: Vec<u32> = PROMPT.iter().chain(FEED).copied().collect();
    let (out, _) = forward_fresh(&target, &mut all, &Batch::causal(&sequence));
    let mut greedy = Sampler::new(Sampling::Greedy, 0);
    let want: Vec<u32> = (PROMPT.len() - 1..sequence.len())
        .map(|r| greedy.sample(out.row(r)))
        .collect();
    for slots in [2, usize::MAX] {
        assert_eq!(
            fed(&target, &all, slots, FEED, FEED.len() + 1),
            want,
            "slots {slots}"
        );
    }
}

#[test]
fn feeding_back_the_greedy_tokens_decodes_exactly_the_greedy_tokens() {
    let (target, mut cache) = fixture_target(usize::MAX);
    let greedy = greedy_tokens(&target, &mut cache, PROMPT, 16);
    assert_eq!(fed(&target, &cache, 4, &greedy, 16), greedy);
}

#[test]
fn a_feed_shorter_than_the_forwards_after_the_prefill_is_refused() {
    let (target, mut cache) = fixture_target(usize::MAX);
    let options = DecodeOptions {
        max_tokens: 5,
        feed: vec![1, 2, 3],
        ..Default::default()
    };
    let err = generate(&target, &mut cache, None, Start::Prompt(PROMPT), &options).unwrap_err();
    assert!(
        matches!(err, EngineError::FeedTooShort { feed: 3, needed: 4 }),
        "{err}"
    );
}
