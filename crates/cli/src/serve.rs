//! `specfit serve`: loads the target (and, for speculative policies, the drafter, its verify
//! policy and route source) once, then hands them to the OpenAI-compatible server in `specfit-server`
//! until SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use specfit_engine::policy::{verify_policy, PolicyName, PolicySpec};
use specfit_engine::{Eagle3, Tokenizer};
use specfit_server::content::ChatFormat;
use specfit_server::queue::MAX_QUEUE;
use specfit_server::{
    Access, DraftRoutes, EngineDecoder, Limits, ServeOptions, Served, Speculation,
};

use crate::policy::{self, RouteChoice};
use crate::target::{StoreArg, TargetArgs, WeightsArg};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint directory or a llama.cpp GGUF file (qwen3moe); default: the
    /// shipped target.
    #[arg(long, default_value_os_t = crate::paths::target())]
    model: PathBuf,
    /// The id clients name in `model` (default: the model's directory or file name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Where routed experts rest (disk: the expert file, converted first when missing; a GGUF
    /// file is read in place).
    #[arg(long, value_enum, default_value = "disk")]
    store: StoreArg,
    /// Expert slots per MoE layer (default: a quarter of the experts).
    #[arg(long)]
    slots: Option<usize>,
    /// Storage dtype of the matrices (default: the checkpoint's).
    #[arg(long, value_enum)]
    weights: Option<WeightsArg>,
    /// EAGLE-3 drafter directory (default: the shipped drafter; not loaded with --policy ar).
    #[arg(long, default_value_os_t = crate::paths::drafter())]
    drafter: PathBuf,
    #[command(flatten)]
    drafter_dtype: crate::drafter::DrafterDtypeArg,
    /// Which draft nodes to verify each cycle (`ar`: plain decoding, no drafter).
    #[arg(long, value_parser = policy::parse_policy(), default_value = "specfit")]
    policy: PolicyName,
    #[command(flatten)]
    tree: crate::tree::TreeArgs,
    /// Cost calibration of the specfit policies (default: the one saved next to the model for
    /// this tier, measured first — about 25 s on the shipped model — when there is none).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// λ of specfit-lambda in tokens per ms (default: the calibrated plain-decoding rate).
    #[arg(long)]
    lambda: Option<f64>,
    /// Route source of the specfit policies: `predictor:FILE` (default: the shipped route
    /// predictor), `atlas` (the target's routers on the pool, every expert also kept in RAM), or
    /// `corrupt:P`.
    #[arg(long)]
    routes: Option<String>,
    /// Read each verify forward's expected experts ahead (specfit policies).
    #[arg(long)]
    read_ahead: bool,
    /// Slot tiers: in each MoE layer, start reading the experts the next N layers' routers pick
    /// for this layer's hidden state (0: off; at most 8; default: 1 where one expert is at
    /// least 1 MiB, else 0; see `generate --layers-ahead`).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=8))]
    layers_ahead: Option<u8>,
    /// Positions a request may use, prompt and output together (default and most: the model's
    /// max_position_embeddings).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Prefill every prompt in full instead of extending the previous request's prefill over
    /// the positions the prompts share (outputs are the same either way).
    #[arg(long)]
    no_prompt_cache: bool,
    /// Require `Authorization: Bearer KEY` on every /v1/ request (401 otherwise); the
    /// SPECFIT_API_KEY environment variable sets it too.
    #[arg(long, env = "SPECFIT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Let web pages from this origin call the API from a browser (CORS; repeat it, or `*` for
    /// any origin).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Also answer requests whose Host header names this host (repeat it; `*` for any). A
    /// server on a loopback address otherwise answers only localhost and loopback IPs (against
    /// DNS rebinding); one on another address answers any Host unless this names some.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Let special token texts a client writes inside chat messages (`<|im_start|>`, …) become
    /// control tokens, as before; by default they are tokenized as plain text.
    #[arg(long)]
    special_tokens_in_content: bool,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait while one is decoded (at most 4096); more are answered 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds a client has to send a request's headers (the connection is closed beyond), and
    /// then its whole body (408 beyond).
    #[arg(long, default_value_t = 30.0)]
    read_timeout: f64,
    /// Seconds requests in progress may run after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10.0)]
    shutdown_grace: f64,
}

