//! Lossless speculative decoding: on the fixture target and its EAGLE-3 drafter, tree decoding
//! with any verify budget and any slot count commits exactly the tokens of plain greedy decoding.

mod common;
use common::*;

use specfit_engine::measure::{probe, ProbePlan};
use specfit_engine::spec::{Routes, Start, TreeShape};
use specfit_engine::{CacheMode, DecodeOptions, Sampler, Sampling, Tier, VerifyPolicy};

/// Prompts of the fixture vocabulary.
const FIVE_TOKENS: [u32; 5] = [1, 243, 56, 119, 188];
const SIX_TOKENS: [u32; 6] = [1, 243, 56, 119, 188, 74];
#[test]
fn tree_decoding_commits_exactly_the_greedy_tokens() {
    let prompts: [&[u32]; 3] = [
        &[1, 243, 56, 119, 188, 74, 255, 15],
        &[1, 5],
        &[1, 100, 100, 100, 100, 100],
    ];
    for prompt in prompts {
        let (target, drafter, mut cache) = fixture_pair(usize::MAX);
        let pair = Pair::new(&target, &drafter);
        let want = greedy_tokens(&target, &mut cache, prompt, 30);
        for (budget, slots, shape) in [
            (7, usize::MAX, TreeShape::default()),
            (7, 1, TreeShape::default()),
            (0, 2, TreeShape::default()),
            (
                3,
                3,
                TreeShape {
                    branching: 3,
                    levels: 3,
                },
            ),
            (
                16,
                usize::MAX,
                TreeShape {
                    branching: 4,
                    levels: 4,
                },
            ),
        ] {
            let (_, mut cache) = fixture_target(slots);
            let options = DecodeOptions {
                shape,
                max_tokens: 30,
                stop: vec![],
                ..DecodeOptions::default()
            };
            let got = pair.top_k(&mut cache, Start::Prompt(prompt), budget, &options);
            assert_eq!(
                got.tokens, want,
                "prompt {prompt:?}, budget {budget}, slots {slots}, {shape:?}"
            );
            eprintln!(
                "budget {budget} slots {slots}: {} cycles, {} committed, {} verified",
                got.cycles, got.committed, got.verified_nodes
            );
            assert!(got.cycles > 0 && got.committed >= got.cycles);
            assert!(got.verified_nodes <= budget * got.cycles);
            cache.verify_slots().unwrap();
        }
    }
}

#[test]
fn eagle3_stops_drafting_once_its_top_k_is_settled_and_verifies_the_same_nodes() {
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let prompt = [1, 243, 56, 119, 188, 74, 255, 15];
    let options = decode_options(40, Sampling::Greedy, 0);
    let mut fewer_levels = 0;
    for k in [0, 1, 2, 3, 5, 7, 12] {
        let early = pair.top_k(&mut cache, Start::Prompt(&prompt), k, &options);
        // Top-K drafting every level (vanilla EAGLE-3 without the settled-top-K stop).
        let mut every = VerifyPolicy::top_k(k).stop_rule(false);
        let start = Start::Prompt(&prompt);
        let full = pair
            .speculate(&mut cache, &mut every, Routes::None, start, &options)
            .unwrap();
        assert_eq!(early.tokens, full.tokens, "k = {k}");
        assert_eq!(
            (early.cycles, early.verified_nodes, early.committed),
            (full.cycles, full.verified_nodes, full.committed),
            "k = {k}: the same nodes verified every cycle"
        );
        assert!(early.drafted_levels <= full.drafted_levels, "k = {k}");
        fewer_levels += usize::from(early.drafted_levels < full.drafted_levels);
    }
    assert!(
        fewer_levels >= 3,
        "the stop saved levels for {fewer_levels} budgets"
    );
}

