//! Decoding, plain and speculative: EAGLE-3 tree decoding on the offloaded engine, where a
//! verify policy ([`specfit_selector::VerifyPolicy`]) chooses the part of the draft tree to
//! verify. The loop is [`Decoder`]'s; drafting, verifying, routing and statistics are each their
//! own module.

mod decoder;
mod draft;
mod routes;
mod stats;
mod verify;

pub(crate) use decoder::prefill;
pub use decoder::{check_context, generate, DecodeOptions, Decoder, Speculation, Start, TokenSink};
pub(crate) use draft::{advance_drafter, draft_tree, feed_drafter, learn, DraftState};
pub use draft::{concat_taps, pool_depth, top_children, DraftNode, TreeShape};
pub use routes::{Atlas, PoolRoutes, Routes};
pub use stats::{decode_rate, per_cycle, DecodeStats};
pub use verify::{taken_along, taken_children, verify, Tree, Verified};
