//! Command-line options of the draft tree that `specfit generate` and `specfit serve` share: K
//! (the most nodes verified per cycle), branching and drafted levels. Not the policy or its
//! calibration (each command defaults those its own way).

use anyhow::Result;
use specfit_engine::spec::TreeShape;

/// `--max-nodes K`, which every command that drafts, calibrates or simulates takes.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct MaxNodesArg {
    /// K: draft nodes verified per cycle by the eagle3 policy, at most by the specfit ones
    /// (`--budget` is accepted too).
    #[arg(
        long = "max-nodes",
        alias = "budget",
        value_name = "K",
        default_value_t = 7,
        value_parser = parse_max_nodes
    )]
    pub max_nodes: usize,
}

/// K from the command line: at most what the exact search supports.
fn parse_max_nodes(text: &str) -> Result<usize, String> {
    let limit = specfit_selector::MAX_SELECT;
    match text.parse::<usize>() {
        Ok(k) if k <= limit => Ok(k),
        _ => Err(format!("expected a whole number from 0 to {limit}")),
    }
}

#[derive(Debug, clap::Args)]
pub struct TreeArgs {
    #[command(flatten)]
    pub nodes: MaxNodesArg,
    /// Children per expanded draft node, and nodes expanded per level.
    #[arg(long, default_value_t = 2)]
    pub branching: usize,
    /// Drafted levels.
    #[arg(long, default_value_t = 5)]
    pub levels: usize,
}

impl TreeArgs {
    /// The draft tree's shape (bounded: [`TreeShape::new`]).
    pub fn shape(&self) -> Result<TreeShape> {
        Ok(TreeShape::new(self.branching, self.levels)?)
    }
}
