//! `specfit bench` end to end: calibration on the shipped models, every policy lossless, and bad
//! arguments.

mod common;
use common::*;

#[test]
fn calibrate_measures_the_shipped_models_and_bench_reports_every_policy_losslessly() {
    let cal = temp("bench-cal.json");
    let out = specfit(
        &cli(
            "calibrate --store ram --cycles 4 --limit 12 --out {}",
            &[cal.to_str().unwrap()],
        ),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // 12 of the 30 shipped prompts, 4 probe forwards each.
    assert!(stderr.contains("48 probe rows, K = "), "{stderr}");
    assert!(stderr.contains("paper form R²"), "{stderr}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    assert_eq!(saved["target"]["tier"], "ram");
    // The shipped safetensors experts are copied into RAM slots, not used in place.
    assert_eq!(saved["target"]["in_place"], false);
    assert_eq!(saved["max_nodes"], 7);

    let dir = temp("bench-out");
    let run = specfit(
        &cli(
            "bench --quick --store ram --limit 2 --max-tokens 10 --calibration {} --out {}",
            &[cal.to_str().unwrap(), dir.to_str().unwrap()],
        ),
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
    // The calibration's context charge as saved (absent there: not fitted, 0).
    let gamma = saved["cost"]
        .get("context_ms")
        .map_or(0.0, |v| v.as_f64().unwrap());
    assert_eq!(report["calibration"]["context_ms"].as_f64(), Some(gamma));
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
        // Replayed with costs probed between the runs, and with the start calibration beside.
        let costs = v["costs"].as_str().unwrap();
        assert!(costs.starts_with("probed between the runs"), "{costs}");
        // The oracle's headroom at each slot point of the checks, beside plain decoding
        // replayed with the same costs and the fastest replayed configuration.
        let headroom = v["headroom"].as_array().unwrap();
        let mut points: Vec<u64> = checks
            .iter()
            .map(|c| c["slots"].as_u64().unwrap())
            .collect();
        points.sort_unstable();
        points.dedup();
        let got: Vec<u64> = headroom
            .iter()
            .map(|h| h["slots"].as_u64().unwrap())
            .collect();
        assert_eq!(got, points, "{v}");
        for h in headroom {
            // (Not at least plain decoding's: the oracle prices each position alone, and on so
            // few tokens what a verify leaves in the slots can cost it more than it gained.)
            assert!(h["oracle_tok_s"].as_f64().unwrap() > 0.0, "{h}");
            assert!(h["ar_tok_s"].as_f64().unwrap() > 0.0, "{h}");
            assert!(h["oracle_tokens_per_cycle"].as_f64().unwrap() >= 1.0, "{h}");
            let best = h["best_tok_s"].as_f64().unwrap();
            assert!(checks.iter().any(|c| c["simulated_tok_s"] == best), "{h}");
        }
        for c in checks {
            assert!(c["simulated_tok_s"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["simulated_at_start_tok_s"].as_f64().unwrap() > 0.0, "{c}");
            assert!(
                c["measured_copies_per_token"].as_f64().unwrap() >= 0.0,
                "{c}"
            );
        }
    }
    // The check's traces are kept, one per validated prompt, for replay with other costs.
    for (set, first) in [("summarization", 241), ("math_reasoning", 401)] {
        for id in [first, first + 1] {
            let path = dir.join(format!("traces/{set}-{id}.jsonl"));
            let text = std::fs::read_to_string(&path).unwrap();
            let header: serde_json::Value =
                serde_json::from_str(text.lines().next().unwrap()).unwrap();
            assert_eq!(header["format"], "specfit-trace", "{}", path.display());
            assert_eq!(header["meta"]["question_id"], id);
            // At most 10 new tokens: up to 9 positions decoded after the prefill's token.
            let steps = text.lines().count() - 1;
            assert!(
                (1..=9).contains(&steps),
                "{steps} steps in {}",
                path.display()
            );
        }
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| policy | slots | tok/s |"));
    assert!(md.contains("| slots | oracle tok/s (simulated) |"));
    let svg = std::fs::read_to_string(dir.join("chart.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("decode tok/s"));

    // The paper-scale plan: a slot sweep of its own, one configuration over a whole set at a
    // time, prompts cut — still every output checked against plain decoding. Its experts are on
    // disk: the calibration measured in RAM is refused, one measured on disk drives it.
    let dir = temp("bench-sweep");
    let sweep = |cal: &std::path::Path| {
        let text = "bench --store disk --limit 2 --max-tokens 8 --max-prompt-tokens 64 \
            --sweep 8,16 --only ar,eagle3,specfit,specfit[predictor],specfit+ahead[predictor] \
            --one-at-a-time --validate 1 --calibration {} --out {}";
        let args = [cal.to_str().unwrap(), dir.to_str().unwrap()];
        cli(text, &args)
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let says = "on the ram tier but they are on the disk tier";
    ends_in_error(&words(&sweep(&cal)), says);
    let disk_cal = temp("bench-cal-disk.json");
    ok(&cli(
        "calibrate --store disk --cycles 4 --limit 12 --out {}",
        &[disk_cal.to_str().unwrap()],
    ));
    ok(&words(&sweep(&disk_cal)));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["lossless"], true);
    for set in report["sets"].as_array().unwrap() {
        let rows: Vec<String> = set["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{}@{}", r["label"].as_str().unwrap(), r["slots"]))
            .collect();
        for want in [
            "ar@16",
            "ar@8",
            "eagle3@8",
            "specfit@16",
            "specfit[predictor]@8",
            "specfit+ahead[predictor]@8",
        ] {
            assert!(
                rows.contains(&want.to_string()),
                "{want} missing from {rows:?}"
            );
        }
        assert!(rows.iter().all(|r| !r.contains("vanilla")), "{rows:?}");
    }
    // One configuration at a time, the simulator check probes its costs between them.
    for v in report["validation"].as_array().unwrap() {
        let costs = v["costs"].as_str().unwrap();
        assert!(costs.starts_with("probed between the runs"), "{costs}");
        assert_eq!(v["prompts"], 1);
    }
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
        &["bench", "--sweep", "8,65", "--quick"][..],
        &["bench", "--max-prompt-tokens", "0", "--quick"][..],
    ] {
        let out = specfit(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}
