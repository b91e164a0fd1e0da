//! The codec of baton's gRPC services and clients: prost's, except that an
//! inference request is first walked on the wire to bound the memory
//! decoding it takes.
//!
//! prost allocates a message's structs as it reads them: an entry of
//! `inputs` is two bytes on the wire (`2a 00`) and an `InferInputTensor` of
//! a few hundred bytes in memory, so a 64 MiB request of empty inputs would
//! take about 18 GB. [`decode_infer_request`] adds up, from the wire and
//! without allocating, what prost will allocate ([`infer_request_size`]),
//! and refuses a request that would take more than [`MAX_EXPANSION`] times
//! its length; requests of real tensors take a few times their length at
//! most (BYTES of empty strings, the worst, 24).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use super::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use super::pb::{InferParameter, ModelInferRequest};

/// The most bytes a request may take decoded, per byte of it on the wire
/// (besides [`SLACK`]).
pub const MAX_EXPANSION: usize = 64;
/// Bytes any request may take decoded besides [`MAX_EXPANSION`] per byte.
pub const SLACK: usize = 64 << 10;

/// A message baton's codec decodes: checked on the wire before prost reads
/// it, if its type says how ([`Wire::check`]).
pub trait Wire: Message + Default + Sized {
    /// Checks the encoded message before it is decoded; nothing by default.
    fn check(bytes: &[u8]) -> Result<(), Status> {
        let _ = bytes;
        Ok(())
    }
}

impl Wire for ModelInferRequest {
    fn check(bytes: &[u8]) -> Result<(), Status> {
        let size = infer_request_size(bytes);
        let limit = MAX_EXPANSION.saturating_mul(bytes.len()).saturating_add(SLACK);
        if size > limit {
            let mut status = Status::resource_exhausted(format!(
                "the request of {} bytes would take {size} bytes decoded, more than {MAX_EXPANSION} times its size: \
                 it repeats empty entries",
                bytes.len()
            ));
            status.metadata_mut().insert(super::KIND_KEY, tonic::metadata::MetadataValue::from_static("too_large"));
            return Err(status);
        }
        Ok(())
    }
}

/// The message types of every RPC but `ModelInfer`'s request, decoded as
/// they are.
macro_rules! unchecked {
    ($($message:path),* $(,)?) => { $(impl Wire for $message {})* };
}

unchecked!(
    super::pb::ServerLiveRequest,
    super::pb::ServerLiveResponse,
    super::pb::ServerReadyRequest,
    super::pb::ServerReadyResponse,
    super::pb::ModelReadyRequest,
    super::pb::ModelReadyResponse,
    super::pb::ServerMetadataRequest,
    super::pb::ServerMetadataResponse,
    super::pb::ModelMetadataRequest,
    super::pb::ModelMetadataResponse,
    super::pb::ModelInferResponse,
    super::pb::ModelStreamInferResponse,
    super::pb::ModelConfigRequest,
    super::pb::ModelConfigResponse,
    super::pb::ModelStatisticsRequest,
    super::pb::ModelStatisticsResponse,
    super::pb::RepositoryIndexRequest,
    super::pb::RepositoryIndexResponse,
    super::pb::RepositoryModelLoadRequest,
    super::pb::RepositoryModelLoadResponse,
    super::pb::RepositoryModelUnloadRequest,
    super::pb::RepositoryModelUnloadResponse,
    super::pb_baton::EventsRequest,
    super::pb_baton::Event,
    super::pb_baton::StatusRequest,
    super::pb_baton::StatusResponse,
    super::pb_baton::LoadRequest,
    super::pb_baton::RollbackRequest,
    super::pb_baton::PinRequest,
    super::pb_baton::UnpinRequest,
    super::pb_baton::DecisionResponse,
    super::pb_baton::OperationReport,
    super::pb_baton::RolloutStartRequest,
    super::pb_baton::RolloutRequest,
    super::pb_baton::RolloutPauseRequest,
    super::pb_baton::RolloutResponse,
);

/// Decodes an inference request as baton's gRPC server does: checked on
/// the wire ([`Wire::check`]), then by prost.
pub fn decode_infer_request(bytes: &[u8]) -> Result<ModelInferRequest, Status> {
    decode(bytes)
}

fn decode<U: Wire>(bytes: &[u8]) -> Result<U, Status> {
    U::check(bytes)?;
    // As tonic's prost codec: a message that does not parse is INTERNAL.
    U::decode(bytes).map_err(|e| Status::internal(e.to_string()))
}

/// The codec the generated services and clients use (see `build.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Wire + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder(PhantomData)
    }
}

/// Decodes a [`Wire`] message, checking it first.
#[derive(Debug, Clone, Copy)]
pub struct CheckedDecoder<U>(PhantomData<U>);

impl<U: Wire> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        use prost::bytes::Buf;
        // The message is one contiguous buffer; taking it does not copy.
        let bytes = buf.copy_to_bytes(buf.remaining());
        decode(&bytes).map(Some)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// What prost allocates decoding an encoded `ModelInferRequest`, added up
