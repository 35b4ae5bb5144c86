//! `specfit record`: a trace of the full draft pool at every position of a greedy output, with
//! atlas routes and agreement flags, for offline replay of any policy (see `specfit-trace`).

use std::path::PathBuf;

use anyhow::Result;
use specfit_engine::measure::{trace_header, PoolWalk};

use crate::files::write_atomic;
use crate::walk::{Walk, WalkArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    walk: WalkArgs,
    /// Positions (greedy tokens) to record.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Trace file (JSON Lines), written atomically.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let Walk {
        model,
        mut cache,
        drafter,
        mut atlas,
        prompt,
        shape,
    } = args.walk.load()?;
    let mut walk = PoolWalk {
        target: &model,
        drafter: &drafter,
        cache: &mut cache,
        atlas: &mut atlas,
        shape,
    };
    let steps = walk.record(&prompt, args.max_tokens)?;
    let mut header = trace_header(&model);
    header.meta.insert(
        "model".into(),
        args.walk.target.model.display().to_string().into(),
    );
    header.meta.insert(
        "drafter".into(),
        args.walk.drafter.display().to_string().into(),
    );
    header
        .meta
        .insert("prompt".into(), serde_json::json!(prompt));
    header
        .meta
        .insert("branching".into(), args.walk.branching.into());
    header.meta.insert("levels".into(), args.walk.levels.into());
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
