//! `specfit convert`: writes a checkpoint's routed experts as the expert-major disk file that
//! `--store disk` reads with O_DIRECT.

use std::path::PathBuf;

use anyhow::{Context, Result};
use specfit_engine::experts::convert;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// Output file (default: MODEL/experts.specfit).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Storage dtype of the expert blocks (default: the checkpoint's).
    #[arg(long, value_enum)]
    weights: Option<crate::target::WeightsArg>,
}

pub fn run(args: &Args) -> Result<()> {
    anyhow::ensure!(
        !specfit_engine::gguf::is_gguf(&args.model),
        "{} is a GGUF file: its experts stream from the file itself (`--store disk`), no conversion needed",
        args.model.display()
    );
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| specfit_engine::default_expert_file(&args.model));
    let report = convert(
        &args.model,
        &out,
        args.weights.map(crate::target::WeightsArg::dtype),
    )
    .with_context(|| format!("converting {}", args.model.display()))?;
    eprintln!(
        "wrote {}: {} expert blocks in {}, {:.1} MiB in {:.2} s",
        report.path.display(),
        report.blocks,
        report.dtype.name(),
        report.bytes as f64 / (1 << 20) as f64,
        report.seconds
    );
    Ok(())
}
