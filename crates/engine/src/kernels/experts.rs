//! Routed experts on the compute threads: one SwiGLU expert over the rows routed to it (float
//! panels or GGUF blocks as stored), and a batch of experts spread over the threads, each writing
//! its own rows of the block's outputs (an expert that runs alone has its matmuls split by output
//! instead); the quantized kernels read each matrix's rows ahead themselves. Routing and summing the outputs
//! are the MoE block's ([`crate::model`]); fetching the experts is the cache's.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::quant::{QuantActs, QuantView};
use super::{silu, Isa, PackedView};
use crate::experts::{ExpertLayout, ExpertMatrices};
use crate::model::layers::swiglu;
use crate::threads::SharedOut;

/// Runs every expert of `batch` over its rows: `rows(e)` gives the rows of `outputs` (H wide)
/// expert `e` writes and its input rows (m × H). Several experts: spread over the threads (one
/// hand-off per batch, each thread taking the next expert left). One expert (a read that just
/// finished): its matmuls are split by output panel instead. Each output is computed by one
/// thread in one fixed order either way.
pub(crate) fn run_experts(
    layout: ExpertLayout,
    batch: &[(u32, ExpertMatrices<'_>)],
    rows: &(dyn Fn(u32) -> (Range<usize>, Vec<f32>) + Sync),
    outputs: &mut [f32],
) {
    let (h, len) = (layout.hidden, outputs.len());
    let out = SharedOut(outputs.as_mut_ptr());
    let compute = |e: u32, matrices: ExpertMatrices<'_>, parallel: bool| {
        let (range, xs) = rows(e);
        assert!(
            range.end * h <= len,
            "an expert's rows lie inside the outputs"
        );
        let y = run_expert(layout, matrices, &xs, range.len(), parallel);
        // SAFETY: each expert writes only its own rows `range` of `outputs`.
        unsafe {
            std::ptr::copy_nonoverlapping(y.as_ptr(), out.get().add(range.start * h), y.len())
        };
    };
    let pool = crate::threads::pool();
    let parts = pool.threads();
    if batch.len() > 1 && parts > 1 {
        // Each thread takes the next expert nobody has taken, so one slow expert (more rows, a
        // stall on memory) does not leave the others waiting at the end of the batch.
        let next = AtomicUsize::new(0);
        pool.run(&|_| {
            while let Some(&(e, matrices)) = batch.get(next.fetch_add(1, Ordering::Relaxed)) {
                compute(e, matrices, false);
            }
        });
    } else {
        for &(e, matrices) in batch {
            compute(e, matrices, true);
        }
    }
}

/// One SwiGLU expert applied to `m` rows `xs` (m × H), from its matrices (a slot's packed
/// `gate | up` and `down`, or GGUF rows): `down(silu(gate(x)) · up(x))`, m × H. With `parallel`,
/// each matmul is split by output across the worker pool (when large enough), for an expert
/// that runs alone.
pub(crate) fn run_expert(
    layout: ExpertLayout,
    matrices: ExpertMatrices<'_>,
    xs: &[f32],
    m: usize,
    parallel: bool,
) -> Vec<f32> {
    let (h, i) = (layout.hidden, layout.intermediate);
    let mut y = vec![0.0; m * h];
    match matrices {
        ExpertMatrices::Float { gate_up, down } => {
            let gemm = |w: PackedView<'_>, x: &[f32], out: &mut [f32]| {
                if parallel {
                    w.gemm(x, m, out)
                } else {
                    w.gemm_serial(x, m, out)
                }
            };
            let mut gu = vec![0.0; m * 2 * i];
            gemm(gate_up, xs, &mut gu); // m × 2I
            let a = swiglu(&gu, i); // m × I
            gemm(down, &a, &mut y); // m × H
        }
        ExpertMatrices::Quant { gate, up, down } => {
            let isa = Isa::detected();
            let gemm = |w: QuantView<'_>, x: &QuantActs, out: &mut [f32]| {
                w.gemm_quantized(isa, x, out, parallel)
            };
            // gate and up share their input: quantized once when their types agree.
            let xg = QuantActs::quantize(gate.ty(), xs, m, h);
            let xu = (up.ty() != gate.ty()).then(|| QuantActs::quantize(up.ty(), xs, m, h));
            let (mut g, mut u) = (vec![0.0; m * i], vec![0.0; m * i]);
            gemm(gate, &xg, &mut g); // m × I
            gemm(up, xu.as_ref().unwrap_or(&xg), &mut u); // m × I
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect(); // m × I
            gemm(down, &QuantActs::quantize(down.ty(), &a, m, i), &mut y); // m × H
        }
    }
    y
}
