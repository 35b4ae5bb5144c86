//! `specfit select` end to end: the shipped example pools, forced baselines, and bad pools
//! (status 2, one line naming the problem).

mod common;
use common::*;

#[test]
fn select_runs_on_the_shipped_example_pools_with_no_arguments() {
    let out = ok(&["select"]);
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
