//! The JSON interchange format (feature `json`): pools in, results out, probe rows in,
//! calibrations out and in. Field names are the format's contract with other tools:
//!
//! ```text
//! pool:   {"layers": L, "experts": E, "max_nodes": K,
//!          "root": {"routes": [[e, ...] per layer]},              (optional)
//!          "nodes": [{"parent": -1, "prob": P, "routes": [[e, ...] per layer]}, ...],
//!          "cost": {"intercepts": [a0, ..., aK], "beta": B}       (or "beta_hit" + "beta_miss")
//!          "resident": [[e, ...] per layer],                      (optional)
//!          "objective": "ratio" | "topk" | "all" | "none" | {"lambda": x}}
//! result: {"selected": [...], "reward", "time_ms", "demand", "hits", "misses", "objective",
//!          "select_us", "newest_level", "takes_newest_level", "visited", "pruned"}
//! probe:  {"nodes": n, "demand": d, "ms": t, "hits": h, "misses": m}   (hits/misses optional)
//! ```
//!
//! A file holds one value or many (JSON Lines, or any whitespace-separated sequence); readers
//! report every problem with the 1-based line it starts on. This module converts and validates;
//! it does not search.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::calibrate::{Calibration, Fit, Probe};
use crate::cost::{CostModel, ExpertCost, ResidentSet};
use crate::error::Error;
use crate::objective::Objective;
use crate::pool::{Pool, PoolBuilder};
use crate::search::{Selection, MAX_SELECT};
use crate::stop::StopDecision;

/// Node budget when a pool does not say (the paper's K).
pub const DEFAULT_MAX_NODES: usize = 7;

/// A pool record as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolJson {
    pub layers: usize,
    pub experts: usize,
    #[serde(default)]
    pub max_nodes: Option<usize>,
    #[serde(default)]
    pub root: Option<RootJson>,
    pub nodes: Vec<NodeJson>,
    #[serde(default)]
    pub cost: Option<CostJson>,
    #[serde(default)]
    pub resident: Option<Vec<Vec<u32>>>,
    #[serde(default)]
    pub objective: Option<serde_json::Value>,
    /// Tokens cached before the root (each verified row attends to them); absent: 0.
    #[serde(default)]
    pub context: Option<usize>,
}

/// The root's routes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootJson {
    pub routes: Vec<Vec<u32>>,
}

/// One draft node; `parent` −1 is the root.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeJson {
    pub parent: i64,
    pub prob: f64,
    pub routes: Vec<Vec<u32>>,
}

/// A cost model: intercepts plus `beta`, or `beta_hit` and `beta_miss`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostJson {
    pub intercepts: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_hit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_miss: Option<f64>,
    /// ms per verified row (the root's included) per cached token; absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_ms: Option<f64>,
}

impl CostJson {
    /// Validates into a cost model.
    pub fn to_model(&self) -> Result<CostModel, Error> {
        let expert = match (self.beta, self.beta_hit, self.beta_miss) {
            (Some(beta), None, None) => ExpertCost::Uniform { beta },
            (None, Some(beta_hit), Some(beta_miss)) => ExpertCost::Residency {
                beta_hit,
                beta_miss,
            },
            (b, h, m) => {
                return Err(Error::AmbiguousCost {
                    beta: b.is_some(),
                    beta_hit: h.is_some(),
                    beta_miss: m.is_some(),
                })
            }
        };
        CostModel::new(self.intercepts.clone(), expert)?
            .with_context_ms(self.context_ms.unwrap_or(0.0))
    }

    /// The interchange form of a cost model.
    pub fn from_model(cost: &CostModel) -> CostJson {
        let (beta, beta_hit, beta_miss) = match cost.expert() {
            ExpertCost::Uniform { beta } => (Some(beta), None, None),
            ExpertCost::Residency {
                beta_hit,
                beta_miss,
            } => (None, Some(beta_hit), Some(beta_miss)),
        };
        CostJson {
            intercepts: cost.intercepts().to_vec(),
            beta,
            beta_hit,
            beta_miss,
            context_ms: (cost.context_ms() > 0.0).then_some(cost.context_ms()),
        }
    }
}

