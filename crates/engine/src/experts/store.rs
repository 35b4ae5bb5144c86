//! Where routed experts rest: the trait every tier implements, and the host-RAM tier. One expert
//! is one contiguous block in the storage dtype: `gate` and `up` stacked (`2I × H`) then `down`
//! (`H × I`), each repacked into K-major panels ([`crate::kernels::packed::pack`]) so that the
//! experts run straight from their slots with the batch-efficient panel kernels. Experts of a
//! quantized GGUF file stay quantized: a 64-byte header naming the three matrices' GGUF types,
//! then `gate`, `up` and `down` as the file stores them (row-major GGUF blocks, run as they are
//! by [`crate::kernels::quant`]), every block padded to the largest layer's size.

use specfit_gguf::GgmlType;

use crate::error::EngineError;
use crate::kernels::packed::{pack, packed_len};
use crate::kernels::quant::{rows_len, QuantView};
use crate::kernels::{PackedView, WeightBuf, WeightDtype, WeightView};

/// Bytes of a quantized block's header: the GGUF type ids of gate, up and down.
const QUANT_HEAD: usize = 64;

/// Shape and dtype of one expert block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertLayout {
    /// `hidden_size`.
    pub hidden: usize,
    /// `moe_intermediate_size`.
    pub intermediate: usize,
    /// Storage dtype.
    pub dtype: WeightDtype,
    /// Quantized blocks (a GGUF's experts kept quantized): the bytes of every block, the largest
    /// layer's. `None`: float blocks in `dtype`.
    pub quant_bytes: Option<usize>,
}

/// The matrices of one expert, as the kernels run them.
#[derive(Debug, Clone, Copy)]
pub enum ExpertMatrices<'a> {
    /// `gate | up` (`2I × H`) and `down` (`H × I`) float panels.
    Float {
        gate_up: PackedView<'a>,
        down: PackedView<'a>,
    },
    /// `gate`, `up` (`I × H`) and `down` (`H × I`) GGUF rows.
    Quant {
        gate: QuantView<'a>,
        up: QuantView<'a>,
        down: QuantView<'a>,
    },
}

impl<'a> ExpertMatrices<'a> {
    /// The bytes the matrices are read from (for prefetching).
    pub fn bytes(&self) -> Vec<&'a [u8]> {
        match self {
            ExpertMatrices::Float { gate_up, down } => vec![gate_up.bytes(), down.bytes()],
            ExpertMatrices::Quant { gate, up, down } => {
                vec![gate.bytes(), up.bytes(), down.bytes()]
            }
        }
    }
}

impl ExpertLayout {
    /// Elements of the packed `gate | up` part (`2I × H`).
    fn gate_up_len(&self) -> usize {
        packed_len(2 * self.intermediate, self.hidden)
    }

    /// Elements in one block (`3 · H · I` plus panel padding).
    pub fn len(&self) -> usize {
        self.gate_up_len() + packed_len(self.hidden, self.intermediate)
    }

    /// Whether the block is empty (never for a valid config).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of one block.
    pub fn bytes(&self) -> usize {
        self.quant_bytes
            .unwrap_or_else(|| self.len() * self.dtype.size())
    }

    /// Bytes a quantized block of these GGUF types needs (before padding to the largest).
    pub fn quant_block_len(&self, types: [GgmlType; 3]) -> Option<usize> {
        let (h, i) = (self.hidden, self.intermediate);
        Some(
            QUANT_HEAD
                + rows_len(types[0], i, h)?
                + rows_len(types[1], i, h)?
                + rows_len(types[2], h, i)?,
        )
    }

    /// Where `gate`, `up` and `down` of GGUF types `types` lie in a quantized block:
    /// `(offset, bytes)` each.
    pub fn quant_parts(&self, types: [GgmlType; 3]) -> [(usize, usize); 3] {
        let (h, i) = (self.hidden, self.intermediate);
        let mut at = QUANT_HEAD;
        let mut place = |ty: GgmlType, n: usize, k: usize| {
            let len = rows_len(ty, n, k).expect("an integer form");
            at += len;
            (at - len, len)
        };
        [
            place(types[0], i, h),
            place(types[1], i, h),
            place(types[2], h, i),
        ]
    }

