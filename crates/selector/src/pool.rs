//! The draft pool: a tree of draft tokens under the last committed token (the root), each with a
//! path probability and the experts the target routes it to in every MoE layer.
//!
//! Validated once, on construction ([`PoolBuilder`]); afterwards every accessor is infallible.
//! This module owns the tree and the route bitsets; which subtree to verify is `search`'s job and
//! what verifying costs is `cost`'s.

use crate::bitset;
use crate::error::{Error, Owner};

/// Most draft nodes a pool may hold (the exact search enumerates subtrees of at most
/// [`crate::MAX_SELECT`] of them).
pub const MAX_POOL_NODES: usize = 1024;

/// A validated draft pool. Node `i`'s parent is `None` (the root) or a node `< i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    layers: usize,
    experts: usize,
    words: usize,
    /// Parent of each node; `None` = the root. N entries.
    parent: Vec<Option<u32>>,
    /// Path probability of each node (product of draft probabilities along its path). N entries.
    prob: Vec<f64>,
    /// Depth of each node; children of the root have depth 1. N entries.
    depth: Vec<u32>,
    /// Whether the root's routes were given (else the root demands nothing).
    root_routed: bool,
    /// Root routes, flat over L·E bits. W words.
    root_mask: Vec<u64>,
    /// Node routes, flat over L·E bits. N × W words.
    masks: Vec<u64>,
    /// Tokens cached before the root: what each verified row attends to.
    context: usize,
}

/// A pool as plain data (the form the interchange format and generators produce).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// MoE layers.
    pub layers: usize,
    /// Experts per MoE layer.
    pub experts: usize,
    /// The root's routes, one expert id list per layer, when known.
    pub root_routes: Option<Vec<Vec<u32>>>,
    /// Draft nodes, parents before children.
    pub nodes: Vec<NodeSpec>,
    /// Tokens cached before the root.
    pub context: usize,
}

/// One draft node as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Parent node index; `None` = the root.
    pub parent: Option<usize>,
    /// Path probability.
    pub prob: f64,
    /// Expert ids per layer.
    pub routes: Vec<Vec<u32>>,
}

impl PoolSpec {
    /// Validates and builds the pool.
    pub fn build(&self) -> Result<Pool, Error> {
        let mut b = PoolBuilder::new(self.layers, self.experts)?;
        if let Some(routes) = &self.root_routes {
            b.root_routes(routes)?;
        }
        for node in &self.nodes {
            b.push(node.parent, node.prob, &node.routes)?;
        }
        b.context(self.context);
        Ok(b.build())
    }
}

/// Builds a [`Pool`] node by node, validating each as it is added.
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    pool: Pool,
}

impl PoolBuilder {
    /// Starts a pool over `layers` MoE layers of `experts` experts each.
    pub fn new(layers: usize, experts: usize) -> Result<PoolBuilder, Error> {
        bitset::check_shape(layers, experts)?;
        let words = bitset::words_for(layers, experts);
        Ok(PoolBuilder {
            pool: Pool {
                layers,
                experts,
                words,
                parent: Vec::new(),
                prob: Vec::new(),
                depth: Vec::new(),
                root_routed: false,
                root_mask: vec![0; words],
                masks: Vec::new(),
                context: 0,
            },
        })
    }

    /// Sets the root's routes: one expert id list per layer.
    pub fn root_routes<R: AsRef<[u32]>>(&mut self, routes: &[R]) -> Result<&mut Self, Error> {
        let p = &mut self.pool;
        let mut bits = vec![0; p.words];
        bitset::fill_routes(&mut bits, Owner::Root, p.layers, p.experts, routes)?;
        p.root_mask = bits;
        p.root_routed = true;
        Ok(self)
    }

    /// Sets the tokens cached before the root (0 unless set): each verified row attends to
    /// them, which the cost model may charge ([`crate::CostModel::at_context`]).
    pub fn context(&mut self, tokens: usize) -> &mut Self {
        self.pool.context = tokens;
        self
    }

    /// Adds a draft node under `parent` (`None` = the root) and returns its index.
    pub fn push<R: AsRef<[u32]>>(
        &mut self,
        parent: Option<usize>,
        prob: f64,
        routes: &[R],
    ) -> Result<usize, Error> {
        let p = &mut self.pool;
        let index = p.parent.len();
        if index >= MAX_POOL_NODES {
            return Err(Error::TooManyNodes {
                nodes: index + 1,
                limit: MAX_POOL_NODES,
            });
        }
        let depth = match parent {
            None => 1,
            Some(q) if q < index => p.depth[q] + 1,
            Some(q) => {
                return Err(Error::BadParent {
                    index,
                    parent: q as i64,
                })
            }
        };
        if !(0.0..=1.0).contains(&prob) {
            return Err(Error::BadProbability { index, prob });
        }
        let start = p.masks.len();
        p.masks.resize(start + p.words, 0);
        let filled = bitset::fill_routes(
            &mut p.masks[start..],
            Owner::Node(index),
            p.layers,
            p.experts,
            routes,
        );
        if let Err(e) = filled {
            p.masks.truncate(start);
            return Err(e);
        }
        p.parent.push(parent.map(|q| q as u32));
        p.prob.push(prob);
        p.depth.push(depth);
        Ok(index)
    }

    /// Finishes the pool.
    pub fn build(self) -> Pool {
        self.pool
    }
}

