//! The KServe V2 / Open Inference Protocol wire formats, protocol only: no
//! server, no routing. REST JSON and its binary extension are here at the
//! top; the gRPC messages and their conversion are in [`grpc`]. The front
//! ends, the drill and the tests share them, so both sides are covered:
//!
//! - server: [`decode_request`] and [`encode_response`];
//! - client: [`encode_request`] and [`decode_response`];
//! - discovery: [`model_metadata`] and Triton's [`model_config`], which
//!   Triton's perf_analyzer reads.
//!
//! Tensor data travels as JSON (`data`, flat or nested, row-major) or with
//! the binary tensor data extension: the JSON header, then each binary
//! tensor's little-endian bytes in tensor order, BYTES elements as a 4-byte
//! little-endian length and the bytes. A tensor carries
//! `parameters.binary_data_size` when its data is binary, and the HTTP
//! header `Inference-Header-Content-Length` says where the JSON ends; the
//! functions here take and return that length, never HTTP types.
//!
//! Two things JSON cannot say: NaN and ±Inf are written as `null` (use
//! binary outputs for exact floats; [`decode_response`] reads `null` back
//! as NaN), and BYTES elements that are not UTF-8 are written lossily.
//! Finite numbers are exact both ways: FP32/FP16 are written as the
//! shortest decimal that reads back to the same value, and serde_json's
//! `float_roundtrip` parser is enabled so FP64 reads back exactly too.
//!
//! Every error is a [`CodecError`] whose message names the tensor at fault
//! and says what was expected and what was found.

mod client;
mod error;
mod framing;
pub mod grpc;
mod metadata;
mod request;
mod response;
mod tensor_decode;
mod tensor_encode;
mod tensor_header;
mod wire_json;

pub use client::{InferResponse, decode_response, encode_request};
pub use error::CodecError;
pub use metadata::{is_batched, model_config, model_metadata, triton_data_type};
pub use request::{InferRequest, RequestHeader, RequestedOutput, decode_request, parse_request};
pub use response::{Encoded, encode_response};
pub use tensor_header::TensorHeader;
