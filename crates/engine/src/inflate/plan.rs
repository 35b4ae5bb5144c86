//! Where every part of the small model goes in the large one: the layer placement, the hidden
//! copies, the head and rotary-pair map, the expert copies, and which small layer each
//! pass-through layer routes like. Pure index arithmetic, checked once; no tensors.

use serde::Serialize;

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::model::eagle3::Eagle3Config;

/// The large model's shape (Hugging Face config names).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    pub num_hidden_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    /// The drafter's MLP width (the published EAGLE-3 head's `intermediate_size`).
    pub drafter_intermediate_size: usize,
}

impl Shape {
    /// Qwen3-30B-A3B (and its published SpecForge EAGLE-3 head: intermediate 12,288).
    pub fn qwen3_30b_a3b() -> Shape {
        Shape {
            num_hidden_layers: 48,
            hidden_size: 2048,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            head_dim: 128,
            num_experts: 128,
            num_experts_per_tok: 8,
            moe_intermediate_size: 768,
            drafter_intermediate_size: 12288,
        }
    }
}

/// The small model's dimensions the map needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Small {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate: usize,
    pub vocab: usize,
}

/// The map from the small model into [`Shape`].
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub shape: Shape,
    pub small: Small,
    /// Large layer index of small layer `i`.
    pub trained_layers: Vec<usize>,
    /// Per large layer: the small layer whose router (and norms) it uses.
    pub router_source: Vec<usize>,
    /// Per large layer: small expert `e` → the first of its copies (the others follow at
    /// `+ small.experts`, `+ 2·small.experts`, …). The identity on trained layers; a seeded
    /// permutation on pass-through layers, so that layers do not share expert ids.
    pub expert_slot: Vec<Vec<usize>>,
}

fn shape_error(field: &'static str, value: usize, reason: String) -> EngineError {
    EngineError::InflateShape {
        field,
        value,
        reason,
    }
}

impl Plan {
    /// Checks that `small` embeds in `shape` and lays it out.
    pub fn new(small_cfg: &Qwen3MoeConfig, shape: Shape) -> Result<Plan, EngineError> {
        let s = Small {
            layers: small_cfg.num_hidden_layers,
            hidden: small_cfg.hidden_size,
            heads: small_cfg.num_attention_heads,
            kv_heads: small_cfg.num_key_value_heads,
            head_dim: small_cfg.head_dim(),
            experts: small_cfg.num_experts,
            num_experts_per_tok: small_cfg.num_experts_per_tok,
            moe_intermediate: small_cfg.moe_intermediate_size,
            vocab: small_cfg.vocab_size,
        };
        if small_cfg.moe_layers().len() != s.layers {
            return Err(shape_error(
                "mlp_only_layers",
                s.layers - small_cfg.moe_layers().len(),
                "dense layers in the source model: every layer must be MoE".into(),
            ));
        }
        if small_cfg.attention_bias {
            return Err(shape_error(
                "attention_bias",
                1,
                "the source model has attention biases (Qwen3-MoE has none)".into(),
            ));
        }
        if !small_cfg.norm_topk_prob {
            return Err(shape_error(
                "norm_topk_prob",
                0,
                "a GGUF qwen3moe always renormalises the top-k weights; the source model does not"
                    .into(),
            ));
        }
        let multiple = |field, large: usize, small: usize| {
            if small == 0 || large < small || !large.is_multiple_of(small) {
                Err(shape_error(
                    field,
                    large,
                    format!("must be a positive multiple of the source model's {small}"),
                ))
            } else {
                Ok(large / small)
            }
        };
        multiple("hidden_size", shape.hidden_size, s.hidden)?;
        if !s.head_dim.is_multiple_of(2) {
            return Err(shape_error(
                "head_dim",
                s.head_dim,
                "the source head_dim is odd".into(),
            ));
        }
        multiple("head_dim", shape.head_dim, s.head_dim)?;
        let copies = multiple("num_experts", shape.num_experts, s.experts)?;
        if shape.num_experts_per_tok != copies * s.num_experts_per_tok {
            return Err(shape_error(
                "num_experts_per_tok",
                shape.num_experts_per_tok,
                format!(
                    "must be {copies} copies × the source model's top-{} = {}",
                    s.num_experts_per_tok,
                    copies * s.num_experts_per_tok
                ),
            ));
        }
        if shape.num_key_value_heads < s.kv_heads
            || !shape
                .num_attention_heads
                .is_multiple_of(shape.num_key_value_heads)
            || shape.num_attention_heads / shape.num_key_value_heads < s.heads / s.kv_heads
        {
            return Err(shape_error(
                "num_attention_heads",
                shape.num_attention_heads,
                format!(
                    "{} query / {} KV heads cannot hold the source model's {} / {} in their GQA groups",
                    shape.num_attention_heads, shape.num_key_value_heads, s.heads, s.kv_heads
                ),
            ));
        }
        if shape.moe_intermediate_size < s.moe_intermediate {
            return Err(shape_error(
                "moe_intermediate_size",
                shape.moe_intermediate_size,
                format!("below the source model's {}", s.moe_intermediate),
            ));
        }
        if shape.num_hidden_layers < s.layers || s.layers == 0 {
            return Err(shape_error(
                "num_hidden_layers",
                shape.num_hidden_layers,
                format!("below the source model's {}", s.layers),
            ));
        }
        let n = shape.num_hidden_layers;
        let trained_layers: Vec<usize> = (0..s.layers).map(|i| i * n / s.layers).collect();
        let router_source = (0..n)
            .map(|l| match trained_layers.iter().position(|&t| t == l) {
                Some(i) => i,
                // A pass-through layer routes like the next trained layer: its input is the
                // residual that layer starts from. After the last one, like the last one.
                None => trained_layers
                    .iter()
                    .position(|&t| t > l)
                    .unwrap_or(s.layers - 1),
            })
            .collect();
        let mut rng = specfit_gguf::quant::Rng::new(0x1f1a_7e00);
        let expert_slot = (0..n)
            .map(|l| {
                let mut slots: Vec<usize> = (0..s.experts).collect();
                if !trained_layers.contains(&l) {
                    for i in (1..slots.len()).rev() {
                        slots.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                    }
                }
                slots
            })
            .collect();
        Ok(Plan {
            shape,
            small: s,
            trained_layers,
            router_source,
            expert_slot,
        })
    }