#[test]
fn no_level_is_drafted_past_the_tokens_left_and_the_last_token_is_decoded_plainly() {
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let prompt = [1, 243, 56, 119, 188, 74, 255, 15];
    let want = greedy_tokens(&target, &mut cache, &prompt, 12);
    for max_tokens in 2..=12 {
        let options = DecodeOptions {
            max_tokens,
            stop: vec![],
            ..DecodeOptions::default()
        };
        // Top-7 drafting every level of the default shape unless told otherwise.
        let mut every = VerifyPolicy::top_k(7).stop_rule(false);
        let got = pair
            .speculate(
                &mut cache,
                &mut every,
                Routes::None,
                Start::Prompt(&prompt),
                &options,
            )
            .unwrap();
        assert_eq!(got.tokens, want[..max_tokens], "max_tokens {max_tokens}");
        // Every committed token is emitted: no cycle verified a path past the limit.
        assert_eq!(got.committed, max_tokens - 1, "max_tokens {max_tokens}");
        if max_tokens == 2 {
            assert_eq!((got.cycles, got.plain_steps, got.drafted_levels), (1, 1, 0));
        }
        if max_tokens == 3 {
            assert_eq!(got.drafted_levels, 1, "one token left past the bonus");
        }
    }
}

#[test]
fn a_probe_plan_that_could_run_past_the_context_is_refused_before_it_starts() {
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let context = target.config().max_position_embeddings;
    for cycles in [usize::MAX, context] {
        let plan = ProbePlan {
            shape: TreeShape::default(),
            max_nodes: 3,
            cycles,
            plain: 0,
            seed: 1,
        };
        let start = std::time::Instant::now();
        match probe(&target, &drafter, &mut cache, None, &[1, 243], &plan) {
            Err(specfit_engine::EngineError::ContextExceeded { context: c, .. }) => {
                assert_eq!(c, context)
            }
            other => panic!("{cycles} cycles: {:?}", other.map(|p| p.verify.len())),
        }
        assert!(start.elapsed().as_secs() < 5, "refused at once");
    }
}

#[test]
fn calibration_probes_and_plain_steps_alternate_an_emptied_cache_with_the_decoding_cache_never_emptied(
) {
    // Every expert fits: the decoding cache misses each expert at most once, unless it were
    // emptied for the all-miss probes (it must not be: the probes on it stand for decoding's
    // steady state; emptied, each of its probes would miss every routed expert again).
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let plan = ProbePlan {
        shape: TreeShape::default(),
        max_nodes: 3,
        cycles: 40,
        plain: 10,
        seed: 1,
    };
    let mut emptied = cache
        .sibling(cache.slots_per_layer(), CacheMode::NoCache)
        .unwrap();
    let prompt = [1, 243, 56, 119, 188, 74];
    let rows = probe(
        &target,
        &drafter,
        &mut cache,
        Some(&mut emptied),
        &prompt,
        &plan,
    )
    .unwrap();
    assert_eq!(rows.verify.len(), 40);
    assert_eq!(rows.plain.len(), 10);
    let cfg = target.config();
    let mut decoding_misses = 0;
    for (cycle, row) in rows.verify.iter().enumerate() {
        if cycle % 2 == 1 {
            assert_eq!(row.hits, 0, "cycle {cycle}: an emptied cache has no hits");
            assert!(
                row.misses >= 8,
                "cycle {cycle}: every layer's experts are read"
            );
        } else {
            decoding_misses += row.misses;
        }
    }
    for (step, row) in rows.plain.iter().enumerate() {
        if step % 2 == 1 {
            assert_eq!(
                row.hits, 0,
                "plain step {step}: an emptied cache has no hits"
            );
        } else {
            decoding_misses += row.misses;
        }
        assert_eq!(row.context, rows.plain[0].context + step, "one sequence");
    }
    let experts = (cfg.moe_layers().len() * cfg.num_experts) as u64;
    assert!(
        decoding_misses <= experts,
        "{decoding_misses} misses: the decoding cache was emptied"
    );
}