    /// Writes a quantized block's header (the three GGUF types) into `out` (this layout's
    /// `bytes()` long) and zeroes what its parts leave unused, for a writer that puts the parts
    /// at [`ExpertLayout::quant_parts`] itself.
    pub fn write_quant_header(&self, types: [GgmlType; 3], out: &mut [u8]) {
        out[..QUANT_HEAD].fill(0);
        for (slot, ty) in types.iter().enumerate() {
            out[4 * slot..4 * slot + 4].copy_from_slice(&ty.id().to_le_bytes());
        }
        let end = self.quant_parts(types)[2];
        out[end.0 + end.1..].fill(0);
    }

    /// Writes the quantized block of GGUF rows `gate`, `up` (`I × H`) and `down` (`H × I`), each
    /// with its type, into `out` (this layout's `bytes()` long).
    pub fn write_quant_block(&self, parts: [(GgmlType, &[u8]); 3], out: &mut [u8]) {
        let types = parts.map(|p| p.0);
        self.write_quant_header(types, out);
        for ((_, bytes), (at, len)) in parts.iter().zip(self.quant_parts(types)) {
            out[at..at + len].copy_from_slice(bytes);
        }
    }

    /// The matrices of `block` (aligned to the dtype; slots are 4 KiB-aligned).
    pub fn expert<'a>(&self, block: &'a [u8]) -> ExpertMatrices<'a> {
        if self.quant_bytes.is_none() {
            let (gate_up, down) = self.matrices(block);
            return ExpertMatrices::Float { gate_up, down };
        }
        let (h, i) = (self.hidden, self.intermediate);
        let ty = |slot: usize| {
            let id = u32::from_le_bytes(block[4 * slot..4 * slot + 4].try_into().expect("4 bytes"));
            GgmlType::from_id(id).expect("a block this layout wrote")
        };
        let mut at = QUANT_HEAD;
        let mut view = |slot: usize, n: usize, k: usize| {
            let t = ty(slot);
            let len = rows_len(t, n, k).expect("an integer form");
            let v = QuantView::new(t, n, k, &block[at..at + len]);
            at += len;
            v
        };
        let gate = view(0, i, h);
        let up = view(1, i, h);
        let down = view(2, h, i);
        ExpertMatrices::Quant { gate, up, down }
    }

    /// A block's bytes from the checkpoint's row-major `gate`, `up` (`I × H`) and `down`
    /// (`H × I`), all in this layout's dtype.
    pub fn block_bytes(
        &self,
        gate: WeightView<'_>,
        up: WeightView<'_>,
        down: WeightView<'_>,
    ) -> Vec<u8> {
        let (h, i) = (self.hidden, self.intermediate);
        let gate_up = match (gate, up) {
            (WeightView::F32(g), WeightView::F32(u)) => WeightBuf::F32([g, u].concat()),
            (WeightView::Bf16(g), WeightView::Bf16(u)) => WeightBuf::Bf16([g, u].concat()),
            _ => panic!("gate and up in different dtypes"),
        };
        let mut bytes = Vec::with_capacity(self.bytes());
        for part in [pack(gate_up.view(), 2 * i, h), pack(down, h, i)] {
            match part {
                WeightBuf::F32(v) => v
                    .iter()
                    .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
                WeightBuf::Bf16(v) => v
                    .iter()
                    .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
            }
        }
        bytes
    }

    /// `(gate | up, down)` of a block's bytes as packed matrices (`2I × H` and `H × I`).
    /// `block` must be aligned to the dtype (slots are 4 KiB-aligned).
    pub fn matrices<'a>(&self, block: &'a [u8]) -> (PackedView<'a>, PackedView<'a>) {
        let (h, i) = (self.hidden, self.intermediate);
        let all = view(&block[..self.bytes()], self.dtype);
        let split = self.gate_up_len();
        (
            PackedView::new(all.slice(0..split), 2 * i, h),
            PackedView::new(all.slice(split..self.len()), h, i),
        )
    }
}