/// Settings given outside the pool (command-line flags); when set they replace the pool's own.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub cost: Option<CostModel>,
    pub objective: Option<Objective>,
    pub max_nodes: Option<usize>,
}

/// A validated pool record: everything one selection needs.
#[derive(Debug, Clone)]
pub struct Problem {
    pub pool: Pool,
    pub cost: CostModel,
    pub max_nodes: usize,
    pub objective: Objective,
    pub resident: Option<ResidentSet>,
}

impl PoolJson {
    /// Validates the record, applying `overrides`.
    pub fn into_problem(self, overrides: &Overrides) -> Result<Problem, Error> {
        let mut b = PoolBuilder::new(self.layers, self.experts)?;
        if let Some(root) = &self.root {
            b.root_routes(&root.routes)?;
        }
        for (index, node) in self.nodes.iter().enumerate() {
            let parent = match node.parent {
                -1 => None,
                p if p >= 0 => Some(p as usize),
                p => return Err(Error::BadParent { index, parent: p }),
            };
            b.push(parent, node.prob, &node.routes)?;
        }
        b.context(self.context.unwrap_or(0));
        let pool = b.build();
        let resident = match &self.resident {
            Some(r) => Some(ResidentSet::new(self.layers, self.experts, r)?),
            None => None,
        };
        let cost = match (&overrides.cost, &self.cost) {
            (Some(c), _) => c.clone(),
            (None, Some(c)) => c.to_model()?,
            (None, None) => return Err(Error::MissingCost),
        };
        let objective = match (overrides.objective, &self.objective) {
            (Some(o), _) => o,
            (None, Some(v)) => parse_objective(v)?,
            (None, None) => Objective::Ratio,
        };
        let max_nodes = overrides
            .max_nodes
            .or(self.max_nodes)
            .unwrap_or(DEFAULT_MAX_NODES);
        if max_nodes > MAX_SELECT {
            return Err(Error::MaxNodesTooLarge {
                max_nodes,
                limit: MAX_SELECT,
            });
        }
        cost.check_covers(max_nodes)?;
        Ok(Problem {
            pool,
            cost,
            max_nodes,
            objective,
            resident,
        })
    }
}

/// `"ratio" | "topk" | "all" | "none" | {"lambda": x}`.
pub fn parse_objective(v: &serde_json::Value) -> Result<Objective, Error> {
    match v {
        serde_json::Value::String(s) if !s.starts_with("lambda:") => Objective::parse(s),
        serde_json::Value::Object(m) if m.len() == 1 => {
            match m.get("lambda").and_then(|l| l.as_f64()) {
                Some(lambda) => Objective::lambda(lambda),
                None => Err(Error::UnknownObjective { got: v.to_string() }),
            }
        }
        _ => Err(Error::UnknownObjective { got: v.to_string() }),
    }
}

/// One output line of `select`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultJson {
    pub selected: Vec<usize>,
    pub reward: f64,
    pub time_ms: f64,
    pub demand: u32,
    pub hits: u32,
    pub misses: u32,
    pub objective: f64,
    /// In-process time of the search alone, in microseconds.
    pub select_us: f64,
    /// Depth of the deepest pool node (the newest drafted level).
    pub newest_level: usize,
    /// The stop rule: whether the winner takes a node of the newest level.
    pub takes_newest_level: bool,
    pub visited: u64,
    pub pruned: u64,
}

