//! `specfit forward`: one forward over given token ids from an empty cache, for inspection and
//! for comparing with `transformers`: every position's logits and every layer's routes, and with
//! `--greedy N`, N argmax steps after the prompt (end-of-sequence ignored).

use std::path::PathBuf;

use anyhow::{ensure, Result};
use serde_json::json;
use specfit_engine::{Batch, Logits};

use crate::files::write_atomic;
use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// After the forward, decode this many argmax tokens (eos ignored).
    #[arg(long, default_value_t = 0)]
    greedy: usize,
    /// Output JSON file (written atomically).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(
        !args.tokens.is_empty(),
        "--tokens: give at least one token id"
    );
    let (model, mut cache) = args.target.load()?;
    let mut kv = model.new_kv_cache();
    let out = model.forward(&Batch::causal(&args.tokens), &mut kv, &mut cache)?;
    let logits: Vec<&[f32]> = (0..args.tokens.len()).map(|r| out.row(r)).collect();
    let mut doc = json!({"logits": logits, "routes": out.routes});
    if args.greedy > 0 {
        let mut tokens = vec![out.argmax(args.tokens.len() - 1)];
        while tokens.len() < args.greedy {
            let last = [*tokens.last().expect("non-empty")];
            let step = model.forward(
                &Batch::causal(&last).with_logits(Logits::Last),
                &mut kv,
                &mut cache,
            )?;
            tokens.push(step.argmax(0));
        }
        doc["tokens"] = json!(tokens);
    }
    write_atomic(&args.out, serde_json::to_string(&doc)?.as_bytes())
}