/// Reinterprets aligned little-endian bytes as a weight view.
fn view(bytes: &[u8], dtype: WeightDtype) -> WeightView<'_> {
    match dtype {
        WeightDtype::F32 => {
            // SAFETY: every bit pattern is a valid f32; `align_to` only yields the aligned middle.
            let (head, mid, _) = unsafe { bytes.align_to::<f32>() };
            assert!(head.is_empty(), "expert block is not 4-byte aligned");
            WeightView::F32(mid)
        }
        WeightDtype::Bf16 => {
            // SAFETY: as above for u16.
            let (head, mid, _) = unsafe { bytes.align_to::<u16>() };
            assert!(head.is_empty(), "expert block is not 2-byte aligned");
            WeightView::Bf16(mid)
        }
    }
}

/// Slow memory holding every routed expert. `layer` is the MoE layer's ordinal (0 = the first
/// sparse layer), `expert` the expert id.
pub trait ExpertStore: Send + Sync {
    /// Shape and dtype of every block.
    fn layout(&self) -> ExpertLayout;
    /// Copies expert `(layer, expert)` into the first `layout().bytes()` bytes of `dst`. `dst` is
    /// a whole slot: 4 KiB-aligned and a multiple of 4 KiB long (so O_DIRECT can read into it).
    /// Several reads may run at once from different threads.
    fn read_into(&self, layer: usize, expert: usize, dst: &mut [u8]) -> Result<(), EngineError>;
    /// Name of the tier, for reports.
    fn tier(&self) -> &'static str;
    /// Whether every expert is used where it rests ([`ExpertStore::in_place`]), with no slots
    /// and no copies (a memory-mapped GGUF).
    fn maps_in_place(&self) -> bool {
        false
    }
    /// Expert `(layer, expert)` where it rests, checked, for a store that
    /// [`ExpertStore::maps_in_place`].
    fn in_place(&self, layer: usize, expert: usize) -> Result<ExpertMatrices<'_>, EngineError> {
        let _ = (layer, expert);
        Err(EngineError::ExpertStore {
            reason: format!("the {} tier copies experts into slots", self.tier()),
        })
    }
}

/// Every expert in one host-RAM buffer, `[layer][expert][gate | up | down]`.
pub struct RamStore {
    layout: ExpertLayout,
    experts: usize,
    data: Vec<u8>,
}

impl RamStore {
    /// An empty store for `layers × experts` blocks.
    pub fn new(layout: ExpertLayout, layers: usize, experts: usize) -> RamStore {
        RamStore {
            layout,
            experts,
            data: vec![0; layers * experts * layout.bytes()],
        }
    }

    /// The bytes of block `(layer, expert)`, for filling at load time.
    pub fn block_mut(&mut self, layer: usize, expert: usize) -> &mut [u8] {
        let len = self.layout.bytes();
        let at = (layer * self.experts + expert) * len;
        &mut self.data[at..at + len]
    }

    /// The bytes of block `(layer, expert)`.
    pub fn block(&self, layer: usize, expert: usize) -> &[u8] {
        let len = self.layout.bytes();
        let at = (layer * self.experts + expert) * len;
        &self.data[at..at + len]
    }
}

impl std::fmt::Debug for RamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamStore")
            .field("layout", &self.layout)
            .field("experts", &self.experts)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl ExpertStore for RamStore {
    fn layout(&self) -> ExpertLayout {
        self.layout
    }

    fn read_into(&self, layer: usize, expert: usize, dst: &mut [u8]) -> Result<(), EngineError> {
        let len = self.layout.bytes();
        dst[..len].copy_from_slice(self.block(layer, expert));
        Ok(())
    }

    fn tier(&self) -> &'static str {
        "ram"
    }
}