impl ResultJson {
    /// The output line for a stop-rule decision that took `select_us` (kept to the nanosecond).
    pub fn new(decision: &StopDecision, select_us: f64) -> ResultJson {
        let s: &Selection = &decision.selection;
        ResultJson {
            selected: s.nodes.clone(),
            reward: s.reward,
            time_ms: s.time_ms,
            demand: s.demand,
            hits: s.hits,
            misses: s.misses,
            objective: s.objective,
            select_us: (select_us * 1000.0).round() / 1000.0,
            newest_level: decision.newest_level,
            takes_newest_level: decision.takes_newest_level,
            visited: s.stats.visited,
            pruned: s.stats.pruned,
        }
    }
}

/// One probe row as written in the file: a verify forward (the cost fits' rows) and, in files
/// written by `specfit probe`, what the replay model also needs. `kind` tells verify forwards
/// from the LRU and emptied caches (`"verify"`, the default: every fit) from all-resident verify
/// forwards (`"resident"`: the replay fit only) and plain-decoding steps (`"plain"`, with
/// `nodes` = 0: the replay model's plain-step fit).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeJson {
    #[serde(default)]
    pub kind: Option<String>,
    pub nodes: usize,
    pub demand: u64,
    pub ms: f64,
    #[serde(default)]
    pub hits: Option<u64>,
    #[serde(default)]
    pub misses: Option<u64>,
    /// Per layer `⌈misses / read_width⌉`, summed.
    #[serde(default)]
    pub read_rounds: Option<usize>,
    /// Reads that waited for a slot (0 when absent: files written before it was counted).
    #[serde(default)]
    pub slot_waits: Option<u64>,
    /// Reads in flight at once when the rounds were counted.
    #[serde(default)]
    pub read_width: Option<usize>,
    /// Tokens already cached.
    #[serde(default)]
    pub context: Option<usize>,
    /// Drafter forwards past the first level, and their time.
    #[serde(default)]
    pub draft_forwards: Option<usize>,
    #[serde(default)]
    pub draft_ms: Option<f64>,
    /// Committed tokens fed back to the drafter, and the time it took.
    #[serde(default)]
    pub fed: Option<usize>,
    #[serde(default)]
    pub feed_ms: Option<f64>,
}

/// What a probe row measured (its `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Verify,
    Resident,
    Plain,
}

impl ProbeJson {
    /// The row's kind; an unknown one is an error naming row `row` (0-based).
    pub fn probe_kind(&self, row: usize) -> Result<ProbeKind, Error> {
        match self.kind.as_deref() {
            None | Some("verify") => Ok(ProbeKind::Verify),
            Some("resident") => Ok(ProbeKind::Resident),
            Some("plain") => Ok(ProbeKind::Plain),
            Some(other) => Err(Error::UnknownProbeKind {
                row,
                kind: other.to_string(),
            }),
        }
    }

    /// Validates row `row` (0-based) into a probe.
    pub fn into_probe(self, row: usize) -> Result<Probe, Error> {
        let hits_misses = match (self.hits, self.misses) {
            (Some(h), Some(m)) => Some((h, m)),
            (None, None) => None,
            _ => return Err(Error::HalfResidency { row }),
        };
        let probe = Probe {
            nodes: self.nodes,
            demand: self.demand,
            ms: self.ms,
            hits_misses,
            context: self.context.unwrap_or(0) as u64,
        };
        crate::calibrate::check_probe(row, &probe)?;
        Ok(probe)
    }
}

/// The drafter's share of a speculative cycle, measured alongside the verify probes: each drafted
/// level past the first costs `ms_per_level` (one drafter forward over the expanded nodes), and
/// feeding the committed tokens back to the drafter costs `feed_ms + feed_ms_per_token · m`.
/// The selector does not use it; trace replay (`specfit-sim`) adds it to each cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftingJson {
    pub ms_per_level: f64,
    pub feed_ms: f64,
    pub feed_ms_per_token: f64,
    /// Extra ms per drafted level per token already cached (the drafter attends to all of
    /// them); 0 in files written before it was measured.
    #[serde(default)]
    pub level_context_ms: f64,
    /// Extra ms per fed token per token already cached.
    #[serde(default)]
    pub feed_context_ms: f64,
    /// How the drafter kept its matrices while measured (`--drafter-dtype`: `native`, `q8_0`,
    /// `q4_k`); absent in files written before drafters were quantized (then `native`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter_dtype: Option<String>,
}

