//! How much the bound prunes: for each pool shape and node budget, the size of the exact search
//! space (every ancestor-closed subtree of ≤ K nodes), the subtrees the search actually scored,
//! and the selection time, over 200 seeded pools, in two cost regimes: the paper's cached
//! β = 0.211 ms per expert, and cheap experts (β = 0.02 ms, e.g. a mostly-hit cache), where the
//! winner is larger and the bound has less to cut. Prints a Markdown table.
//!
//! ```text
//! cargo run --release -p specfit-selector --example prune_report
//! ```

use std::time::Instant;

use specfit_selector::synth::{self, Shape};
use specfit_selector::{count_subtrees, CostModel, Objective, Selector};

const POOLS: u64 = 200;
const REPEATS: usize = 20;

fn main() {
    println!("| pool | K | β ms | subtrees (mean) | scored (mean) | subtrees per scored | nodes picked (mean) | select median µs | p99 µs |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let shapes = [
        ("paper 18", Shape::paper()),
        ("wide 32", Shape::wide(32)),
        ("wide 60", Shape::wide(60)),
    ];
    for (label, shape) in shapes {
        let pools: Vec<_> = (0..POOLS)
            .map(|s| synth::pool(&shape, s).build().unwrap())
            .collect();
        for (k, beta) in [7usize, 12, 16]
            .into_iter()
            .flat_map(|k| [(k, 0.211), (k, 0.02)])
        {
            let cost = CostModel::paper(synth::paper_intercepts(k), beta).unwrap();
            let mut sel = Selector::new(cost, k, Objective::Ratio).unwrap();
            let (mut space, mut scored, mut picked) = (0f64, 0f64, 0f64);
            let mut times = Vec::new();
            for pool in &pools {
                space += count_subtrees(pool, k) as f64;
                let s = sel.select(pool, None).unwrap();
                scored += s.stats.visited as f64;
                picked += s.nodes.len() as f64;
                for _ in 0..REPEATS {
                    let t = Instant::now();
                    std::hint::black_box(sel.select(std::hint::black_box(pool), None).unwrap());
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            times.sort_by(f64::total_cmp);
            let n = POOLS as f64;
            println!(
                "| {label} | {k} | {beta} | {:.0} | {:.1} | 1 in {:.0} | {:.2} | {:.2} | {:.2} |",
                space / n,
                scored / n,
                space / scored,
                picked / n,
                times[times.len() / 2],
                times[times.len() * 99 / 100]
            );
        }
    }
    let kernel = Selector::new(
        CostModel::paper(vec![1.0], 0.0).unwrap(),
        0,
        Objective::Ratio,
    )
    .unwrap();
    println!("\npopcount kernels: {}", kernel.kernel_name());
}