/// `secs` of flag `name` as a duration: a number of seconds from 0 to one day.
fn seconds(name: &str, secs: f64) -> Result<Duration> {
    ensure!(
        (0.0..=86_400.0).contains(&secs),
        "{name} {secs}: must be a number of seconds from 0 to 86400"
    );
    Ok(Duration::from_secs_f64(secs))
}

pub fn run(args: &Args) -> Result<()> {
    ensure!(
        args.tree.nodes.max_nodes > 0,
        "--max-nodes must be positive"
    );
    let shape = args.tree.shape()?;
    let [read_timeout, shutdown_grace] = [
        ("--read-timeout", args.read_timeout),
        ("--shutdown-grace", args.shutdown_grace),
    ]
    .map(|(name, secs)| seconds(name, secs));
    let (read_timeout, shutdown_grace) = (read_timeout?, shutdown_grace?);
    ensure!(
        (1..=MAX_QUEUE).contains(&args.queue),
        "--queue {}: must be between 1 and {MAX_QUEUE}",
        args.queue
    );
    ensure!(
        !args.read_ahead || args.policy.needs_routes(),
        "--read-ahead needs a specfit policy (it reads ahead on the policy's routes)"
    );
    // Checked before the model loads: a setting that cannot work fails at once.
    let access = Access::new(
        args.api_key.clone(),
        args.allowed_origins.clone(),
        args.allowed_hosts.clone(),
        &args.host,
    )?;
    let route = match &args.routes {
        Some(text) => RouteChoice::parse(text)?,
        None => RouteChoice::Predictor(crate::paths::predictor()),
    };
    let cfg = specfit_engine::Qwen3MoeConfig::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let slots = crate::target::slots_or_default(&cfg, args.slots)?;
    if let Some(path) = args.calibration.as_ref().filter(|p| !p.exists()) {
        bail!("--calibration {} does not exist", path.display());
    }
    let tokenizer = Tokenizer::load(&args.model)?;
    let mut target = TargetArgs::prepared(&args.model, args.store, slots, args.weights)?;
    target.layers_ahead = args.layers_ahead;
    let (model, cache) = target.load()?;
    // Checked before the drafter and the calibration load: a template that does not compile
    // or a context the model does not have.
    let template = specfit_server::chat::ChatTemplate::new(
        tokenizer.chat_template(),
        tokenizer.bos_token(),
        tokenizer.eos_token(),
    )?;
    let context = context(args, model.config())?;
    let speculation = if args.policy == PolicyName::Ar {
        None
    } else {
        let drafter = args.drafter_dtype.load(&args.drafter, &model)?;
        let routes = match (&route, args.policy.needs_routes()) {
            (_, false) => DraftRoutes::None,
            (RouteChoice::Predictor(path), true) => DraftRoutes::Predictor(Box::new(
                policy::load_predictor(path, &model, &drafter).with_context(|| {
                    format!(
                        "route predictor {} (the specfit policies' route source; for another model train one with `specfit train-predictor`, or pass --routes atlas)",
                        path.display()
                    )
                })?,
            )),
            (RouteChoice::Atlas | RouteChoice::Corrupt(_), true) => {
                DraftRoutes::Atlas(Box::new(policy::atlas_for(target.atlas()?, &route, 0)))
            }
        };
        let calibration = if args.policy.needs_routes() {
            Some(calibration(args, &model, &drafter, &cache, &tokenizer)?)
        } else {
            None
        };
        let max_nodes = args.tree.nodes.max_nodes;
        let spec = PolicySpec::command(args.policy, max_nodes, args.lambda, calibration.as_ref());
        Some(Speculation {
            policy: verify_policy(&spec, model.config())?,
            drafter,
            routes,
            shape,
            read_ahead: args.read_ahead,
        })
    };
    let decoder = EngineDecoder::new(model, cache, speculation, args.policy.name())
        .reuse_prompts(!args.no_prompt_cache);
    let served = served(args, &decoder, tokenizer, template, context)?;
    let options = ServeOptions {
        host: args.host.clone(),
        port: args.port,
        queue: args.queue,
        limits: Limits {
            max_body_bytes: args.max_body_bytes,
            read_timeout,
        },
        shutdown_grace,
        access,
    };
    let (name, policy) = (served.name.clone(), served.policy.clone());
    let tier = format!(
        "{} store, {slots} slots/layer",
        if args.store == StoreArg::Disk {
            "disk"
        } else {
            "ram"
        }
    );
    specfit_server::run(decoder, served, &options, |addr| {
        eprintln!(
            "specfit serve: listening on http://{addr} (model {name:?}, policy {policy}, {tier})"
        );
    })?;
    eprintln!("specfit serve: stopped");
    Ok(())
}

