//! `specfit simulate`: replays a trace — recorded by `specfit record`, or synthetic at paper scale
//! — under every policy and several slot counts, with costs from a calibration or a hardware
//! preset (the residency-aware fit is the simulated machine; the paper-form fit is what SpecFit
//! believes), and prints the comparison table.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use specfit_selector::json::CalibrationJson;
use specfit_selector::{Objective, Selector, VerifyPolicy};
use specfit_sim::oracle::simulate_oracle;
use specfit_sim::synth::{self, SynthParams};
use specfit_sim::{
    calibrate_on, fit_confidence, preset, simulate_many, topk_acceptance_many, SimConfig,
};
use specfit_trace::{TraceHeader, TraceStep};

use crate::files::read_text;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace from `specfit record`; repeat for several prompts (replayed one after the other, the
    /// expert slots carrying over, as a session serving one prompt after another).
    #[arg(
        long,
        required_unless_present = "synthetic",
        conflicts_with = "synthetic"
    )]
    trace: Vec<PathBuf>,
    /// A synthetic paper-scale trace (48 layers × 128 experts, top-8, 18-node pools) whose
    /// drafter confidence is fitted so that EAGLE-3's top-K accepts the paper's tokens per cycle:
    /// `summarization` (1.54), `gsm8k` (3.35), or `accept:X`.
    #[arg(long)]
    synthetic: Option<String>,
    /// Positions of the synthetic trace (at most 20,000).
    #[arg(long, default_value_t = 400)]
    positions: usize,
    /// Synthetic routing: probability a token keeps each expert of the previous token (default:
    /// the value fitted to the paper's throughputs).
    #[arg(long, default_value_t = specfit_sim::synth::PAPER_LOCALITY)]
    locality: f64,
    /// Synthetic routing: probability a drafted child keeps each expert of its parent (default:
    /// the value fitted to the paper's throughputs).
    #[arg(long, default_value_t = specfit_sim::synth::PAPER_SHARE)]
    share: f64,
    /// Calibration from `specfit calibrate` with a residency-aware fit.
    #[arg(long, required_unless_present = "preset", conflicts_with = "preset")]
    calibration: Option<PathBuf>,
    /// A published machine: `a100` or `rtx4090` (the paper's β; see `specfit_sim::preset`).
    #[arg(long)]
    preset: Option<String>,
    /// Slots per MoE layer to simulate (0 = cleared every forward); default 100/50/25/12.5/0% of the experts.
    #[arg(long, value_delimiter = ',')]
    slots: Option<Vec<usize>>,
    #[command(flatten)]
    nodes: crate::tree::MaxNodesArg,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: &Args) -> Result<()> {
    let (header, traces) = load_traces(args)?;
    let calibrated_here = args.calibration.is_none();
    let (machine, believed, k) = match (&args.calibration, &args.preset) {
        (Some(path), _) => {
            let cal = CalibrationJson::parse(&read_text(path)?)
                .with_context(|| format!("{}", path.display()))?;
            let machine = specfit_sim::machine::from_calibration(&cal).with_context(|| {
                format!(
                    "{} has no residency-aware fit (probe rows need hits and misses)",
                    path.display()
                )
            })?;
            (
                machine,
                cal.cost_model(false)?,
                args.nodes.max_nodes.min(cal.max_nodes),
            )
        }
        (None, Some(name)) => {
            let p = preset(name, args.nodes.max_nodes)
                .with_context(|| format!("--preset {name:?}: expected a100 or rtx4090"))?;
            eprintln!(
                "preset {} (assumed intercepts and hit cost: see specfit_sim::preset)",
                p.name
            );
            (
                SimConfig::verify_only(0, p.true_cost),
                p.believed,
                args.nodes.max_nodes,
            )
        }
        (None, None) => bail!("give --calibration FILE or --preset NAME"),
    };
    eprintln!(
        "{} positions in {} trace(s); eagle3 top-{k} accepts {:.2} draft tokens per cycle",
        traces.iter().map(Vec::len).sum::<usize>(),
        traces.len(),
        topk_acceptance_many(&header, &traces, k)
    );
    let e = header.experts;
    let mut slots = args
        .slots
        .clone()
        .unwrap_or_else(|| vec![e, e / 2, e / 4, (e / 8).max(1), 0]);
    slots.dedup();

    println!("| slots/layer | policy | tok/s | × ar | gain over eagle3 | tokens/cycle | nodes verified/cycle | copies/token |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &s in &slots {
        let config = SimConfig {
            slots: s,
            ..machine.clone()
        };
        // With a preset, SpecFit believes what probing this simulated machine at this cache size
        // gives (as `specfit probe` + `calibrate` would); with a calibration file, its paper form.
        let believed = if calibrated_here {
            let cal = calibrate_on(&header, &traces, &config, k, args.seed)?;
            eprintln!(
                "slots {s}: SpecFit's calibration on the simulated machine: β = {:.3} ms, R² = {:.3}",
                match cal.paper.cost.expert() {
                    specfit_selector::ExpertCost::Uniform { beta } => beta,
                    specfit_selector::ExpertCost::Residency { beta_miss, .. } => beta_miss,
                },
                cal.paper.r2
            );
            cal.paper.cost
        } else {
            believed.clone()
        };
        let specfit = |cost| Selector::new(cost, k, Objective::Ratio).map(VerifyPolicy::specfit);
        let policies: Vec<(&str, VerifyPolicy)> = vec![
            ("ar", VerifyPolicy::plain()),
            ("eagle3", VerifyPolicy::top_k(k)),
            ("specfit", specfit(believed)?),
            (
                "specfit-resident",
                specfit(machine.true_cost.clone())?.residency(true),
            ),
        ];
        let mut results: Vec<(&str, specfit_sim::SimReport)> = policies
            .iter()
            .map(|(name, p)| Ok((*name, simulate_many(&header, &traces, p, &config)?)))
            .collect::<Result<_>>()?;
        // What a selector that knew which drafts the target takes would reach (a reference,
        // not a policy: it reads the future from the trace).
        let oracle = simulate_oracle(&header, &traces, k, &config)?;
        results.push(("oracle", oracle));
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
                r.committed as f64 / (r.cycles + r.plain_steps).max(1) as f64,
                r.verified_nodes as f64 / (r.cycles + r.plain_steps).max(1) as f64,
                r.misses as f64 / r.committed.max(1) as f64
            );
        }
    }
    Ok(())
}