#[test]
fn verification_accepts_exactly_the_longest_path_the_target_agrees_with() {
    use specfit_engine::spec::{verify, DraftNode, Tree};
    use specfit_engine::Batch;
    let (target, drafter, mut cache) = fixture_pair(2);
    let want = greedy_tokens(&target, &mut cache, &FIVE_TOKENS, 8);
    let wrong = |t: u32| (t + 1) % 256;
    // Level 1: a wrong sibling first, then the right token; below it a chain of 3 right tokens
    // with a wrong sibling at depth 2, and a wrong token at depth 5.
    let node = |parent, token, depth| DraftNode {
        parent,
        token,
        prob: 0.5,
        edge: 0.5,
        depth,
        hidden: vec![],
    };
    let pool = vec![
        node(None, wrong(want[1]), 1),
        node(None, want[1], 1),
        node(Some(1), wrong(want[2]), 2),
        node(Some(1), want[2], 2),
        node(Some(3), want[3], 3),
        node(Some(4), want[4], 4),
        node(Some(5), wrong(want[5]), 5),
    ];
    for (chosen, accepted) in [
        (vec![0, 1, 2, 3, 4, 5, 6], vec![1, 3, 4, 5]),
        (vec![0, 1, 2, 3], vec![1, 3]),
        (vec![0], vec![]),
        (vec![], vec![]),
    ] {
        let mut kv = prefilled(&target, &mut cache, &FIVE_TOKENS);
        let mut greedy = Sampler::new(Sampling::Greedy, 0);
        let tree = Tree {
            root: want[0],
            pool: &pool,
            chosen: &chosen,
        };
        let v = verify(&target, &drafter, &mut cache, &mut kv, tree, &mut greedy).unwrap();
        assert_eq!(v.accepted, accepted, "chosen {chosen:?}");
        let k = accepted.len();
        assert_eq!(v.committed, want[1..=k + 1].to_vec());
        assert_eq!(kv.len(), FIVE_TOKENS.len() + 1 + k);
        assert_eq!(v.features.len(), (k + 1) * 3 * target.config().hidden_size);
        // Decoding on from the compacted cache continues the greedy sequence.
        let next = target
            .forward(&Batch::causal(&[want[k + 1]]), &mut kv, &mut cache)
            .unwrap();
        assert_eq!(next.argmax(0), want[k + 2]);
    }
    // A chosen set that is not ancestor-closed is an error, not a silent answer.
    let mut kv = target.new_kv_cache();
    target
        .forward(&Batch::causal(&FIVE_TOKENS), &mut kv, &mut cache)
        .unwrap();
    let tree = Tree {
        root: want[0],
        pool: &pool,
        chosen: &[3],
    };
    let err = verify(
        &target,
        &drafter,
        &mut cache,
        &mut kv,
        tree,
        &mut Sampler::new(Sampling::Greedy, 0),
    )
    .unwrap_err();
    assert!(err.to_string().contains("without its parent"), "{err}");
}

#[test]
fn specfit_selection_with_atlas_routes_and_the_stop_rule_stays_lossless() {
    use specfit_engine::spec::Atlas;
    use specfit_selector::CostModel;
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let want = greedy_tokens(&target, &mut cache, &SIX_TOKENS, 24);
    let costs = [
        CostModel::paper(vec![1.0; 8], 0.0).unwrap(), // experts free: verify as much as useful
        CostModel::paper(vec![1.0; 8], 10.0).unwrap(), // experts dear: verify little
        CostModel::residency(vec![1.0; 8], 0.0, 5.0).unwrap(), // residency-aware on live slots
        // Experts free, but each verified row dear at the cycle's context (cached tokens).
        CostModel::paper(vec![1.0; 8], 0.0)
            .unwrap()
            .with_context_ms(1e3)
            .unwrap(),
    ];
    let mut verified = Vec::new();
    for (i, cost) in costs.into_iter().enumerate() {
        let residency = cost.is_residency();
        let mut policy = specfit_policy(cost).residency(residency);
        let (_, mut cache) = fixture_target(2);
        let mut atlas = Atlas::new(fixture_target(usize::MAX).1);
        let options = decode_options(24, Sampling::Greedy, 0);
        let routes = Routes::Atlas(&mut atlas);
        let start = Start::Prompt(&SIX_TOKENS);
        let wall = std::time::Instant::now();
        let got = pair
            .speculate(&mut cache, &mut policy, routes, start, &options)
            .unwrap();
        let wall = wall.elapsed().as_secs_f64();
        assert_eq!(got.tokens, want, "cost {i}");
        // Every speculative cycle searched at least once (the stop rule may search after each
        // level); plain steps, counted among the cycles, do not search.
        assert!(
            got.cycles > 0 && got.select_us.len() >= got.cycles - got.plain_steps,
            "{got:?}"
        );
        // The atlas routes outside the decode clock: its time is counted once, apart.
        assert!(got.atlas_seconds > 0.0, "{got:?}");
        assert!(
            got.prefill_seconds + got.decode_seconds + got.atlas_seconds <= wall,
            "{got:?} in {wall} s"
        );
        eprintln!(
            "cost {i}: {} cycles, {} verified",
            got.cycles, got.verified_nodes
        );
        verified.push(got.verified_nodes);
    }
    // Dear experts make SpecFit verify fewer nodes than free ones, and so do dear rows at the
    // decoder's context.
    assert!(verified[1] < verified[0], "{verified:?}");
    assert!(verified[3] < verified[0], "{verified:?}");
    // A policy that needs routes refuses to run without a route source.
    let cost = CostModel::paper(vec![1.0; 8], 0.1).unwrap();
    let mut policy = specfit_policy(cost);
    let (_, mut cache) = fixture_target(2);
    let options = decode_options(4, Sampling::Greedy, 0);
    let start = Start::Prompt(&SIX_TOKENS);
    let err = pair
        .speculate(&mut cache, &mut policy, Routes::None, start, &options)
        .unwrap_err();
    assert!(
        matches!(err, specfit_engine::EngineError::NoRoutes { .. }),
        "{err}"
    );
}

