//! End-to-end: the `specfit` binary on real files — the shipped example pools, synthetic probes,
//! and every kind of bad input, which must exit with status 2 and one line on stderr.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn specfit(args: &[&str], stdin: Option<&str>) -> Output {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_specfit"));
    cmd.args(args)
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn specfit");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specfit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn select_runs_on_the_shipped_example_pools_with_no_arguments() {
    let out = specfit(&["select"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    for line in &lines {
        assert!(line["selected"].as_array().unwrap().len() <= 7);
        assert!(line["select_us"].as_f64().unwrap() > 0.0);
        assert_eq!(line["newest_level"], 5);
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("8 pools"));
}

#[test]
fn baselines_can_be_forced_from_the_command_line() {
    let topk = specfit(&["select", "--objective", "topk", "--quiet"], None);
    let stdout = String::from_utf8(topk.stdout).unwrap();
    for l in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["selected"].as_array().unwrap().len(), 7);
    }
    let none = specfit(&["select", "--objective", "none", "--quiet"], None);
    assert!(String::from_utf8(none.stdout)
        .unwrap()
        .lines()
        .all(|l| l.contains("\"selected\":[]")));
}

#[test]
fn calibrate_recovers_the_cost_model_that_generated_noiseless_probes() {
    let probes = temp("probes.jsonl");
    let cal = temp("calibration.json");
    let p = probes.to_str().unwrap();
    let gen = specfit(
        &[
            "synth",
            "probes",
            "--noise",
            "0",
            "--beta-hit",
            "0.211",
            "--beta-miss",
            "0.211",
            "--out",
            p,
        ],
        None,
    );
    assert!(gen.status.success());
    let out = specfit(
        &["calibrate", "--probes", p, "--out", cal.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    assert!((file["cost"]["beta"].as_f64().unwrap() - 0.211).abs() < 1e-9);
    let a: Vec<f64> = file["cost"]["intercepts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (n, an) in a.iter().enumerate() {
        assert!(
            (an - (130.0 + 2.0 * n as f64)).abs() < 1e-6,
            "a[{n}] = {an}"
        );
    }
    assert!(file["fit"]["r2"].as_f64().unwrap() > 0.999_999);
    // The calibration drives selection in place of the pools' own cost.
    let sel = specfit(
        &[
            "select",
            "--calibration",
            cal.to_str().unwrap(),
            "--residency-cost",
            "--quiet",
        ],
        None,
    );
    assert!(
        sel.status.success(),
        "{}",
        String::from_utf8_lossy(&sel.stderr)
    );
}

fn fails_with(args: &[&str], stdin: Option<&str>, want: &str) {
    let out = specfit(args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: one line, got {stderr:?}"
    );
    assert!(
        stderr.contains(want),
        "{args:?}: got {stderr:?}, want {want:?}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn bad_pools_exit_with_status_two_and_one_line_naming_the_problem() {
    let good = r#"{"layers": 1, "experts": 4, "nodes": [{"parent": -1, "prob": 0.5, "routes": [[1]]}], "cost": {"intercepts": [1,1,1,1,1,1,1,1], "beta": 0.1}}"#;
    let cases = [
        (
            good.replace("\"parent\": -1", "\"parent\": 3"),
            "line 2: nodes[0].parent = 3",
        ),
        (good.replace("0.5", "NaN"), "line 2, column"),
        (good.replace("0.5", "-0.5"), "line 2: nodes[0].prob = -0.5"),
        (
            good.replace("[[1]]", "[[4]]"),
            "line 2: nodes[0].routes[0] holds expert 4, but experts = 4",
        ),
        (
            good.replace("[[1]]", "[[1], [2]]"),
            "line 2: nodes[0].routes has 2 layers, expected layers = 1",
        ),
        (
            good.replace("[[1]]", "[[1, 1]]"),
            "line 2: nodes[0].routes[0] lists expert 1 twice",
        ),
        (
            good.replace("[1,1,1,1,1,1,1,1]", "[1,1]"),
            "line 2: cost.intercepts has 2 entries; max_nodes = 7 needs at least 8",
        ),
        (good.replace("0.1}", "-0.1}"), "line 2: cost.beta = -0.1"),
        (
            good[..good.len() - 20].to_string(),
            "EOF while parsing a list",
        ),
        (
            "not json at all".to_string(),
            "line 2, column 2: expected ident",
        ),
    ];
    for (bad, want) in cases {
        fails_with(
            &["select", "--pool", "-"],
            Some(&format!("{good}\n{bad}\n")),
            want,
        );
    }
    fails_with(&["select", "--pool", "-"], Some(""), "no pool in the input");
    fails_with(
        &["select", "--pool", "/nonexistent/pools.jsonl"],
        None,
        "reading /nonexistent/pools.jsonl",
    );
    // Argument errors are clap's: status 2, the reason on the first line, then a usage hint.
    let out = specfit(&["select", "--objective", "best"], None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .next()
            .unwrap()
            .contains("objective = \"best\""),
        "{stderr}"
    );
}

#[test]
fn bad_probe_files_exit_with_status_two() {
    let probes = temp("bad-probes.jsonl");
    std::fs::write(
        &probes,
        "{\"nodes\": 0, \"demand\": 10, \"ms\": 5}\n{\"nodes\": 2, \"demand\": 10, \"ms\": 5}\n",
    )
    .unwrap();
    fails_with(
        &["calibrate", "--probes", probes.to_str().unwrap()],
        None,
        "no probe row has nodes = 1",
    );
    std::fs::write(
        &probes,
        "{\"nodes\": 0, \"demand\": 10, \"ms\": 5, \"speed\": 1}\n",
    )
    .unwrap();
    fails_with(
        &["calibrate", "--probes", probes.to_str().unwrap()],
        None,
        "line 1, column",
    );
    let cal = temp("bad-calibration.json");
    std::fs::write(&cal, "{\"format\": \"x\"}").unwrap();
    fails_with(
        &["select", "--calibration", cal.to_str().unwrap()],
        None,
        "missing field",
    );
}

/// A copy of a fixture checkpoint with a word-level tokenizer over its 256 ids: 0–2 are the
/// ChatML specials, id `i` ≥ 3 is the word `w{i}`.
fn fixture_with_tokenizer(name: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/qwen3moe")
        .join(name);
    let dir = temp(&format!("model-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut vocab = serde_json::Map::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), serde_json::json!(i));
    }
    for i in 3..256 {
        vocab.insert(format!("w{i}"), serde_json::json!(i));
    }
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| serde_json::json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|endoftext|>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let cfg = serde_json::json!({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn forward_writes_the_transformers_logits_and_greedy_tokens() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3moe/topk_norm");
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
    let run = specfit(
        &[
            "forward",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            &ids.join(","),
            "--greedy",
            "8",
            "--slots",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(got["tokens"], reference["greedy"]["tokens"]);
    assert_eq!(got["routes"][0][0], reference["routes"]["topk_ids"][0][0]);
    let bad = specfit(
        &[
            "forward",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            "1,256",
            "--out",
            out.to_str().unwrap(),
        ],
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
    let conv = specfit(&["convert", "--model", d], None);
    assert!(
        conv.status.success(),
        "{}",
        String::from_utf8_lossy(&conv.stderr)
    );
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
    let chat = specfit(
        &[
            "generate",
            "--model",
            d,
            "--prompt",
            "w5 w6",
            "--chat",
            "--max-tokens",
            "3",
            "--temperature",
            "0.8",
            "--seed",
            "4",
        ],
        None,
    );
    assert!(
        chat.status.success(),
        "{}",
        String::from_utf8_lossy(&chat.stderr)
    );
    let no_tok = specfit(
        &[
            "generate",
            "--model",
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/qwen3moe/topk_norm")
                .to_str()
                .unwrap(),
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
    let plain = specfit(&base, None);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let mut spec_args = base.to_vec();
    spec_args.extend(["--drafter", drafter.to_str().unwrap(), "--budget", "5"]);
    let spec = specfit(&spec_args, None);
    let stderr = String::from_utf8_lossy(&spec.stderr);
    assert!(spec.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&spec.stdout).trim(),
        String::from_utf8_lossy(&plain.stdout).trim()
    );
    assert!(stderr.contains("draft nodes verified"), "{stderr}");
    // SpecFit policies with a calibration stay lossless too.
    let probes = temp("spec-probes.jsonl");
    let cal = temp("spec-cal.json");
    assert!(specfit(
        &["synth", "probes", "--out", probes.to_str().unwrap()],
        None
    )
    .status
    .success());
    // A calibration that does not name its target is refused, not trusted.
    let unstamped = temp("spec-cal-unstamped.json");
    assert!(specfit(
        &[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--out",
            unstamped.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
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
    assert!(specfit(
        &[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--out",
            cal.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
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
        assert_eq!(
            String::from_utf8_lossy(&run.stdout).trim(),
            String::from_utf8_lossy(&plain.stdout).trim(),
            "{policy}"
        );
    }
    let corrupt = specfit(
        &[
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
        .concat(),
        None,
    );
    assert!(
        corrupt.status.success(),
        "{}",
        String::from_utf8_lossy(&corrupt.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&corrupt.stdout).trim(),
        String::from_utf8_lossy(&plain.stdout).trim()
    );
    let missing = specfit(&[&spec_args[..], &["--policy", "specfit"]].concat(), None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("needs --calibration"));
    // Sampling: the same seed gives the same tokens with and without speculation.
    let sampling = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "11"];
    let plain_sampled = specfit(&[&base[..], &sampling[..]].concat(), None);
    let spec_sampled = specfit(&[&spec_args[..], &sampling[..]].concat(), None);
    assert!(
        spec_sampled.status.success(),
        "{}",
        String::from_utf8_lossy(&spec_sampled.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&spec_sampled.stdout).trim(),
        String::from_utf8_lossy(&plain_sampled.stdout).trim()
    );
}

#[test]
fn probe_rows_calibrate_the_engine_and_drive_specfit_losslessly() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("fixtures/qwen3moe/eagle_target");
    let drafter = root.join("fixtures/eagle3/tiny");
    let (m, d) = (model.to_str().unwrap(), drafter.to_str().unwrap());
    let probes = temp("engine-probes.jsonl");
    let cal = temp("engine-cal.json");
    let run = specfit(
        &[
            "probe",
            "--model",
            m,
            "--drafter",
            d,
            "--prompt-ids",
            "1,243,56,119",
            "--cycles",
            "48",
            "--slots",
            "2",
            "--out",
            probes.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&probes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 48);
    assert!(
        (0..=7).all(|n| rows.iter().any(|r| r["nodes"] == n)),
        "every node count 0..=7 is probed"
    );
    // Every distinct (layer, expert) the forward needs is either a hit or a copy, exactly once.
    assert!(rows.iter().all(
        |r| r["hits"].as_u64().unwrap() + r["misses"].as_u64().unwrap()
            == r["demand"].as_u64().unwrap()
    ));
    let fit = specfit(
        &[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--model",
            m,
            "--out",
            cal.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        fit.status.success(),
        "{}",
        String::from_utf8_lossy(&fit.stderr)
    );
    let base = [
        "generate",
        "--model",
        m,
        "--prompt-ids",
        "1,243,56,119",
        "--max-tokens",
        "20",
        "--ignore-eos",
        "--slots",
        "2",
    ];
    let plain = specfit(&base, None);
    let spec = specfit(
        &[
            &base[..],
            &[
                "--drafter",
                d,
                "--policy",
                "specfit",
                "--calibration",
                cal.to_str().unwrap(),
            ],
        ]
        .concat(),
        None,
    );
    assert!(
        spec.status.success(),
        "{}",
        String::from_utf8_lossy(&spec.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&spec.stdout).trim(),
        String::from_utf8_lossy(&plain.stdout).trim()
    );
    assert!(String::from_utf8_lossy(&spec.stderr).contains("selection median"));
    // The calibration is stamped with the target's shape: another target refuses it.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let other = root.join("fixtures/qwen3moe/topk_norm");
    let wrong = specfit(
        &[
            "generate",
            "--model",
            other.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "8",
            "--drafter",
            d,
            "--policy",
            "specfit",
            "--calibration",
            cal.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(wrong.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("was measured on a target of shape"));
}

#[test]
fn record_writes_a_versioned_trace_the_trace_reader_accepts() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("fixtures/qwen3moe/eagle_target");
    let drafter = root.join("fixtures/eagle3/tiny");
    let out = temp("trace.jsonl");
    let run = specfit(
        &[
            "record",
            "--model",
            model.to_str().unwrap(),
            "--drafter",
            drafter.to_str().unwrap(),
            "--prompt-ids",
            "1,243,56,119",
            "--max-tokens",
            "6",
            "--slots",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (header, steps) = specfit_trace::read(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        (
            header.moe_layers,
            header.experts,
            header.top_k,
            header.vocab
        ),
        (8, 4, 2, 256)
    );
    assert_eq!(steps.len(), 6);
    assert!(steps
        .iter()
        .all(|s| s.nodes.len() == 18 && s.root_routes.len() == 8));
}

#[test]
fn a_trained_route_predictor_beats_chance_and_drives_specfit_losslessly() {
    // On the shipped target and drafter, trained on a few calibration questions and scored on
    // held-out ones.
    let d = "models/drafter";
    let pred = temp("predictor.safetensors");
    let train = specfit(
        &[
            "train-predictor",
            "--prompts",
            "data/calibration/gsm8k_train.jsonl",
            "--limit",
            "10",
            "--positions",
            "6",
            "--out",
            pred.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&train.stderr).to_string();
    assert!(train.status.success(), "{stderr}");
    // "held-out X (chance Y)": the head must beat guessing.
    let held: f64 = stderr
        .split(", held-out ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let chance: f64 = stderr
        .split("(chance ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(held > chance + 0.1, "{stderr}");
    let probes = temp("pred-probes.jsonl");
    let cal = temp("pred-cal.json");
    assert!(specfit(
        &["synth", "probes", "--out", probes.to_str().unwrap()],
        None
    )
    .status
    .success());
    assert!(specfit(
        &[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--model",
            "models/target",
            "--out",
            cal.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
    let base = [
        "generate",
        "--prompt-ids",
        "1,243,56,119",
        "--max-tokens",
        "20",
        "--ignore-eos",
        "--slots",
        "2",
    ];
    let plain = specfit(&base, None);
    let routes = format!("predictor:{}", pred.display());
    let spec = specfit(
        &[
            &base[..],
            &[
                "--drafter",
                d,
                "--policy",
                "specfit",
                "--routes",
                &routes,
                "--calibration",
                cal.to_str().unwrap(),
            ],
        ]
        .concat(),
        None,
    );
    assert!(
        spec.status.success(),
        "{}",
        String::from_utf8_lossy(&spec.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&spec.stdout).trim(),
        String::from_utf8_lossy(&plain.stdout).trim()
    );
    // A predictor for another shape is refused.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let other = root.join("fixtures/qwen3moe/topk_norm");
    let wrong = specfit(
        &[
            "generate",
            "--model",
            other.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--drafter",
            d,
            "--policy",
            "specfit",
            "--routes",
            &routes,
            "--calibration",
            cal.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(wrong.status.code(), Some(2));
}

#[test]
fn simulate_replays_a_recorded_trace_under_every_policy() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (model, drafter) = (
        root.join("fixtures/qwen3moe/eagle_target"),
        root.join("fixtures/eagle3/tiny"),
    );
    let (m, d) = (model.to_str().unwrap(), drafter.to_str().unwrap());
    let (trace, probes, cal) = (
        temp("sim-trace.jsonl"),
        temp("sim-probes.jsonl"),
        temp("sim-cal.json"),
    );
    assert!(specfit(
        &[
            "record",
            "--model",
            m,
            "--drafter",
            d,
            "--prompt-ids",
            "1,243,56",
            "--max-tokens",
            "30",
            "--out",
            trace.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
    assert!(specfit(
        &[
            "probe",
            "--model",
            m,
            "--drafter",
            d,
            "--prompt-ids",
            "1,243,56",
            "--cycles",
            "32",
            "--slots",
            "2",
            "--out",
            probes.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
    assert!(specfit(
        &[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--out",
            cal.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
    let out = specfit(
        &[
            "simulate",
            "--trace",
            trace.to_str().unwrap(),
            "--calibration",
            cal.to_str().unwrap(),
            "--slots",
            "4,2,0",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.lines().count(), 2 + 3 * 4, "{table}");
    assert!(table
        .lines()
        .filter(|l| l.contains("| ar |"))
        .all(|l| l.contains("| 1.00 |")));
    // A calibration without hit/miss counts cannot drive the simulated machine.
    let plain = temp("sim-plain.jsonl");
    std::fs::write(&plain, "{\"nodes\": 0, \"demand\": 10, \"ms\": 5}\n{\"nodes\": 1, \"demand\": 12, \"ms\": 6}\n{\"nodes\": 0, \"demand\": 11, \"ms\": 5.5}\n").unwrap();
    let plain_cal = temp("sim-plain-cal.json");
    assert!(specfit(
        &[
            "calibrate",
            "--probes",
            plain.to_str().unwrap(),
            "--out",
            plain_cal.to_str().unwrap()
        ],
        None
    )
    .status
    .success());
    let refused = specfit(
        &[
            "simulate",
            "--trace",
            trace.to_str().unwrap(),
            "--calibration",
            plain_cal.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no residency-aware fit"));
}

#[test]
fn simulate_runs_paper_scale_synthetic_traces_on_a_preset() {
    let out = specfit(
        &[
            "simulate",
            "--synthetic",
            "gsm8k",
            "--preset",
            "a100",
            "--slots",
            "48,0",
            "--positions",
            "120",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("eagle3 top-7 accepts"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        2 + 2 * 4
    );
    let bad = specfit(
        &["simulate", "--synthetic", "poetry", "--preset", "a100"],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    let bad = specfit(
        &["simulate", "--synthetic", "gsm8k", "--preset", "tpu"],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_committed_h200_calibration_is_the_fit_of_the_committed_h200_probes_and_replays() {
    let cal = temp("h200-cal.json");
    let out = specfit(
        &[
            "calibrate",
            "--probes",
            "docs/gpu/h200-probes.jsonl",
            "--out",
            cal.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let committed = read(&root.join("docs/gpu/specfit-calibration.h200.json"));
    let refit = read(&cal);
    // Equal up to the last bits another processor's floating point may change.
    fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value::*;
        match (a, b) {
            (Number(x), Number(y)) => {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
            }
            (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close(p, q)),
            (Object(x), Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
            }
            _ => a == b,
        }
    }
    for key in [
        "cost",
        "cost_residency",
        "fit",
        "fit_residency",
        "max_nodes",
    ] {
        assert!(
            close(&committed[key], &refit[key]),
            "{key}: {} vs {}",
            committed[key],
            refit[key]
        );
    }
    let out = specfit(
        &[
            "simulate",
            "--synthetic",
            "summarization",
            "--calibration",
            "docs/gpu/specfit-calibration.h200.json",
            "--slots",
            "48",
            "--positions",
            "120",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2 + 4);
}

#[test]
fn calibrate_stores_drafting_costs_measured_elsewhere_and_refuses_bad_ones() {
    let drafting = temp("drafting.json");
    std::fs::write(
        &drafting,
        r#"{"ms_per_level": 1.5, "feed_ms": 0.25, "feed_ms_per_token": 0.125}"#,
    )
    .unwrap();
    let cal = temp("h200-drafting-cal.json");
    let args = |d: &std::path::Path| {
        vec![
            "calibrate".to_string(),
            "--probes".into(),
            "docs/gpu/h200-probes.jsonl".into(),
            "--drafting".into(),
            d.to_str().unwrap().into(),
            "--out".into(),
            cal.to_str().unwrap().into(),
        ]
    };
    let run = |d: &std::path::Path| {
        let a = args(d);
        specfit(&a.iter().map(String::as_str).collect::<Vec<_>>(), None)
    };
    let out = run(&drafting);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    assert_eq!(file["drafting"]["ms_per_level"], 1.5);
    assert_eq!(file["drafting"]["feed_ms_per_token"], 0.125);
    assert_eq!(file["drafting"]["level_context_ms"], 0.0);
    for bad in [
        r#"{"ms_per_level": -1.0, "feed_ms": 0.25, "feed_ms_per_token": 0.125}"#,
        r#"{"ms_per_level": 1.0, "feed_ms": 0.25}"#,
        r#"{"ms_per_level": 1.0, "feed_ms": 0.25, "feed_ms_per_token": 0.1, "extra": 1}"#,
        "not json",
    ] {
        std::fs::write(&drafting, bad).unwrap();
        let out = run(&drafting);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim().lines().count(),
            1,
            "{bad}"
        );
    }
    // --drafting only goes with rows fitted from a file.
    let out = specfit(&["calibrate", "--drafting", "x.json"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn calibrate_measures_the_shipped_models_and_bench_reports_every_policy_losslessly() {
    let cal = temp("bench-cal.json");
    let out = specfit(
        &[
            "calibrate",
            "--store",
            "ram",
            "--cycles",
            "4",
            "--out",
            cal.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("paper form R²"), "{stderr}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    assert_eq!(saved["target"]["tier"], "ram");
    assert_eq!(saved["max_nodes"], 7);

    let dir = temp("bench-out");
    let run = specfit(
        &[
            "bench",
            "--quick",
            "--store",
            "ram",
            "--limit",
            "2",
            "--max-tokens",
            "10",
            "--calibration",
            cal.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("summarization") && stdout.contains("math_reasoning"));
    assert!(stdout.contains("lossless: every policy's output equals plain decoding's"));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["format"], "specfit-bench");
    assert_eq!(report["lossless"], true);
    let sets = report["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 2);
    for set in sets {
        assert_eq!(set["prompts"], 2);
        let rows = set["rows"].as_array().unwrap();
        let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
        for want in ["ar", "eagle3", "eagle3 (vanilla)", "specfit"] {
            assert!(labels.contains(&want), "{want} missing from {labels:?}");
        }
        for r in rows {
            assert_eq!(r["lossless_prompts"], r["prompts"]);
            assert!(r["decoded_tokens"].as_u64().unwrap() > 0);
            assert!(r["tok_s"].as_f64().unwrap() > 0.0);
            let wait = r["copy_wait_share"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&wait), "{r}");
            // Every drafting policy commits at least one token per cycle.
            assert!(r["tokens_per_cycle"].as_f64().unwrap() >= 1.0, "{r}");
        }
        let ar = rows.iter().find(|r| r["label"] == "ar").unwrap();
        assert_eq!(ar["speedup_vs_ar"], 1.0);
        assert_eq!(ar["nodes_per_cycle"], 0.0);
    }
    // The simulator check ran on both sets (2 prompts each).
    assert_eq!(report["validation"].as_array().unwrap().len(), 2);
    for v in report["validation"].as_array().unwrap() {
        let checks = v["checks"].as_array().unwrap();
        let within = checks
            .iter()
            .filter(|c| c["error"].as_f64().unwrap().abs() <= 0.10)
            .count();
        assert_eq!(v["within_10_percent"].as_u64().unwrap() as usize, within);
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| policy | slots | tok/s |"));
    let svg = std::fs::read_to_string(dir.join("chart.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("decode tok/s"));
}

#[test]
fn bench_rejects_unknown_prompt_sets_rows_and_bad_slot_counts_with_one_line() {
    for args in [
        &["bench", "--prompts", "no_such_set", "--quick"][..],
        &["bench", "--slots", "0", "--quick"][..],
        &["bench", "--slots", "65", "--quick"][..],
        &["bench", "--max-tokens", "0", "--quick"][..],
        &["bench", "--calibration", "/nonexistent/cal.json", "--quick"][..],
        &["bench", "--only", "ar,no-such-policy", "--quick"][..],
    ] {
        let out = specfit(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
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
        &[
            "generate",
            "--model",
            model,
            "--store",
            "disk",
            "--experts",
            missing.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
        ],
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
        &[
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "127",
        ],
        None,
    );
    one_line(&too_long, "max_position_embeddings");
    let fits = specfit(
        &[
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "126",
            "--ignore-eos",
        ],
        None,
    );
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
}
