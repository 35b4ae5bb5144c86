//! Traces round-trip, and readers refuse other versions and malformed steps with their line.

use specfit_trace::{read, write, TraceError, TraceHeader, TraceNode, TraceStep};

fn step(position: usize) -> TraceStep {
    TraceStep {
        position,
        root: 3,
        root_routes: vec![vec![0, 1]],
        nodes: vec![
            TraceNode {
                parent: -1,
                token: 4,
                prob: 0.6,
                depth: 1,
                routes: vec![vec![1, 2]],
                agrees: true,
            },
            TraceNode {
                parent: 0,
                token: 5,
                prob: 0.3,
                depth: 2,
                routes: vec![vec![3, 0]],
                agrees: false,
            },
        ],
        next: 4,
    }
}

#[test]
fn a_written_trace_reads_back_identically() {
    let mut header = TraceHeader::new(1, 4, 2, 16);
    header.meta.insert("model".into(), "m".into());
    let steps = vec![step(3), step(4)];
    let mut bytes = Vec::new();
    write(&mut bytes, &header, &steps).unwrap();
    assert_eq!(
        read(std::str::from_utf8(&bytes).unwrap()).unwrap(),
        (header, steps)
    );
}

#[test]
fn other_versions_and_malformed_steps_are_refused_with_a_hint() {
    let header = TraceHeader {
        version: 9,
        ..TraceHeader::new(1, 4, 2, 16)
    };
    let mut bytes = Vec::new();
    write(&mut bytes, &header, &[]).unwrap();
    let err = read(std::str::from_utf8(&bytes).unwrap()).unwrap_err();
    assert!(matches!(err, TraceError::Version { version: 9, .. }));
    assert!(err.to_string().contains("re-record with `specfit record`"));
    let mut bad = step(0);
    bad.nodes[1].parent = 5;
    let mut bytes = Vec::new();
    write(&mut bytes, &TraceHeader::new(1, 4, 2, 16), &[step(0), bad]).unwrap();
    let err = read(std::str::from_utf8(&bytes).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 3: nodes[1].parent = 5"), "{err}");
    let mut wide = step(0);
    wide.nodes[0].routes = vec![vec![7]];
    let mut bytes = Vec::new();
    write(&mut bytes, &TraceHeader::new(1, 4, 2, 16), &[wide]).unwrap();
    let e = read(std::str::from_utf8(&bytes).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("routes"), "{e}");
    assert!(matches!(read(""), Err(TraceError::Empty)));
}

#[test]
fn a_header_that_names_experts_per_token_top_k_still_reads() {
    let header = TraceHeader::new(1, 4, 2, 16);
    let mut bytes = Vec::new();
    write(&mut bytes, &header, &[step(0)]).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.contains("\"num_experts_per_tok\":2"), "{text}");
    let old = text.replacen("num_experts_per_tok", "top_k", 1);
    let (back, steps) = read(&old).unwrap();
    assert_eq!((back, steps), (header, vec![step(0)]));
}
