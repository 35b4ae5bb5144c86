//! `specfit probe`: measures on this engine exactly what `specfit calibrate` measures — verify
//! forwards of random ancestor-closed subtrees of every size `0..=K` from the LRU and from emptied
//! caches, all-resident verify forwards and plain steps, with their drafting times — and writes
//! them as probe rows, which `specfit calibrate --probes` fits into the same calibration.

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use specfit_engine::spec::TreeShape;
use specfit_engine::Tokenizer;

use crate::files::{read_text, write_atomic};
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// EAGLE-3 drafter directory.
    #[arg(long)]
    drafter: PathBuf,
    #[command(flatten)]
    drafter_dtype: crate::drafter::DrafterDtypeArg,
    /// Calibration prompts: a text file, one prompt per line (needs the model's tokenizer).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompts: Option<PathBuf>,
    /// A prompt as comma-separated token ids (instead of --prompts).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Probe forwards per prompt.
    #[arg(long, default_value_t = 32)]
    cycles: usize,
    #[command(flatten)]
    nodes: crate::tree::MaxNodesArg,
    #[arg(long, default_value_t = 2)]
    branching: usize,
    #[arg(long, default_value_t = 5)]
    levels: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Probe rows (JSON Lines), written atomically.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let (model, mut cache) = args.target.load()?;
    let drafter = args.drafter_dtype.load(&args.drafter, &model)?;
    let prompts: Vec<Vec<u32>> = match (&args.prompts, &args.prompt_ids) {
        (Some(path), _) => {
            let tok = Tokenizer::load(&args.target.model)?;
            read_text(path)?
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| tok.encode(l))
                .collect::<Result<_, _>>()
                .with_context(|| format!("tokenizing {}", path.display()))?
        }
        (None, Some(ids)) => vec![ids.clone()],
        (None, None) => anyhow::bail!("give --prompts FILE or --prompt-ids"),
    };
    ensure!(prompts.iter().all(|p| !p.is_empty()), "empty prompt");
    let plan = specfit_engine::measure::CalibrationPlan {
        cycles: args.cycles,
        max_nodes: args.nodes.max_nodes,
        shape: TreeShape::new(args.branching, args.levels)?,
        seed: args.seed,
    };
    let measured = crate::calibrate::measure(&model, &drafter, &mut cache, &prompts, &plan)?;
    let text = crate::calibrate::rows_jsonl(&measured);
    write_atomic(&args.out, text.as_bytes())?;
    eprintln!(
        "{} verify, {} all-resident and {} plain-step rows ({} prompts) -> {}",
        measured.verify.len(),
        measured.resident.len(),
        measured.plain.len(),
        prompts.len(),
        args.out.display()
    );
    Ok(())
}
