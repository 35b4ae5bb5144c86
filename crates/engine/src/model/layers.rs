//! Building blocks shared by the model files: RoPE, linear layers, GQA attention over the KV
//! cache with an arbitrary visibility mask (its kernel is [`crate::kernels::attention`]), and the
//! SwiGLU MLP. All arithmetic goes through the batch-invariant kernels. Architecture-specific wiring stays in each model file.

use crate::error::EngineError;
use crate::kernels::attention;
use crate::kernels::quant::QuantMatrix;
use crate::kernels::{rms_norm_in_place, silu, PackedMatrix, WeightBuf, WeightView};
use crate::kv::KvCache;
use crate::weights::Checkpoint;
use specfit_gguf::GgmlType;

/// Rotary position embedding (rotate-half over the full head_dim).
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    /// `1 / θ^(2i/D)` for i < D/2, in f32 as transformers computes it.
    inv_freq: Vec<f32>,
}

impl Rope {
    pub(crate) fn new(theta: f64, head_dim: usize) -> Rope {
        let inv_freq = (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0 / theta.powf(exponent as f64) as f32
            })
            .collect();
        Rope { inv_freq }
    }

    /// The rotation of each token of a forward (computed once, shared by every head and layer).
    pub(crate) fn table(&self, positions: &[usize]) -> RopeTable {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &position in positions {
            for &f in &self.inv_freq {
                let angle = position as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable { cos, sin, half }
    }
}

/// `cos` and `sin` of every (token, frequency) of one forward.
#[derive(Debug, Clone)]
pub(crate) struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    /// Tokens covered.
    pub(crate) fn tokens(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates one head vector `x` (D) of token `i`: `x·cos + rotate_half(x)·sin`.
    pub(crate) fn apply(&self, x: &mut [f32], i: usize) {
        let h = self.half;
        let (cos, sin) = (&self.cos[i * h..(i + 1) * h], &self.sin[i * h..(i + 1) * h]);
        for j in 0..h {
            let (a, b) = (x[j], x[j + h]);
            x[j] = a * cos[j] + (-b) * sin[j];
            x[j + h] = b * cos[j] + a * sin[j];
        }
    }
}

/// One matrix of a linear layer as read from a checkpoint (row-major `[out, in]`): float values,
/// or a GGUF file's quantized rows (kept quantized, see [`QuantMatrix`]).
#[derive(Debug, Clone)]
enum RawWeight {
    Float(WeightBuf),
    Quant(GgmlType, Vec<u8>),
}

/// A linear layer's weights as read from a checkpoint, before packing: one or more matrices
/// over the same input whose outputs are concatenated (stacked q/k/v, gate/up).
#[derive(Debug, Clone)]
pub(crate) struct RawLinear {
    /// `(matrix, its out)`, in output order.
    parts: Vec<(RawWeight, usize)>,
    bias: Option<Vec<f32>>,
    out: usize,
    inp: usize,
}

impl RawLinear {
    pub(crate) fn load(
        ck: &mut Checkpoint,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<RawLinear, EngineError> {
        let wname = format!("{name}.weight");
        let w = match ck.take_quantized(&wname, &[out, inp])? {
            Some((ty, bytes)) => RawWeight::Quant(ty, bytes),
            None => RawWeight::Float(ck.take_weight(&wname, &[out, inp])?),
        };
        let bias = if bias {
            Some(ck.take(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Ok(RawLinear {
            parts: vec![(w, out)],
            bias,
            out,
            inp,
        })
    }

    /// Stacks linears over the same input into one (their outputs concatenated per row);
    /// neighbours stored alike are merged into one matrix.
    pub(crate) fn stack(parts: &[RawLinear]) -> RawLinear {
        let mut merged: Vec<(RawWeight, usize)> = Vec::new();
        for (w, out) in parts.iter().flat_map(|p| p.parts.iter().cloned()) {
            match (merged.last_mut(), w) {
                (
                    Some((RawWeight::Float(WeightBuf::F32(a)), n)),
                    RawWeight::Float(WeightBuf::F32(b)),
                ) => {
                    a.extend(b);
                    *n += out;
                }
                (
                    Some((RawWeight::Float(WeightBuf::Bf16(a)), n)),
                    RawWeight::Float(WeightBuf::Bf16(b)),
                ) => {
                    a.extend(b);
                    *n += out;
                }
                (Some((RawWeight::Quant(ta, a), n)), RawWeight::Quant(tb, b)) if *ta == tb => {
                    a.extend(b);
                    *n += out;
                }
                (_, w) => merged.push((w, out)),
            }
        }
        let bias = parts.iter().all(|p| p.bias.is_some()).then(|| {
            parts
                .iter()
                .flat_map(|p| p.bias.as_ref().expect("checked").iter().copied())
                .collect()
        });
        RawLinear {
            parts: merged,
            bias,
            out: parts.iter().map(|p| p.out).sum(),
            inp: parts[0].inp,
        }
    }
}

/// A packed weight matrix: float panels, quantized GGUF rows, or several stacked along the
/// output (when stacked parts are stored differently). Every output is one panel chain either
/// way, so the choice never changes a bit.
#[derive(Debug, Clone)]
pub(crate) enum Matrix {
    Float(PackedMatrix),
    Quant(QuantMatrix),
    /// Parts with their output widths, concatenated per row.
    Stack(Vec<(Matrix, usize)>),
}

impl Matrix {
    fn pack(w: RawWeight, out: usize, inp: usize) -> Matrix {
        match w {
            RawWeight::Float(w) => Matrix::Float(PackedMatrix::pack(w.view(), out, inp)),
            RawWeight::Quant(ty, bytes) => Matrix::Quant(
                QuantMatrix::from_gguf(ty, &bytes, out, inp).expect("checked when taken"),
            ),
        }
    }

    /// Whether every part is kept as quantized rows.
    pub(crate) fn is_quantized(&self) -> bool {
        match self {
            Matrix::Float(_) => false,
            Matrix::Quant(_) => true,
            Matrix::Stack(parts) => parts.iter().all(|(m, _)| m.is_quantized()),
        }
    }

    /// `out = x · Wᵀ` for `rows × inp` → `rows × n`, split over the worker pool when large.
    pub(crate) fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        match self {
            Matrix::Float(m) => m.gemm(x, rows, out),
            Matrix::Quant(m) => m.view().gemm(x, rows, out),
            Matrix::Stack(parts) => {
                let n: usize = parts.iter().map(|p| p.1).sum();
                let mut at = 0;
                for (m, w) in parts {
                    let mut part = vec![0.0f32; rows * w];
                    m.gemm(x, rows, &mut part);
                    for r in 0..rows {
                        out[r * n + at..r * n + at + w].copy_from_slice(&part[r * w..(r + 1) * w]);
                    }
                    at += w;
                }
            }
        }
    }
}

/// `y = x Wᵀ (+ b)` with W repacked into panels ([`Matrix`]).
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) w: Matrix,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) out: usize,
    pub(crate) inp: usize,
}

impl Linear {
    /// The bias-free `out × inp` layer `name` (every packed layer the models load).
    pub(crate) fn load(
        ck: &mut Checkpoint,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Result<Linear, EngineError> {
        Ok(Linear::pack(RawLinear::load(ck, name, out, inp, false)?))
    }

    /// Packs a loaded layer.
    pub(crate) fn pack(raw: RawLinear) -> Linear {
        let mut parts: Vec<(Matrix, usize)> = raw
            .parts
            .into_iter()
            .map(|(w, out)| (Matrix::pack(w, out, raw.inp), out))
            .collect();
        let w = if parts.len() == 1 {
            parts.pop().expect("one part").0
        } else {
            Matrix::Stack(parts)
        };
        Linear {
            w,
            bias: raw.bias,
            out: raw.out,
            inp: raw.inp,
        }
    }

    /// A bias-free layer over a row-major `[out, in]` matrix (a tied LM head).
    pub(crate) fn from_weights(w: WeightView<'_>, out: usize, inp: usize) -> Linear {
        Linear {
            w: Matrix::Float(PackedMatrix::pack(w, out, inp)),
            bias: None,
            out,
            inp,
        }
    }

    /// A bias-free layer over GGUF rows of type `ty` (a tied LM head of a quantized file).
    pub(crate) fn from_gguf(ty: GgmlType, bytes: &[u8], out: usize, inp: usize) -> Option<Linear> {
        Some(Linear {
            w: Matrix::Quant(QuantMatrix::from_gguf(ty, bytes, out, inp)?),
            bias: None,
            out,
            inp,
        })
    }

    /// `rows × in` → `rows × out`.
    pub(crate) fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * self.out];
        self.w.gemm(x, rows, &mut y);
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.out) {
                for (v, bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        }
        y
    }
}

