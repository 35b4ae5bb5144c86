//! Command-line options shared by every command that runs the target model: where the experts
//! rest and how many slots each MoE layer gets.

use std::path::PathBuf;

use anyhow::{Context, Result};
use specfit_engine::{load_target, CacheMode, ExpertCache, Qwen3Moe, Tier, WeightDtype};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreArg {
    /// Every expert in host RAM (a GGUF file's quantized experts: the memory-mapped file itself,
    /// used in place, no slots).
    Ram,
    /// The expert file written by `specfit convert` (a GGUF file: the file itself), read with
    /// O_DIRECT.
    Disk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsArg {
    F32,
    Bf16,
}

impl WeightsArg {
    pub fn dtype(self) -> WeightDtype {
        match self {
            WeightsArg::F32 => WeightDtype::F32,
            WeightsArg::Bf16 => WeightDtype::Bf16,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct TargetArgs {
    /// Hugging Face checkpoint directory (config.json + safetensors) or a llama.cpp GGUF file
    /// (qwen3moe); default: the shipped target.
    #[arg(long, default_value_os_t = crate::paths::target())]
    pub model: PathBuf,
    /// Where routed experts rest.
    #[arg(long, value_enum, default_value = "ram")]
    pub store: StoreArg,
    /// Disk expert file (default: MODEL/experts.specfit; `--experts` is accepted too).
    #[arg(long = "expert-file", alias = "experts", value_name = "FILE")]
    pub experts: Option<PathBuf>,
    /// Expert slots per MoE layer (default: all experts resident; 0: no cache, every routed
    /// expert copied every forward, as with --clear-cache).
    #[arg(long)]
    pub slots: Option<usize>,
    /// Empty the slots before every forward (the paper's "vanilla" baseline; same as --slots 0).
    #[arg(long)]
    pub clear_cache: bool,
    /// Storage dtype of the matrices (default: the checkpoint's; bf16 is widened exactly).
    #[arg(long, value_enum)]
    pub weights: Option<WeightsArg>,
    /// Layer-ahead reads on the slot tiers: in each MoE layer, apply the next N layers' routers
    /// to the current hidden state and start reading the experts they pick (0: off; at most 8;
    /// outputs are unchanged, only copies move). Default: 1 where one expert is at least 1 MiB
    /// (a large model's experts), else 0.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=8))]
    pub layers_ahead: Option<u8>,
}

impl TargetArgs {
    /// The options of a command that chooses them itself (`serve`, `bench`): `slots` per layer,
    /// the default expert file, which is converted first for the disk tier when needed.
    pub fn prepared(
        model: &std::path::Path,
        store: StoreArg,
        slots: usize,
        weights: Option<WeightsArg>,
    ) -> Result<TargetArgs> {
        if store == StoreArg::Disk {
            ensure_expert_file(model)?;
        }
        Ok(TargetArgs {
            model: model.to_path_buf(),
            store,
            experts: None,
            slots: Some(slots),
            clear_cache: false,
            weights,
            layers_ahead: None,
        })
    }

    /// An atlas for this model: every expert resident in a separate RAM cache, used only to route
    /// draft pools outside the timer.
    pub fn atlas(&self) -> Result<specfit_engine::spec::Atlas> {
        let (_, all) = load_target(
            &self.model,
            &Tier::Ram,
            usize::MAX,
            CacheMode::Lru,
            self.weights.map(WeightsArg::dtype),
        )?;
        Ok(specfit_engine::spec::Atlas::new(all))
    }

    /// Whether the slots are emptied before every forward (`--clear-cache` or `--slots 0`).
    pub fn no_cache(&self) -> bool {
        self.clear_cache || self.slots == Some(0)
    }

    /// Loads the model and its expert cache.
    pub fn load(&self) -> Result<(Qwen3Moe, ExpertCache)> {
        let tier = match self.store {
            StoreArg::Ram => Tier::Ram,
            StoreArg::Disk => Tier::Disk(
                self.experts
                    .clone()
                    .unwrap_or_else(|| specfit_engine::default_expert_file(&self.model)),
            ),
        };
        // No cache (`--clear-cache` or `--slots 0`): every expert fits, and the slots are emptied
        // before every forward.
        let mode = if self.no_cache() {
            CacheMode::NoCache
        } else {
            CacheMode::Lru
        };
        let slots = match self.slots {
            Some(0) | None => usize::MAX,
            Some(s) => s,
        };
        if self.store == StoreArg::Ram {
            warn_if_larger_than_memory(&self.model);
        }
        if specfit_engine::gguf::is_gguf(&self.model) {
            let made = specfit_engine::gguf::ensure_checksums(&self.model)
                .with_context(|| format!("loading {}", self.model.display()))?;
            if let Some(made) = made {
                eprintln!("{made}");
            }
        }
        let (model, mut cache) = load_target(
            &self.model,
            &tier,
            slots,
            mode,
            self.weights.map(WeightsArg::dtype),
        )
        .with_context(|| format!("loading {}", self.model.display()))?;
        let layers_ahead = self
            .layers_ahead
            .map_or_else(|| cache.auto_layers_ahead(), usize::from);
        cache.set_layers_ahead(layers_ahead);
        Ok((model, cache))
    }
}

/// This machine's `MemAvailable` in bytes (Linux), if it can be read.
pub fn memory_available() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    })
}

/// Slot memory a run may hold at once: half of what the machine has available (the rest is the
/// page cache's, which the disk tier and a mapped file read through).
pub fn memory_budget() -> u64 {
    memory_available().map_or(u64::MAX, |b| b / 2)
}

/// Warns when a GGUF file about to be mapped in place (`--store ram`) is larger than the memory
/// available: its experts would be paged in from disk again and again, as llama.cpp's mmap does
/// on such files, where `--store disk --slots N` reads each missing expert once into its slot.
fn warn_if_larger_than_memory(model: &std::path::Path) {
    if !specfit_engine::gguf::is_gguf(model) {
        return;
    }
    let available = memory_available();
    let size = std::fs::metadata(model).map(|m| m.len()).ok();
    if let (Some(available), Some(size)) = (available, size) {
        if size > available {
            eprintln!(
                "warning: {} ({:.1} GB) is larger than the memory available ({:.1} GB): with --store ram its experts are paged in from disk on every use; --store disk --slots N reads each missing expert once into a slot",
                model.display(),
                size as f64 / 1e9,
                available as f64 / 1e9
            );
        }
    }
}

/// Converts a checkpoint's experts to the disk file when it does not exist yet, was written by
/// an older build in another format, or was made from the checkpoint as it was before it
/// changed (a GGUF file is its own expert store).
pub fn ensure_expert_file(model: &std::path::Path) -> Result<()> {
    if specfit_engine::gguf::is_gguf(model) {
        return Ok(());
    }
    let file = specfit_engine::default_expert_file(model);
    if specfit_engine::experts::is_current_format(&file) {
        match specfit_engine::experts::staleness(&file, model)? {
            None => return Ok(()),
            Some(why) => eprintln!("{}: {why}: converting the checkpoint again", file.display()),
        }
    } else {
        eprintln!(
            "no expert file in this build's format at {}: converting the checkpoint first",
            file.display()
        );
    }
    let report = specfit_engine::experts::convert(model, &file, None)
        .with_context(|| format!("converting {}", model.display()))?;
    eprintln!(
        "wrote {}: {} expert blocks, {:.1} MiB",
        report.path.display(),
        report.blocks,
        report.bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// The model's end-of-sequence ids: `generation_config.json`'s, else the config's.
pub fn eos_tokens(
    model: &std::path::Path,
    cfg: &specfit_engine::Qwen3MoeConfig,
) -> Result<Vec<u32>> {
    Ok(specfit_engine::GenerationConfig::load(model)?
        .eos_token_id
        .or(cfg.eos_token_id.clone())
        .map(|t| t.to_vec())
        .unwrap_or_default())
}

/// `--slots`, else a quarter of the experts ([`crate::calibrate::default_slots`]), checked
/// against the model's experts per layer.
pub fn slots_or_default(
    cfg: &specfit_engine::Qwen3MoeConfig,
    slots: Option<usize>,
) -> Result<usize> {
    let slots = slots.unwrap_or_else(|| crate::calibrate::default_slots(cfg));
    anyhow::ensure!(
        slots <= cfg.num_experts,
        "--slots {slots}: must be from 0 (no cache: every expert copied every forward) to the \
         model's {} experts per layer",
        cfg.num_experts
    );
    Ok(slots)
}