    /// Checks that `drafter` (the small model's EAGLE-3 head) inflates with this plan, and
    /// returns its tap layers as large-model SpecForge ids (`eagle_aux_hidden_state_layer_ids`:
    /// the layer whose output is tapped).
    pub fn drafter_taps(&self, drafter: &Eagle3Config) -> Result<Vec<usize>, EngineError> {
        let d = drafter
            .head_dim
            .unwrap_or(drafter.hidden_size / drafter.num_attention_heads.max(1));
        let checks = [
            ("hidden_size", drafter.hidden_size, self.small.hidden),
            ("head_dim", d, self.small.head_dim),
            ("vocab_size", drafter.vocab_size, self.small.vocab),
        ];
        for (field, value, want) in checks {
            if value != want {
                return Err(shape_error(
                    field,
                    value,
                    format!("the drafter must match the source target's {want}"),
                ));
            }
        }
        if drafter.num_key_value_heads > self.shape.num_key_value_heads
            || drafter.num_attention_heads / drafter.num_key_value_heads.max(1)
                > self.shape.num_attention_heads / self.shape.num_key_value_heads
        {
            return Err(shape_error(
                "num_attention_heads",
                drafter.num_attention_heads,
                "the drafter's heads do not fit the large GQA groups".into(),
            ));
        }
        if drafter.intermediate_size > self.shape.drafter_intermediate_size {
            return Err(shape_error(
                "intermediate_size",
                drafter.intermediate_size,
                format!(
                    "the drafter's MLP is wider than the large head's {}",
                    self.shape.drafter_intermediate_size
                ),
            ));
        }
        let n = self.small.layers;
        let inputs = drafter.taps(n);
        // The input of small layer L is the input of large layer trained_layers[L]: everything
        // before it is the small layers before L and pass-through layers.
        inputs
            .iter()
            .map(|&l| match l {
                l if (1..n).contains(&l) => Ok(self.trained_layers[l] - 1),
                _ => Err(shape_error(
                    "eagle_aux_hidden_state_layer_ids",
                    l,
                    format!("the drafter taps the input of layer {l}; 1..{n} can be placed"),
                )),
            })
            .collect()
    }

    /// Copies of the small hidden state in the large one (the residual stream holds the small
    /// one `hidden_copies` times over, so every RMSNorm sees the same mean square).
    pub fn hidden_copies(&self) -> usize {
        self.shape.hidden_size / self.small.hidden
    }

    /// Large rotary pairs per small pair.
    pub fn pair_factor(&self) -> usize {
        self.shape.head_dim / self.small.head_dim
    }

    /// Copies of each small expert.
    pub fn expert_copies(&self) -> usize {
        self.shape.num_experts / self.small.experts
    }

    /// The large query head of small query head `h` (GQA group kept, `heads`/`kv_heads` of the
    /// model in question).
    pub fn query_head(&self, h: usize, heads: usize, kv_heads: usize) -> usize {
        let group = heads / kv_heads;
        let large_group = self.shape.num_attention_heads / self.shape.num_key_value_heads;
        (h / group) * large_group + h % group
    }

