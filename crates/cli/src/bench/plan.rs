//! What one bench run measures: the prompt sets (pinned by Spec-Bench question id) and the list
//! of configurations (policy × route source × slots × β scale). Plain data and how it is built
//! from the options; running it is `bench::run`, reporting is `bench::report`.

use std::path::Path;

use anyhow::{Context, Result};
use specfit_engine::Tokenizer;

use specfit_engine::policy::PolicyName;

use crate::policy::RouteChoice;

/// One prompt of a set.
#[derive(Debug, Clone)]
pub struct BenchPrompt {
    pub question_id: u64,
    pub tokens: Vec<u32>,
}

/// A named prompt set (Spec-Bench category).
#[derive(Debug, Clone)]
pub struct PromptSet {
    pub name: String,
    pub prompts: Vec<BenchPrompt>,
}

/// The shipped sets and how many prompts of each the default run uses (the paper's).
pub const DEFAULT_SETS: [(&str, usize); 2] = [("summarization", 40), ("math_reasoning", 80)];

/// Reads `path` (Spec-Bench JSON Lines: question_id, turns[0]) and renders the first `limit`
/// prompts, in file order, with the model's chat template.
pub fn read_set(
    name: &str,
    path: &Path,
    limit: usize,
    max_prompt_tokens: Option<usize>,
    tok: &Tokenizer,
) -> Result<PromptSet> {
    use crate::prompt::{chat_tokens, read_jsonl, user_turn};
    let prompts = read_jsonl(path, limit, |v, at| {
        let question_id = v["question_id"]
            .as_u64()
            .with_context(|| format!("{at}: no integer question_id"))?;
        let user = user_turn(v, at)?;
        let tokens = match max_prompt_tokens {
            Some(n) => chat_tokens(tok, &cut_to_tokens(tok, user, n)?, at)?,
            None => chat_tokens(tok, user, at)?,
        };
        Ok(BenchPrompt {
            question_id,
            tokens,
        })
    })?;
    Ok(PromptSet {
        name: name.to_string(),
        prompts,
    })
}

/// `text` cut to the text of its first `n` tokens (whole when shorter).
fn cut_to_tokens(tok: &Tokenizer, text: &str, n: usize) -> Result<String> {
    let ids = tok.encode(text)?;
    Ok(if ids.len() > n {
        tok.decode(&ids[..n])?
    } else {
        text.to_string()
    })
}

/// Slots per layer of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slots {
    /// No cache: every routed expert is copied every forward (the slots are scratch).
    None,
    Count(usize),
}

