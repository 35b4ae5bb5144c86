//! Options and loading shared by the commands that walk a greedy output drafting full pools at
//! every position (`record`, `train-predictor`): the target, the drafter, the prompt, the tree
//! shape, and the atlas that routes the pools.

use std::path::PathBuf;

use anyhow::Result;
use specfit_engine::spec::{Atlas, TreeShape};
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe};

use crate::prompt::PromptArgs;
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct WalkArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// EAGLE-3 drafter directory (default: the shipped drafter).
    #[arg(long, default_value_os_t = crate::paths::drafter())]
    pub drafter: PathBuf,
    #[command(flatten)]
    pub drafter_dtype: crate::drafter::DrafterDtypeArg,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Children per expanded draft node, and nodes expanded per level.
    #[arg(long, default_value_t = 2)]
    pub branching: usize,
    /// Drafted levels.
    #[arg(long, default_value_t = 5)]
    pub levels: usize,
}

/// Everything a walk needs, loaded.
pub struct Walk {
    pub model: Qwen3Moe,
    pub cache: ExpertCache,
    pub drafter: Eagle3,
    pub atlas: Atlas,
    pub prompt: Vec<u32>,
    pub shape: TreeShape,
}

impl WalkArgs {
    /// Loads the target, its expert cache, the drafter, the atlas and the prompt.
    pub fn load(&self) -> Result<Walk> {
        let shape = TreeShape::new(self.branching, self.levels)?;
        let (model, cache) = self.target.load()?;
        let tokenizer = self.prompt.tokenizer(&self.target.model)?;
        let prompt = self.prompt.tokens(tokenizer.as_ref(), false)?;
        let drafter = self.drafter_dtype.load(&self.drafter, &model)?;
        let atlas = self.target.atlas()?;
        Ok(Walk {
            model,
            cache,
            drafter,
            atlas,
            prompt,
            shape,
        })
    }
}
