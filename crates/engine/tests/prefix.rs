//! Decoding from a prompt prefilled once (`Prefix`) gives bit for bit what decoding the whole
//! prompt gives — plain and speculative, greedy and sampled, through sibling caches of any size —
//! which the bench relies on to prefill each prompt once for every policy.

mod common;
use common::*;

use specfit_engine::spec::{Routes, Start};
use specfit_engine::{generate, CacheMode, EngineError, Prefix, Sampling, VerifyPolicy};

const PROMPTS: [&[u32]; 3] = [
    &[1, 243, 56, 119, 188, 74, 255, 15],
    &[7],
    &[1, 100, 100, 5],
];

#[test]
fn plain_decoding_from_a_prefix_equals_decoding_the_whole_prompt() {
    let (target, mut all) = fixture_target(usize::MAX);
    for prompt in PROMPTS {
        for sampling in [Sampling::Greedy, Sampling::from_temperature(0.9, 0.95)] {
            let options = decode_options(24, sampling, 3);
            let mut fresh = all.sibling(2, CacheMode::Lru).unwrap();
            let want =
                generate(&target, &mut fresh, None, Start::Prompt(prompt), &options).unwrap();
            let prefix = Prefix::new(&target, None, &mut all, prompt).unwrap();
            assert_eq!(prefix.prompt_len(), prompt.len());
            assert!(!prefix.has_drafter());
            for slots in [1, 2, usize::MAX] {
                let mut cache = all.sibling(slots, CacheMode::Lru).unwrap();
                let start = Start::Prefix(&prefix);
                let got = generate(&target, &mut cache, None, start, &options).unwrap();
                assert_eq!(
                    got.tokens, want.tokens,
                    "prompt {prompt:?} {sampling:?} slots {slots}"
                );
                assert_eq!(got.prompt_tokens, prompt.len());
                cache.verify_slots().unwrap();
            }
        }
    }
}

#[test]
fn speculative_decoding_from_a_prefix_equals_decoding_the_whole_prompt() {
    let (target, drafter, mut all) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    for prompt in PROMPTS {
        for sampling in [Sampling::Greedy, Sampling::from_temperature(0.8, 0.9)] {
            let options = decode_options(24, sampling, 11);
            let mut fresh = all.sibling(3, CacheMode::Lru).unwrap();
            let want = pair.top_k(&mut fresh, Start::Prompt(prompt), 5, &options);
            let prefix = Prefix::new(&target, Some(&drafter), &mut all, prompt).unwrap();
            assert!(prefix.has_drafter());
            for (slots, mode) in [
                (3, CacheMode::Lru),
                (1, CacheMode::Lru),
                (usize::MAX, CacheMode::NoCache),
            ] {
                let mut cache = all.sibling(slots, mode).unwrap();
                let got = pair.top_k(&mut cache, Start::Prefix(&prefix), 5, &options);
                assert_eq!(
                    got.tokens, want.tokens,
                    "prompt {prompt:?} {sampling:?} slots {slots}"
                );
                if slots == 3 {
                    // Same cache size from the same empty state: the same cycles.
                    assert_eq!(got.cycles, want.cycles);
                    assert_eq!(got.committed, want.committed);
                }
            }
        }
    }
}

#[test]
fn a_prefix_without_the_drafter_is_refused_for_speculative_decoding() {
    let (target, drafter, mut all) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let prefix = Prefix::new(&target, None, &mut all, &[1, 2, 3]).unwrap();
    let options = decode_options(4, Sampling::Greedy, 0);
    let mut policy = VerifyPolicy::top_k(5);
    let start = Start::Prefix(&prefix);
    let err = pair
        .speculate(&mut all, &mut policy, Routes::None, start, &options)
        .unwrap_err();
    assert!(matches!(err, EngineError::PrefixWithoutDrafter), "{err}");
}