/// Fit quality as stored in a calibration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitJson {
    pub rows: usize,
    pub r2: f64,
    pub median_abs_err_ms: f64,
}

/// The calibration file `specfit calibrate` writes and `select --calibration` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationJson {
    pub format: String,
    pub version: u64,
    pub max_nodes: usize,
    /// The paper's form `a[n] + β · demand`.
    pub cost: CostJson,
    pub fit: FitJson,
    /// The residency-aware form, when the probes carried hits and misses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_residency: Option<CostJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit_residency: Option<FitJson>,
    /// What the probes were measured on (model shape, tier, slots), when known; tools check it
    /// before using the costs on another target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Map<String, serde_json::Value>>,
    /// Drafting costs, when the calibration was measured on an engine with a drafter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafting: Option<DraftingJson>,
    /// The fuller machine model trace replay uses (see [`ReplayJson`]), when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayJson>,
    /// How often the target took the probes' drafted children, per bin of the drafter's
    /// probability ([`crate::Acceptance`]), when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<AcceptanceJson>,
}

/// [`crate::Acceptance`]'s counts as stored: drafted and taken children per probability bin
/// (`BINS` each, bin `i` holding probabilities in `[i, i + 1) / BINS`), and of those the top
/// children's (absent in files written before they were counted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptanceJson {
    pub drafted: Vec<u64>,
    pub taken: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_drafted: Option<Vec<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_taken: Option<Vec<u64>>,
}

impl AcceptanceJson {
    pub fn new(a: &crate::Acceptance) -> AcceptanceJson {
        let (drafted, taken) = a.counts();
        let (top_drafted, top_taken) = a.top_counts();
        AcceptanceJson {
            drafted: drafted.to_vec(),
            taken: taken.to_vec(),
            top_drafted: Some(top_drafted.to_vec()),
            top_taken: Some(top_taken.to_vec()),
        }
    }

    /// The counts, checked.
    pub fn to_counts(&self) -> Result<crate::Acceptance, Error> {
        let all = crate::Acceptance::from_counts(&self.drafted, &self.taken)?;
        match (&self.top_drafted, &self.top_taken) {
            (Some(d), Some(t)) => all.with_top(d, t),
            (None, None) => Ok(all),
            (Some(_), None) => Err(Error::AcceptanceTopIncomplete {
                present: "top_drafted",
                missing: "top_taken",
            }),
            (None, Some(_)) => Err(Error::AcceptanceTopIncomplete {
                present: "top_taken",
                missing: "top_drafted",
            }),
        }
    }
}

/// What a forward costs on the measured machine, for trace replay: a verify forward of `n` draft
/// nodes costs `intercepts[n] + beta_hit · hits + beta_miss · misses + read_round_ms · R +
/// context_ms · (n + 1) · c`, where `R` is the number of read rounds (per MoE layer
/// `⌈misses / read_width⌉`: a layer waits about one read latency per `read_width` reads in
/// flight together) and `c` the number of tokens already cached (attention reads them all). A plain
/// decoding step costs what [`PlainJson`] says when present (its own fit on back-to-back plain
/// steps), else `ar_intercept` with the verify coefficients. Fitted by NNLS on verify probes
/// and plain steps over short and long prompts. The selector does not use it (its cost has no
/// context term).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayJson {
    pub intercepts: Vec<f64>,
    pub ar_intercept: f64,
    pub beta_hit: f64,
    pub beta_miss: f64,
    pub context_ms: f64,
    /// 0 in files written before it was measured.
    #[serde(default)]
    pub read_round_ms: f64,
    /// Reads in flight at once on the measured engine (its I/O threads).
    #[serde(default = "one")]
    pub read_width: usize,
    /// ms per read that could start only once a slot was freed by an expert computed (0 in
    /// files written before it was measured).
    #[serde(default)]
    pub slot_wait_ms: f64,
    pub r2: f64,
    pub median_abs_err_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<PlainJson>,
    /// The measured forwards' spread around the fit: the robust standard deviation (1.4826 ×
    /// the median absolute deviation) of ln(measured / fitted ms) over the verify probes and
    /// plain steps. The replay multiplies each forward's time by log-normal noise of this
    /// spread, which a measuring policy (the never-lose rule) hears as it hears measured times
    /// (0 in files written before it was measured: no noise).
    #[serde(default)]
    pub noise: f64,
}

