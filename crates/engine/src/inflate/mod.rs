//! `inflate`: a small trained Qwen3-MoE target and its EAGLE-3 drafter embedded, function-
//! preserving up to rounding, in a large model's tensor shapes (by default Qwen3-30B-A3B's, with
//! the small vocabulary), so that the engine does a large model's work — every byte read, every
//! multiply — while the tokens, the acceptance and the routing are the trained pair's.
//!
//! The construction ([`plan`]): the residual stream holds the small one `H/h` times over (every
//! RMSNorm then sees the small mean square, so norm weights and ε are unchanged); rotary pair `j`
//! becomes pair `m·j` (the same frequency under the same θ), its copies normalised alike and
//! cancelled in q·k by a zero k-norm weight, the softmax scale carried by the q-norm (×√m);
//! query heads keep their GQA groups, every other head has zero output columns; each expert
//! appears `E/e` times with its router row (the copies tie, so top-k picks them together and
//! the renormalised weights sum to the small expert's); expert MLPs are zero-padded; the small
//! layers are spread over the large ones, the rest pass the residual through (full-size random
//! q/k/v and gate/up, zero attention output and down projections) and route like the next
//! small layer, with their expert ids permuted. Writing ([`target`], [`drafter`]) streams the
//! GGUF to a temporary name renamed at the end. It loads no model for inference.

pub mod drafter;
pub mod plan;
pub mod routers;
pub mod rows;
pub mod target;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::model::eagle3::Eagle3Config;
use crate::predictor::{HeadShape, RoutePredictor};
use crate::weights::Checkpoint;
pub use plan::{Plan, Shape};

/// The weight formats `inflate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FileType {
    /// Every matrix `Q8_0`.
    Q8_0,
    /// llama.cpp's `Q4_K_M` mix ([`specfit_gguf::quant::q4_k_m_type`]).
    Q4KM,
    /// Every matrix `F32`: no rounding but the construction's (for checking it exactly).
    F32,
}

