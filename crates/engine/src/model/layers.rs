//! Building blocks shared by the model files: RoPE, linear layers, GQA attention over the KV
//! cache with an arbitrary visibility mask, and the SwiGLU MLP. All arithmetic goes through the
//! batch-invariant kernels. Architecture-specific wiring stays in each model file.

use crate::error::EngineError;
use crate::kernels::{matmul, rms_norm_in_place, silu, softmax_in_place, WeightBuf};
use crate::kv::KvCache;
use crate::weights::Checkpoint;

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

    /// Rotates one head vector `x` (D) for `position`: `x·cos + rotate_half(x)·sin`.
    pub(crate) fn apply(&self, x: &mut [f32], position: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = position as f32 * f;
            let (sin, cos) = (angle.sin(), angle.cos());
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos + (-b) * sin;
            x[i + half] = b * cos + a * sin;
        }
    }
}

/// `y = x Wᵀ (+ b)` with W in the `nn.Linear` layout `[out, in]`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) w: WeightBuf,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) out: usize,
    pub(crate) inp: usize,
}

impl Linear {
    pub(crate) fn load(
        ck: &mut Checkpoint,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, EngineError> {
        let w = ck.take_weight(&format!("{name}.weight"), &[out, inp])?;
        let bias = if bias {
            Some(ck.take(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Ok(Linear { w, bias, out, inp })
    }

    /// Stacks linears over the same input into one (their outputs concatenated per row).
    pub(crate) fn stack(parts: &[Linear]) -> Linear {
        let w = match &parts[0].w {
            WeightBuf::F32(_) => WeightBuf::F32(
                parts
                    .iter()
                    .flat_map(|p| match &p.w {
                        WeightBuf::F32(v) => v.iter().copied(),
                        WeightBuf::Bf16(_) => unreachable!("one storage dtype per checkpoint"),
                    })
                    .collect(),
            ),
            WeightBuf::Bf16(_) => WeightBuf::Bf16(
                parts
                    .iter()
                    .flat_map(|p| match &p.w {
                        WeightBuf::Bf16(v) => v.iter().copied(),
                        WeightBuf::F32(_) => unreachable!("one storage dtype per checkpoint"),
                    })
                    .collect(),
            ),
        };
        let bias = parts.iter().all(|p| p.bias.is_some()).then(|| {
            parts
                .iter()
                .flat_map(|p| p.bias.as_ref().expect("checked").iter().copied())
                .collect()
        });
        Linear {
            w,
            bias,
            out: parts.iter().map(|p| p.out).sum(),
            inp: parts[0].inp,
        }
    }

    /// `rows × in` → `rows × out`.
    pub(crate) fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * self.out];
        matmul(x, rows, self.w.view(), self.out, self.inp, &mut y);
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
            qkv: Linear::stack(&[
                Linear::load(ck, &format!("{p}.q_proj"), s.heads * d, s.input, s.bias)?,
                Linear::load(ck, &format!("{p}.k_proj"), s.kv_heads * d, s.input, s.bias)?,
                Linear::load(ck, &format!("{p}.v_proj"), s.kv_heads * d, s.input, s.bias)?,
            ]),
            o_proj: Linear::load(ck, &format!("{p}.o_proj"), s.output, s.heads * d, false)?,
            q_norm: norm(ck, "q_norm")?,
            k_norm: norm(ck, "k_norm")?,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            eps: s.eps,
        })
    }

    /// `x`: T × H (already normed) → T × H. Appends this forward's keys/values to `kv[layer]`;
    /// token `i` attends to the cache indices `visible[i]`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        positions: &[usize],
        visible: &[Vec<usize>],
        rope: &Rope,
        kv: &mut KvCache,
        layer: usize,
    ) -> Vec<f32> {
        let (t, d) = (positions.len(), self.head_dim);
        // One job for q, k and v (each output is still its own dot product): T × (Q + K + V).
        let (qn, kn) = (self.heads * d, self.kv_heads * d);
        let qkv = self.qkv.forward(x, t);
        let width = qn + 2 * kn;
        let mut q: Vec<f32> = qkv
            .chunks_exact(width)
            .flat_map(|r| r[..qn].iter().copied())
            .collect(); // T × Hq·D
        let mut k: Vec<f32> = qkv
            .chunks_exact(width)
            .flat_map(|r| r[qn..qn + kn].iter().copied())
            .collect(); // T × Hkv·D
        let v: Vec<f32> = qkv
            .chunks_exact(width)
            .flat_map(|r| r[qn + kn..].iter().copied())
            .collect(); // T × Hkv·D
                        // QK-norm per head, then RoPE at each token's own position.
        for (i, &pos) in positions.iter().enumerate() {
            for head in q[i * self.heads * d..(i + 1) * self.heads * d].chunks_exact_mut(d) {
                if let Some(w) = &self.q_norm {
                    rms_norm_in_place(head, w, self.eps);
                }
                rope.apply(head, pos);
            }
            for head in k[i * self.kv_heads * d..(i + 1) * self.kv_heads * d].chunks_exact_mut(d) {
                if let Some(w) = &self.k_norm {
                    rms_norm_in_place(head, w, self.eps);
                }
                rope.apply(head, pos);
            }
        }
        kv.push(layer, &k, &v);
        let (keys, values, row) = (kv.keys(layer), kv.values(layer), kv.row());
        let scale = 1.0 / (d as f32).sqrt();
        let group = self.heads / self.kv_heads;
        let mut attn = vec![0.0f32; t * self.heads * d]; // T × Hq·D
        let mut scores = Vec::new();
        for i in 0..t {
            for h in 0..self.heads {
                let qh = &q[(i * self.heads + h) * d..(i * self.heads + h + 1) * d];
                let kvh = h / group;
                // softmax(q·kᵀ · D^-1/2) over the visible keys, in cache order.
                scores.clear();
                scores.extend(visible[i].iter().map(|&j| {
                    crate::kernels::dot(qh, &keys[j * row + kvh * d..j * row + (kvh + 1) * d])
                        * scale
                }));
                softmax_in_place(&mut scores);
                let out = &mut attn[(i * self.heads + h) * d..(i * self.heads + h + 1) * d];
                for (&j, &p) in visible[i].iter().zip(&scores) {
                    let vj = &values[j * row + kvh * d..j * row + (kvh + 1) * d];
                    for (o, &vv) in out.iter_mut().zip(vj) {
                        *o += p * vv;
                    }
                }
            }
        }
        self.o_proj.forward(&attn, t)
    }
}

/// A SwiGLU MLP: `down(silu(gate(x)) · up(x))` (`Qwen3MoeMLP`, `LlamaMLP`).
#[derive(Debug, Clone)]
pub(crate) struct DenseMlp {
    pub(crate) gate: Linear, // [Im, H]
    pub(crate) up: Linear,   // [Im, H]
    pub(crate) down: Linear, // [H, Im]
}

impl DenseMlp {
    pub(crate) fn load(
        ck: &mut Checkpoint,
        p: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<DenseMlp, EngineError> {
        Ok(DenseMlp {
            gate: Linear::load(ck, &format!("{p}.gate_proj"), inter, hidden, false)?,
            up: Linear::load(ck, &format!("{p}.up_proj"), inter, hidden, false)?,
            down: Linear::load(ck, &format!("{p}.down_proj"), hidden, inter, false)?,
        })
    }

    pub(crate) fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let g = self.gate.forward(x, t);
        let u = self.up.forward(x, t);
        let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        self.down.forward(&a, t)
    }
}
