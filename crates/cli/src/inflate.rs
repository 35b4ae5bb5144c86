//! `specfit inflate`: writes the shipped (or any small Qwen3-MoE) target and its EAGLE-3
//! drafter embedded in Qwen3-30B-A3B's tensor shapes, as GGUF targets and a bf16 drafter.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use specfit_engine::inflate::routers::Target;
use specfit_engine::inflate::{inflate, FileType, Options, Routing, Shape};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TypeArg {
    /// Every matrix Q8_0 (31.8 GB for Qwen3-30B-A3B shapes with the shipped vocabulary).
    #[value(name = "q8_0")]
    Q8_0,
    /// llama.cpp's Q4_K_M mix (18.1 GB).
    #[value(name = "q4_k_m")]
    Q4KM,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The small pair to inflate (its predictor is carried over when the file exists).
    #[command(flatten)]
    pair: crate::paths::PairArgs,
    /// Output directory: DIR/target-TYPE.gguf, DIR/drafter/, DIR/route-predictor.safetensors,
    /// DIR/inflate.json.
    #[arg(long)]
    out: PathBuf,
    /// Weight formats of the target (one file each).
    #[arg(
        long = "type",
        value_enum,
        value_delimiter = ',',
        default_value = "q4_k_m"
    )]
    types: Vec<TypeArg>,
    /// What the pass-through layers' routers are fitted to on the calibration prompts:
    /// `lru=H` (the hit rate of an LRU holding half the experts, as published for
    /// Qwen3-30B-A3B: 64 of 128 slots ≈ 0.67), `overlap=S` (the share of a token's experts the
    /// previous token used; about 0.43 on Qwen3-30B-A3B), or `copy` (the next trained layer's
    /// router as it is).
    #[arg(long, default_value = "lru=0.67")]
    router_target: String,
}

/// `--router-target` (`None`: copy).
fn parse_target(text: &str, experts: usize) -> Result<Option<Target>> {
    if text == "copy" {
        return Ok(None);
    }
    let bad = || {
        anyhow::anyhow!("--router-target {text:?}: lru=H, overlap=S (a share in (0, 1)) or copy")
    };
    let (kind, value) = text.split_once('=').ok_or_else(bad)?;
    let v: f64 = value.parse().map_err(|_| bad())?;
    anyhow::ensure!(v > 0.0 && v < 1.0, bad());
    match kind {
        // Half the small model's experts: the large model's 64 of 128.
        "lru" => Ok(Some(Target::LruHits {
            slots: experts / 2,
            share: v,
        })),
        "overlap" => Ok(Some(Target::Overlap(v))),
        _ => Err(bad()),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let types: Vec<FileType> = args
        .types
        .iter()
        .map(|t| match t {
            TypeArg::Q8_0 => FileType::Q8_0,
            TypeArg::Q4KM => FileType::Q4KM,
        })
        .collect();
    let started = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let small = specfit_engine::Qwen3MoeConfig::load(&args.pair.model)?;
    let target = parse_target(&args.router_target, small.num_experts)?;
    let routing = match target {
        Some(target) => {
            let tokenizer = specfit_engine::Tokenizer::load(&args.pair.model)?;
            Some(Routing {
                prompts: crate::calibrate::default_prompts(&tokenizer)?,
                target,
            })
        }
        None => None,
    };
    let opts = Options {
        model: args.pair.model.clone(),
        drafter: args.pair.drafter.clone(),
        predictor: Some(args.pair.predictor.clone()),
        out: args.out.clone(),
        types,
        shape: Shape::qwen3_30b_a3b(),
        routing,
    };
    let manifest = inflate(&opts, &mut |p| {
        bar.set_length(p.total);
        bar.set_position(p.written);
        bar.set_message(p.file.display().to_string());
    })
    .with_context(|| format!("inflating {}", args.pair.model.display()))?;
    bar.finish_and_clear();
    let plan = &manifest.plan;
    eprintln!(
        "wrote {} in {:.0} s: {} layers (trained {:?}), hidden {}, {} experts top-{}, vocabulary {} \
         (Qwen3-30B-A3B: 151,936); drafter taps {:?}{}",
        args.out.display(),
        started.elapsed().as_secs_f64(),
        plan.shape.num_hidden_layers,
        plan.trained_layers,
        plan.shape.hidden_size,
        plan.shape.num_experts,
        plan.shape.num_experts_per_tok,
        plan.small.vocab,
        manifest.drafter_taps,
        if manifest.predictor { "; route predictor carried over" } else { "" }
    );
    if !manifest.routers.is_empty() {
        let mean = |f: fn(&specfit_engine::inflate::FittedRouter) -> f64| {
            manifest.routers.iter().map(f).sum::<f64>() / manifest.routers.len() as f64
        };
        eprintln!(
            "{} pass-through routers fitted to {} on the calibration prompts: previous-token overlap {:.3}, LRU hits at half the experts {:.3} (the copied small routers: {:.3}, {:.3})",
            manifest.routers.len(),
            manifest
                .router_target
                .as_ref()
                .map_or("nothing".to_string(), ToString::to_string),
            mean(|r| r.overlap),
            mean(|r| r.lru_half),
            mean(|r| r.base_overlap),
            mean(|r| r.base_lru_half)
        );
    }
    Ok(())
}
