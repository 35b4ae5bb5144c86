//! The slot memory: every MoE layer's `S` expert-sized slots in one arena on transparent huge
//! pages, slot `s` of layer `l` at `(l · S + s) · stride`, each 4 KiB-aligned; moved to fresh
//! memory on request. Which expert a slot holds is the LRU's business.

use crate::error::EngineError;
use crate::experts::aligned::{padded, AlignedBuf};
use crate::experts::io::SlotPtr;

/// Every layer's slots, layer after layer.
pub(super) struct Arena {
    data: AlignedBuf,
    /// Bytes per slot (the block padded to 4 KiB).
    stride: usize,
    per_layer: usize,
}

impl Arena {
    /// `per_layer` slots of `block` bytes for each of `layers` layers (zeroed).
    pub(super) fn new(layers: usize, per_layer: usize, block: usize) -> Result<Arena, EngineError> {
        let stride = padded(block);
        let bytes = layers * per_layer * stride;
        let data = AlignedBuf::try_huge_zeroed(bytes).ok_or(EngineError::SlotMemory {
            slots: per_layer,
            layers,
            bytes,
        })?;
        Ok(Arena {
            data,
            stride,
            per_layer,
        })
    }

    /// Where slot `s` of `layer` starts.
    fn offset(&self, layer: usize, s: usize) -> usize {
        (layer * self.per_layer + s) * self.stride
    }

    /// The first `len` bytes of slot `s` of `layer`.
    pub(super) fn slot(&self, layer: usize, s: usize, len: usize) -> &[u8] {
        self.data.range(self.offset(layer, s), len)
    }

    /// Slot `s` of `layer` as a read destination.
    pub(super) fn slot_ptr(&mut self, layer: usize, s: usize) -> SlotPtr {
        let (at, len) = (self.offset(layer, s), self.stride);
        SlotPtr {
            ptr: self.data.range_ptr(at, len),
            len,
        }
    }

    /// A buffer as large as one slot, for reading an expert outside the arena.
    pub(super) fn scratch(&self) -> AlignedBuf {
        AlignedBuf::zeroed(self.stride)
    }

    /// Moves the slots to newly allocated memory, bytes unchanged, then frees the old memory
    /// (no read may be in flight).
    pub(super) fn relocate(&mut self) {
        let len = self.data.as_slice().len();
        let mut fresh = AlignedBuf::huge_zeroed(len);
        fresh.as_mut_slice().copy_from_slice(self.data.as_slice());
        self.data = fresh;
    }

    /// The arena's first byte (to tell arenas apart).
    #[cfg(test)]
    pub(super) fn base(&self) -> *const u8 {
        self.data.as_slice().as_ptr()
    }
}
