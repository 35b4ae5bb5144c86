//! Where routed experts rest: the trait every tier implements, and the host-RAM tier. One expert
//! is one contiguous block `gate | up | down` of `f32`: `gate` and `up` are `I × H`, `down` is
//! `H × I` (the `nn.Linear` layouts of the checkpoint).

use crate::error::EngineError;

/// Shape of one expert block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertLayout {
    /// `hidden_size`.
    pub hidden: usize,
    /// `moe_intermediate_size`.
    pub intermediate: usize,
}

impl ExpertLayout {
    /// Floats in one block (3 · H · I).
    pub fn len(&self) -> usize {
        3 * self.hidden * self.intermediate
    }

    /// Whether the block is empty (never for a valid config).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of one block as stored in fast memory.
    pub fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }

    /// `(gate, up, down)` views of a block.
    pub fn split<'a>(&self, block: &'a [f32]) -> (&'a [f32], &'a [f32], &'a [f32]) {
        let m = self.hidden * self.intermediate;
        (&block[..m], &block[m..2 * m], &block[2 * m..3 * m])
    }
}

/// Slow memory holding every routed expert. `layer` is the MoE layer's ordinal (0 = the first
/// sparse layer), `expert` the expert id.
pub trait ExpertStore: Send {
    /// Shape of every block.
    fn layout(&self) -> ExpertLayout;
    /// Copies expert `(layer, expert)` into the first `layout().len()` floats of `dst`. `dst` is
    /// a whole slot: 4 KiB-aligned and a multiple of 4 KiB long (so O_DIRECT can read into it).
    fn read_into(
        &mut self,
        layer: usize,
        expert: usize,
        dst: &mut [f32],
    ) -> Result<(), EngineError>;
    /// Name of the tier, for reports.
    fn tier(&self) -> &'static str;
}

/// Every expert in one host-RAM buffer, `[layer][expert][gate | up | down]`.
pub struct RamStore {
    layout: ExpertLayout,
    experts: usize,
    data: Vec<f32>,
}

impl RamStore {
    /// An empty store for `layers × experts` blocks.
    pub fn new(layout: ExpertLayout, layers: usize, experts: usize) -> RamStore {
        RamStore {
            layout,
            experts,
            data: vec![0.0; layers * experts * layout.len()],
        }
    }

    /// The block of `(layer, expert)`, for filling at load time.
    pub fn block_mut(&mut self, layer: usize, expert: usize) -> &mut [f32] {
        let len = self.layout.len();
        let at = (layer * self.experts + expert) * len;
        &mut self.data[at..at + len]
    }

    /// The block of `(layer, expert)`.
    pub fn block(&self, layer: usize, expert: usize) -> &[f32] {
        let len = self.layout.len();
        let at = (layer * self.experts + expert) * len;
        &self.data[at..at + len]
    }
}

impl std::fmt::Debug for RamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamStore")
            .field("layout", &self.layout)
            .field("experts", &self.experts)
            .field("floats", &self.data.len())
            .finish()
    }
}

impl ExpertStore for RamStore {
    fn layout(&self) -> ExpertLayout {
        self.layout
    }

    fn read_into(
        &mut self,
        layer: usize,
        expert: usize,
        dst: &mut [f32],
    ) -> Result<(), EngineError> {
        let len = self.layout.len();
        dst[..len].copy_from_slice(self.block(layer, expert));
        Ok(())
    }

    fn tier(&self) -> &'static str {
        "ram"
    }
}