#[test]
fn an_empty_prompt_is_an_error_not_a_panic() {
    let (target, mut all) = fixture_target(usize::MAX);
    let err = Prefix::new(&target, None, &mut all, &[]).unwrap_err();
    assert!(matches!(err, EngineError::EmptyPrompt), "{err}");
    let options = decode_options(3, Sampling::Greedy, 0);
    let err = generate(&target, &mut all, None, Start::Prompt(&[]), &options).unwrap_err();
    assert!(matches!(err, EngineError::EmptyPrompt), "{err}");
}

#[test]
fn a_prefix_extended_from_another_prompts_prefix_decodes_like_a_fresh_one() {
    let (target, drafter, mut all) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let base: &[u32] = &[1, 243, 56, 119, 188, 74, 255, 15];
    // (earlier prompt, new prompt): the same, a longer turn, a shorter one, a change in the
    // middle, at the start, at the last token, one-token prompts.
    let pairs: [(&[u32], &[u32]); 7] = [
        (base, base),
        (base, &[1, 243, 56, 119, 188, 74, 255, 15, 9, 9, 30]),
        (base, &[1, 243, 56]),
        (base, &[1, 243, 56, 7, 188, 74]),
        (base, &[5, 243, 56, 119]),
        (base, &[1, 243, 56, 119, 188, 74, 255, 16]),
        (&[7], &[7, 8]),
    ];
    for (earlier, prompt) in pairs {
        // Plain decoding.
        let sampling = Sampling::from_temperature(0.9, 0.95);
        let options = decode_options(12, sampling, 5);
        let mut fresh = all.sibling(2, CacheMode::Lru).unwrap();
        let want = plain_tokens(&target, &mut fresh, prompt, sampling, 5, 12);
        let old = Prefix::new(&target, None, &mut all, earlier).unwrap();
        let common = earlier
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = old.reusable(prompt);
        assert_eq!(keep, common.min(earlier.len() - 1).min(prompt.len() - 1));
        let prefix = old.extend(&target, None, &mut all, prompt).unwrap();
        let made = Prefix::new(&target, None, &mut all, prompt).unwrap();
        assert!(
            prefix.same_state(&made),
            "plain: {earlier:?} then {prompt:?}"
        );
        let mut cache = all.sibling(2, CacheMode::Lru).unwrap();
        let start = Start::Prefix(&prefix);
        let got = generate(&target, &mut cache, None, start, &options).unwrap();
        assert_eq!(got.tokens, want, "plain: {earlier:?} then {prompt:?}");
        // Speculative decoding: the drafter's cache is extended too.
        let options = decode_options(12, sampling, 5);
        let mut fresh = all.sibling(3, CacheMode::Lru).unwrap();
        let want = pair.top_k(&mut fresh, Start::Prompt(prompt), 5, &options);
        let old = Prefix::new(&target, Some(&drafter), &mut all, earlier).unwrap();
        assert_eq!(old.reusable(prompt), keep.min(common.saturating_sub(1)));
        let prefix = old
            .extend(&target, Some(&drafter), &mut all, prompt)
            .unwrap();
        assert_eq!(prefix.prompt_len(), prompt.len());
        let made = Prefix::new(&target, Some(&drafter), &mut all, prompt).unwrap();
        assert!(
            prefix.same_state(&made),
            "with drafter: {earlier:?} then {prompt:?}"
        );
        let mut cache = all.sibling(3, CacheMode::Lru).unwrap();
        let got = pair.top_k(&mut cache, Start::Prefix(&prefix), 5, &options);
        assert_eq!(
            got.tokens, want.tokens,
            "speculative: {earlier:?} then {prompt:?}"
        );
        assert_eq!((got.cycles, got.committed), (want.cycles, want.committed));
        // A prefix made without the drafter cannot be extended into one with it: it starts over.
        let plain = Prefix::new(&target, None, &mut all, earlier).unwrap();
        assert!(plain
            .extend(&target, Some(&drafter), &mut all, prompt)
            .unwrap()
            .has_drafter());
    }
}
