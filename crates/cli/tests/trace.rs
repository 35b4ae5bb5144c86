//! `specfit record` and `specfit simulate` end to end: traces the reader accepts, replay under
//! every policy, paper-scale synthetic traces.

mod common;
use common::*;

use std::path::PathBuf;

#[test]
fn record_writes_a_versioned_trace_the_trace_reader_accepts() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("fixtures/qwen3moe/eagle_target");
    let drafter = root.join("fixtures/eagle3/tiny");
    let out = temp("trace.jsonl");
    ok(&cli(
        "record --model {} --drafter {} --prompt-ids 1,243,56,119 \
            --max-tokens 6 --slots 2 --out {}",
        &[
            model.to_str().unwrap(),
            drafter.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    ));
    let (header, steps) = specfit_trace::read(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        (
            header.moe_layers,
            header.experts,
            header.num_experts_per_tok,
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
    ok(&cli(
        "record --model {} --drafter {} --prompt-ids 1,243,56 --max-tokens 30 --out {}",
        &[m, d, trace.to_str().unwrap()],
    ));
    ok(&cli(
        "probe --model {} --drafter {} --prompt-ids 1,243,56 --cycles 32 --slots 2 --out {}",
        &[m, d, probes.to_str().unwrap()],
    ));
    fit_probes(&probes, None, &cal);
    let out = ok(&cli(
        "simulate --trace {} --calibration {} --slots 4,2,0",
        &[trace.to_str().unwrap(), cal.to_str().unwrap()],
    ));
    let table = String::from_utf8_lossy(&out.stdout);
    // Four policies and the oracle at each of 3 slot points.
    assert_eq!(table.lines().count(), 2 + 3 * 5, "{table}");
    assert!(table
        .lines()
        .filter(|l| l.contains("| ar |"))
        .all(|l| l.contains("| 1.00 |")));
    // Two prompts' traces replay one after the other, the oracle beside the policies at each
    // slot point (column 4: × ar).
    let second = temp("sim-trace-2.jsonl");
    ok(&cli(
        "record --model {} --drafter {} --prompt-ids 7,19,200,3 --max-tokens 20 --out {}",
        &[m, d, second.to_str().unwrap()],
    ));
    let two = "simulate --trace {} --trace {} --calibration {} --slots 4,0";
    let out = ok(&cli(
        two,
        &[
            trace.to_str().unwrap(),
            second.to_str().unwrap(),
            cal.to_str().unwrap(),
        ],
    ));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in 2 trace(s)"));
    let table = String::from_utf8_lossy(&out.stdout);
    let oracle: Vec<f64> = table
        .lines()
        .filter(|l| l.contains("| oracle |"))
        .map(|l| l.split('|').nth(4).unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(oracle.len(), 2, "{table}");
    assert!(oracle.iter().all(|&x| x > 0.0), "{table}");
    // Traces of another model shape are refused, naming both.
    let text = std::fs::read_to_string(&second).unwrap();
    let other = temp("sim-trace-other.jsonl");
    std::fs::write(&other, text.replacen("\"vocab\":256", "\"vocab\":300", 1)).unwrap();
    let refused = specfit(
        &[
            "simulate",
            "--trace",
            trace.to_str().unwrap(),
            "--trace",
            other.to_str().unwrap(),
            "--calibration",
            cal.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("another model shape"), "{stderr}");
    // A calibration without hit/miss counts cannot drive the simulated machine.
    let plain = temp("sim-plain.jsonl");
    std::fs::write(&plain, "{\"nodes\": 0, \"demand\": 10, \"ms\": 5}\n{\"nodes\": 1, \"demand\": 12, \"ms\": 6}\n{\"nodes\": 0, \"demand\": 11, \"ms\": 5.5}\n").unwrap();
    let plain_cal = temp("sim-plain-cal.json");
    fit_probes(&plain, None, &plain_cal);
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
        &cli(
            "simulate --synthetic gsm8k --preset a100 --slots 48,0 --positions 120",
            &[],
        ),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("eagle3 top-7 accepts"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        2 + 2 * 5
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
