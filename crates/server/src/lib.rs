//! `specfit serve`: an OpenAI-compatible HTTP server over specfit's engine.
pub mod api;
pub mod chat;
pub mod decoder;
pub mod error;
pub mod text;
