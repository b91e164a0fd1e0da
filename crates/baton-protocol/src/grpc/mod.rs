//! The KServe V2 / Open Inference Protocol over gRPC: the messages and
//! services generated from `proto/` (the server side for baton, the client
//! side for its drill and tests), and the conversion between the inference
//! messages and baton's tensors.
//!
//! `grpc_service.proto` and `model_config.proto` carry the message names,
//! field names and field numbers of the Open Inference Protocol and Triton's
//! definitions, so tritonclient and perf_analyzer work unchanged; they hold
//! only what baton implements. `baton_management.proto` is baton's own.

pub mod codec;
pub mod convert;

/// The metadata key that carries an error's stable kind (e.g.
/// `model_not_found`) next to the status code and message.
pub const KIND_KEY: &str = "baton-error-kind";

/// Code generated from `proto/grpc_service.proto` and
/// `proto/model_config.proto` (package `inference`): messages, the server
/// side of `GRPCInferenceService` and its client.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// Code generated from `proto/baton_management.proto` (package
/// `baton.v1`): messages, the server side of `Management` and its client.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod pb_baton {
    include!(concat!(env!("OUT_DIR"), "/baton.v1.rs"));
}
