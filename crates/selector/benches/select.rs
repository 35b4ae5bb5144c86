//! Criterion benches of the selector's hot paths: one selection on the paper's pool shape (and
//! its variants), the scaling sweep over pool size × budget, the stop rule, pool construction
//! and calibration. Pools come from the crate's seeded generator; each bench cycles through 64
//! pools so that no single lucky pool sets the figure.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use specfit_selector::synth::{self, Shape};
use specfit_selector::{
    calibrate, stop_rule, CostModel, Objective, Pool, PoolSpec, Probe, ResidentSet, Selector,
};

const POOLS: u64 = 64;

fn intercepts(k: usize) -> Vec<f64> {
    synth::paper_intercepts(k)
}

fn pools(shape: &Shape) -> Vec<Pool> {
    (0..POOLS)
        .map(|s| synth::pool(shape, s).build().unwrap())
        .collect()
}

fn bench_paper(c: &mut Criterion) {
    let shape = Shape::paper();
    let pools = pools(&shape);
    let mut g = c.benchmark_group("select/paper18_k7");
    let variants = [
        (
            "ratio",
            CostModel::paper(intercepts(7), 0.211).unwrap(),
            Objective::Ratio,
        ),
        (
            "lambda",
            CostModel::paper(intercepts(7), 0.211).unwrap(),
            Objective::Lambda { lambda: 0.03 },
        ),
        (
            "residency",
            CostModel::residency(intercepts(7), 0.02, 0.408).unwrap(),
            Objective::Ratio,
        ),
        (
            "topk",
            CostModel::paper(intercepts(7), 0.211).unwrap(),
            Objective::TopK,
        ),
    ];
    let resident = ResidentSet::new(48, 128, &synth::resident(&shape, 48, 1)).unwrap();
    let portable = (
        "ratio_portable_kernels",
        CostModel::paper(intercepts(7), 0.211).unwrap(),
        Objective::Ratio,
    );
    for (name, cost, objective) in variants.into_iter().chain([portable]) {
        let mut sel = Selector::new(cost, 7, objective).unwrap();
        if name.ends_with("portable_kernels") {
            sel = sel.with_portable_kernels();
        }
        let mut i = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % pools.len();
                sel.select(&pools[i], Some(&resident)).unwrap()
            })
        });
    }
    g.finish();
}

fn bench_scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("select/scaling");
    for (label, shape) in [
        ("18", Shape::paper()),
        ("32", Shape::wide(32)),
        ("60", Shape::wide(60)),
    ] {
        let pools = pools(&shape);
        for k in [7usize, 12, 16] {
            let mut sel = Selector::new(
                CostModel::paper(intercepts(k), 0.211).unwrap(),
                k,
                Objective::Ratio,
            )
            .unwrap();
            let mut i = 0;
            g.bench_with_input(BenchmarkId::new(format!("nodes{label}"), k), &k, |b, _| {
                b.iter(|| {
                    i = (i + 1) % pools.len();
                    sel.select(&pools[i], None).unwrap()
                })
            });
        }
    }
    g.finish();
}

/// The stop rule as a decode loop runs it: once per drafted level, on the pool so far.
fn bench_stop_rule(c: &mut Criterion) {
    let specs: Vec<PoolSpec> = (0..POOLS)
        .map(|s| synth::pool(&Shape::paper(), s))
        .collect();
    let levels: Vec<Vec<Pool>> = specs
        .iter()
        .map(|spec| {
            let full = spec.build().unwrap();
            (1..=5)
                .map(|d| {
                    let mut part = spec.clone();
                    part.nodes.retain(|_| true);
                    let keep: Vec<bool> = (0..full.len()).map(|i| full.depth(i) <= d).collect();
                    part.nodes = spec
                        .nodes
                        .iter()
                        .zip(&keep)
                        .filter(|(_, k)| **k)
                        .map(|(n, _)| n.clone())
                        .collect();
                    part.build().unwrap()
                })
                .collect()
        })
        .collect();
    let mut sel = Selector::new(
        CostModel::paper(intercepts(7), 0.211).unwrap(),
        7,
        Objective::Ratio,
    )
    .unwrap();
    let mut i = 0;
    c.bench_function("stop_rule/paper18_k7_all_levels", |b| {
        b.iter(|| {
            i = (i + 1) % levels.len();
            levels[i]
                .iter()
                .map(|p| stop_rule(&mut sel, p, None).unwrap().keep_drafting())
                .count()
        })
    });
}

fn bench_build(c: &mut Criterion) {
    let specs: Vec<PoolSpec> = (0..POOLS)
        .map(|s| synth::pool(&Shape::paper(), s))
        .collect();
    let mut i = 0;
    c.bench_function("pool/build_paper18", |b| {
        b.iter(|| {
            i = (i + 1) % specs.len();
            specs[i].build().unwrap()
        })
    });
}

fn bench_calibrate(c: &mut Criterion) {
    let mut rng = synth::Rng::new(3);
    let probes: Vec<Probe> = (0..2000)
        .map(|r| {
            let nodes = r % 8;
            let demand = 300 + rng.below(900) as u64;
            let ms = 130.0 + 2.0 * nodes as f64 + 0.211 * demand as f64 + rng.unit();
            Probe {
                nodes,
                demand,
                ms,
                hits_misses: None,
                context: 0,
            }
        })
        .collect();
    c.bench_function("calibrate/2000_rows_k7", |b| {
        b.iter(|| calibrate(&probes).unwrap())
    });
}

criterion_group!(
    benches,
    bench_paper,
    bench_scaling,
    bench_stop_rule,
    bench_build,
    bench_calibrate
);
criterion_main!(benches);