impl Pool {
    /// Number of draft nodes (the root not counted).
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether the pool has no draft nodes.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// MoE layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Experts per MoE layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Words of one flat route bitset.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Parent of node `i` (`None` = the root).
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parent[i].map(|q| q as usize)
    }

    /// Path probability of node `i`.
    pub fn prob(&self, i: usize) -> f64 {
        self.prob[i]
    }

    /// Depth of node `i` (children of the root have depth 1).
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i] as usize
    }

    /// Depth of the deepest node: the newest drafted level (0 for an empty pool).
    pub fn max_depth(&self) -> usize {
        self.depth.iter().copied().max().unwrap_or(0) as usize
    }

    /// Whether the root's routes were given.
    pub fn root_routed(&self) -> bool {
        self.root_routed
    }

    /// The root's flat route bitset (all zero when not given).
    pub fn root_bits(&self) -> &[u64] {
        &self.root_mask
    }

    /// Node `i`'s flat route bitset.
    pub fn expert_bits(&self, i: usize) -> &[u64] {
        &self.masks[i * self.words..(i + 1) * self.words]
    }

    /// Node `i`'s routes as sorted expert id lists, one per layer.
    pub fn routes(&self, i: usize) -> Vec<Vec<u32>> {
        bitset::to_routes(self.expert_bits(i), self.layers, self.experts)
    }

    /// The root's routes as sorted expert id lists (`None` when not given).
    pub fn root_routes(&self) -> Option<Vec<Vec<u32>>> {
        self.root_routed
            .then(|| bitset::to_routes(&self.root_mask, self.layers, self.experts))
    }

    /// Tokens cached before the root.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The pool as plain data.
    pub fn to_spec(&self) -> PoolSpec {
        PoolSpec {
            layers: self.layers,
            experts: self.experts,
            root_routes: self.root_routes(),
            nodes: (0..self.len())
                .map(|i| NodeSpec {
                    parent: self.parent(i),
                    prob: self.prob(i),
                    routes: self.routes(i),
                })
                .collect(),
            context: self.context,
        }
    }

    /// Whether `nodes` is ancestor-closed: every node's parent is the root or also in `nodes`.
    pub fn is_ancestor_closed(&self, nodes: &[usize]) -> bool {
        let mut member = vec![false; self.len()];
        for &i in nodes {
            member[i] = true;
        }
        nodes
            .iter()
            .all(|&i| self.parent(i).is_none_or(|q| member[q]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_derived_from_parents() {
        let mut b = PoolBuilder::new(1, 4).unwrap();
        let a = b.push(None, 0.5, &[[0u32]]).unwrap();
        let c = b.push(Some(a), 0.25, &[[1u32]]).unwrap();
        b.push(Some(c), 0.1, &[[2u32]]).unwrap();
        b.push(None, 0.3, &[[3u32]]).unwrap();
        let pool = b.build();
        assert_eq!(
            (0..4).map(|i| pool.depth(i)).collect::<Vec<_>>(),
            [1, 2, 3, 1]
        );
        assert_eq!(pool.max_depth(), 3);
        assert_eq!(pool.routes(1), vec![vec![1]]);
        assert!(pool.is_ancestor_closed(&[0, 1]));
        assert!(!pool.is_ancestor_closed(&[1]));
    }

    #[test]
    fn a_pool_round_trips_through_its_plain_data_form() {
        let spec = PoolSpec {
            layers: 2,
            experts: 70,
            root_routes: Some(vec![vec![1, 69], vec![0]]),
            nodes: vec![
                NodeSpec {
                    parent: None,
                    prob: 0.6,
                    routes: vec![vec![3], vec![64, 65]],
                },
                NodeSpec {
                    parent: Some(0),
                    prob: 0.3,
                    routes: vec![vec![], vec![2]],
                },
            ],
            context: 1234,
        };
        assert_eq!(spec.build().unwrap().to_spec(), spec);
    }

    #[test]
    fn a_parent_listed_after_its_child_is_rejected() {
        let mut b = PoolBuilder::new(1, 4).unwrap();
        let err = b.push(Some(0), 0.5, &[[0u32]]).unwrap_err();
        assert_eq!(
            err,
            Error::BadParent {
                index: 0,
                parent: 0
            }
        );
    }

    #[test]
    fn probabilities_outside_the_unit_interval_or_nan_are_rejected() {
        for prob in [f64::NAN, -0.1, 1.5, f64::INFINITY] {
            let mut b = PoolBuilder::new(1, 4).unwrap();
            let err = b.push(None, prob, &[[0u32]]).unwrap_err();
            assert!(
                matches!(err, Error::BadProbability { index: 0, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn a_failed_push_leaves_the_pool_unchanged() {
        let mut b = PoolBuilder::new(2, 4).unwrap();
        let e = b
            .push(None, 0.5, &[vec![0u32], vec![9]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("9"), "{e}");
        b.push(None, 0.5, &[vec![0u32], vec![1]]).unwrap();
        let pool = b.build();
        assert_eq!(pool.len(), 1);
        assert_eq!(pool.routes(0), vec![vec![0], vec![1]]);
    }

    #[test]
    fn shapes_outside_the_supported_range_are_rejected() {
        assert_eq!(
            PoolBuilder::new(0, 8).unwrap_err(),
            Error::LayersOutOfRange {
                layers: 0,
                max: bitset::MAX_LAYERS
            }
        );
        for experts in [513, 0] {
            assert_eq!(
                PoolBuilder::new(4, experts).unwrap_err(),
                Error::ExpertsOutOfRange {
                    experts,
                    max: bitset::MAX_EXPERTS
                }
            );
        }
        assert!(PoolBuilder::new(61, 384).is_ok());
    }

    #[test]
    fn a_pool_over_more_layers_than_any_model_has_is_refused_before_allocating() {
        let err = PoolBuilder::new(1_000_000_000, 128).unwrap_err();
        assert_eq!(
            err,
            Error::LayersOutOfRange {
                layers: 1_000_000_000,
                max: bitset::MAX_LAYERS
            }
        );
        assert!(crate::cost::ResidentSet::new(usize::MAX, 8, &[[0u32]]).is_err());
    }
}