/// The shape of an attention block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttentionShape {
    /// Width of the input rows (H for Qwen3-MoE, 2·H for the EAGLE-3 layer).
    pub input: usize,
    /// Width of the output rows.
    pub output: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bias: bool,
    pub eps: f32,
}

/// Multi-head attention with GQA and rotate-half RoPE (`Qwen3MoeAttention`, and the Llama
/// attention of the EAGLE-3 layer without QK-norm).
#[derive(Debug, Clone)]
pub(crate) struct Attention {
    /// `q_proj`, `k_proj` and `v_proj` stacked: [(Hq + 2·Hkv)·D, in], one matmul job.
    qkv: Linear,
    o_proj: Linear,           // [out, Hq·D]
    q_norm: Option<Vec<f32>>, // [D]
    k_norm: Option<Vec<f32>>, // [D]
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
}

impl Attention {
    pub(crate) fn load(
        ck: &mut Checkpoint,
        p: &str,
        s: &AttentionShape,
    ) -> Result<Attention, EngineError> {
        let d = s.head_dim;
        let norm = |ck: &mut Checkpoint, name: &str| -> Result<Option<Vec<f32>>, EngineError> {
            if s.qk_norm {
                Ok(Some(ck.take(&format!("{p}.{name}.weight"), &[d])?))
            } else {
                Ok(None)
            }
        };
        Ok(Attention {
            qkv: Linear::pack(RawLinear::stack(&[
                RawLinear::load(ck, &format!("{p}.q_proj"), s.heads * d, s.input, s.bias)?,
                RawLinear::load(ck, &format!("{p}.k_proj"), s.kv_heads * d, s.input, s.bias)?,
                RawLinear::load(ck, &format!("{p}.v_proj"), s.kv_heads * d, s.input, s.bias)?,
            ])),
            o_proj: Linear::load(ck, &format!("{p}.o_proj"), s.output, s.heads * d)?,
            q_norm: norm(ck, "q_norm")?,
            k_norm: norm(ck, "k_norm")?,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            eps: s.eps,
        })
    }

