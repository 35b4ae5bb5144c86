//! `specfit train-predictor`: fits the linear route predictor (drafter hidden state + token
//! embedding → per-layer expert scores) on routes the target computes for every node of draft
//! pools along greedy outputs of training prompts, reports its per-layer top-k accuracy on
//! held-out prompts and saves it.

use std::path::PathBuf;

use anyhow::{ensure, Result};
use specfit_engine::measure::PoolWalk;
use specfit_engine::predictor::{HeadShape, RoutePredictor, RouteSample};
use specfit_engine::spec::TreeShape;
use specfit_engine::{Eagle3, Tokenizer};

use crate::prompt::read_prompts;
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// EAGLE-3 drafter directory (default: the shipped drafter).
    #[arg(long, default_value_os_t = crate::paths::drafter())]
    drafter: PathBuf,
    /// Training prompts, JSON Lines: {"question": …} or a chat document {"messages": [{"role":
    /// "user", "content": …}, …]} (its first user turn).
    #[arg(long)]
    prompts: PathBuf,
    /// Held-out prompts (same format) for the reported accuracy; default: the last fifth of
    /// --prompts.
    #[arg(long)]
    held_out: Option<PathBuf>,
    /// Use at most this many prompts of each file.
    #[arg(long, default_value_t = 64)]
    limit: usize,
    /// Greedy positions per prompt at which a full pool is drafted and routed.
    #[arg(long, default_value_t = 24)]
    positions: usize,
    /// Ridge penalty of the least-squares fit.
    #[arg(long, default_value_t = 1e-2)]
    ridge: f64,
    /// Output safetensors file (written atomically).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(args.positions >= 1, "--positions must be at least 1");
    ensure!(
        args.ridge.is_finite() && args.ridge >= 0.0,
        "--ridge must be >= 0"
    );
    let (model, mut cache) = args.target.load()?;
    let drafter = Eagle3::load(&args.drafter, model.config())?;
    let mut atlas = args.target.atlas()?;
    let tok = Tokenizer::load(&args.target.model)?;
    let mut train = read_prompts(&args.prompts, &tok, args.limit)?;
    let held = match &args.held_out {
        Some(path) => read_prompts(path, &tok, args.limit)?,
        None => {
            ensure!(
                train.len() >= 2,
                "need at least 2 prompts to hold out a fifth (or give --held-out)"
            );
            let keep = train.len() - (train.len() / 5).max(1);
            train.split_off(keep)
        }
    };
    let mut walk = PoolWalk {
        target: &model,
        drafter: &drafter,
        cache: &mut cache,
        atlas: &mut atlas,
        shape: TreeShape::default(),
    };
    let mut collect = |prompts: &[Vec<u32>]| -> Result<Vec<RouteSample>> {
        let mut all = Vec::new();
        for p in prompts {
            all.extend(walk.route_samples(p, args.positions)?);
        }
        Ok(all)
    };
    let train_samples = collect(&train)?;
    let held_samples = collect(&held)?;
    let shape = HeadShape::for_pair(model.config(), drafter.config().hidden_size);
    let (experts, k) = (shape.experts, shape.num_experts_per_tok);
    let predictor = RoutePredictor::fit(&train_samples, shape, args.ridge)?;
    let held_acc = predictor.accuracy(&held_samples);
    let train_acc = predictor.accuracy(&train_samples);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    // What guessing k experts uniformly at random would score.
    let chance = k as f64 / experts as f64;
    eprintln!(
        "{} training samples from {} prompts, {} held-out samples from {} prompts; top-{k} accuracy: train {:.3}, held-out {:.3} (chance {:.3})",
        train_samples.len(),
        train.len(),
        held_samples.len(),
        held.len(),
        mean(&train_acc),
        mean(&held_acc),
        chance
    );
    eprintln!(
        "held-out per layer: {}",
        held_acc
            .iter()
            .map(|a| format!("{a:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    predictor.save(&args.out)?;
    eprintln!("saved {}", args.out.display());
    Ok(())
}
