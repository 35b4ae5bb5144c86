//! Routed experts live outside the model: an [`ExpertStore`] holds every expert of every MoE
//! layer in slow memory, and an [`ExpertCache`] keeps `S` slots per layer in fast memory. The
//! forward may compute an expert only from a slot. The router lives in the model file; this
//! module only stores, copies and counts.

pub mod aligned;
mod cache;
pub mod disk;
mod fingerprint;
mod io;
mod stats;
mod store;

pub use cache::{CacheMode, ExpertCache, LAYER_AHEAD_MIN_BYTES};
pub use disk::{convert, is_current_format, staleness, ConvertReport, DiskStore};
pub use fingerprint::{Fingerprint, SourceFile};
pub use io::reads_in_flight;
pub use stats::{CopyStats, LayerStats};
pub use store::{ExpertLayout, ExpertMatrices, ExpertStore, RamStore};