    /// `x`: T × H (already normed) → T × H. Appends this forward's keys/values to `kv[layer]`;
    /// token `i` (rotated by `rope`'s row `i`) attends to the cache indices `visible[i]`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        rope: &RopeTable,
        visible: &[Vec<usize>],
        kv: &mut KvCache,
        layer: usize,
    ) -> Vec<f32> {
        let (t, d) = (rope.tokens(), self.head_dim);
        // One job for q, k and v (each output is still its own chain): T × (Q + K + V).
        let (qn, kn) = (self.heads * d, self.kv_heads * d);
        let qkv = self.qkv.forward(x, t);
        let width = qn + 2 * kn;
        let mut q = vec![0.0f32; t * qn]; // T × Hq·D
        let mut k = vec![0.0f32; t * kn]; // T × Hkv·D
        let mut v = vec![0.0f32; t * kn]; // T × Hkv·D
        for (i, r) in qkv.chunks_exact(width).enumerate() {
            q[i * qn..(i + 1) * qn].copy_from_slice(&r[..qn]);
            k[i * kn..(i + 1) * kn].copy_from_slice(&r[qn..qn + kn]);
            v[i * kn..(i + 1) * kn].copy_from_slice(&r[qn + kn..]);
        }
        // QK-norm per head, then RoPE at each token's own position.
        for i in 0..t {
            for head in q[i * qn..(i + 1) * qn].chunks_exact_mut(d) {
                if let Some(w) = &self.q_norm {
                    rms_norm_in_place(head, w, self.eps);
                }
                rope.apply(head, i);
            }
            for head in k[i * kn..(i + 1) * kn].chunks_exact_mut(d) {
                if let Some(w) = &self.k_norm {
                    rms_norm_in_place(head, w, self.eps);
                }
                rope.apply(head, i);
            }
        }
        kv.push(layer, &k, &v);
        let attn = attention::attend(&q, visible, kv, layer, self.heads); // T × Hq·D
        self.o_proj.forward(&attn, t)
    }
}

/// A SwiGLU MLP: `down(silu(gate(x)) · up(x))` (`Qwen3MoeMLP`, `LlamaMLP`).
#[derive(Debug, Clone)]
pub(crate) struct DenseMlp {
    /// `gate_proj` and `up_proj` stacked: [2·Im, H], one matmul job.
    gate_up: Linear,
    down: Linear, // [H, Im]
    inter: usize,
}

impl DenseMlp {
    pub(crate) fn load(
        ck: &mut Checkpoint,
        p: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<DenseMlp, EngineError> {
        Ok(DenseMlp {
            gate_up: Linear::pack(RawLinear::stack(&[
                RawLinear::load(ck, &format!("{p}.gate_proj"), inter, hidden, false)?,
                RawLinear::load(ck, &format!("{p}.up_proj"), inter, hidden, false)?,
            ])),
            down: Linear::load(ck, &format!("{p}.down_proj"), hidden, inter)?,
            inter,
        })
    }

    pub(crate) fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let gu = self.gate_up.forward(x, t); // T × 2·Im
        let a = swiglu(&gu, self.inter); // T × Im
        self.down.forward(&a, t)
    }
}

/// `silu(gate) · up` for rows that hold `gate | up` side by side (`2·inter` wide): the SwiGLU
/// activation of the dense MLPs and of the routed experts.
pub(crate) fn swiglu(gate_up: &[f32], inter: usize) -> Vec<f32> {
    gate_up
        .chunks_exact(2 * inter)
        .flat_map(|r| {
            r[..inter]
                .iter()
                .zip(&r[inter..])
                .map(|(&g, &u)| silu(g) * u)
        })
        .collect()
}
