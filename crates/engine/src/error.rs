//! The engine's one error type. Variants carry the file, tensor and values involved so that the
//! CLI can print them as one line. It does not format for any particular front end.

use std::path::PathBuf;

/// Everything that can go wrong loading a model or running a forward.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The I/O error is part of the message, not a chained source, so it prints once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: architectures = {got:?}; this engine runs Qwen3MoeForCausalLM")]
    UnsupportedArchitecture { path: PathBuf, got: Vec<String> },
    #[error("config.json: {field} = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// The GGUF error is part of the message, not a chained source, so it prints once.
    #[error("{path}: {error}")]
    Gguf {
        path: PathBuf,
        error: specfit_gguf::GgufError,
    },
    #[error("inflate: {field} = {value}: {reason}")]
    InflateShape {
        field: &'static str,
        value: usize,
        reason: String,
    },
    #[error("{path}: {reason}")]
    InflateOutput { path: PathBuf, reason: String },
    #[error("{path}: {needed} bytes needed ({:.1} GB), {available} free ({:.1} GB)", *needed as f64 / 1e9, *available as f64 / 1e9)]
    DiskSpace {
        path: PathBuf,
        needed: u64,
        available: u64,
    },
    #[error("{path}: metadata {key}: {reason}")]
    GgufMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: {reason}; restore it from git, or delete it and put the checkpoint's model.safetensors beside it")]
    Compressed { path: PathBuf, reason: String },
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor {name} is missing (looked in {searched})")]
    MissingTensor { name: String, searched: String },
    #[error("{path}: tensor {name} is not part of a Qwen3MoeForCausalLM with this config")]
    ExtraTensor { path: PathBuf, name: String },
    #[error("{path}: tensor {name} has shape {got:?}, config.json implies {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("{path}: tensor {name} has dtype {dtype}; supported: F32, BF16, F16")]
    TensorDtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{index}: weight_map names shard {shard}, which does not exist")]
    MissingShard { index: PathBuf, shard: String },
    #[error(
        "token id {token} at position {index} is outside the vocabulary (vocab_size = {vocab})"
    )]
    TokenOutOfRange {
        token: u32,
        index: usize,
        vocab: usize,
    },
    #[error(
        "teacher forcing: {feed} ids fed, {needed} needed (one per forward after the prefill)"
    )]
    FeedTooShort { feed: usize, needed: usize },
    #[error("teacher forcing decodes plainly: it cannot be combined with a drafter")]
    FeedWhileSpeculating,
    #[error("the prompt ({prompt} tokens) plus {max_tokens} new tokens{} needs more positions than the model's {context} (max_position_embeddings); at most {} new tokens fit", tree_note(*tree), context.saturating_sub(prompt.saturating_add(*tree)))]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        /// Positions the draft tree needs below the last token (0: plain decoding).
        tree: usize,
        context: usize,
    },
    #[error(
        "position {position} is past the model's {context} positions (max_position_embeddings)"
    )]
    PastContext { position: usize, context: usize },
    #[error("{path}: a file, but not a GGUF file (it starts with {head:02x?}, not \"GGUF\"): give a Hugging Face checkpoint directory or a .gguf file")]
    NotAModel { path: PathBuf, head: Vec<u8> },
    #[error("decoder layer {layer}'s {block} put out a NaN or an infinity: a weight of model.layers.{layer}.{block} is corrupt or overflows; the forward stopped rather than decode wrong tokens")]
    NonFinite { layer: usize, block: &'static str },
    #[error("{}: tensor {tensor} holds a NaN or an infinity (element or block {at}): the file is corrupt or was written wrong", path.display())]
    NonFiniteTensor {
        path: PathBuf,
        tensor: String,
        at: usize,
    },
    #[error("{}: tensor {tensor} is corrupt: its CRC32C is {got:08x} but {} recorded {want:08x} when the file was first used", path.display(), sidecar.display())]
    CorruptTensor {
        path: PathBuf,
        tensor: String,
        got: u32,
        want: u32,
        sidecar: PathBuf,
    },
    #[error("a draft tree of branching {branching} and {levels} levels drafts {} nodes; both must be positive and the pool at most {limit} nodes", nodes.map_or("too many".to_string(), |n| n.to_string()))]
    TreeTooLarge {
        branching: usize,
        levels: usize,
        nodes: Option<usize>,
        limit: usize,
    },
    #[error("batch has {tokens} tokens but {positions} position ids")]
    PositionCount { tokens: usize, positions: usize },
    #[error("mask: {reason}")]
    BadMask { reason: String },
    #[error("selector: {0}")]
    /// The error is part of the message, not a chained source, so it prints once.
    Selector(specfit_selector::Error),
    #[error("routes: {reason}")]
    NoRoutes { reason: String },
    #[error("drafter input: {reason}")]
    BadDraftInput { reason: String },
    #[error("KV cache: {reason}")]
    BadCacheEdit { reason: String },
    #[error("drafter {field} = {drafter} does not fit the target ({target})")]
    DrafterMismatch {
        field: &'static str,
        drafter: String,
        target: String,
    },
    #[error("expert store: {reason}")]
    ExpertStore { reason: String },
    #[error("slots per layer = {slots}: need at least 1 (for no cache use CacheMode::NoCache, which `--slots 0` selects)")]
    TooFewSlots { slots: usize },
    #[error(
        "cannot allocate {:.1} GiB for {slots} expert slots in each of {layers} MoE layers; use fewer slots",
        *bytes as f64 / (1u64 << 30) as f64
    )]
    SlotMemory {
        slots: usize,
        layers: usize,
        bytes: usize,
    },
    #[error("the prompt is empty: decoding needs at least one prompt token")]
    EmptyPrompt,
    #[error("this prefix was prefilled without a drafter; speculative decoding needs Prefix::new with the drafter")]
    PrefixWithoutDrafter,
    #[error("unknown policy {name:?}: expected ar, eagle3, specfit, specfit-lambda, specfit-resident or specfit-adaptive")]
    UnknownPolicy { name: String },
    #[error("--policy {policy} needs a calibration (from `specfit calibrate`)")]
    NoCalibration { policy: crate::policy::PolicyName },
    #[error("calibration {}: {reason}", path.display())]
    BadCalibration { path: PathBuf, reason: String },
    #[error(
        "the calibration predicts {ms} ms for a plain decoding step; re-run `specfit calibrate`"
    )]
    BadPlainStepCost { ms: f64 },
    #[error("calibration: --cycles must be positive")]
    NoProbeCycles,
    #[error("calibration fit: {reason}")]
    Fit { reason: String },
}

impl From<specfit_selector::Error> for EngineError {
    fn from(e: specfit_selector::Error) -> EngineError {
        EngineError::Selector(e)
    }
}

impl EngineError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EngineError {
        let path = path.into();
        move |error| EngineError::Io { path, error }
    }
}

fn tree_note(tree: usize) -> String {
    if tree > 0 {
        format!(" plus the {tree}-level draft tree")
    } else {
        String::new()
    }
}
