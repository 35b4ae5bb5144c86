//! The crate's one error type. Every variant carries the offending values and names the field in
//! the interchange format's words (`nodes[3].routes[5]`, `cost.beta`), so a caller can print it as
//! is. It does not know about files or line numbers except through [`Error::AtLine`].

use std::fmt;

/// Which part of a pool a route list belongs to; displays as its interchange-format path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `root.routes`
    Root,
    /// `nodes[i].routes`
    Node(usize),
    /// `resident`
    Resident,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Root => write!(f, "root.routes"),
            Owner::Node(i) => write!(f, "nodes[{i}].routes"),
            Owner::Resident => write!(f, "resident"),
        }
    }
}

/// Everything that can be wrong with a pool, a cost model, a probe set or an input file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("layers = {layers}: must be between 1 and {max}")]
    LayersOutOfRange { layers: usize, max: usize },
    #[error("experts = {experts}: must be between 1 and {max}")]
    ExpertsOutOfRange { experts: usize, max: usize },
    #[error("nodes: {nodes} draft nodes exceed the limit of {limit}")]
    TooManyNodes { nodes: usize, limit: usize },
    #[error(
        "nodes[{index}].parent = {parent}: must be -1 (the root) or an earlier node (0..{index})"
    )]
    BadParent { index: usize, parent: i64 },
    #[error("nodes[{index}].prob = {prob}: a path probability must be a number in [0, 1]")]
    BadProbability { index: usize, prob: f64 },
    #[error("{owner} has {got} layers, expected layers = {expected}")]
    LayerCountMismatch {
        owner: Owner,
        got: usize,
        expected: usize,
    },
    #[error(
        "{owner}[{layer}] holds expert {expert}, but experts = {experts} (ids are 0..{experts})"
    )]
    ExpertOutOfRange {
        owner: Owner,
        layer: usize,
        expert: u64,
        experts: usize,
    },
    #[error("{owner}[{layer}] lists expert {expert} twice")]
    DuplicateExpert {
        owner: Owner,
        layer: usize,
        expert: u32,
    },
    #[error(
        "resident set is {got_layers} layers x {got_experts} experts, \
         but the pool is {layers} x {experts}"
    )]
    ResidentShapeMismatch {
        got_layers: usize,
        got_experts: usize,
        layers: usize,
        experts: usize,
    },

    #[error("cost.intercepts has {got} entries; max_nodes = {max_nodes} needs at least {need}")]
    TooFewIntercepts {
        got: usize,
        max_nodes: usize,
        need: usize,
    },
    #[error("cost.intercepts[{index}] = {value}: must be finite and >= 0")]
    BadIntercept { index: usize, value: f64 },
    #[error("cost.{name} = {value}: must be finite and >= 0")]
    BadBeta { name: &'static str, value: f64 },
    #[error("replay.noise = {value}: must be finite, >= 0 and at most {max}")]
    BadNoise { value: f64, max: f64 },
    #[error(
        "cost: give either \"beta\" or both \"beta_hit\" and \"beta_miss\" (got beta: {beta}, \
         beta_hit: {beta_hit}, beta_miss: {beta_miss})"
    )]
    AmbiguousCost {
        beta: bool,
        beta_hit: bool,
        beta_miss: bool,
    },
    #[error("cost is missing: give \"cost\" in the pool or a calibration file")]
    MissingCost,
    #[error("the calibration has no residency-aware cost (\"cost_residency\"): it was fitted without hit and miss counts; measure one with `specfit calibrate`")]
    NoResidencyCost,
    #[error("objective lambda = {lambda}: must be finite and >= 0")]
    BadLambda { lambda: f64 },
    #[error(
        "objective = {got:?}: expected \"ratio\", \"topk\", \"all\", \"none\" or {{\"lambda\": x}}"
    )]
    UnknownObjective { got: String },
    #[error("max_nodes = {max_nodes}: exact search supports at most {limit}")]
    MaxNodesTooLarge { max_nodes: usize, limit: usize },
    #[error("the exact search over {nodes} draft nodes with max_nodes = {max_nodes} scored more than {limit} subtrees without finishing (tied or near-tied nodes leave nothing to prune); draft a smaller pool or lower max_nodes")]
    SearchTooLarge {
        nodes: usize,
        max_nodes: usize,
        limit: u64,
    },

    #[error("no probe rows: calibration needs at least one row per node count 0..=max")]
    NoProbes,
    #[error(
        "no probe row has nodes = {nodes}: calibration needs one per node count 0..={max_nodes}"
    )]
    MissingNodeCount { nodes: usize, max_nodes: usize },
    #[error("probe row {row}: {field} = {value}: must be finite and >= 0")]
    BadProbe {
        row: usize,
        field: &'static str,
        value: f64,
    },
    #[error("probe row {row}: kind = {kind:?}: expected \"verify\", \"resident\" or \"plain\"")]
    UnknownProbeKind { row: usize, kind: String },
    #[error("probe row {row}: \"hits\" and \"misses\" must be given together")]
    HalfResidency { row: usize },
    #[error(
        "probe row {row}: some rows carry hits/misses and some do not; give them on all rows or none"
    )]
    MixedResidency { row: usize },
    #[error("too few measurements ({rows}) to fit {coefficients} costs")]
    TooFewMeasurements { rows: usize, coefficients: usize },
    #[error("non-negative least squares did not converge in {iterations} iterations")]
    NnlsNoConvergence { iterations: usize },
    #[error(
        "calibration file: format = {format:?}, version = {version}; expected {expected:?} v1"
    )]
    BadCalibrationFormat {
        format: String,
        version: u64,
        expected: &'static str,
    },

    #[error("acceptance counts: {got} bins, expected {expected}")]
    AcceptanceBins { got: usize, expected: usize },
    #[error("acceptance counts: bin {bin} has {taken} taken of {drafted} drafted")]
    AcceptanceTakenExceedsDrafted {
        bin: usize,
        taken: u64,
        drafted: u64,
    },
    #[error(
        "acceptance counts: bin {bin} has {top_taken} taken of {top_drafted} top children, \
         but {taken} taken of {drafted} children in all"
    )]
    AcceptanceTopExceedsAll {
        bin: usize,
        top_drafted: u64,
        top_taken: u64,
        drafted: u64,
        taken: u64,
    },
    #[error("acceptance counts: {present} without {missing}")]
    AcceptanceTopIncomplete {
        present: &'static str,
        missing: &'static str,
    },

    #[error("line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// The error is part of the message, not a chained source, so it prints once.
    #[error("line {line}: {error}")]
    AtLine { line: usize, error: Box<Error> },
    #[error("no JSON value in the input")]
    EmptyInput,
}

impl Error {
    /// Attaches the 1-based line number of the input record this error came from.
    pub fn at_line(self, line: usize) -> Error {
        match self {
            Error::Syntax { .. } | Error::AtLine { .. } => self,
            other => Error::AtLine {
                line,
                error: Box::new(other),
            },
        }
    }
}
