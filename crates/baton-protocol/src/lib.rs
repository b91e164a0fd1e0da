//! The KServe V2 / Open Inference Protocol wire formats, protocol only: no
//! server, no routing. REST JSON and its binary extension are here at the
//! top; the gRPC messages and their conversion are in [`grpc`]. The front
//! ends, the drill and the tests share them, so both sides are covered:
//!
//! - server: [`parse_request`] then [`RequestHeader::decode`] (or both at
//!   once, [`decode_request`]), and [`encode_response`];
//! - client: [`encode_request`] and [`decode_response`];
//! - discovery: [`model_metadata`] and Triton's [`model_config`], which
//!   Triton's perf_analyzer reads.
//!
//! # Decoding a request in two steps
//!
//! A request is parsed first and decoded second, so that a server can
//! refuse it, or reserve its memory, before any tensor is allocated:
//!
//! 1. [`parse_request`] parses the JSON header and checks every field, but
//!    leaves tensor data where it is in the body: JSON `data` as text
//!    (checked to be JSON, not converted), binary data as a slice. Binary
//!    sizes are checked against the shapes exactly, and JSON data too
//!    short to hold its shape's elements (fewer than half its length) is
//!    refused by counting them without allocating. The [`RequestHeader`]
//!    gives each input's name, datatype and shape, and the bytes its
//!    decoded tensor will take ([`TensorHeader::tensor_bytes`]); nothing
//!    proportional to the data has been allocated.
//! 2. [`RequestHeader::check`] checks the inputs against the model's
//!    [`Signature`](baton_core::tensors::signature::Signature) and `max_batch_size`
//!    (baton-core's [`check_request`](baton_core::tensors::signature::Signature::check_request),
//!    the check a version runs on decoded tensors too): unknown or missing
//!    inputs, datatypes, shapes, and for a batching model that the inputs
//!    agree on the batch size and that it fits the limit.
//! 3. The caller reserves [`RequestHeader::tensor_bytes`] from whatever
//!    budget it keeps.
//! 4. [`RequestHeader::decode`] writes each tensor's elements straight into
//!    a buffer of exactly its size (BYTES: a vector of exactly the element
//!    count), checking each element and the count as it goes: decoding
//!    allocates the tensors' bytes and nothing proportional to the JSON.
//!
//! ```no_run
//! # fn serve(body: &[u8], header_length: Option<usize>, model: &baton_core::tensors::signature::Signature)
//! #     -> Result<(), String> {
//! let header = baton_protocol::parse_request(body, header_length).map_err(|e| e.to_string())?;
//! header.check(model, 64).map_err(|e| e.to_string())?; // 64: the model's max_batch_size
//! let reserved = header.tensor_bytes(); // take this much from the request-memory budget
//! let request = header.decode().map_err(|e| e.to_string())?;
//! # let _ = (reserved, request);
//! # Ok(())
//! # }
//! ```
//!
//! gRPC requests take the same steps: [`grpc::convert::parse_request`],
//! [`grpc::convert::Parsed::check`], [`grpc::convert::Parsed::decode`].
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
pub mod token;
mod wire_json;

pub use client::{InferResponse, decode_response, encode_request};
pub use error::CodecError;
pub use metadata::{is_batched, model_config, model_metadata, triton_data_type};
pub use request::{InferRequest, RequestHeader, RequestedOutput, decode_request, parse_request};
pub use response::{Encoded, encode_response, encode_response_with};
pub use tensor_header::TensorHeader;