#[test]
fn speculative_sampling_draws_the_same_tokens_as_plain_sampling_with_the_same_seed() {
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let prompt = [1u32, 243, 56, 119];
    for (seed, temperature, top_p, budget) in [
        (0, 0.7, 1.0, 7),
        (1, 1.0, 0.9, 7),
        (2, 1.5, 1.0, 16),
        (3, 1.0, 0.5, 3),
        (4, 0.3, 1.0, 0),
    ] {
        let sampling = Sampling::TopP { temperature, top_p };
        let want = plain_tokens(&target, &mut cache, &prompt, sampling, seed, 20);
        let (_, mut c) = fixture_target(2);
        let options = decode_options(20, sampling, seed);
        let got = pair.top_k(&mut c, Start::Prompt(&prompt), budget, &options);
        assert_eq!(
            got.tokens, want,
            "seed {seed}, T {temperature}, top-p {top_p}, budget {budget}"
        );
    }
}

#[test]
fn speculative_sampling_reproduces_the_targets_distribution() {
    use specfit_engine::{Batch, Logits};
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let prompt = [1u32, 17, 9];
    let sampling = Sampling::from_temperature(1.0, 1.0);
    // Exact marginal of the second generated token: Σ_x1 p(x1) p(x2 | x1).
    let (first, kv) = forward_fresh(
        &target,
        &mut cache,
        &Batch::causal(&prompt).with_logits(Logits::Last),
    );
    let vocab = target.config().vocab_size;
    let mut marginal = vec![0.0f64; vocab];
    for (x1, p1) in Sampler::probs(sampling, first.row(0)) {
        let mut kv1 = kv.clone();
        let second = target
            .forward(&Batch::causal(&[x1]), &mut kv1, &mut cache)
            .unwrap();
        for (x2, p2) in Sampler::probs(sampling, second.row(0)) {
            marginal[x2 as usize] += p1 * p2;
        }
    }
    // Speculative runs with seeds 0..N; count the second token.
    let n = 1200;
    let mut counts = vec![0usize; vocab];
    for seed in 0..n {
        let options = decode_options(2, sampling, seed);
        let got = pair.top_k(&mut cache, Start::Prompt(&prompt), 7, &options);
        counts[got.tokens[1] as usize] += 1;
    }
    // Pearson chi-square over tokens expected at least 5 times, the rest pooled.
    let (mut chi2, mut df, mut rest_e, mut rest_o) = (0.0, 0usize, 0.0, 0.0);
    for t in 0..vocab {
        let e = marginal[t] * n as f64;
        if e >= 5.0 {
            chi2 += (counts[t] as f64 - e).powi(2) / e;
            df += 1;
        } else {
            rest_e += e;
            rest_o += counts[t] as f64;
        }
    }
    if rest_e > 0.0 {
        chi2 += (rest_o - rest_e).powi(2) / rest_e;
        df += 1;
    }
    let k = (df - 1) as f64;
    // 0.1% critical value (Wilson–Hilferty).
    let crit = k * (1.0 - 2.0 / (9.0 * k) + 3.09 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(df > 5, "too few bins ({df})");
    assert!(
        chi2 < crit,
        "chi2 {chi2:.1} >= {crit:.1} with {k} degrees of freedom"
    );
}

/// A trace of `positions` greedy positions after `prompt` (the default tree shape), each pool
/// routed by an atlas over `atlas_cache`.
fn recorded(
    target: &specfit_engine::Qwen3Moe,
    drafter: &specfit_engine::Eagle3,
    cache: &mut specfit_engine::ExpertCache,
    atlas_cache: specfit_engine::ExpertCache,
    prompt: &[u32],
    positions: usize,
) -> Vec<specfit_trace::TraceStep> {
    let mut atlas = specfit_engine::spec::Atlas::new(atlas_cache);
    let mut walk = specfit_engine::measure::PoolWalk {
        target,
        drafter,
        cache,
        atlas: &mut atlas,
        shape: TreeShape::default(),
    };
    walk.record(prompt, positions).unwrap()
}

#[test]
fn a_recorded_trace_follows_the_greedy_output_and_marks_agreement() {
    let (target, drafter, mut cache) = fixture_pair(2);
    let prompt = [1u32, 243, 56, 119];
    let want = greedy_tokens(&target, &mut cache, &prompt, 13);
    let atlas = fixture_target(usize::MAX).1;
    let steps = recorded(&target, &drafter, &mut cache, atlas, &prompt, 12);
    assert_eq!(steps.len(), 12);
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(
            (s.position, s.root, s.next),
            (prompt.len() + i, want[i], want[i + 1])
        );
        assert_eq!(s.nodes.len(), 18);
        for n in s.nodes.iter().filter(|n| n.parent == -1) {
            assert_eq!(n.agrees, n.token == s.next);
        }
        for n in s.nodes.iter().filter(|n| n.parent >= 0) {
            let parent = &s.nodes[n.parent as usize];
            // A deeper node can only matter when its parent agreed; agreement is then about the
            // target's greedy token after the parent.
            if parent.agrees && parent.parent == -1 {
                let next_next = want[i + 2];
                assert_eq!(n.agrees, n.token == next_next);
            }
        }
    }
    // The trace survives the file format, with its checks.
    let header = specfit_trace::TraceHeader::new(8, 4, 2, 256);
    let mut bytes = Vec::new();
    specfit_trace::write(&mut bytes, &header, &steps).unwrap();
    let (_, back) = specfit_trace::read(std::str::from_utf8(&bytes).unwrap()).unwrap();
    assert_eq!(back, steps);
}

