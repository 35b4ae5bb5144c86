//! `specfit forward` and `specfit generate` end to end: logits against transformers, plain and
//! speculative decoding printing the same tokens, and the errors a new user hits.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::Output;

#[test]
fn forward_writes_the_transformers_logits_and_greedy_tokens() {
    let model = other_target();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("reference.json")).unwrap())
            .unwrap();
    let ids: Vec<String> = reference["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let out = temp("forward.json");
    ok(&cli(
        "forward --model {} --tokens {} --greedy 8 --slots 2 --out {}",
        &[
            model.to_str().unwrap(),
            &ids.join(","),
            out.to_str().unwrap(),
        ],
    ));
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(got["tokens"], reference["greedy"]["tokens"]);
    assert_eq!(got["routes"][0][0], reference["routes"]["topk_ids"][0][0]);
    let bad = specfit(
        &cli(
            "forward --model {} --tokens 1,256 --out {}",
            &[model.to_str().unwrap(), out.to_str().unwrap()],
        ),
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("token id 256 at position 1 is outside the vocabulary"));
}

#[test]
fn generate_streams_the_greedy_continuation_and_stops_at_eos_on_either_tier() {
    let dir = fixture_with_tokenizer("topk_norm");
    let d = dir.to_str().unwrap();
    let prompt = "<|im_start|> w243 w56 w119 w188 w74 w255 w15 w15 w216 w31 w187";
    ok(&["convert", "--model", d]);
    for extra in [
        vec![],
        vec!["--store", "disk", "--slots", "2"],
        vec!["--slots", "3", "--clear-cache"],
    ] {
        let mut args = vec![
            "generate",
            "--model",
            d,
            "--prompt",
            prompt,
            "--max-tokens",
            "20",
        ];
        args.extend(extra.iter());
        let out = specfit(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        // transformers' greedy tokens are 41 175 100 51 216 41 2(eos) 228.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "w41 w175 w100 w51 w216 w41",
            "{args:?}"
        );
        assert!(stderr.contains("7 tokens"), "{stderr}");
        assert!(stderr.contains("misses"), "{stderr}");
    }
    ok(&cli(
        "generate --model {} --prompt {} --chat --max-tokens 3 --temperature 0.8 --seed 4",
        &[d, "w5 w6"],
    ));
    let no_tok = specfit(
        &[
            "generate",
            "--model",
            other_target().to_str().unwrap(),
            "--prompt",
            "x",
        ],
        None,
    );
    assert_eq!(no_tok.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_tok.stderr).contains("tokenizer.json"));
}

#[test]
fn speculative_generation_prints_the_same_tokens_as_plain_decoding() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("fixtures/qwen3moe/eagle_target");
    let drafter = root.join("fixtures/eagle3/tiny");
    let base = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,243,56,119,188",
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--slots",
        "2",
    ];
    let plain = ok(&base);
    let mut spec_args = base.to_vec();
    spec_args.extend(["--drafter", drafter.to_str().unwrap(), "--budget", "5"]);
    let spec = specfit(&spec_args, None);
    let stderr = String::from_utf8_lossy(&spec.stderr);
    assert!(spec.status.success(), "{stderr}");
    same_output(&spec, &plain, "");
    assert!(stderr.contains("draft nodes verified"), "{stderr}");
    // SpecFit policies with a calibration stay lossless too.
    let probes = temp("spec-probes.jsonl");
    let cal = temp("spec-cal.json");
    ok(&["synth", "probes", "--out", probes.to_str().unwrap()]);
    // A calibration that does not name its target is refused, not trusted.
    let unstamped = temp("spec-cal-unstamped.json");
    fit_probes(&probes, None, &unstamped);
    let refused = specfit(
        &[
            &spec_args[..],
            &[
                "--policy",
                "specfit",
                "--calibration",
                unstamped.to_str().unwrap(),
            ],
        ]
        .concat(),
        None,
    );
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("does not name the target"), "{why}");
    assert_eq!(why.trim().lines().count(), 1, "{why}");
    fit_probes(&probes, Some(model.to_str().unwrap()), &cal);
    for policy in ["specfit", "specfit-lambda", "specfit-resident"] {
        let run = specfit(
            &[
                &spec_args[..],
                &["--policy", policy, "--calibration", cal.to_str().unwrap()],
            ]
            .concat(),
            None,
        );
        assert!(
            run.status.success(),
            "{policy}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        same_output(&run, &plain, policy);
    }
    // One measured with another slot count still drives the run, with a note saying so.
    let other_slots = temp("spec-cal-16-slots.json");
    let mut stamped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    stamped["target"]["slots"] = 16.into();
    std::fs::write(&other_slots, stamped.to_string()).unwrap();
    let noted = ok(&[&spec_args[..], &specfit_flags_for(&other_slots)].concat());
    same_output(&noted, &plain, "another slot count");
    let note = String::from_utf8_lossy(&noted.stderr);
    assert!(
        note.contains("was measured with 16 expert slots per layer; this run has 2"),
        "{note}"
    );
    let corrupt = ok(&[
        &spec_args[..],
        &[
            "--policy",
            "specfit",
            "--routes",
            "corrupt:0.6",
            "--calibration",
            cal.to_str().unwrap(),
        ],
    ]
    .concat());
    same_output(&corrupt, &plain, "");
    let missing = specfit(&[&spec_args[..], &["--policy", "specfit"]].concat(), None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("needs --calibration"));
    // Sampling: the same seed gives the same tokens with and without speculation.
    let sampling = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "11"];
    let plain_sampled = specfit(&[&base[..], &sampling[..]].concat(), None);
    let spec_sampled = ok(&[&spec_args[..], &sampling[..]].concat());
    same_output(&spec_sampled, &plain_sampled, "");
}