impl Slots {
    /// Slots as a number (0 for none), for charts and JSON.
    pub fn number(self) -> usize {
        match self {
            Slots::None => 0,
            Slots::Count(n) => n,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Row label, e.g. `specfit[predictor]`, `eagle3 (vanilla)`, `specfit β×2`.
    pub label: String,
    pub policy: PolicyName,
    pub routes: RouteChoice,
    pub slots: Slots,
    /// Multiplies the calibrated per-expert cost (the β×2 ablation).
    pub beta_scale: f64,
    /// Read each layer's expected experts ahead of the verify forward (`+ahead`).
    pub read_ahead: bool,
    /// Score by the drafter's own probabilities (`specfit (drafter p)`, the paper's scoring).
    pub drafter_probs: bool,
    /// MoE layers whose experts each layer predicts and starts reading
    /// ([`specfit_engine::ExpertCache::layers_ahead`]; `+layer-ahead`; 0 = off).
    pub layers_ahead: usize,
    /// Plain decoding a second time beside `ar` (`ar (again)`): two identical decoders, so its
    /// ratio to `ar` is how finely this run resolves a ratio at these slots.
    pub again: bool,
}

impl Config {
    fn new(policy: PolicyName, routes: RouteChoice, slots: Slots, beta_scale: f64) -> Config {
        let mut label = policy.name().to_string();
        if policy.needs_routes() && routes != RouteChoice::Atlas {
            label.push_str(&format!("[{}]", routes.label()));
        }
        if beta_scale != 1.0 {
            label.push_str(&format!(" β×{beta_scale}"));
        }
        if policy == PolicyName::Eagle3 && slots == Slots::None {
            label.push_str(" (vanilla)");
        }
        Config {
            label,
            policy,
            routes,
            slots,
            beta_scale,
            read_ahead: false,
            drafter_probs: false,
            layers_ahead: 0,
            again: false,
        }
    }

    /// Plain decoding run again beside `ar` at the same slots (label `ar (again)`).
    fn again(mut self) -> Config {
        self.label.push_str(" (again)");
        self.again = true;
        self
    }

    /// The same configuration reading `layers` MoE layers ahead (label `ar+layer-ahead`,
    /// `specfit+layer-ahead[predictor]`).
    fn layer_ahead(mut self, layers: usize) -> Config {
        let at = self.policy.name().len();
        self.label.insert_str(at, "+layer-ahead");
        self.layers_ahead = layers;
        self
    }

    /// Whether this is a policy's plain row: atlas routes (where it takes routes), β as
    /// calibrated, no reads ahead of any kind, scored by the target's acceptance. The ratios
    /// against `ar` and `eagle3` are to their plain rows.
    pub fn is_plain(&self) -> bool {
        self.beta_scale == 1.0
            && !self.read_ahead
            && !self.drafter_probs
            && self.layers_ahead == 0
            && !self.again
    }

    /// The same configuration scored by the drafter's own probabilities.
    fn drafter_probs(mut self) -> Config {
        self.label.push_str(" (drafter p)");
        self.drafter_probs = true;
        self
    }

    /// The same configuration with read-ahead (label `specfit+ahead[predictor]`, say).
    fn ahead(mut self) -> Config {
        let at = self.policy.name().len();
        self.label.insert_str(at, "+ahead");
        self.read_ahead = true;
        self
    }
}

/// What configurations to build.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub experts: usize,
    pub default_slots: usize,
    /// Whether the route predictor is available (its row is skipped otherwise).
    pub predictor: Option<std::path::PathBuf>,
    /// Quick mode: only the default and no-cache points, main policies.
    pub quick: bool,
    /// The slot points of the sweep instead of none, 100%, half and a quarter (`--sweep`);
    /// each gets `ar`, `eagle3`, `specfit` and, with a predictor, `specfit[predictor]` and
    /// `specfit+ahead[predictor]`.
    pub points: Option<Vec<Slots>>,
    /// With N > 0, `ar` and SpecFit (on predicted routes where there is a predictor) also run
    /// reading N layers ahead (`+layer-ahead`), at the default slots and at every point of a
    /// sweep of its own; never in quick mode.
    pub layers_ahead: usize,
}

/// The configurations, `ar` at the default slots first (it is the reference every other
/// output is checked against). At the default slot count: every policy and variant; at 100%,
/// half, a quarter and no slots: `ar`, cached `eagle3` and `specfit` (no slots: `eagle3` is
/// the vanilla baseline, cleared every forward). Outside quick mode, every slot point also
/// runs `ar (again)`.
pub fn configs(s: &Sweep) -> Vec<Config> {
    let d = Slots::Count(s.default_slots);
    let atlas = RouteChoice::Atlas;
    let mut out = vec![
        Config::new(PolicyName::Ar, atlas.clone(), d, 1.0),
        Config::new(PolicyName::Eagle3, atlas.clone(), Slots::None, 1.0),
        Config::new(PolicyName::Eagle3, atlas.clone(), d, 1.0),
        Config::new(PolicyName::Specfit, atlas.clone(), d, 1.0),
    ];
    if !s.quick {
        out.push(Config::new(PolicyName::Ar, atlas.clone(), d, 1.0).again());
        out.push(Config::new(
            PolicyName::SpecfitLambda,
            atlas.clone(),
            d,
            1.0,
        ));
        out.push(Config::new(
            PolicyName::SpecfitResident,
            atlas.clone(),
            d,
            1.0,
        ));
        out.push(Config::new(
            PolicyName::SpecfitAdaptive,
            atlas.clone(),
            d,
            1.0,
        ));
        // Read-ahead on the atlas's routes (exact, outside the clock: an upper bound) and on
        // the predictor's (inside the clock: what a deployment gets).
        out.push(Config::new(PolicyName::Specfit, atlas.clone(), d, 1.0).ahead());
        if let Some(p) = &s.predictor {
            let r = RouteChoice::Predictor(p.clone());
            out.push(Config::new(PolicyName::Specfit, r.clone(), d, 1.0));
            out.push(Config::new(PolicyName::Specfit, r.clone(), d, 1.0).ahead());
            // With no routing kept out of the clock: the adaptive row's realistic twin.
            out.push(Config::new(PolicyName::SpecfitAdaptive, r, d, 1.0));
        }
        let r = RouteChoice::Corrupt(0.4);
        out.push(Config::new(PolicyName::Specfit, r, d, 1.0));
        out.push(Config::new(PolicyName::Specfit, atlas.clone(), d, 2.0));
        out.push(Config::new(PolicyName::Specfit, atlas.clone(), d, 1.0).drafter_probs());
        out.extend(layer_ahead_rows(s, d));
    }
    let sweep = match &s.points {
        Some(points) => points.clone(),
        None => {
            let mut sweep = vec![Slots::None];
            if !s.quick {
                sweep.extend(
                    [s.experts, s.default_slots / 2, s.default_slots / 4]
                        .into_iter()
                        .filter(|&n| n > 0 && n != s.default_slots)
                        .map(Slots::Count),
                );
            }
            sweep.sort();
            sweep.dedup();
            sweep
        }
    };
    for slots in sweep {
        let mut row: Vec<Config> = [PolicyName::Ar, PolicyName::Eagle3, PolicyName::Specfit]
            .into_iter()
            .map(|policy| Config::new(policy, atlas.clone(), slots, 1.0))
            .collect();
        if !s.quick {
            row.push(Config::new(PolicyName::Ar, atlas.clone(), slots, 1.0).again());
        }
        // A sweep of its own (`--sweep`) also runs SpecFit on predicted routes, without and
        // with read-ahead, at every point (on a model larger than memory the atlas's exact
        // routes may be out of reach).
        if let (Some(_), Some(p)) = (&s.points, &s.predictor) {
            let r = RouteChoice::Predictor(p.clone());
            row.push(Config::new(PolicyName::Specfit, r.clone(), slots, 1.0));
            row.push(Config::new(PolicyName::Specfit, r, slots, 1.0).ahead());
            row.extend(layer_ahead_rows(s, slots));
        }
        for c in row {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// `ar` and SpecFit (on the predictor's routes when there is one: what a deployment runs)
/// reading `s.layers_ahead` layers ahead at `slots`; none in quick mode or with 0 layers.
fn layer_ahead_rows(s: &Sweep, slots: Slots) -> Vec<Config> {
    if s.quick || s.layers_ahead == 0 || slots == Slots::None {
        return Vec::new();
    }
    let routes = s
        .predictor
        .clone()
        .map_or(RouteChoice::Atlas, RouteChoice::Predictor);
    [
        Config::new(PolicyName::Ar, RouteChoice::Atlas, slots, 1.0),
        Config::new(PolicyName::Specfit, routes, slots, 1.0),
    ]
    .map(|c| c.layer_ahead(s.layers_ahead))
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(quick: bool, predictor: bool) -> Sweep {
        Sweep {
            experts: 64,
            default_slots: 8,
            predictor: predictor.then(|| "p.safetensors".into()),
            quick,
            points: None,
            layers_ahead: 1,
        }
    }

    #[test]
    fn the_full_sweep_has_every_variant_at_the_default_and_the_main_policies_elsewhere() {
        let c = configs(&sweep(false, true));
        assert_eq!(c[0].policy, PolicyName::Ar);
        assert_eq!(c[0].slots, Slots::Count(8));
        let labels: Vec<String> = c
            .iter()
            .map(|c| format!("{}@{}", c.label, c.slots.number()))
            .collect();
        for want in [
            "eagle3 (vanilla)@0",
            "eagle3@8",
            "specfit@8",
            "specfit-lambda@8",
            "specfit-resident@8",
            "specfit-adaptive@8",
            "specfit[predictor]@8",
            "specfit+ahead@8",
            "specfit+ahead[predictor]@8",
            "specfit-adaptive[predictor]@8",
            "specfit[corrupt:0.4]@8",
            "specfit β×2@8",
            "specfit (drafter p)@8",
            "ar+layer-ahead@8",
            "specfit+layer-ahead[predictor]@8",
            "ar@0",
            "specfit@0",
            "ar@64",
            "eagle3@64",
            "specfit@4",
            "ar@2",
            "ar (again)@8",
            "ar (again)@0",
            "ar (again)@64",
        ] {
            assert!(
                labels.contains(&want.to_string()),
                "{want} not in {labels:?}"
            );
        }
        // No configuration twice.
        for (i, a) in c.iter().enumerate() {
            assert!(c[i + 1..].iter().all(|b| b != a), "{a:?} twice");
        }
        assert_eq!(c.len(), 15 + 2 + 3 + 4 * 3);
        // `ar (again)` is never the reference the ratios divide by.
        let again: Vec<&Config> = c.iter().filter(|c| c.again).collect();
        assert_eq!(again.len(), 5);
        assert!(again
            .iter()
            .all(|c| c.policy == PolicyName::Ar && !c.is_plain()));
        let layer_ahead = c.iter().filter(|c| c.layers_ahead > 0).count();
        assert_eq!(layer_ahead, 2);
        assert!(c
            .iter()
            .filter(|c| c.layers_ahead > 0)
            .all(|c| !c.is_plain()));
        // With 0 layers ahead those rows go.
        let off = configs(&Sweep {
            layers_ahead: 0,
            ..sweep(false, true)
        });
        assert_eq!(off.len(), c.len() - 2);
    }

    #[test]
    fn without_a_predictor_its_row_is_left_out_and_quick_keeps_four_policies_and_two_slot_points() {
        let c = configs(&sweep(false, false));
        assert!(c
            .iter()
            .all(|c| !matches!(c.routes, RouteChoice::Predictor(_))));
        let q = configs(&sweep(true, true));
        let labels: Vec<String> = q
            .iter()
            .map(|c| format!("{}@{}", c.label, c.slots.number()))
            .collect();
        assert_eq!(
            labels,
            [
                "ar@8",
                "eagle3 (vanilla)@0",
                "eagle3@8",
                "specfit@8",
                "ar@0",
                "specfit@0"
            ]
        );
    }

    #[test]
    fn a_sweep_of_its_own_runs_specfit_on_predicted_routes_with_and_without_reads_ahead_at_every_point(
    ) {
        let s = Sweep {
            points: Some(vec![Slots::Count(16), Slots::Count(32)]),
            ..sweep(false, true)
        };
        let labels: Vec<String> = configs(&s)
            .iter()
            .map(|c| format!("{}@{}", c.label, c.slots.number()))
            .collect();
        for n in [16, 32] {
            for policy in [
                "ar",
                "ar (again)",
                "eagle3",
                "specfit",
                "specfit[predictor]",
                "specfit+ahead[predictor]",
                "ar+layer-ahead",
                "specfit+layer-ahead[predictor]",
            ] {
                let want = format!("{policy}@{n}");
                assert!(labels.contains(&want), "{want} not in {labels:?}");
            }
        }
    }
}