#[test]
fn the_plain_steps_of_a_probe_count_what_a_recorded_trace_of_the_same_positions_says() {
    // The shipped pair (trained: its drafter's children are often taken) on a real sentence.
    let dir = root().join("models/target");
    let load =
        || specfit_engine::load_target(&dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    let (target, mut cache) = load();
    let drafter =
        specfit_engine::Eagle3::load(&root().join("models/drafter"), target.config()).unwrap();
    let tokenizer = specfit_engine::Tokenizer::load(&dir).unwrap();
    let prompt = tokenizer
        .encode("The history of the city begins with a small fishing village on the river")
        .unwrap();
    let positions = 12;
    // The probe: no cycles, only plain steps, each after a pool drafted outside its timer.
    let plan = ProbePlan {
        shape: TreeShape::default(),
        max_nodes: 3,
        cycles: 0,
        plain: positions,
        seed: 1,
    };
    let probed = probe(&target, &drafter, &mut cache, None, &prompt, &plan).unwrap();
    let (drafted, taken) = probed.acceptance.counts();
    let (drafted, taken): (u64, u64) = (drafted.iter().sum(), taken.iter().sum());
    // The naive count: the trace's agreement flags at the same positions, each pool's children
    // of reached nodes as deep as the probe's continuation reaches (`positions - i` tokens).
    let steps = recorded(&target, &drafter, &mut cache, load().1, &prompt, positions);
    let (mut want_drafted, mut want_taken) = (0u64, 0u64);
    for (i, s) in steps.iter().enumerate() {
        let mut reached = vec![false; s.nodes.len()];
        for (j, n) in s.nodes.iter().enumerate() {
            let parent_reached = n.parent < 0 || reached[n.parent as usize];
            if parent_reached && n.depth <= positions - i {
                reached[j] = n.agrees;
                want_drafted += 1;
                want_taken += u64::from(n.agrees);
            }
        }
    }
    assert_eq!((drafted, taken), (want_drafted, want_taken));
    assert!(
        drafted >= 2 * positions as u64 && taken > 0,
        "{drafted} / {taken}"
    );
}

#[test]
fn tree_decoding_from_the_disk_tier_commits_the_greedy_tokens_with_and_without_read_ahead() {
    use specfit_engine::spec::Atlas;
    use specfit_selector::CostModel;
    let file = fixture_expert_file("spec-disk");
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let want = greedy_tokens(&target, &mut cache, &FIVE_TOKENS, 20);
    for mode in [CacheMode::Lru, CacheMode::NoCache] {
        let mut disk = fixture_disk_cache(&file, 2, mode);
        let options = decode_options(20, Sampling::Greedy, 0);
        let got = pair.top_k(&mut disk, Start::Prompt(&FIVE_TOKENS), 7, &options);
        assert_eq!(got.tokens, want, "{mode:?}");
        assert!(got.copies.misses > 0);
        disk.verify_slots().unwrap();
    }
    // Reading each verify's expected experts ahead (SpecFit on atlas routes) keeps the tokens.
    for slots in [2, 4] {
        let mut disk = fixture_disk_cache(&file, slots, CacheMode::Lru);
        let cost = CostModel::paper(vec![1.0; 8], 0.1).unwrap();
        let mut policy = specfit_policy(cost);
        let mut atlas = Atlas::new(fixture_target(usize::MAX).1);
        let options = DecodeOptions {
            max_tokens: 20,
            read_ahead: true,
            ..DecodeOptions::default()
        };
        let routes = Routes::Atlas(&mut atlas);
        let start = Start::Prompt(&FIVE_TOKENS);
        let got = pair
            .speculate(&mut disk, &mut policy, routes, start, &options)
            .unwrap();
        assert_eq!(got.tokens, want, "{slots} slots");
        let c = got.copies;
        assert!(c.read_ahead > 0 && c.ahead_used > 0, "{slots} slots: {c:?}");
        assert!(c.ahead_used <= c.read_ahead);
        disk.verify_slots().unwrap();
    }
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[test]
fn layer_ahead_reads_on_the_disk_tier_keep_the_greedy_tokens_and_score_their_guesses() {
    let file = fixture_expert_file("spec-layer-ahead");
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let want = greedy_tokens(&target, &mut cache, &FIVE_TOKENS, 20);
    for (slots, layers) in [(2, 1), (4, 1), (4, 2)] {
        let mut disk = fixture_disk_cache(&file, slots, CacheMode::Lru);
        disk.set_layers_ahead(layers);
        assert_eq!(disk.layers_ahead(), layers);
        let options = decode_options(20, Sampling::Greedy, 0);
        let got = pair.top_k(&mut disk, Start::Prompt(&FIVE_TOKENS), 7, &options);
        assert_eq!(got.tokens, want, "{slots} slots, {layers} layers ahead");
        let c = got.copies;
        assert!(c.read_ahead > 0 && c.predicted > 0, "{slots} slots: {c:?}");
        assert!(
            c.predicted_right <= c.predicted.min(c.predicted_needed),
            "{c:?}"
        );
        // The first MoE layer is never predicted: nothing runs before it.
        assert_eq!(disk.stats().per_layer[0].predicted, 0);
        disk.verify_slots().unwrap();
    }
    // Slots emptied every forward: nothing is read ahead.
    let mut cleared = fixture_disk_cache(&file, 4, CacheMode::NoCache);
    cleared.set_layers_ahead(1);
    assert_eq!(cleared.layers_ahead(), 0);
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[test]
fn adaptive_specfit_with_plain_bursts_stays_lossless_greedy_and_sampled() {
    use specfit_engine::spec::Atlas;
    use specfit_selector::CostModel;
    let (target, drafter, _) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    for (prompt, sampling) in [
        (&[1u32, 243, 56, 119, 188, 74][..], Sampling::Greedy),
        (&[1u32, 5][..], Sampling::from_temperature(0.8, 0.9)),
    ] {
        let want = plain_tokens(&target, &mut fixture_target(2).1, prompt, sampling, 7, 40);
        // Cheap experts (verifies nodes, few bursts) and dear ones (mostly empty subtrees: bursts).
        let mut bursts = Vec::new();
        for beta in [0.0, 50.0] {
            let cost = CostModel::paper(vec![1.0; 8], beta).unwrap();
            let mut policy = specfit_policy(cost).bursts(specfit_selector::Bursts::AfterEmpty);
            let mut atlas = Atlas::new(fixture_target(usize::MAX).1);
            let options = decode_options(40, sampling, 7);
            let routes = Routes::Atlas(&mut atlas);
            let start = Start::Prompt(prompt);
            let got = pair
                .speculate(
                    &mut fixture_target(2).1,
                    &mut policy,
                    routes,
                    start,
                    &options,
                )
                .unwrap();
            assert_eq!(got.tokens, want, "β {beta} {sampling:?}");
            assert!(got.plain_steps < got.cycles);
            bursts.push(got.plain_steps);
        }
        // Dear experts leave the subtree empty and trigger bursts; free ones verify nodes.
        assert!(bursts[1] > 0 && bursts[1] >= bursts[0], "{bursts:?}");
    }
}

#[test]
fn logits_computed_later_from_the_final_residual_equal_the_forwards_rows() {
    use specfit_engine::{Batch, Logits, Mask};
    let (target, mut cache) = fixture_target(usize::MAX);
    let tokens = [1u32, 243, 56, 119, 188, 74];
    let parents = [None, Some(0), Some(0), Some(1), Some(3), Some(2)];
    let taps = [target.final_tap()];
    let (out, _) = forward_fresh(
        &target,
        &mut cache,
        &Batch {
            tokens: &tokens,
            positions: Some(&[0, 1, 1, 2, 3, 2]),
            mask: Mask::Tree(&parents),
            taps: &taps,
            logits: Logits::All,
        },
    );
    let h = target.config().hidden_size;
    for r in 0..tokens.len() {
        let later = target.logits_of(&out.taps[0][r * h..(r + 1) * h]);
        assert_eq!(bits(&later), bits(out.row(r)), "row {r}");
    }
}

#[test]
fn a_cancelled_generation_stops_at_the_next_cycle_with_a_prefix_of_the_full_output() {
    let (target, drafter, mut cache) = fixture_pair(usize::MAX);
    let pair = Pair::new(&target, &drafter);
    let full = greedy_tokens(&target, &mut cache, &SIX_TOKENS, 30);
    // Plain decoding stops right after the token during which the flag went up.
    let cancel = specfit_engine::Cancel::default();
    let options = DecodeOptions {
        max_tokens: 30,
        cancel: cancel.clone(),
        ..Default::default()
    };
    let raised = cancel.clone();
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let options = DecodeOptions {
        on_token: Some(specfit_engine::spec::TokenSink(std::sync::Arc::new(
            move |_| {
                if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == 3 {
                    raised.cancel();
                }
            },
        ))),
        ..options
    };
    let start = Start::Prompt(&SIX_TOKENS);
    let got = specfit_engine::generate(&target, &mut cache, None, start, &options).unwrap();
    assert_eq!(got.tokens, full[..3]);
    // Tree decoding finishes the cycle it is in, then stops.
    for at in [1, 5] {
        let cancel = specfit_engine::Cancel::default();
        let raised = cancel.clone();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let options = DecodeOptions {
            max_tokens: 30,
            cancel: cancel.clone(),
            on_token: Some(specfit_engine::spec::TokenSink(std::sync::Arc::new(
                move |_| {
                    if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == at {
                        raised.cancel();
                    }
                },
            ))),
            ..DecodeOptions::default()
        };
        let got = pair.top_k(&mut cache, Start::Prompt(&SIX_TOKENS), 7, &options);
        assert!(
            got.tokens.len() >= at && got.tokens.len() < 30,
            "{at}: {got:?}"
        );
        assert_eq!(got.tokens, full[..got.tokens.len()]);
        if at == 1 {
            assert_eq!(
                got.cycles, 0,
                "raised by the prefill's token: no cycle runs"
            );
        }
    }
}

#[test]
fn decodes_forwards_and_trees_past_their_limits_are_refused_not_wrapped_around() {
    use specfit_engine::{Batch, EngineError};
    let (target, mut cache) = fixture_target(usize::MAX);
    let context = target.config().max_position_embeddings;
    // prompt + max_tokens wraps around usize: still refused.
    let options = decode_options(usize::MAX, Sampling::Greedy, 0);
    let err = specfit_engine::generate(&target, &mut cache, None, Start::Prompt(&[1, 2]), &options)
        .unwrap_err();
    assert!(matches!(err, EngineError::ContextExceeded { .. }), "{err}");
    // A forward that would write past the last position.
    let tokens = vec![1u32; context + 1];
    let mut kv = target.new_kv_cache();
    let err = target
        .forward(&Batch::causal(&tokens), &mut kv, &mut cache)
        .unwrap_err();
    assert!(
        matches!(err, EngineError::PastContext { position, .. } if position == context),
        "{err}"
    );
    assert_eq!(TreeShape::new(2, 5).unwrap().pool_nodes(), Some(18));
    for (branching, levels) in [(0, 5), (2, 0), (1_000_000, 5), (usize::MAX, usize::MAX)] {
        let err = TreeShape::new(branching, levels).unwrap_err();
        assert!(err.to_string().contains("1024"), "{err}");
    }
}

#[test]
fn after_a_plain_burst_the_drafter_drafts_as_if_it_had_been_given_every_token() {
    use specfit_engine::spec::{Decoder, Speculation};
    use specfit_engine::{load_target, Eagle3, Tier};
    // A burst the drafter learns whole leaves it where a prompt holding those tokens would: the
    // cycles after it draft, and accept, exactly what the cycles after that longer prompt do.
    // The shipped pair: its trained drafter reads its context (a random one barely does).
    let (target_dir, drafter_dir) = (root().join("models/target"), root().join("models/drafter"));
    let load = || load_target(&target_dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    let target = load().0;
    let drafter = Eagle3::load(&drafter_dir, target.config()).unwrap();
    let options = decode_options(60, Sampling::Greedy, 7);
    let run = |prompt: &[u32], burst: usize| {
        let mut policy = VerifyPolicy::top_k(7);
        let mut cache = load().1;
        let speculation = Speculation {
            drafter: &drafter,
            policy: &mut policy,
            routes: Routes::None,
        };
        let start = Start::Prompt(prompt);
        let mut d =
            Decoder::start(&target, &mut cache, Some(speculation), start, &options).unwrap();
        if burst > 0 {
            d.commit_plain(burst).unwrap();
        }
        for _ in 0..8 {
            d.step().unwrap();
        }
        d.finish()
    };
    let tokenizer = specfit_engine::Tokenizer::load(&target_dir).unwrap();
    let prompt = tokenizer
        .encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many")
        .unwrap();
    let burst = run(&prompt, 12);
    // The longer prompt ends with the burst's first 12 tokens (the root and 11 burst tokens), so
    // its root is the burst's last.
    let mut longer = prompt.clone();
    longer.extend(&burst.tokens[..12]);
    let prefilled = run(&longer, 0);
    assert_eq!(burst.plain_steps, 12);
    assert_eq!(burst.tokens[12..], prefilled.tokens[..]);
    assert_eq!(burst.accept_counts, prefilled.accept_counts);
    assert_eq!(burst.drafted_levels, prefilled.drafted_levels);
    assert!(burst.accept_counts.len() > 1, "some drafts were accepted");
}
