//! `specfit inflate`: writes the shipped (or any small Qwen3-MoE) target and its EAGLE-3
//! drafter embedded in Qwen3-30B-A3B's tensor shapes, as GGUF targets and a bf16 drafter.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use specfit_engine::inflate::{inflate, FileType, Options, Routing, Shape};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TypeArg {
    /// Every matrix Q8_0 (about 31.7 GB).
    #[value(name = "q8_0")]
    Q8_0,
    /// llama.cpp's Q4_K_M mix (about 17.3 GB).
    #[value(name = "q4_k_m")]
    Q4KM,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Small Qwen3-MoE target (Hugging Face directory; default: the shipped target).
    #[arg(long, default_value_os_t = crate::paths::target())]
    model: PathBuf,
    /// Its EAGLE-3 drafter (default: the shipped drafter).
    #[arg(long, default_value_os_t = crate::paths::drafter())]
    drafter: PathBuf,
    /// Its route predictor, carried over when the file exists (default: the shipped one).
    #[arg(long, default_value_os_t = crate::paths::predictor())]
    predictor: PathBuf,
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
    /// Previous-token expert overlap the pass-through layers' routers are fitted to (on the
    /// calibration prompts); 0 copies the next trained layer's router instead. Default: the
    /// figure measured on Qwen3-30B-A3B.
    #[arg(long, default_value_t = 0.43)]
    router_overlap: f64,
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
    anyhow::ensure!(
        (0.0..1.0).contains(&args.router_overlap),
        "--router-overlap {}: a share in [0, 1)",
        args.router_overlap
    );
    let routing = if args.router_overlap > 0.0 {
        let tokenizer = specfit_engine::Tokenizer::load(&args.model)?;
        Some(Routing {
            prompts: crate::calibrate::default_prompts(&tokenizer)?,
            overlap: args.router_overlap,
        })
    } else {
        None
    };
    let opts = Options {
        model: args.model.clone(),
        drafter: args.drafter.clone(),
        predictor: Some(args.predictor.clone()),
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
    .with_context(|| format!("inflating {}", args.model.display()))?;
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
    if let (Some(target), false) = (manifest.router_overlap, manifest.routers.is_empty()) {
        let mean = |f: fn(&specfit_engine::inflate::FittedRouter) -> f64| {
            manifest.routers.iter().map(f).sum::<f64>() / manifest.routers.len() as f64
        };
        eprintln!(
            "{} pass-through routers fitted to a previous-token overlap of {target}: {:.3} on the calibration prompts (the copied small routers: {:.3})",
            manifest.routers.len(),
            mean(|r| r.overlap),
            mean(|r| r.base)
        );
    }
    Ok(())
}
