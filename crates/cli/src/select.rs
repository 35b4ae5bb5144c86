//! `specfit select`: reads pool records, runs the selection and the stop rule on each, and
//! prints one result line per pool, then a summary on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use specfit_selector::json::{read_pools, CalibrationJson, Overrides, Problem, ResultJson};
use specfit_selector::{stop, Objective, Selector};

use crate::files::read_text;

/// The pool file the main job runs on when `--pool` is not given.
pub const DEFAULT_POOL: &str = "examples/pools/paper.jsonl";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pool file: one pool object or JSON Lines of pools; `-` reads stdin.
    #[arg(long, default_value = DEFAULT_POOL)]
    pool: PathBuf,
    /// Take the cost model from this calibration file (replaces each pool's "cost").
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// With --calibration: use its residency-aware form (beta_hit, beta_miss).
    #[arg(long, requires = "calibration")]
    residency_cost: bool,
    /// Replace each pool's objective: ratio, topk, all, none or lambda:X.
    #[arg(long, value_parser = parse_objective)]
    objective: Option<Objective>,
    /// Replace each pool's node budget K.
    #[arg(long)]
    max_nodes: Option<usize>,
    /// Do not print the summary on stderr.
    #[arg(long)]
    quiet: bool,
}

fn parse_objective(s: &str) -> Result<Objective, String> {
    Objective::parse(s).map_err(|e| e.to_string())
}

pub fn run(args: &Args) -> Result<()> {
    let overrides = Overrides {
        cost: match &args.calibration {
            Some(path) => {
                let cal = CalibrationJson::parse(&read_text(path)?)
                    .with_context(|| format!("calibration {}", path.display()))?;
                Some(cal.cost_model(args.residency_cost).with_context(|| {
                    format!("calibration {} has no residency-aware fit", path.display())
                })?)
            }
            None => None,
        },
        objective: args.objective,
        max_nodes: args.max_nodes,
    };
    let text = read_text(&args.pool)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut selector: Option<Selector> = None;
    let mut times = Vec::new();
    let mut nodes = 0usize;
    for problem in read_pools(&text, &overrides) {
        let problem = problem.with_context(|| format!("{}", args.pool.display()))?;
        let sel = reuse_or_build(&mut selector, &problem)?;
        let start = Instant::now();
        let selection = sel.select(&problem.pool, problem.resident.as_ref())?;
        let select_us = start.elapsed().as_secs_f64() * 1e6;
        let decision = stop::decide(&problem.pool, selection);
        times.push(select_us);
        nodes += decision.selection.nodes.len();
        serde_json::to_writer(&mut out, &ResultJson::new(&decision, select_us))?;
        writeln!(out)?;
    }
    out.flush()?;
    if times.is_empty() {
        anyhow::bail!("{}: no pool in the input", args.pool.display());
    }
    if !args.quiet {
        times.sort_by(f64::total_cmp);
        eprintln!(
            "{} pools, {:.2} draft nodes selected on average, select median {:.2} µs (max {:.2} µs)",
            times.len(),
            nodes as f64 / times.len() as f64,
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }
    Ok(())
}

/// Keeps the selector (and its scratch buffers) across pools that share cost, budget and
/// objective, so that `select_us` measures the search rather than allocation.
fn reuse_or_build<'a>(slot: &'a mut Option<Selector>, p: &Problem) -> Result<&'a mut Selector> {
    let same = slot.as_ref().is_some_and(|s| {
        s.cost() == &p.cost && s.max_nodes() == p.max_nodes && s.objective() == p.objective
    });
    if !same {
        *slot = Some(Selector::new(p.cost.clone(), p.max_nodes, p.objective)?);
    }
    Ok(slot.as_mut().expect("just set"))
}
