//! The trace format: what `specfit record` writes and a simulator replays. For every position of
//! a greedy output, the full draft pool the drafter proposed there — parents, tokens, path
//! probabilities, every node's expert routes per MoE layer, whether the target's argmax agrees
//! with each node — plus the root's routes and the target's next token: enough to replay *any*
//! selection policy offline (a policy picks a subtree; the accepted length follows from the
//! agreement flags; the next position is the old one plus the committed tokens).
//!
//! On disk: JSON Lines, a [`TraceHeader`] first, then one [`TraceStep`] per position. Readers
//! reject another format or version with a hint to re-record. Plain data; no ML dependency.
//!
//! # Example
//!
//! ```
//! use specfit_trace::{read, write, TraceHeader, TraceNode, TraceStep};
//!
//! let header = TraceHeader::new(2, 8, 2, 256);
//! let step = TraceStep {
//!     position: 5,
//!     root: 17,
//!     root_routes: vec![vec![0, 3], vec![1, 2]],
//!     nodes: vec![TraceNode { parent: -1, token: 9, prob: 0.7, depth: 1, routes: vec![vec![0, 4], vec![2, 5]], agrees: true }],
//!     next: 9,
//! };
//! let mut bytes = Vec::new();
//! write(&mut bytes, &header, std::slice::from_ref(&step))?;
//! let (h, steps) = read(std::str::from_utf8(&bytes).unwrap())?;
//! assert_eq!((h, steps), (header, vec![step]));
//! # Ok::<(), specfit_trace::TraceError>(())
//! ```

use std::io::Write;

use serde::{Deserialize, Serialize};

/// The `format` tag of trace headers.
pub const FORMAT: &str = "specfit-trace";
/// The version this crate writes and reads.
pub const VERSION: u32 = 1;

/// First line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceHeader {
    pub format: String,
    pub version: u32,
    /// MoE layers of the target (routes have one list per MoE layer).
    pub moe_layers: usize,
    pub experts: usize,
    /// Experts per token per layer (traces written before the name settled say `top_k`).
    #[serde(alias = "top_k")]
    pub num_experts_per_tok: usize,
    pub vocab: usize,
    /// Free-form provenance (model and drafter paths, prompt, tree shape).
    #[serde(default)]
    pub meta: serde_json::Map<String, serde_json::Value>,
}

impl TraceHeader {
    /// A header of the current format and version.
    pub fn new(
        moe_layers: usize,
        experts: usize,
        num_experts_per_tok: usize,
        vocab: usize,
    ) -> TraceHeader {
        TraceHeader {
            format: FORMAT.into(),
            version: VERSION,
            moe_layers,
            experts,
            num_experts_per_tok,
            vocab,
            meta: serde_json::Map::new(),
        }
    }
}

/// One drafted node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceNode {
    /// Parent node index; −1 = the root. Parents precede children.
    pub parent: i64,
    pub token: u32,
    /// Path probability under the drafter.
    pub prob: f64,
    /// 1 for children of the root.
    pub depth: usize,
    /// Experts per MoE layer, in the target router's top-k order.
    pub routes: Vec<Vec<u32>>,
    /// Whether the target's greedy token after the node's parent is this node's token.
    pub agrees: bool,
}

/// The pool at one position of the greedy output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceStep {
    /// Tokens committed before the root (prompt included).
    pub position: usize,
    /// The last committed token (verified with any subtree).
    pub root: u32,
    pub root_routes: Vec<Vec<u32>>,
    pub nodes: Vec<TraceNode>,
    /// The target's greedy token after the root.
    pub next: u32,
}

/// What can be wrong with a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Json { line: usize, message: String },
    #[error("trace format {format:?} version {version}; this build reads {FORMAT:?} version {VERSION} — re-record with `specfit record`")]
    Version { format: String, version: u32 },
    #[error("line {line}: {reason}")]
    Invalid { line: usize, reason: String },
    #[error("empty trace: no header line")]
    Empty,
    /// The error is part of the message, not a chained source, so it prints once.
    #[error("writing the trace: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for TraceError {
    fn from(e: std::io::Error) -> TraceError {
        TraceError::Io(e)
    }
}

/// Writes a header and steps as JSON Lines.
pub fn write(
    out: &mut impl Write,
    header: &TraceHeader,
    steps: &[TraceStep],
) -> Result<(), TraceError> {
    serde_json::to_writer(&mut *out, header).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    for step in steps {
        serde_json::to_writer(&mut *out, step).map_err(std::io::Error::from)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Reads and checks a trace: the header's format and version, and every step against it
/// (layer counts, expert ids, parents before children).
pub fn read(text: &str) -> Result<(TraceHeader, Vec<TraceStep>), TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (i, first) = lines.next().ok_or(TraceError::Empty)?;
    let header: TraceHeader = serde_json::from_str(first).map_err(|e| TraceError::Json {
        line: i + 1,
        message: e.to_string(),
    })?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(TraceError::Version {
            format: header.format,
            version: header.version,
        });
    }
    let mut steps = Vec::new();
    for (i, line) in lines {
        let step: TraceStep = serde_json::from_str(line).map_err(|e| TraceError::Json {
            line: i + 1,
            message: e.to_string(),
        })?;
        check(&header, &step).map_err(|reason| TraceError::Invalid {
            line: i + 1,
            reason,
        })?;
        steps.push(step);
    }
    Ok((header, steps))
}

fn check(h: &TraceHeader, s: &TraceStep) -> Result<(), String> {
    let routes_ok = |r: &Vec<Vec<u32>>| {
        r.len() == h.moe_layers && r.iter().flatten().all(|&e| (e as usize) < h.experts)
    };
    if !routes_ok(&s.root_routes) {
        return Err(format!(
            "root_routes do not fit {} layers × {} experts",
            h.moe_layers, h.experts
        ));
    }
    for (i, n) in s.nodes.iter().enumerate() {
        if n.parent < -1 || n.parent >= i as i64 {
            return Err(format!(
                "nodes[{i}].parent = {}: must be -1 or an earlier node",
                n.parent
            ));
        }
        if !(0.0..=1.0).contains(&n.prob) {
            return Err(format!("nodes[{i}].prob = {}: not a probability", n.prob));
        }
        if !routes_ok(&n.routes) {
            return Err(format!(
                "nodes[{i}].routes do not fit {} layers × {} experts",
                h.moe_layers, h.experts
            ));
        }
    }
    Ok(())
}
