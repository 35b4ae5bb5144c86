//! `specfit train-predictor` end to end: a route predictor that beats chance and drives SpecFit
//! losslessly.

mod common;
use common::*;

#[test]
fn a_trained_route_predictor_beats_chance_and_drives_specfit_losslessly() {
    // On the shipped target and drafter, trained on a few calibration questions and scored on
    // held-out ones.
    let d = "models/drafter";
    let pred = temp("predictor.safetensors");
    let train = specfit(
        &cli(
            "train-predictor --prompts data/calibration/gsm8k_train.jsonl \
                --limit 10 --positions 6 --out {}",
            &[pred.to_str().unwrap()],
        ),
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
    ok(&["synth", "probes", "--out", probes.to_str().unwrap()]);
    fit_probes(&probes, Some("models/target"), &cal);
    let base = GREEDY_20;
    let plain = specfit(&base, None);
    let routes = format!("predictor:{}", pred.display());
    let with_routes = [&specfit_flags(d, &cal)[..], &["--routes", &routes]].concat();
    let spec = ok(&[&base[..], &with_routes].concat());
    same_output(&spec, &plain, "");
    // A predictor for another shape is refused.
    let other = other_target();
    let generate_other = cli(
        "generate --prompt-ids 1,2 --model {}",
        &[other.to_str().unwrap()],
    );
    let wrong = specfit(&[generate_other, with_routes].concat(), None);
    assert_eq!(wrong.status.code(), Some(2));
}
