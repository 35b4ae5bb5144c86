//! Where the shipped models and data live: under the working directory when it has them (a
//! checkout), else under the source tree this binary was built from. Nothing is downloaded.

use std::path::{Path, PathBuf};

/// `rel` (e.g. `models/target`) under the working directory if it exists there, else under the
/// repository this binary was built from.
pub fn shipped(rel: &str) -> PathBuf {
    let here = Path::new(rel);
    if here.exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The shipped target checkpoint.
pub fn target() -> PathBuf {
    shipped("models/target")
}

/// The shipped EAGLE-3 drafter.
pub fn drafter() -> PathBuf {
    shipped("models/drafter")
}

/// The shipped route predictor (a `specfit train-predictor` head).
pub fn predictor() -> PathBuf {
    shipped("models/route-predictor.safetensors")
}

/// The calibration `specfit calibrate` saves next to a model, one per tier: inside a checkpoint
/// directory, or beside a GGUF file (`model.gguf` → `model.specfit-calibration.disk.json`).
pub fn calibration(model: &Path, tier: &str) -> PathBuf {
    if model.is_file() {
        return model.with_extension(format!("specfit-calibration.{tier}.json"));
    }
    model.join(format!("specfit-calibration.{tier}.json"))
}

/// The target, drafter and route predictor a command runs on (default: the shipped ones).
#[derive(Debug, Clone, clap::Args)]
pub struct PairArgs {
    /// Target checkpoint (a Hugging Face directory, or a qwen3moe GGUF file where the command
    /// reads one; default: the shipped target).
    #[arg(long, default_value_os_t = target())]
    pub model: PathBuf,
    /// Its EAGLE-3 drafter (default: the shipped drafter).
    #[arg(long, default_value_os_t = drafter())]
    pub drafter: PathBuf,
    /// Its route predictor, used when the file exists (default: the shipped one).
    #[arg(long, default_value_os_t = predictor())]
    pub predictor: PathBuf,
}
