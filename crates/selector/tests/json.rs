//! The JSON entry point: line numbers, one clear error per kind of bad input, and fuzzing with
//! arbitrary bytes and mutations of valid records (no input may panic).

use proptest::prelude::*;
use specfit_selector::json::{read_pools, read_probes, CalibrationJson, Overrides};
use specfit_selector::{calibrate, Probe};

const GOOD: &str = r#"{"layers": 2, "experts": 8, "max_nodes": 2,
 "root": {"routes": [[0, 1], [2, 3]]},
 "nodes": [{"parent": -1, "prob": 0.8, "routes": [[0, 4], [2, 3]]},
           {"parent": 0, "prob": 0.5, "routes": [[1, 5], [2, 6]]}],
 "cost": {"intercepts": [10, 10.5, 11], "beta": 0.5}}"#;

fn first_error(text: &str) -> String {
    let overrides = Overrides::default();
    let first = read_pools(text, &overrides).find_map(Result::err);
    first.map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn a_pretty_printed_pool_parses_and_selects() {
    let overrides = Overrides::default();
    let problems: Vec<_> = read_pools(GOOD, &overrides)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].pool.len(), 2);
    assert_eq!(problems[0].max_nodes, 2);
}

#[test]
fn every_kind_of_bad_pool_is_named_with_its_field_value_and_line() {
    let one_line = GOOD.replace('\n', "");
    let cases: &[(&str, &str, &str)] = &[
        (
            "\"parent\": 0,",
            "\"parent\": 7,",
            "line 2: nodes[1].parent = 7: must be -1 (the root) or an earlier node (0..1)",
        ),
        (
            "\"parent\": 0,",
            "\"parent\": 1,",
            "line 2: nodes[1].parent = 1",
        ),
        (
            "\"parent\": 0,",
            "\"parent\": -3,",
            "line 2: nodes[1].parent = -3",
        ),
        (
            "\"prob\": 0.5",
            "\"prob\": 1.5",
            "line 2: nodes[1].prob = 1.5: a path probability must be a number in [0, 1]",
        ),
        ("\"prob\": 0.5", "\"prob\": NaN", "line 2, column"),
        (
            "[[1, 5], [2, 6]]",
            "[[1, 5], [2, 8]]",
            "line 2: nodes[1].routes[1] holds expert 8, but experts = 8",
        ),
        (
            "[[1, 5], [2, 6]]",
            "[[1, 5]]",
            "line 2: nodes[1].routes has 1 layers, expected layers = 2",
        ),
        (
            "[[1, 5], [2, 6]]",
            "[[1, 5], [6, 6]]",
            "line 2: nodes[1].routes[1] lists expert 6 twice",
        ),
        (
            "[10, 10.5, 11]",
            "[10, 10.5]",
            "line 2: cost.intercepts has 2 entries; max_nodes = 2 needs at least 3",
        ),
        (
            "\"beta\": 0.5",
            "\"beta\": -0.5",
            "line 2: cost.beta = -0.5: must be finite and >= 0",
        ),
        (
            "\"beta\": 0.5",
            "\"beta_hit\": 0.5",
            "cost: give either \"beta\" or both",
        ),
        (
            "\"max_nodes\": 2",
            "\"max_nodes\": 2, \"objective\": \"best\"",
            "line 2: objective = \"best\": expected",
        ),
        (
            "\"max_nodes\": 2",
            "\"max_nodes\": 2, \"objective\": {\"lambda\": -1}",
            "objective lambda = -1",
        ),
        (
            "\"max_nodes\": 2",
            "\"max_nodes\": 2, \"colour\": 1",
            "unknown field `colour`",
        ),
        ("\"layers\": 2", "\"layers\": 0", "line 2: layers = 0"),
        (
            "\"experts\": 8",
            "\"experts\": 1000",
            "experts = 1000: must be between 1 and 512",
        ),
        (
            "[[0, 1], [2, 3]]}",
            "[[0, 1], [2, 3]]}, \"resident\": [[9], []]",
            "line 2: resident[0] holds expert 9",
        ),
    ];
    for (from, to, want) in cases {
        assert!(one_line.contains(from), "{from}");
        let text = format!("{one_line}\n{}\n", one_line.replacen(from, to, 1));
        let got = first_error(&text);
        assert!(
            got.contains(want),
            "replacing {from} by {to}: got {got:?}, want {want:?}"
        );
        assert!(!got.contains('\n'), "one line: {got:?}");
    }
}

#[test]
fn truncated_and_non_json_text_report_where_they_break() {
    let cut = &GOOD[..GOOD.len() / 2];
    assert!(
        first_error(cut).starts_with("line 3, column"),
        "{}",
        first_error(cut)
    );
    assert!(first_error("hello").starts_with("line 1, column 1: expected value"));
    assert!(first_error("{\"layers\": 1}").contains("missing field"));
    let overrides = Overrides::default();
    assert_eq!(read_pools("  \n ", &overrides).count(), 0);
}

