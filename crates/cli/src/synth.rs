//! `specfit synth`: seeded synthetic inputs in the interchange format — paper-shaped draft pools
//! and probe rows drawn from a known cost model (so that `calibrate` can be checked against the
//! truth). They exercise the tools; they are not measurements.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{ensure, Result};
use serde_json::json;
use specfit_selector::synth::{self, Rng, Shape};

use crate::files::write_atomic;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Draft pools shaped like EAGLE-3 drafts over Qwen3-30B-A3B (48 layers × 128 experts, top-8).
    Pools(PoolArgs),
    /// Probe rows ms = a[n] + beta·demand (+ hit/miss split) + uniform noise.
    Probes(ProbeArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ShapeArg {
    /// Top-2 expansion over 5 levels: 18 nodes (the paper's pool).
    Paper,
    /// EAGLE-2-style top-4 expansion over 6 levels, re-ranked to 32 nodes.
    Wide32,
    /// As wide32, re-ranked to 60 nodes (EAGLE's default tree size).
    Wide60,
}

#[derive(Debug, clap::Args)]
pub struct PoolArgs {
    #[arg(long, value_enum, default_value = "paper")]
    shape: ShapeArg,
    /// Number of pools.
    #[arg(long, default_value_t = 4)]
    count: u64,
    /// Seed of the first pool (pool i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Node budget K written into each pool.
    #[arg(long, default_value_t = 7)]
    max_nodes: usize,
    /// Per-expert cost β in ms written into each pool (the paper's A100 PCIe cached figure).
    #[arg(long, default_value_t = 0.211)]
    beta: f64,
    /// Output file (atomic); stdout when absent.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Rows to write.
    #[arg(long, default_value_t = 400)]
    rows: usize,
    /// Largest node count (rows cycle through 0..=max_nodes).
    #[arg(long, default_value_t = 7)]
    max_nodes: usize,
    /// Intercept of the autoregressive step a[0] in ms; a[n] = a0 + slope·n.
    #[arg(long, default_value_t = 130.0)]
    a0: f64,
    #[arg(long, default_value_t = 2.0)]
    slope: f64,
    /// Cost of a resident expert (ms).
    #[arg(long, default_value_t = 0.05)]
    beta_hit: f64,
    /// Cost of a copied expert (ms).
    #[arg(long, default_value_t = 0.408)]
    beta_miss: f64,
    /// Half-width of the uniform noise added to each time (ms).
    #[arg(long, default_value_t = 1.0)]
    noise: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (atomic); stdout when absent.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(cmd: &Command) -> Result<()> {
    let text = match cmd {
        Command::Pools(a) => pools(a)?,
        Command::Probes(a) => probes(a)?,
    };
    let out = match cmd {
        Command::Pools(a) => &a.out,
        Command::Probes(a) => &a.out,
    };
    match out {
        Some(path) => write_atomic(path, text.as_bytes()),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The most pools or probe rows one call writes (its output is built in memory).
const MAX_RECORDS: u64 = 1_000_000;

/// Refuses a record count or node budget past what the output and the selector allow.
fn check_counts(count: u64, max_nodes: usize) -> Result<()> {
    ensure!(
        (1..=MAX_RECORDS).contains(&count),
        "the count {count} must be between 1 and {MAX_RECORDS}"
    );
    let limit = specfit_selector::MAX_SELECT;
    ensure!(
        max_nodes <= limit,
        "--max-nodes {max_nodes} must be at most {limit}"
    );
    Ok(())
}

fn pools(a: &PoolArgs) -> Result<String> {
    check_counts(a.count, a.max_nodes)?;
    ensure!(
        a.beta.is_finite() && a.beta >= 0.0,
        "--beta {} must be finite and >= 0",
        a.beta
    );
    let shape = match a.shape {
        ShapeArg::Paper => Shape::paper(),
        ShapeArg::Wide32 => Shape::wide(32),
        ShapeArg::Wide60 => Shape::wide(60),
    };
    let intercepts = synth::paper_intercepts(a.max_nodes);
    let mut text = String::new();
    for i in 0..a.count {
        let spec = synth::pool(&shape, a.seed + i);
        let nodes: Vec<_> = spec
            .nodes
            .iter()
            .map(|n| json!({"parent": n.parent.map_or(-1, |p| p as i64), "prob": n.prob, "routes": n.routes}))
            .collect();
        let record = json!({
            "layers": spec.layers,
            "experts": spec.experts,
            "max_nodes": a.max_nodes,
            "root": {"routes": spec.root_routes},
            "nodes": nodes,
            "cost": {"intercepts": intercepts, "beta": a.beta},
            "objective": "ratio",
        });
        writeln!(text, "{record}")?;
    }
    Ok(text)
}

fn probes(a: &ProbeArgs) -> Result<String> {
    check_counts(a.rows as u64, a.max_nodes)?;
    ensure!(
        a.rows > a.max_nodes,
        "--rows {} must exceed --max-nodes {}",
        a.rows,
        a.max_nodes
    );
    let mut rng = Rng::new(a.seed);
    let mut text = String::new();
    for r in 0..a.rows {
        let nodes = r % (a.max_nodes + 1);
        let demand = 384 + (nodes as u64) * 120 + rng.below(200) as u64;
        let hits = rng.below(demand as usize + 1) as u64;
        let misses = demand - hits;
        let noise = (rng.unit() * 2.0 - 1.0) * a.noise;
        let ms = a.a0
            + a.slope * nodes as f64
            + a.beta_hit * hits as f64
            + a.beta_miss * misses as f64
            + noise;
        let record = json!({"nodes": nodes, "demand": demand, "ms": ms.max(0.0), "hits": hits, "misses": misses});
        writeln!(text, "{record}")?;
    }
    Ok(text)
}