/// The recorded traces (of one model shape), or a synthetic one fitted to
/// the requested acceptance.
fn load_traces(args: &Args) -> Result<(TraceHeader, Vec<Vec<TraceStep>>)> {
    if let Some((first, rest)) = args.trace.split_first() {
        let read = |path: &PathBuf| {
            specfit_trace::read(&read_text(path)?).with_context(|| format!("{}", path.display()))
        };
        let (header, steps) = read(first)?;
        let mut traces = vec![steps];
        for path in rest {
            let (h, steps) = read(path)?;
            let shape = |h: &TraceHeader| (h.moe_layers, h.experts, h.num_experts_per_tok, h.vocab);
            anyhow::ensure!(
                shape(&h) == shape(&header),
                "{}: recorded on another model shape than {} (MoE layers, experts, experts per token, vocabulary: {:?} vs {:?})",
                path.display(),
                first.display(),
                shape(&h),
                shape(&header)
            );
            traces.push(steps);
        }
        return Ok((header, traces));
    }
    let profile = args.synthetic.as_deref().unwrap_or_default();
    let target = match profile {
        "summarization" => 1.54,
        "gsm8k" => 3.35,
        other => match other.strip_prefix("accept:").map(str::parse::<f64>) {
            Some(Ok(x)) if x >= 0.0 && x <= args.nodes.max_nodes as f64 => x,
            _ => bail!(
                "--synthetic {other:?}: expected summarization, gsm8k or accept:X with 0 <= X <= K"
            ),
        },
    };
    anyhow::ensure!(
        (1..=synth::MAX_POSITIONS).contains(&args.positions),
        "--positions {}: must be between 1 and {}",
        args.positions,
        synth::MAX_POSITIONS
    );
    for (name, v) in [("--locality", args.locality), ("--share", args.share)] {
        anyhow::ensure!((0.0..=1.0).contains(&v), "{name} {v}: must be in [0, 1]");
    }
    let base = SynthParams {
        positions: args.positions,
        locality: args.locality,
        share: args.share,
        ..SynthParams::paper(0.5, args.seed)
    };
    let confidence = fit_confidence(&base, args.nodes.max_nodes, target);
    eprintln!("synthetic {profile}: drafter confidence {confidence:.3} for {target} accepted tokens per cycle");
    let (header, steps) = synth::trace(&SynthParams { confidence, ..base });
    Ok((header, vec![steps]))
}
