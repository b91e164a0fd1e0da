//! What a version does to a request around its graph, in Rust, so that the
//! processing a model was trained with ships in the version's directory
//! beside its weights and cannot drift from them.

pub mod features;