/// The largest timing noise a calibration may record ([`ReplayJson::noise`], a log standard
/// deviation): 2 spreads a forward's time over a factor of e⁴ between ±2σ, beyond any machine.
pub const MAX_NOISE: f64 = 2.0;

/// A plain decoding step's cost on the measured machine, fitted on plain steps alone (they run
/// back to back, with warmer processor caches than a verify after drafting):
/// `intercept + beta_hit · hits + beta_miss · misses + read_round_ms · R + context_ms · c`
/// (read rounds `R` as in [`ReplayJson`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainJson {
    pub intercept: f64,
    pub beta_hit: f64,
    pub beta_miss: f64,
    pub read_round_ms: f64,
    pub context_ms: f64,
    /// As [`ReplayJson::slot_wait_ms`].
    #[serde(default)]
    pub slot_wait_ms: f64,
    pub r2: f64,
    pub median_abs_err_ms: f64,
}

fn one() -> usize {
    1
}

/// The `format` tag of calibration files.
pub const CALIBRATION_FORMAT: &str = "specfit-calibration";

impl CalibrationJson {
    /// The file form of a calibration.
    pub fn new(cal: &Calibration) -> CalibrationJson {
        let fit = |f: &Fit| FitJson {
            rows: f.rows,
            r2: f.r2,
            median_abs_err_ms: f.median_abs_err_ms,
        };
        CalibrationJson {
            format: CALIBRATION_FORMAT.to_string(),
            version: 1,
            max_nodes: cal.max_nodes,
            cost: CostJson::from_model(&cal.paper.cost),
            fit: fit(&cal.paper),
            target: None,
            drafting: None,
            replay: None,
            acceptance: None,
            cost_residency: cal
                .residency
                .as_ref()
                .map(|f| CostJson::from_model(&f.cost)),
            fit_residency: cal.residency.as_ref().map(fit),
        }
    }

    /// Parses and checks a calibration file's text.
    pub fn parse(text: &str) -> Result<CalibrationJson, Error> {
        let mut values = read_values::<CalibrationJson>(text);
        let (line, cal) = values.next().unwrap_or(Err(Error::EmptyInput))?;
        if cal.format != CALIBRATION_FORMAT || cal.version != 1 {
            return Err(Error::BadCalibrationFormat {
                format: cal.format,
                version: cal.version,
                expected: CALIBRATION_FORMAT,
            }
            .at_line(line));
        }
        if let Some(d) = &cal.drafting {
            for (name, value) in [
                ("drafting.ms_per_level", d.ms_per_level),
                ("drafting.feed_ms", d.feed_ms),
                ("drafting.feed_ms_per_token", d.feed_ms_per_token),
            ] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(Error::BadBeta { name, value }.at_line(line));
                }
            }
        }
        if let Some(a) = &cal.acceptance {
            a.to_counts().map_err(|e| e.at_line(line))?;
        }
        if let Some(r) = &cal.replay {
            if !(r.noise.is_finite() && (0.0..=MAX_NOISE).contains(&r.noise)) {
                let (value, max) = (r.noise, MAX_NOISE);
                return Err(Error::BadNoise { value, max }.at_line(line));
            }
        }
        Ok(cal)
    }

    /// The paper-form cost model, or the residency-aware one when `residency` is set.
    pub fn cost_model(&self, residency: bool) -> Result<CostModel, Error> {
        match (residency, &self.cost_residency) {
            (false, _) => self.cost.to_model(),
            (true, Some(c)) => c.to_model(),
            (true, None) => Err(Error::NoResidencyCost),
        }
    }
}