impl FileType {
    /// The name in file names and flags: `q8_0`, `q4_k_m`.
    pub fn name(self) -> &'static str {
        match self {
            FileType::Q8_0 => "q8_0",
            FileType::Q4KM => "q4_k_m",
            FileType::F32 => "f32",
        }
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`).
    pub fn ftype(self) -> u32 {
        match self {
            FileType::Q8_0 => 7,
            FileType::Q4KM => 15,
            FileType::F32 => 0,
        }
    }

    /// The file the target is written to in `dir`.
    pub fn target_path(self, dir: &Path) -> PathBuf {
        dir.join(format!("target-{}.gguf", self.name()))
    }
}

/// What to inflate and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// The small target (a Hugging Face Qwen3-MoE directory).
    pub model: PathBuf,
    /// Its EAGLE-3 drafter.
    pub drafter: PathBuf,
    /// Its route predictor, carried over to the large model when given.
    pub predictor: Option<PathBuf>,
    pub out: PathBuf,
    pub types: Vec<FileType>,
    pub shape: Shape,
    /// Pass-through routers: copies of the next small layer's router (`None`), or fitted on
    /// calibration prompts ([`routers`]).
    pub routing: Option<Routing>,
}

/// How pass-through routers are fitted.
#[derive(Debug, Clone)]
pub struct Routing {
    /// Token ids.
    pub prompts: Vec<Vec<u32>>,
    pub target: routers::Target,
}

/// One pass-through layer's fitted router, as the manifest records it.
#[derive(Debug, Clone, Serialize)]
pub struct FittedRouter {
    pub layer: usize,
    pub scale: f64,
    /// On the calibration prompts: previous-token overlap and LRU hit rate at half the
    /// experts, fitted and (`base_*`) of the small router alone.
    pub overlap: f64,
    pub lru_half: f64,
    pub base_overlap: f64,
    pub base_lru_half: f64,
}

/// What was written.
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub source_model: PathBuf,
    pub source_drafter: PathBuf,
    pub plan: Plan,
    /// The drafter's taps as large-model SpecForge layer ids.
    pub drafter_taps: Vec<usize>,
    pub predictor: bool,
    /// What the pass-through routers were fitted to, and the fits (empty: copies of the small
    /// routers).
    pub router_target: Option<routers::Target>,
    pub routers: Vec<FittedRouter>,
}

/// The manifest's file in an output directory.
pub fn manifest_path(dir: &Path) -> PathBuf {
    dir.join("inflate.json")
}

/// Bytes of the target file of `plan` in `ty` (the tensor data; the header adds little).
fn target_bytes(
    plan: &Plan,
    tensors: &target::Tensors,
    vectors: &target::Vectors,
    ty: FileType,
) -> u64 {
    let total = target::tensors(plan, tensors, ty, vectors)
        .iter()
        .map(|t| t.matrix.bytes(t.spec.ty))
        .sum();
    total
}

/// Bytes free for an unprivileged writer on the filesystem holding `path` (or its nearest
/// existing ancestor).
fn free_bytes(path: &Path) -> Result<u64, EngineError> {
    let mut p = path.to_path_buf();
    while !p.exists() {
        if !p.pop() {
            p = PathBuf::from(".");
            break;
        }
    }
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| {
        EngineError::InflateOutput {
            path: p.clone(),
            reason: "the path holds a NUL byte".into(),
        }
    })?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(EngineError::io(&p)(std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The small target's tensors, read as f32 with their shapes checked.
fn read_small(model: &Path, cfg: &Qwen3MoeConfig) -> Result<target::Tensors, EngineError> {
    let ck = Checkpoint::open(model)?;
    let (h, d) = (cfg.hidden_size, cfg.head_dim());
    let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
    let (e, i) = (cfg.num_experts, cfg.moe_intermediate_size);
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    if !cfg.tie_word_embeddings {
        want.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    for l in 0..cfg.num_hidden_layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        want.extend([
            (p("input_layernorm.weight"), vec![h]),
            (p("self_attn.q_proj.weight"), vec![q, h]),
            (p("self_attn.k_proj.weight"), vec![kv, h]),
            (p("self_attn.v_proj.weight"), vec![kv, h]),
            (p("self_attn.o_proj.weight"), vec![h, q]),
            (p("self_attn.q_norm.weight"), vec![d]),
            (p("self_attn.k_norm.weight"), vec![d]),
            (p("post_attention_layernorm.weight"), vec![h]),
            (p("mlp.gate.weight"), vec![e, h]),
        ]);
        for x in 0..e {
            want.extend([
                (p(&format!("mlp.experts.{x}.gate_proj.weight")), vec![i, h]),
                (p(&format!("mlp.experts.{x}.up_proj.weight")), vec![i, h]),
                (p(&format!("mlp.experts.{x}.down_proj.weight")), vec![h, i]),
            ]);
        }
    }
    want.into_iter()
        .map(|(name, shape)| Ok((name.clone(), ck.peek(&name, &shape)?)))
        .collect()
}

/// The small route predictor as one for the large model: large layer `l`'s expert `id` scores
/// as the small predictor scores small expert `small_expert(l, id)` in the layer `l` routes
/// like; the features (drafter hidden, token embedding) read their first copies.
fn inflate_predictor(
    plan: &Plan,
    path: &Path,
    small_drafter_hidden: usize,
) -> Result<RoutePredictor, EngineError> {
    let (s, big) = (&plan.small, &plan.shape);
    let small_dim = small_drafter_hidden + s.hidden;
    let small_shape = HeadShape {
        layers: s.layers,
        experts: s.experts,
        num_experts_per_tok: s.num_experts_per_tok,
        dim: small_dim,
    };
    let p = RoutePredictor::load(path, small_shape)?;
    let (w0, b0) = p.weights();
    let (layers, experts) = (big.num_hidden_layers, big.num_experts);
    let dim = 2 * big.hidden_size;
    let mut w = vec![0.0f32; layers * experts * dim];
    let mut b = vec![0.0f32; layers * experts];
    for l in 0..layers {
        for id in 0..experts {
            let small_row = plan.router_source[l] * s.experts + plan.small_expert(l, id);
            let out = l * experts + id;
            b[out] = b0[small_row];
            let src = &w0[small_row * small_dim..(small_row + 1) * small_dim];
            let dst = &mut w[out * dim..(out + 1) * dim];
            dst[..small_drafter_hidden].copy_from_slice(&src[..small_drafter_hidden]);
            dst[big.hidden_size..big.hidden_size + s.hidden]
                .copy_from_slice(&src[small_drafter_hidden..]);
        }
    }
    let shape = HeadShape {
        layers,
        experts,
        num_experts_per_tok: big.num_experts_per_tok,
        dim,
    };
    Ok(RoutePredictor::from_parts(shape, w, b))
}

/// Progress of a run: bytes of the current file written so far and its total.
pub struct Progress<'a> {
    pub file: &'a Path,
    pub written: u64,
    pub total: u64,
}

/// Writes the inflated target(s), drafter, route predictor and manifest into `opts.out`.
/// Refuses a source that is not a Qwen3-MoE target with an EAGLE-3 drafter that fits it, a
/// target file that exists, a directory holding another inflation, and too little disk space;
/// nothing partial is left behind.
pub fn inflate(
    opts: &Options,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Manifest, EngineError> {
    if crate::gguf::is_gguf(&opts.model) {
        return Err(EngineError::InflateOutput {
            path: opts.model.clone(),
            reason: "a GGUF file; inflate reads a Hugging Face checkpoint directory".into(),
        });
    }
    let cfg = Qwen3MoeConfig::load(&opts.model)?;
    let plan = Plan::new(&cfg, opts.shape.clone())?;
    let drafter_cfg_path = opts.drafter.join("config.json");
    let text =
        std::fs::read_to_string(&drafter_cfg_path).map_err(EngineError::io(&drafter_cfg_path))?;
    let drafter_cfg: Eagle3Config = serde_json::from_str(&text).map_err(|e| EngineError::Json {
        path: drafter_cfg_path.clone(),
        message: e.to_string(),
    })?;
    // The drafter must fit the small target as it is before it can fit the large one.
    crate::model::Eagle3::check(&drafter_cfg, &cfg)?;
    let taps = plan.drafter_taps(&drafter_cfg)?;
    let predictor = opts.predictor.as_ref().filter(|p| p.exists());
    let out = &opts.out;
    if out.exists() && !out.is_dir() {
        return Err(EngineError::InflateOutput {
            path: out.clone(),
            reason: "exists and is not a directory".into(),
        });
    }
    for ty in &opts.types {
        let path = ty.target_path(out);
        if path.exists() {
            return Err(EngineError::InflateOutput {
                path,
                reason: "already exists; remove it or choose another --out".into(),
            });
        }
    }
    let tensors = read_small(&opts.model, &cfg)?;
    let (fitted, routers) = match &opts.routing {
        Some(r) => fit_routers(&opts.model, &plan, &tensors, r)?,
        None => (Vec::new(), vec![None; plan.shape.num_hidden_layers]),
    };
    let manifest = Manifest {
        source_model: opts.model.clone(),
        source_drafter: opts.drafter.clone(),
        plan: plan.clone(),
        drafter_taps: taps.clone(),
        predictor: predictor.is_some(),
        router_target: opts.routing.as_ref().map(|r| r.target),
        routers: fitted,
    };
    let manifest_json = serde_json::to_string_pretty(&manifest).expect("plain data") + "\n";
    // The drafter, predictor and manifest are the same for every file type: written once,
    // kept when the directory holds this very inflation.
    let manifest_file = manifest_path(out);
    let same = match std::fs::read_to_string(&manifest_file) {
        Ok(old) if old == manifest_json => true,
        Ok(_) => {
            return Err(EngineError::InflateOutput {
                path: manifest_file,
                reason: "describes another inflation (other source or shape); choose another --out"
                    .into(),
            })
        }
        Err(_) => false,
    };
    let drafter_dir = out.join("drafter");
    let predictor_path = out.join("route-predictor.safetensors");
    let write_shared = !same || !drafter_dir.join("model.safetensors").exists();
    if write_shared && (drafter_dir.exists() || predictor_path.exists()) {
        return Err(EngineError::InflateOutput {
            path: drafter_dir,
            reason:
                "exists without this inflation's inflate.json; remove it or choose another --out"
                    .into(),
        });
    }
    let vectors = target::Vectors::new(&plan, &tensors, routers);
    let sizes: Vec<u64> = opts
        .types
        .iter()
        .map(|&t| target_bytes(&plan, &tensors, &vectors, t))
        .collect();
    let big = &plan.shape;
    let drafter_bytes = 2
        * (big.hidden_size * 3 * big.hidden_size
            + (big.num_attention_heads + 2 * big.num_key_value_heads)
                * big.head_dim
                * 2
                * big.hidden_size
            + big.hidden_size * big.num_attention_heads * big.head_dim
            + 3 * big.drafter_intermediate_size * big.hidden_size
            + drafter_cfg
                .draft_vocab_size
                .unwrap_or(drafter_cfg.vocab_size)
                * big.hidden_size) as u64;
    let predictor_bytes =
        4 * (big.num_hidden_layers * big.num_experts * (2 * big.hidden_size + 1)) as u64;
    let needed = sizes.iter().sum::<u64>()
        + if write_shared {
            drafter_bytes + predictor_bytes
        } else {
            0
        }
        + (64 << 20);
    let available = free_bytes(out)?;
    if needed > available {
        return Err(EngineError::DiskSpace {
            path: out.clone(),
            needed,
            available,
        });
    }
    std::fs::create_dir_all(out).map_err(EngineError::io(out))?;
    if write_shared {
        drafter::write(&plan, &opts.drafter, &drafter_cfg, &taps, &drafter_dir)?;
        if let Some(p) = predictor {
            inflate_predictor(&plan, p, drafter_cfg.hidden_size)?.save(&predictor_path)?;
        }
    }
    if !same {
        let tmp = manifest_file.with_extension("json.tmp");
        std::fs::write(&tmp, &manifest_json).map_err(EngineError::io(&tmp))?;
        std::fs::rename(&tmp, &manifest_file).map_err(EngineError::io(&manifest_file))?;
    }
    let tokenizer = tokenizer_metadata(&opts.model)?;
    for (&ty, &total) in opts.types.iter().zip(&sizes) {
        let path = ty.target_path(out);
        let metadata = target::metadata(&plan, ty, &cfg, tokenizer.clone(), &opts.model);
        let files = target::tensors(&plan, &tensors, ty, &vectors);
        let mut written = 0u64;
        target::write(&path, &metadata, &files, &mut |bytes| {
            written += bytes;
            progress(Progress {
                file: &path,
                written,
                total,
            });
        })?;
    }
    Ok(manifest)
}

/// Fits every pass-through layer's router on the small target's normalised residuals over the
/// calibration prompts: per large layer, `Some([experts, hidden])` for a pass-through layer.
type Routers = Vec<Option<Vec<f32>>>;

fn fit_routers(
    model: &Path,
    plan: &Plan,
    tensors: &target::Tensors,
    routing: &Routing,
) -> Result<(Vec<FittedRouter>, Routers), EngineError> {
    let s = &plan.small;
    let (small, mut cache) = crate::load_target(
        model,
        &crate::Tier::Ram,
        usize::MAX,
        crate::CacheMode::Lru,
        None,
    )?;
    let eps = small.config().rms_norm_eps as f32;
    // Inputs of small layers 1..L (L: the final residual), per prompt.
    let taps: Vec<usize> = (1..=s.layers).collect();
    let mut residuals: Vec<Vec<Vec<Vec<f32>>>> = vec![Vec::new(); s.layers]; // [tap][prompt][token]
    for prompt in &routing.prompts {
        let mut kv = small.new_kv_cache();
        let out = small.forward(
            &crate::Batch {
                taps: &taps,
                logits: crate::Logits::None,
                ..crate::Batch::causal(prompt)
            },
            &mut kv,
            &mut cache,
        )?;
        for (k, tap) in out.taps.iter().enumerate() {
            residuals[k].push(tap.chunks_exact(s.hidden).map(<[f32]>::to_vec).collect());
        }
    }
    // The routes' share reused from the previous token and LRU hit rate at half the experts.
    let stats = |routes: &[Vec<Vec<u32>>]| {
        (
            routers::previous_overlap(routes),
            routers::lru_hits(routes, s.experts / 2),
        )
    };
    // Every pass-through layer after the same small layers sees the same residual and copies
    // the same small router: its inputs, slow features and the small router's own figures are
    // made once per boundary.
    struct Boundary {
        inputs: routers::Inputs,
        features: Vec<(Vec<f64>, f64)>,
        base: (f64, f64),
    }
    let mut boundaries: Vec<Option<Boundary>> = (0..s.layers).map(|_| None).collect();
    let mut fitted = Vec::new();
    let mut routers = vec![None; plan.shape.num_hidden_layers];
    for (l, slot) in routers.iter_mut().enumerate() {
        if plan.trained_layers.contains(&l) {
            continue;
        }
        // Small layers before l: the residual it sees is the input of small layer `before`.
        let before = plan.trained_layers.iter().filter(|&&t| t < l).count();
        let source = plan.router_source[l];
        let small_router = &tensors[&format!("model.layers.{source}.mlp.gate.weight")];
        let boundary = match &mut boundaries[before - 1] {
            Some(b) => b,
            empty => {
                let w = &tensors[&format!("model.layers.{source}.post_attention_layernorm.weight")];
                let inputs = routers::Inputs {
                    dim: s.hidden,
                    sequences: residuals[before - 1]
                        .iter()
                        .map(|seq| {
                            seq.iter()
                                .map(|r| {
                                    let mut x = r.clone();
                                    crate::kernels::rms_norm_in_place(&mut x, w, eps);
                                    x
                                })
                                .collect()
                        })
                        .collect(),
                };
                let features = routers::slow_features(&inputs, routers::FEATURES)?;
                let base = stats(&routers::routes(
                    small_router,
                    s.num_experts_per_tok,
                    &inputs,
                ));
                empty.insert(Boundary {
                    inputs,
                    features,
                    base,
                })
            }
        };
        let f = routers::fit(
            small_router,
            s.num_experts_per_tok,
            &boundary.inputs,
            &boundary.features,
            routing.target,
            0x5107_0000 + l as u64,
        );
        let (overlap, lru_half) = stats(&routers::routes(
            &f.weights,
            s.num_experts_per_tok,
            &boundary.inputs,
        ));
        fitted.push(FittedRouter {
            layer: l,
            scale: f.scale,
            overlap,
            lru_half,
            base_overlap: boundary.base.0,
            base_lru_half: boundary.base.1,
        });
        *slot = Some(f.weights);
    }
    Ok((fitted, routers))
}

/// The small target's tokenizer as GGUF metadata.
fn tokenizer_metadata(model: &Path) -> Result<Vec<(String, specfit_gguf::Value)>, EngineError> {
    let path = model.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(EngineError::io(&path))?;
    let config_path = model.join("tokenizer_config.json");
    let config: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
        Ok(t) => Some(serde_json::from_str(&t).map_err(|e| EngineError::Json {
            path: config_path.clone(),
            message: e.to_string(),
        })?),
        Err(_) => None,
    };
    crate::gguf::metadata_of(&path, &text, config.as_ref())
}