#[test]
fn generate_names_the_fix_for_a_missing_expert_file_and_refuses_decoding_past_the_context() {
    let model = "fixtures/qwen3moe/eagle_target";
    let one_line = |out: &Output, needle: &str| {
        assert_eq!(out.status.code(), Some(2));
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains(needle), "{why}");
        assert_eq!(why.trim().lines().count(), 1, "{why}");
    };
    // Never converted: the error says what to run, once.
    let missing = temp("never-converted.specfit");
    let out = specfit(
        &cli(
            "generate --model {} --store disk --expert-file {} --prompt-ids 1,2",
            &[model, missing.to_str().unwrap()],
        ),
        None,
    );
    one_line(&out, "specfit convert");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .matches("No such file")
            .count(),
        0
    );
    // The fixture has 128 positions: 2 prompt tokens + 127 is one too many, 126 fit.
    let too_long = specfit(
        &cli(
            "generate --prompt-ids 1,2 --max-tokens 127 --model {}",
            &[model],
        ),
        None,
    );
    one_line(&too_long, "max_position_embeddings");
    // With a drafter the draft tree's levels (as given) need positions too: 2 + 100 + 26 > 128.
    let text =
        "generate --drafter fixtures/eagle3/tiny --prompt-ids 1,2 --max-tokens 100 --levels 27";
    let deep = specfit(&cli(&format!("{text} --model {{}}"), &[model]), None);
    one_line(&deep, "27-level draft tree");
    ok(&cli(
        "generate --prompt-ids 1,2 --max-tokens 126 --ignore-eos --model {}",
        &[model],
    ));
}

/// Plain decoding of 6 tokens of a 3-token prompt on the tiny EAGLE-3 target.
const SIX_TOKENS: [&str; 8] = [
    "generate",
    "--model",
    "fixtures/qwen3moe/eagle_target",
    "--prompt-ids",
    "1,243,56",
    "--max-tokens",
    "6",
    "--ignore-eos",
];

#[test]
fn slots_zero_means_no_cache_like_clear_cache() {
    let base = SIX_TOKENS;
    let zero = ok(&[&base[..], &["--slots", "0"]].concat());
    let cleared = ok(&[&base[..], &["--clear-cache"]].concat());
    assert_eq!(zero.stdout, cleared.stdout);
    // The copy counts, without the timing.
    let stats = |o: &Output| {
        let line = String::from_utf8_lossy(&o.stderr)
            .lines()
            .find(|l| l.starts_with("experts"))
            .unwrap()
            .to_string();
        line.split("; waiting").next().unwrap().to_string()
    };
    assert_eq!(stats(&zero), stats(&cleared));
    assert!(stats(&zero).contains(" 0.0 hits"), "{}", stats(&zero));
}

#[test]
fn feed_ids_decode_a_fixed_sequence_and_bad_feeds_get_one_clear_line() {
    let base = SIX_TOKENS;
    let greedy = ok(&base);
    let ids = String::from_utf8_lossy(&greedy.stdout).trim().to_string();
    // Fed back, the greedy tokens decode exactly the greedy tokens.
    let fed_back = ok(&[&base[..], &["--feed-ids", &ids]].concat());
    assert_eq!(String::from_utf8_lossy(&fed_back.stdout).trim(), ids);
    // Another sequence fed: the chosen tokens follow it, not the greedy continuation.
    let other = ok(&[&base[..], &["--feed-ids", "7,7,7,7,7"]].concat());
    assert_ne!(String::from_utf8_lossy(&other.stdout).trim(), ids);
    fails_with(
        &[&base[..], &["--feed-ids", "7,7"]].concat(),
        None,
        "--feed-ids gives 2 ids; --max-tokens 6 needs 5",
    );
    fails_with(
        &[&base[..], &["--feed-ids", "7,7,99999,7,7"]].concat(),
        None,
        "id 99999 (number 3) is outside the vocabulary",
    );
    let with_drafter = specfit(
        &[&base[..], &["--feed-ids", "7,7,7,7,7", "--drafter"]].concat(),
        None,
    );
    assert_eq!(with_drafter.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&with_drafter.stderr).contains("cannot be used with"));
}

/// `--policy specfit --calibration CAL`.
fn specfit_flags_for(cal: &std::path::Path) -> [&str; 4] {
    [
        "--policy",
        "specfit",
        "--calibration",
        cal.to_str().unwrap(),
    ]
}