#[test]
fn the_line_reported_is_the_line_the_record_starts_on() {
    let one_line = GOOD.replace('\n', " ");
    let bad = one_line.replace("\"prob\": 0.5", "\"prob\": 2");
    let text = format!("{one_line}\n\n{one_line}\n{GOOD}\n{bad}\n");
    assert!(
        first_error(&text).starts_with("line 9: nodes[1].prob = 2"),
        "{}",
        first_error(&text)
    );
}

#[test]
fn probe_rows_are_validated_with_their_lines() {
    let rows =
        "{\"nodes\": 0, \"demand\": 10, \"ms\": 5}\n{\"nodes\": 1, \"demand\": 10, \"ms\": -1}\n";
    assert_eq!(
        read_probes(rows).unwrap_err().to_string(),
        "line 2: probe row 1: ms = -1: must be finite and >= 0"
    );
    let half = "{\"nodes\": 0, \"demand\": 10, \"ms\": 5, \"hits\": 3}";
    assert!(read_probes(half)
        .unwrap_err()
        .to_string()
        .contains("\"hits\" and \"misses\" must be given together"));
    let e = read_probes("{\"nodes\": -1, \"demand\": 1, \"ms\": 1}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodes"), "{e}");
    // Rows of other kinds are validated too but are not verify forwards.
    let kinds = "{\"nodes\": 0, \"demand\": 4, \"ms\": 1, \"kind\": \"plain\"}\n{\"nodes\": 2, \"demand\": 9, \"ms\": 3}\n";
    assert_eq!(read_probes(kinds).unwrap().len(), 1);
    let unknown = "{\"nodes\": 0, \"demand\": 4, \"ms\": 1, \"kind\": \"warm\"}";
    assert_eq!(
        read_probes(unknown).unwrap_err().to_string(),
        "line 1: probe row 0: kind = \"warm\": expected \"verify\", \"resident\" or \"plain\""
    );
}

#[test]
fn a_calibration_file_round_trips_and_rejects_other_formats() {
    let probes: Vec<Probe> = (0..30)
        .map(|i| Probe {
            nodes: i % 3,
            demand: 100 + i as u64 * 7,
            ms: 5.0 + (i % 3) as f64 + 0.1 * (100 + i * 7) as f64,
            hits_misses: None,
            context: 0,
        })
        .collect();
    let file = CalibrationJson::new(&calibrate(&probes).unwrap());
    let text = serde_json::to_string_pretty(&file).unwrap();
    let back = CalibrationJson::parse(&text).unwrap();
    assert_eq!(back, file);
    assert!(back.cost_model(false).is_ok());
    assert_eq!(
        back.cost_model(true).unwrap_err(),
        specfit_selector::Error::NoResidencyCost
    );
    let other = text.replace("specfit-calibration", "something-else");
    assert!(CalibrationJson::parse(&other)
        .unwrap_err()
        .to_string()
        .contains("format = \"something-else\""));
}

