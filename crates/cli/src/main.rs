//! `specfit`: the command-line front end. Each subcommand lives in its own module; this file
//! only parses arguments and turns every error into one line on stderr and exit status 2.

mod bench;
mod calibrate;
mod convert;
mod drafter;
mod files;
mod forward;
mod generate;
mod inflate;
mod paths;
mod policy;
mod probe;
mod prompt;
mod record;
mod select;
mod serve;
mod simulate;
mod synth;
mod target;
mod train_predictor;
mod tree;
mod walk;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Fast, lossless speculative decoding for MoE models whose experts do not fit in fast memory.
#[derive(Debug, Parser)]
#[command(name = "specfit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The paper's experiment on this machine: every policy across cache sizes on the shipped
    /// models and prompt sets, lossless-checked; writes report.json, report.md and chart.svg.
    Bench(bench::Args),
    /// Choose the subtree of each draft pool to verify (JSON or JSON Lines in, one result line out per pool).
    Select(select::Args),
    /// Measure probe forwards and fit the cost model (intercepts a[n], beta; beta_hit/beta_miss) by NNLS.
    Calibrate(calibrate::Args),
    /// Decode text on the offloaded engine and report tok/s and expert copies.
    Generate(generate::Args),
    /// Replay a trace under every policy and slot count with calibrated costs.
    Simulate(simulate::Args),
    /// Fit the linear route predictor from routes recorded on the target.
    TrainPredictor(train_predictor::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions, streaming,
    /// /v1/models, /health, /metrics) until SIGTERM or Ctrl-C.
    Serve(serve::Args),
    /// Record the full draft pool at every position of a greedy output (a trace for replay).
    Record(record::Args),
    /// Measure verify forwards on this engine for `specfit calibrate`.
    Probe(probe::Args),
    /// Write a checkpoint's routed experts as the expert-major disk file (for `--store disk`).
    Convert(convert::Args),
    /// Embed a small trained target and its drafter in Qwen3-30B-A3B's tensor shapes
    /// (function-preserving): GGUF targets (Q4_K_M, Q8_0) and a bf16 EAGLE-3 drafter.
    Inflate(inflate::Args),
    /// One target forward over given token ids (and optional greedy steps), written as JSON.
    Forward(forward::Args),
    /// Write seeded synthetic pools or probe rows (for demos, benches and tests).
    #[command(subcommand)]
    Synth(synth::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Select(args) => select::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Synth(cmd) => synth::run(&cmd),
        Command::Forward(args) => forward::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Inflate(args) => inflate::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Probe(args) => probe::run(&args),
        Command::Record(args) => record::run(&args),
        Command::TrainPredictor(args) => train_predictor::run(&args),
        Command::Simulate(args) => simulate::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