/// from the wire without allocating: each struct, string, vector and map
/// entry, twice for what growing vectors leave unused. Fields past a
/// malformed one are not counted: prost refuses the message there.
pub fn infer_request_size(bytes: &[u8]) -> usize {
    let entry = 2 * size_of::<(String, InferParameter)>();
    fields(bytes, |field, value| match (field, value) {
        (4, Value::Bytes(b)) => entry + b.len(),
        (5, Value::Bytes(b)) => size_of::<InferInputTensor>() + input_size(b, entry),
        (6, Value::Bytes(b)) => size_of::<InferRequestedOutputTensor>() + output_size(b, entry),
        (7, Value::Bytes(b)) => size_of::<Vec<u8>>() + b.len(),
        (_, Value::Bytes(b)) => b.len(),
        _ => 0,
    })
    .saturating_mul(2)
}

/// An `InferInputTensor`: its shape (8 bytes per element, at most one per
/// byte), parameters and contents.
fn input_size(bytes: &[u8], entry: usize) -> usize {
    fields(bytes, |field, value| match (field, value) {
        (3, value) => numbers(value, 8),
        (4, Value::Bytes(b)) => entry + b.len(),
        (5, Value::Bytes(b)) => contents_size(b),
        (_, Value::Bytes(b)) => b.len(),
        _ => 0,
    })
}

/// An `InferRequestedOutputTensor`: its name and parameters.
fn output_size(bytes: &[u8], entry: usize) -> usize {
    fields(bytes, |field, value| match (field, value) {
        (2, Value::Bytes(b)) => entry + b.len(),
        (_, Value::Bytes(b)) => b.len(),
        _ => 0,
    })
}

/// `InferTensorContents`: each repeated field's elements in memory.
fn contents_size(bytes: &[u8]) -> usize {
    fields(bytes, |field, value| match (field, value) {
        (1, value) => numbers(value, 1),
        (2 | 4, value) => numbers(value, 4),
        (3 | 5, value) => numbers(value, 8),
        // Fixed-width floats take in memory what they take on the wire.
        (6, Value::Bytes(b)) | (7, Value::Bytes(b)) => b.len(),
        (6, _) => 4,
        (7, _) => 8,
        (8, Value::Bytes(b)) => size_of::<Vec<u8>>() + b.len(),
        _ => 0,
    })
}

/// A repeated number field of `width` bytes in memory: one element, or a
/// packed run of at most one per byte.
fn numbers(value: Value<'_>, width: usize) -> usize {
    match value {
        Value::Bytes(b) => width.saturating_mul(b.len()),
        Value::Scalar => width,
    }
}

/// A field's value on the wire, as far as sizes go.
#[derive(Clone, Copy)]
enum Value<'a> {
    /// Length-delimited.
    Bytes(&'a [u8]),
    /// A varint or a fixed-width number.
    Scalar,
}

/// Adds up `size` over the fields of a message, until its end or the
/// first field that does not parse.
fn fields(mut bytes: &[u8], mut size: impl FnMut(u64, Value<'_>) -> usize) -> usize {
    let mut total = 0usize;
    while !bytes.is_empty() {
        let Some(key) = varint(&mut bytes) else { break };
        let value = match key & 7 {
            0 => varint(&mut bytes).map(|_| Value::Scalar),
            1 => bytes.split_off(..8).map(|_| Value::Scalar),
            5 => bytes.split_off(..4).map(|_| Value::Scalar),
            2 => varint(&mut bytes)
                .and_then(|n| usize::try_from(n).ok())
                .and_then(|n| bytes.split_off(..n))
                .map(Value::Bytes),
            _ => None,
        };
        let Some(value) = value else { break };
        total = total.saturating_add(size(key >> 3, value));
    }
    total
}

/// Takes a varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::pb::InferTensorContents;

    #[test]
    fn empty_entries_are_refused_and_real_tensors_pass() {
        let empty_inputs = [0x2a, 0].repeat(1 << 16);
        let e = decode_infer_request(&empty_inputs).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("more than 64 times its size"), "{}", e.message());

        let strings = InferTensorContents { bytes_contents: vec![Vec::new(); 1 << 16], ..Default::default() };
        let ints = InferTensorContents { int64_contents: vec![1; 1 << 16], ..Default::default() };
        for contents in [strings, ints] {
            let input = InferInputTensor {
                name: "x".into(),
                datatype: "BYTES".into(),
                shape: vec![1 << 16],
                contents: Some(contents),
                ..Default::default()
            };
            let request = ModelInferRequest { inputs: vec![input], ..Default::default() };
            assert_eq!(decode_infer_request(&request.encode_to_vec()).unwrap(), request);
        }
    }

    #[test]
    fn a_malformed_message_is_prosts_error() {
        let e = decode_infer_request(&[0x2a, 0x05, 0x0a]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
    }
}
