//! Counts from flags past what a command can do: every one exits 2 within seconds with a line
//! naming the limit, never a panic, an allocation the machine cannot hold, or a run without end.

mod common;
use common::*;

use std::time::{Duration, Instant};

const HUGE: &str = "18446744073709551615";

/// `args` (with `{}` standing for [`HUGE`]) exits 2 quickly and says `says`.
fn refused(text: &str, says: &str) {
    let line = text.replace("{}", HUGE);
    let start = Instant::now();
    let out = specfit(&cli(&line, &[]), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{line}: {stderr}");
    assert!(!stderr.contains("panicked"), "{line}: {stderr}");
    assert!(stderr.contains(says), "{line}: {stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{line}: {:?}",
        start.elapsed()
    );
}

#[test]
fn huge_counts_are_refused_with_their_limit() {
    let pair =
        "--model fixtures/qwen3moe/eagle_target --drafter fixtures/eagle3/tiny --prompt-ids 1,2";
    for (args, says) in [
        (format!("generate {pair} --max-tokens {{}}"), "max_position_embeddings"),
        (format!("generate {pair} --max-tokens 4 --branching 1000000"), "at most 1024 nodes"),
        (format!("generate {pair} --max-tokens 4 --levels {{}}"), "max_position_embeddings"),
        (format!("generate {pair} --max-tokens 4 --max-nodes {{}}"), "from 0 to 64"),
        (format!("record {pair} --max-tokens {{}} --out /nonexistent/x"), "max_position_embeddings"),
        (format!("probe {pair} --cycles {{}} --out /nonexistent/x"), "max_position_embeddings"),
        (
            "forward --model fixtures/qwen3moe/eagle_target --tokens 1,2 --greedy {} --out /nonexistent/x".into(),
            "max_position_embeddings",
        ),
        ("serve --policy ar --port 0 --queue {}".into(), "between 1 and 4096"),
        ("serve --policy ar --port 0 --read-timeout 1e300".into(), "from 0 to 86400"),
        ("synth pools --count {}".into(), "between 1 and 1000000"),
        ("synth probes --rows {}".into(), "between 1 and 1000000"),
        (
            "simulate --synthetic gsm8k --positions {} --calibration docs/gpu/specfit-calibration.h200.json".into(),
            "between 1 and 20000",
        ),
    ] {
        refused(&args, says);
    }
}

#[test]
fn a_file_that_is_no_model_and_a_policy_without_its_drafter_are_named_as_such() {
    let bad = temp("not-a-model.gguf");
    std::fs::write(&bad, b"XXXXjunk").unwrap();
    let model = bad.to_str().unwrap();
    fails_with(
        &cli("generate --prompt-ids 1,2 --model {}", &[model]),
        None,
        "not a GGUF file (it starts with [58, 58, 58, 58]",
    );
    let dir = temp("dir-as-safetensors");
    std::fs::create_dir_all(dir.join("model.safetensors")).unwrap();
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/qwen3moe/eagle_target/config.json"
    );
    std::fs::copy(cfg, dir.join("config.json")).unwrap();
    let dir = dir.to_str().unwrap();
    fails_with(
        &cli("generate --store ram --prompt-ids 1,2 --model {}", &[dir]),
        None,
        "a directory, not a safetensors file",
    );
    refused("generate --policy specfit --prompt-ids 1,2", "--drafter");
}
