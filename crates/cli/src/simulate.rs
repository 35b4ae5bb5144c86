//! `specfit simulate`: replays a trace from `specfit record` under every policy and several slot
//! counts, with costs from a calibration (the residency-aware fit is the simulated machine; the
//! paper-form fit is what SpecFit believes), and prints the comparison table.

use std::path::PathBuf;

use anyhow::{Context, Result};
use specfit_selector::json::CalibrationJson;
use specfit_selector::Objective;
use specfit_sim::{simulate, SimConfig, SimPolicy};

use crate::files::read_text;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace from `specfit record`.
    #[arg(long)]
    trace: PathBuf,
    /// Calibration from `specfit calibrate` with a residency-aware fit (probes with hits/misses).
    #[arg(long)]
    calibration: PathBuf,
    /// Slots per MoE layer to simulate (0 = cleared every forward); default 100/50/25/12.5/0% of the experts.
    #[arg(long, value_delimiter = ',')]
    slots: Option<Vec<usize>>,
    /// Verify budget K.
    #[arg(long, default_value_t = 7)]
    budget: usize,
}

pub fn run(args: &Args) -> Result<()> {
    let (header, steps) = specfit_trace::read(&read_text(&args.trace)?)
        .with_context(|| format!("{}", args.trace.display()))?;
    let cal = CalibrationJson::parse(&read_text(&args.calibration)?)
        .with_context(|| format!("{}", args.calibration.display()))?;
    let true_cost = cal.cost_model(true).with_context(|| {
        format!(
            "{} has no residency-aware fit (probe rows need hits and misses)",
            args.calibration.display()
        )
    })?;
    let believed = cal.cost_model(false)?;
    let k = args.budget.min(cal.max_nodes);
    let e = header.experts;
    let mut slots = args
        .slots
        .clone()
        .unwrap_or_else(|| vec![e, e / 2, e / 4, (e / 8).max(1), 0]);
    slots.dedup();
    let policies: Vec<(&str, SimPolicy)> = vec![
        ("ar", SimPolicy::Ar),
        ("eagle3", SimPolicy::TopK(k)),
        (
            "specfit",
            SimPolicy::SpecFit {
                cost: believed.clone(),
                objective: Objective::Ratio,
                max_nodes: k,
                stop_rule: true,
                residency: false,
            },
        ),
        (
            "specfit-resident",
            SimPolicy::SpecFit {
                cost: true_cost.clone(),
                objective: Objective::Ratio,
                max_nodes: k,
                stop_rule: true,
                residency: true,
            },
        ),
    ];
    println!("| slots/layer | policy | tok/s | × ar | gain over eagle3 | tokens/cycle | nodes verified/cycle | copies/token |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &s in &slots {
        let config = SimConfig {
            slots: s,
            true_cost: true_cost.clone(),
        };
        let results: Vec<(&str, specfit_sim::SimReport)> = policies
            .iter()
            .map(|(name, p)| Ok((*name, simulate(&header, &steps, p, &config)?)))
            .collect::<Result<_>>()?;
        let ar = results[0].1.tokens_per_second();
        let eagle = results[1].1.tokens_per_second();
        for (name, r) in &results {
            let tps = r.tokens_per_second();
            println!(
                "| {} | {name} | {tps:.2} | {:.2} | {:+.1}% | {:.2} | {:.2} | {:.2} |",
                if s == 0 {
                    "cleared".to_string()
                } else {
                    s.to_string()
                },
                tps / ar,
                100.0 * (tps / eagle - 1.0),
                r.committed as f64 / r.cycles.max(1) as f64,
                r.verified_nodes as f64 / r.cycles.max(1) as f64,
                r.misses as f64 / r.committed.max(1) as f64
            );
        }
    }
    Ok(())
}
