//! Fuzzing the gRPC request decoder: the server's decoding of
//! `ModelInferRequest` bytes (checked on the wire, then prost), then [`parse_request`] and [`Parsed::decode`], with inputs as
//! `raw_input_contents` and as typed contents. Arbitrary bytes, valid
//! messages damaged (long varints, lengths past the message, keys of every
//! wire type), and messages with claimed shapes far past their contents:
//! a request or an error of a known kind, never a panic; the reservation
//! covers what decoding allocates; valid requests round-trip.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use baton_core::tensors::tensor::{DataType, Tensor, element_count};
use baton_protocol::CodecError;
use baton_protocol::grpc::codec::decode_infer_request;
use baton_protocol::grpc::convert::parse_request;
use baton_protocol::grpc::pb::model_infer_request::InferInputTensor;
use baton_protocol::grpc::pb::{InferTensorContents, ModelInferRequest};
use baton_testkit::fuzz::{
    REQUEST_KINDS, assert_within_reservation, config, damaged, model_of, named, seeds, tensor, wire_tokens,
};
use proptest::prelude::*;
use prost::Message;

/// Decodes a message as the server does, asserting what holds for any
/// input (see the module); the decoded inputs, or why not.
fn decode_checked(bytes: &[u8]) -> Result<Vec<Tensor>, String> {
    let request = decode_infer_request(bytes).map_err(|e| e.to_string())?;
    let known = |e: CodecError| {
        assert!(REQUEST_KINDS.contains(&e.kind()) && e.is_client_error(), "{e:?}");
        e.to_string()
    };
    let parsed = parse_request(request).map_err(known)?;
    let reserved: Vec<usize> = parsed.inputs().map(|t| t.tensor_bytes()).collect();
    assert_eq!(parsed.check(&model_of(parsed.inputs()), 0), Ok(()));
    let decoded = parsed.decode().map_err(known)?;
    assert_within_reservation(&decoded.inputs, &reserved);
    Ok(decoded.inputs)
}

proptest! {
    #![proptest_config(config(256))]

    /// Any bytes: prost refuses them, or the request decodes or is refused.
    #[test]
    fn arbitrary_messages_are_refused_or_decoded(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_checked(&bytes);
    }

    /// Valid messages damaged at the wire level.
    #[test]
    fn damaged_messages_are_refused_or_decoded(bytes in damaged(seeds::grpc(), wire_tokens(), 4)) {
        let _ = decode_checked(&bytes);
    }

    /// Valid requests round-trip, raw and typed.
    #[test]
    fn valid_requests_round_trip(raw in prop::collection::vec(tensor(false), 0..4),
        typed in prop::collection::vec(tensor(false).prop_filter("FP16 has no typed field", |t| t.datatype != DataType::Fp16), 0..4),) {
        for (tensors, raw) in [(named(raw), true), (named(typed), false)] {
            let bytes = seeds::grpc_request(&tensors, raw).encode_to_vec();
            prop_assert_eq!(decode_checked(&bytes), Ok(tensors));
        }
    }

    /// Shapes far past the contents, negative dimensions, contents of
    /// another datatype: refused before anything is packed.
    #[test]
    fn claimed_shapes_past_the_contents_are_refused_while_parsing(
        dims in prop::collection::vec(prop_oneof![Just(1i64 << 62), Just(1i64 << 40), Just(-1i64), Just(i64::MIN), 1i64..1000], 1..4),
        datatype in proptest::sample::select(DataType::ALL.to_vec()),
        raw in any::<bool>(),
    ) {
        prop_assume!(element_count(&dims).is_none_or(|n| n > 4));
        let contents = InferTensorContents { fp32_contents: vec![1.0; 2], bytes_contents: vec![b"ab".to_vec(); 2], ..Default::default() };
        let input = InferInputTensor {
            name: "x".into(),
            datatype: datatype.as_str().into(),
            shape: dims,
            contents: (!raw).then_some(contents),
            ..Default::default()
        };
        let raw_input_contents = if raw { vec![vec![2, 0, 0, 0, b'a', b'b']] } else { Vec::new() };
        let request = ModelInferRequest { inputs: vec![input], raw_input_contents, ..Default::default() };
        let bytes = request.encode_to_vec();
        let request = ModelInferRequest::decode(&bytes[..]).expect("a valid message");
        let e = parse_request(request).unwrap_err();
        prop_assert!(matches!(e, CodecError::InvalidTensor(_) | CodecError::InvalidBinary(_)), "{:?}", e);
    }
}