#[test]
fn a_calibrations_timing_noise_is_read_and_bounded() {
    let cal = |noise: &str| {
        format!(
            "{{\"format\": \"specfit-calibration\", \"version\": 1, \"max_nodes\": 1, \
             \"cost\": {{\"intercepts\": [1.0, 2.0], \"beta\": 0.5}}, \
             \"fit\": {{\"rows\": 10, \"r2\": 0.9, \"median_abs_err_ms\": 0.1}}, \
             \"replay\": {{\"intercepts\": [1.0, 2.0], \"ar_intercept\": 1.0, \"beta_hit\": 0.0, \
             \"beta_miss\": 0.5, \"context_ms\": 0.0, \"r2\": 0.9, \"median_abs_err_ms\": 0.1{noise}}}}}"
        )
    };
    // Files written before it was measured have none: no noise.
    let old = CalibrationJson::parse(&cal("")).unwrap();
    assert_eq!(old.replay.unwrap().noise, 0.0);
    let measured = CalibrationJson::parse(&cal(", \"noise\": 0.2")).unwrap();
    assert_eq!(measured.replay.unwrap().noise, 0.2);
    for bad in ["-0.1", "2.5", "1e308"] {
        let e = CalibrationJson::parse(&cal(&format!(", \"noise\": {bad}")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("replay.noise") && e.contains("at most 2"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn acceptance_counts_are_read_with_or_without_the_top_childrens_and_checked() {
    let bins = |at: usize, n: u64| {
        let mut v = vec![0u64; 20];
        v[at] = n;
        format!("{v:?}")
    };
    let cal = |acceptance: &str| {
        format!(
            "{{\"format\": \"specfit-calibration\", \"version\": 1, \"max_nodes\": 1, \
             \"cost\": {{\"intercepts\": [1.0, 2.0], \"beta\": 0.5}}, \
             \"fit\": {{\"rows\": 10, \"r2\": 0.9, \"median_abs_err_ms\": 0.1}}, \
             \"acceptance\": {{{acceptance}}}}}"
        )
    };
    let all = format!("\"drafted\": {}, \"taken\": {}", bins(1, 10), bins(1, 6));
    // Files written before top children were counted: both curves are the one over all.
    let old = CalibrationJson::parse(&cal(&all)).unwrap();
    let counts = old.acceptance.as_ref().unwrap().to_counts().unwrap();
    assert_eq!(counts.top_counts().0.iter().sum::<u64>(), 0);
    assert_eq!(
        counts.curve().at(0.07, true),
        counts.curve().at(0.07, false)
    );
    // With them: the top children's five of six taken, the others' one of four.
    let top = format!(
        "\"top_drafted\": {}, \"top_taken\": {}",
        bins(1, 6),
        bins(1, 5)
    );
    let new = CalibrationJson::parse(&cal(&format!("{all}, {top}"))).unwrap();
    let counts = new.acceptance.as_ref().unwrap().to_counts().unwrap();
    assert!(counts.curve().at(0.075, true) > counts.curve().at(0.075, false));
    let text = serde_json::to_string(&new).unwrap();
    assert_eq!(CalibrationJson::parse(&text).unwrap(), new);
    // More top children taken than children taken, or half the pair, are refused.
    let over = format!(
        "\"top_drafted\": {}, \"top_taken\": {}",
        bins(1, 8),
        bins(1, 7)
    );
    let e = CalibrationJson::parse(&cal(&format!("{all}, {over}")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bin 1 has 7 taken of 8 top children"), "{e}");
    let half = format!("\"top_drafted\": {}", bins(1, 6));
    let e = CalibrationJson::parse(&cal(&format!("{all}, {half}")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("top_drafted without top_taken"), "{e}");
}

#[test]
fn a_pools_context_and_a_costs_context_charge_are_read_and_written() {
    // The GOOD pool at 1 000 cached tokens, its cost charging 0.002 ms per row per token.
    let text = GOOD
        .replace("\"beta\": 0.5}", "\"beta\": 0.5, \"context_ms\": 0.002}")
        .replace("\"max_nodes\": 2,", "\"max_nodes\": 2, \"context\": 1000,");
    let overrides = Overrides::default();
    let problem = read_pools(&text, &overrides).next().unwrap().unwrap();
    assert_eq!(problem.pool.context(), 1000);
    assert_eq!(problem.cost.context_ms(), 0.002);
    assert_eq!(
        problem.cost.at_context(1000).intercepts(),
        [12.0, 14.5, 17.0]
    );
    // Absent, both are 0; a negative charge is refused with its value.
    let plain = read_pools(GOOD, &overrides).next().unwrap().unwrap();
    assert_eq!((plain.pool.context(), plain.cost.context_ms()), (0, 0.0));
    let bad = text.replace("0.002", "-0.002");
    assert!(
        first_error(&bad).contains("context_ms = -0.002"),
        "{}",
        first_error(&bad)
    );
    // A calibration fitted at varied contexts writes the charge and reads it back.
    let probes: Vec<Probe> = (0..30)
        .map(|i| {
            let (n, c) = (i % 3, 50 + 90 * i as u64);
            Probe {
                nodes: n,
                demand: 100 + i as u64 * 7,
                ms: 5.0
                    + n as f64
                    + 0.1 * (100 + i * 7) as f64
                    + 0.003 * ((n + 1) as u64 * c) as f64,
                hits_misses: None,
                context: c,
            }
        })
        .collect();
    let file = CalibrationJson::new(&calibrate(&probes).unwrap());
    let text = serde_json::to_string_pretty(&file).unwrap();
    assert!(text.contains("\"context_ms\""), "{text}");
    let back = CalibrationJson::parse(&text).unwrap();
    assert_eq!(back, file);
    let gamma = back.cost_model(false).unwrap().context_ms();
    assert!((gamma - 0.003).abs() < 1e-9, "{gamma}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_readers(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let overrides = Overrides::default();
        for item in read_pools(&text, &overrides) {
            let _ = item;
        }
        let _ = read_probes(&text);
        let _ = CalibrationJson::parse(&text);
    }

    #[test]
    fn mutated_valid_pools_never_panic_and_errors_stay_one_line(
        at in 0usize..GOOD.len(),
        len in 0usize..12,
        insert in "[-0-9.,:\\[\\]{}\"a-z ]{0,6}",
    ) {
        let mut text = GOOD.to_string();
        let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let end = (at + len).min(text.len());
        let end = (end..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap();
        text.replace_range(at..end, &insert);
        let overrides = Overrides::default();
        for item in read_pools(&text, &overrides) {
            if let Err(e) = item {
                prop_assert!(!e.to_string().contains('\n'));
            }
        }
    }
}
