//! `specfit calibrate`: fits the cost model from probe rows and prints (or saves) the
//! calibration JSON, with the fit quality on stderr.

use std::path::PathBuf;

use anyhow::{Context, Result};
use specfit_selector::calibrate;
use specfit_selector::json::{read_probes, CalibrationJson};

use crate::files::{read_text, write_atomic};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Probe rows, JSON Lines: {"nodes": n, "demand": d, "ms": t} (+ "hits", "misses"); `-` = stdin.
    #[arg(long)]
    probes: PathBuf,
    /// Write the calibration here (atomically) instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The model the probes were measured on: its shape is stamped into the calibration so that
    /// using it on another target is refused.
    #[arg(long)]
    model: Option<PathBuf>,
}

/// The shape a calibration is valid for.
pub fn target_stamp(
    cfg: &specfit_engine::Qwen3MoeConfig,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("moe_layers".into(), cfg.moe_layers().len().into());
    m.insert("experts".into(), cfg.num_experts.into());
    m.insert("num_experts_per_tok".into(), cfg.num_experts_per_tok.into());
    m.insert("hidden_size".into(), cfg.hidden_size.into());
    m.insert("vocab_size".into(), cfg.vocab_size.into());
    m
}

pub fn run(args: &Args) -> Result<()> {
    let text = read_text(&args.probes)?;
    let probes = read_probes(&text).with_context(|| format!("{}", args.probes.display()))?;
    let cal = calibrate(&probes).with_context(|| format!("{}", args.probes.display()))?;
    let mut file = CalibrationJson::new(&cal);
    if let Some(dir) = &args.model {
        file.target = Some(target_stamp(&specfit_engine::Qwen3MoeConfig::load(dir)?));
    }
    let mut json = serde_json::to_string_pretty(&file)?;
    json.push('\n');
    eprintln!(
        "{} probe rows, K = {}: paper form R² = {:.4}, median |error| = {:.3} ms",
        cal.paper.rows, cal.max_nodes, cal.paper.r2, cal.paper.median_abs_err_ms
    );
    if let Some(f) = &cal.residency {
        eprintln!(
            "residency form R² = {:.4}, median |error| = {:.3} ms",
            f.r2, f.median_abs_err_ms
        );
    }
    match &args.out {
        Some(path) => write_atomic(path, json.as_bytes()),
        None => {
            print!("{json}");
            Ok(())
        }
    }
}
