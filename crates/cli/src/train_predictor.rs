//! `specfit train-predictor`: fits the linear route predictor (drafter hidden state + token
//! embedding → per-layer expert scores) on routes recorded from the target at every position of
//! greedy outputs, reports its per-layer top-k accuracy on held-out positions and saves it.

use std::path::PathBuf;

use anyhow::{ensure, Result};
use specfit_engine::predictor::RoutePredictor;
use specfit_engine::spec::collect_route_samples;

use crate::walk::{Walk, WalkArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    walk: WalkArgs,
    /// Greedy positions to collect pools at (the last fifth is held out for the accuracy).
    #[arg(long, default_value_t = 200)]
    positions: usize,
    /// Ridge penalty of the least-squares fit.
    #[arg(long, default_value_t = 1e-2)]
    ridge: f64,
    /// Output safetensors file (written atomically).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(
        args.positions >= 5,
        "--positions must be at least 5 (one fifth is held out)"
    );
    ensure!(
        args.ridge.is_finite() && args.ridge >= 0.0,
        "--ridge must be >= 0"
    );
    let Walk {
        model,
        mut cache,
        drafter,
        mut atlas,
        prompt,
        shape,
    } = args.walk.load()?;
    let samples = collect_route_samples(
        &model,
        &drafter,
        &mut cache,
        &mut atlas,
        &prompt,
        shape,
        args.positions,
    )?;
    let split = samples.len() * 4 / 5;
    let cfg = model.config();
    let (layers, experts, k) = (
        cfg.moe_layers().len(),
        cfg.num_experts,
        cfg.num_experts_per_tok,
    );
    let predictor = RoutePredictor::fit(&samples[..split], layers, experts, k, args.ridge)?;
    let held = predictor.accuracy(&samples[split..]);
    let train = predictor.accuracy(&samples[..split]);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    // What guessing k experts uniformly at random would score.
    let chance = k as f64 / experts as f64;
    eprintln!(
        "{} samples ({} training, {} held out); top-{k} accuracy: train {:.3}, held-out {:.3} (chance {:.3})",
        samples.len(),
        split,
        samples.len() - split,
        mean(&train),
        mean(&held),
        chance
    );
    eprintln!(
        "held-out per layer: {}",
        held.iter()
            .map(|a| format!("{a:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    predictor.save(&args.out)?;
    eprintln!("saved {}", args.out.display());
    Ok(())
}