    /// Large dimension `x` of a rotary head (0..head_dim) as `(small dim, copy)`: small rotary
    /// pair `j` becomes large pair `m·j` (the same frequency under the same θ, m =
    /// [`Plan::pair_factor`]); large pairs `m·j + r`, r > 0, are copy `r` of it.
    pub fn rotary_dim(&self, x: usize) -> (usize, usize) {
        let (half, small_half) = (self.shape.head_dim / 2, self.small.head_dim / 2);
        let (side, pair) = (x / half, x % half);
        let m = self.pair_factor();
        (side * small_half + pair / m, pair % m)
    }

    /// Large expert ids of small expert `e` in large layer `l` (all its copies).
    pub fn expert_ids(&self, l: usize, e: usize) -> impl Iterator<Item = usize> + '_ {
        let first = self.expert_slot[l][e];
        (0..self.expert_copies()).map(move |k| first + k * self.small.experts)
    }

    /// The small expert behind large expert `id` in large layer `l`.
    pub fn small_expert(&self, l: usize, id: usize) -> usize {
        let slot = id % self.small.experts;
        self.expert_slot[l]
            .iter()
            .position(|&s| s == slot)
            .expect("a permutation")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Qwen3MoeConfig {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/target/config.json"),
        )
        .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn eight_layers_spread_over_forty_eight_and_pass_through_layers_route_like_the_next() {
        let plan = Plan::new(&small(), Shape::qwen3_30b_a3b()).unwrap();
        assert_eq!(plan.trained_layers, [0, 6, 12, 18, 24, 30, 36, 42]);
        assert_eq!(plan.router_source[0], 0);
        assert_eq!(plan.router_source[1], 1);
        assert_eq!(plan.router_source[6], 1);
        assert_eq!(plan.router_source[41], 7);
        assert_eq!(plan.router_source[47], 7);
        assert_eq!(
            (
                plan.hidden_copies(),
                plan.pair_factor(),
                plan.expert_copies()
            ),
            (8, 2, 2)
        );
    }

    #[test]
    fn rotary_pair_j_goes_to_pair_2j_on_both_halves() {
        let plan = Plan::new(&small(), Shape::qwen3_30b_a3b()).unwrap();
        // Small head_dim 64: dims j and j+32 form pair j. Large 128: dims p and p+64.
        assert_eq!(plan.rotary_dim(0), (0, 0));
        assert_eq!(plan.rotary_dim(1), (0, 1));
        assert_eq!(plan.rotary_dim(2), (1, 0));
        assert_eq!(plan.rotary_dim(64), (32, 0));
        assert_eq!(plan.rotary_dim(66), (33, 0));
        assert_eq!(plan.rotary_dim(127), (63, 1));
        // Same frequency: 1/θ^(2·(2j)/128) = 1/θ^(2j/64).
        for j in 0..32 {
            assert_eq!((2 * (2 * j)) as f32 / 128.0, (2 * j) as f32 / 64.0);
        }
    }

    #[test]
    fn query_heads_stay_in_their_kv_groups() {
        let plan = Plan::new(&small(), Shape::qwen3_30b_a3b()).unwrap();
        // 4 query / 2 KV small heads: 0,1 → KV 0; 2,3 → KV 1. Large groups of 8.
        let heads: Vec<usize> = (0..4).map(|h| plan.query_head(h, 4, 2)).collect();
        assert_eq!(heads, [0, 1, 8, 9]);
    }

    #[test]
    fn every_small_expert_has_two_copies_and_layers_permute_their_ids() {
        let plan = Plan::new(&small(), Shape::qwen3_30b_a3b()).unwrap();
        for l in 0..48 {
            let mut all: Vec<usize> = (0..64).flat_map(|e| plan.expert_ids(l, e)).collect();
            for e in 0..64 {
                for id in plan.expert_ids(l, e) {
                    assert_eq!(plan.small_expert(l, id), e);
                }
            }
            all.sort();
            assert_eq!(all, (0..128).collect::<Vec<_>>());
        }
        assert_eq!(plan.expert_ids(6, 5).collect::<Vec<_>>(), [5, 69]);
        assert_ne!(plan.expert_slot[1], plan.expert_slot[2]);
        assert_ne!(plan.expert_slot[1], (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn shapes_that_cannot_hold_the_model_are_refused_with_the_field() {
        type Change = fn(&mut Shape);
        let changes: [(&str, Change); 3] = [
            ("num_experts_per_tok", |s| s.num_experts_per_tok = 6),
            ("hidden_size", |s| s.hidden_size = 1000),
            ("num_hidden_layers", |s| s.num_hidden_layers = 4),
        ];
        for (field, change) in changes {
            let mut shape = Shape::qwen3_30b_a3b();
            change(&mut shape);
            let e = Plan::new(&small(), shape).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        let mut shape = Shape::qwen3_30b_a3b();
        shape.num_experts_per_tok = 6;
        let e = Plan::new(&small(), shape).unwrap_err().to_string();
        assert!(e.contains("8"), "the count the model needs: {e}");
    }
}