/// Reads a sequence of JSON values (one, or JSON Lines), yielding each with the 1-based line it
/// starts on. Stops after the first error, which carries its line and column.
pub fn read_values<'a, T: DeserializeOwned + 'a>(
    text: &'a str,
) -> impl Iterator<Item = Result<(usize, T), Error>> + 'a {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<T>();
    let mut offset = 0;
    let mut line = 1;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        // Advance over JSON whitespace (ASCII only) to the next value to learn its line.
        let bytes = text.as_bytes();
        let skipped = bytes[offset..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
        line += newlines(&bytes[offset..offset + skipped]);
        offset += skipped;
        let start_line = line;
        let item = stream.next()?;
        let end = stream.byte_offset().clamp(offset, bytes.len());
        line += newlines(&bytes[offset..end]);
        offset = end;
        match item {
            Ok(v) => Some(Ok((start_line, v))),
            Err(e) => {
                failed = true;
                Some(Err(syntax(text, &e)))
            }
        }
    })
}

fn newlines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

/// A serde_json error with its position and the text just before it, so the offending field
/// is visible (`near "prob": NaN`).
fn syntax(text: &str, e: &serde_json::Error) -> Error {
    let full = e.to_string();
    let mut message = match full.rfind(" at line ") {
        Some(cut) => full[..cut].to_string(),
        None => full,
    };
    let line_text = text.lines().nth(e.line().saturating_sub(1)).unwrap_or("");
    let end = line_text
        .char_indices()
        .map(|(i, _)| i)
        .nth(e.column())
        .unwrap_or(line_text.len());
    let start = line_text[..end]
        .char_indices()
        .rev()
        .nth(39)
        .map_or(0, |(i, _)| i);
    let near = line_text[start..end].trim();
    if !near.is_empty() {
        message = format!("{message}, near `{near}`");
    }
    Error::Syntax {
        line: e.line(),
        column: e.column(),
        message,
    }
}

/// Reads every pool record of `text` into a validated problem (or the first error, with its line).
pub fn read_pools<'a>(
    text: &'a str,
    overrides: &'a Overrides,
) -> impl Iterator<Item = Result<Problem, Error>> + 'a {
    read_values::<PoolJson>(text).map(move |item| {
        item.and_then(|(line, p)| p.into_problem(overrides).map_err(|e| e.at_line(line)))
    })
}

/// Reads the verify rows of a probe file (rows of other kinds are skipped).
pub fn read_probes(text: &str) -> Result<Vec<Probe>, Error> {
    Ok(read_probe_json(text)?
        .into_iter()
        .filter(|(kind, _, _)| *kind == ProbeKind::Verify)
        .map(|(_, _, probe)| probe)
        .collect())
}

/// Every row of a probe file as written, with its kind and its validated probe (the replay and
/// drafting fits read the rows; [`read_probes`] keeps the verify rows' probes).
pub fn read_probe_json(text: &str) -> Result<Vec<(ProbeKind, ProbeJson, Probe)>, Error> {
    let mut rows = Vec::new();
    for item in read_values::<ProbeJson>(text) {
        let (line, row) = item?;
        let index = rows.len();
        let kind = row.probe_kind(index).map_err(|e| e.at_line(line))?;
        let probe = row.clone().into_probe(index).map_err(|e| e.at_line(line))?;
        rows.push((kind, row, probe));
    }
    Ok(rows)
}