/// Positions a request may use: `--max-model-len`, else all the model has.
fn context(args: &Args, cfg: &specfit_engine::Qwen3MoeConfig) -> Result<usize> {
    let most = cfg.max_position_embeddings;
    match args.max_model_len {
        None => Ok(most),
        Some(n) if (1..=most).contains(&n) => Ok(n),
        Some(n) => bail!("--max-model-len {n} must be between 1 and the model's {most} positions"),
    }
}

/// The model as clients see it: name, tokenizer, chat template, context, stop tokens, and
/// what the decoder reports of itself (policy, draft-tree positions).
fn served(
    args: &Args,
    decoder: &EngineDecoder,
    tokenizer: Tokenizer,
    template: specfit_server::chat::ChatTemplate,
    context: usize,
) -> Result<Served> {
    let cfg = decoder.config();
    let name = match &args.served_model_name {
        Some(n) => n.clone(),
        None => args
            .model
            .file_stem()
            .map_or_else(|| "specfit".into(), |s| s.to_string_lossy().into_owned()),
    };
    let stop_tokens = crate::target::eos_tokens(&args.model, cfg)?;
    let mut chat_stop_tokens = stop_tokens.clone();
    chat_stop_tokens.extend(tokenizer.token_id("<|im_end|>"));
    chat_stop_tokens.extend(tokenizer.eos_token().and_then(|t| tokenizer.token_id(t)));
    chat_stop_tokens.dedup();
    Ok(Served {
        name,
        chat: ChatFormat::new(template, &tokenizer, args.special_tokens_in_content),
        context,
        tree_positions: decoder.tree_positions(),
        vocab: cfg.vocab_size,
        stop_tokens,
        chat_stop_tokens,
        policy: decoder.policy().to_string(),
        tokenizer,
    })
}

/// `--calibration`, else the one saved next to the model for this tier, else measured now.
fn calibration(
    args: &Args,
    model: &specfit_engine::Qwen3Moe,
    drafter: &Eagle3,
    cache: &specfit_engine::ExpertCache,
    tokenizer: &Tokenizer,
) -> Result<specfit_selector::json::CalibrationJson> {
    if let Some(path) = &args.calibration {
        return crate::policy::calibration(path, model, drafter, cache);
    }
    let path = crate::paths::calibration(&args.model, specfit_engine::policy::tier_key(cache));
    if path.exists() {
        return crate::policy::calibration(&path, model, drafter, cache);
    }
    eprintln!(
        "no calibration at {}: measuring this machine's costs first (probe forwards)",
        path.display()
    );
    crate::calibrate::measure_and_save(
        model,
        drafter,
        cache,
        tokenizer,
        args.tree.nodes.max_nodes,
        &path,
    )
}
