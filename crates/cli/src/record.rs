//! `specfit record`: a trace of the full draft pool at every position of a greedy output, with
//! atlas routes and agreement flags, for offline replay of any policy (see `specfit-trace`).

use std::path::PathBuf;

use anyhow::{ensure, Result};
use specfit_engine::spec::{record, TreeShape};
use specfit_engine::Eagle3;
use specfit_trace::TraceHeader;

use crate::files::write_atomic;
use crate::prompt::PromptArgs;
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// EAGLE-3 drafter directory.
    #[arg(long)]
    drafter: PathBuf,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Positions (greedy tokens) to record.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 2)]
    branching: usize,
    #[arg(long, default_value_t = 5)]
    levels: usize,
    /// Trace file (JSON Lines), written atomically.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(
        args.branching > 0 && args.levels > 0,
        "--branching and --levels must be positive"
    );
    let (model, mut cache) = args.target.load()?;
    let tokenizer = args.prompt.tokenizer(&args.target.model)?;
    let prompt = args.prompt.tokens(tokenizer.as_ref(), false)?;
    let drafter = Eagle3::load(&args.drafter, model.config())?;
    let mut atlas = args.target.atlas()?;
    let shape = TreeShape {
        branching: args.branching,
        levels: args.levels,
    };
    let steps = record(
        &model,
        &drafter,
        &mut cache,
        &mut atlas,
        &prompt,
        shape,
        args.max_tokens,
    )?;
    let cfg = model.config();
    let mut header = TraceHeader::new(
        cfg.moe_layers().len(),
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.vocab_size,
    );
    header.meta.insert(
        "model".into(),
        args.target.model.display().to_string().into(),
    );
    header
        .meta
        .insert("drafter".into(), args.drafter.display().to_string().into());
    header
        .meta
        .insert("prompt".into(), serde_json::json!(prompt));
    header
        .meta
        .insert("branching".into(), args.branching.into());
    header.meta.insert("levels".into(), args.levels.into());
    let mut bytes = Vec::new();
    specfit_trace::write(&mut bytes, &header, &steps)?;
    write_atomic(&args.out, &bytes)?;
    let agree: usize = steps
        .iter()
        .map(|s| s.nodes.iter().filter(|n| n.agrees).count())
        .sum();
    let nodes: usize = steps.iter().map(|s| s.nodes.len()).sum();
    eprintln!(
        "{} positions, {nodes} draft nodes ({agree} agree with the target) -> {}",
        steps.len(),
        args.out.display()
    );
    Ok(())
}
