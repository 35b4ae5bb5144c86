//! `specfit calibrate` and `specfit probe` end to end: fits of synthetic, engine-measured and
//! committed probe rows, drafting costs measured elsewhere, and bad probe files.

mod common;
use common::*;

use std::path::PathBuf;

#[test]
fn calibrate_recovers_the_cost_model_that_generated_noiseless_probes() {
    let probes = temp("probes.jsonl");
    let cal = temp("calibration.json");
    let p = probes.to_str().unwrap();
    let gen = specfit(
        &cli(
            "synth probes --noise 0 --beta-hit 0.211 --beta-miss 0.211 --out {}",
            &[p],
        ),
        None,
    );
    assert!(gen.status.success());
    ok(&["calibrate", "--probes", p, "--out", cal.to_str().unwrap()]);
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
    ok(&[
        "select",
        "--calibration",
        cal.to_str().unwrap(),
        "--residency-cost",
        "--quiet",
    ]);
}

#[test]
fn bad_probe_files_exit_with_status_two() {
    let probes = temp("bad-probes.jsonl");
    let args = ["calibrate", "--probes", probes.to_str().unwrap()];
    let no_one_node =
        "{\"nodes\": 0, \"demand\": 10, \"ms\": 5}\n{\"nodes\": 2, \"demand\": 10, \"ms\": 5}\n";
    let unknown_field = "{\"nodes\": 0, \"demand\": 10, \"ms\": 5, \"speed\": 1}\n";
    for (rows, says) in [
        (no_one_node, "no probe row has nodes = 1"),
        (unknown_field, "line 1, column"),
    ] {
        std::fs::write(&probes, rows).unwrap();
        fails_with(&args, None, says);
    }
    let cal = temp("bad-calibration.json");
    std::fs::write(&cal, "{\"format\": \"x\"}").unwrap();
    fails_with(
        &["select", "--calibration", cal.to_str().unwrap()],
        None,
        "missing field",
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
    ok(&cli(
        "probe --model {} --drafter {} --prompt-ids 1,243,56,119 --cycles 48 --slots 2 --out {}",
        &[m, d, probes.to_str().unwrap()],
    ));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&probes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // What `specfit calibrate` measures: 48 verify forwards, and 16 plain steps per prompt.
    let kind = |k: &str| rows.iter().filter(|r| r["kind"] == k).count();
    assert_eq!((kind("verify"), kind("plain")), (48, 16));
    assert!(
        (0..=7).all(|n| rows
            .iter()
            .any(|r| r["kind"] == "verify" && r["nodes"] == n)),
        "every node count 0..=7 is probed"
    );
    // Every distinct (layer, expert) the forward needs is either a hit or a copy, exactly once.
    assert!(rows.iter().all(
        |r| r["hits"].as_u64().unwrap() + r["misses"].as_u64().unwrap()
            == r["demand"].as_u64().unwrap()
    ));
    fit_probes(&probes, Some(m), &cal);
    // The file fits into the whole calibration, replay model and drafting costs included.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    for key in ["cost", "cost_residency", "replay", "drafting", "target"] {
        assert!(file[key].is_object(), "{key} missing: {file}");
    }
    assert!(file["replay"]["plain"].is_object(), "{file}");
    let base = [&GREEDY_20[..], &["--model", m]].concat();
    let plain = specfit(&base, None);
    let spec = ok(&[&base[..], &specfit_flags(d, &cal)].concat());
    same_output(&spec, &plain, "");
    assert!(String::from_utf8_lossy(&spec.stderr).contains("selection median"));
    // The calibration is stamped with the target's shape: another target refuses it.
    let other = other_target();
    let generate_other = cli(
        "generate --prompt-ids 1,2 --max-tokens 8 --model {}",
        &[other.to_str().unwrap()],
    );
    let wrong = specfit(&[generate_other, specfit_flags(d, &cal)].concat(), None);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("was measured on a target of shape"));
    // A calibration measured with the experts on another tier is refused too.
    let mut disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    disk["target"]["tier"] = "disk".into();
    let disk_cal = temp("engine-cal-disk.json");
    std::fs::write(&disk_cal, disk.to_string()).unwrap();
    let elsewhere = [&base[..], &specfit_flags(d, &disk_cal)].concat();
    fails_with(
        &elsewhere,
        None,
        "measured with the experts on the disk tier",
    );
}

#[test]
fn the_committed_h200_calibration_is_the_fit_of_the_committed_h200_probes_and_replays() {
    let cal = temp("h200-cal.json");
    ok(&[
        "calibrate",
        "--probes",
        "docs/gpu/h200-probes.jsonl",
        "--out",
        cal.to_str().unwrap(),
    ]);
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
    let out = ok(&cli(
        "simulate --synthetic summarization --calibration \
            docs/gpu/specfit-calibration.h200.json --slots 48 --positions \
            120",
        &[],
    ));
    // Four policies and the oracle at one slot point.
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2 + 5);
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
        specfit(&words(&a), None)
    };
    ok(&words(&args(&drafting)));
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
fn calibrate_refuses_a_zero_prompt_limit_before_loading_anything_and_a_limit_on_fitted_rows() {
    for args in [
        &["calibrate", "--limit", "0", "--model", "/nonexistent"][..],
        &[
            "calibrate",
            "--probes",
            "docs/gpu/h200-probes.jsonl",
            "--limit",
            "2",
        ][..],
    ] {
        let out = specfit(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("--limit"), "{args:?}: {why}");
    }
}
