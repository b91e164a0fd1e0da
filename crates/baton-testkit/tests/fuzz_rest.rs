//! Fuzzing the REST request decoder (JSON header, JSON tensor data, and
//! the binary data extension after `Inference-Header-Content-Length`):
//! arbitrary bytes, valid requests damaged (see [`baton_testkit::fuzz`]),
//! claimed shapes and sizes far past the body, and nesting past serde's
//! limit. Whatever the input, decoding returns a request or a client error
//! of a known kind; parsing never promises less memory than decoding
//! takes; and valid requests of every datatype round-trip, as JSON and as
//! binary data.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use baton_core::tensors::tensor::{DataType, Tensor, element_count};
use baton_protocol::{CodecError, encode_request, parse_request};
use baton_testkit::fuzz::{
    REQUEST_KINDS, assert_within_reservation, config, damaged, model_of, named, seeds, tensor, text_tokens,
};
use proptest::prelude::*;

/// Parses, checks against a model made of the request's own inputs, and
/// decodes, asserting what holds for any body: errors are client errors
/// of a known kind, the reservation covers what decoding allocates, and
/// decoded tensors agree with their shapes. The decoded inputs, or the
/// error.
fn decode_checked(body: &[u8], header_length: Option<usize>) -> Result<Vec<Tensor>, CodecError> {
    let known = |e: CodecError| {
        assert!(REQUEST_KINDS.contains(&e.kind()) && e.is_client_error(), "{e:?}");
        e
    };
    let header = parse_request(body, header_length).map_err(known)?;
    let reserved: Vec<usize> = header.inputs().map(|t| t.tensor_bytes()).collect();
    assert_eq!(header.check(&model_of(header.inputs()), 0), Ok(()), "a request fits a model of its own inputs");
    let request = header.decode().map_err(known)?;
    assert_within_reservation(&request.inputs, &reserved);
    Ok(request.inputs)
}

/// A header length near the true one, or anywhere, or none.
fn any_header_length(body_len: usize, original: Option<usize>) -> impl Strategy<Value = Option<usize>> {
    let near = original.unwrap_or(body_len);
    prop_oneof![
        3 => Just(original),
        1 => Just(None),
        1 => (0..=body_len + 1).prop_map(Some),
        1 => (near.saturating_sub(3)..=near + 3).prop_map(Some),
        1 => Just(Some(usize::MAX)),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Any bytes, with any header length: a request or a client error.
    #[test]
    fn arbitrary_bodies_are_refused_or_decoded(
        body in prop::collection::vec(any::<u8>(), 0..256),
        header_length in prop::option::of(0usize..300),
    ) {
        let _ = decode_checked(&body, header_length);
    }

    /// Any JSON-looking text built of the request's own words.
    #[test]
    fn arbitrary_json_is_refused_or_decoded(
        body in r#"\{("(id|inputs|name|datatype|shape|data|parameters|binary_data_size|outputs|FP32|BYTES)"|[\[\]{},:]|-?[0-9]{1,20}|true|null|"[a-z]{0,3}"| ){0,48}\}"#,
    ) {
        let _ = decode_checked(body.as_bytes(), None);
    }

    /// Valid requests damaged: huge and negative dimensions and sizes,
    /// counts that disagree with shapes, cut and repeated pieces.
    #[test]
    fn damaged_requests_are_refused_or_decoded(
        (body, header_length) in (0..seeds::rest().len()).prop_flat_map(|i| {
            let (body, header_length) = seeds::rest().swap_remove(i);
            let len = body.len();
            (damaged(vec![body], text_tokens(), 4), any_header_length(len, header_length))
        }),
    ) {
        let _ = decode_checked(&body, header_length);
    }

    /// Valid requests of every datatype round-trip, as JSON and as binary.
    #[test]
    fn valid_requests_round_trip(
        json in prop::collection::vec(tensor(true), 0..4),
        binary in prop::collection::vec(tensor(false), 0..4),
    ) {
        for (tensors, binary) in [(named(json), false), (named(binary), true)] {
            let encoded = encode_request(&tensors, binary, &[], Some("id"));
            let decoded = decode_checked(&encoded.body, encoded.header_length);
            prop_assert_eq!(decoded, Ok(tensors));
        }
    }

    /// A shape claiming up to 2^62 elements, over data of a few, is refused
    /// as a tensor error while parsing, for JSON and binary data alike.
    #[test]
    fn claimed_shapes_past_the_data_are_refused_while_parsing(
        dims in prop::collection::vec(prop_oneof![Just(1i64 << 62), Just(1i64 << 40), Just(i64::MAX), 1i64..1000], 1..4),
        datatype in proptest::sample::select(DataType::ALL.to_vec()),
        binary in any::<bool>(),
    ) {
        prop_assume!(element_count(&dims).is_none_or(|n| n > 4));
        let data = if datatype == DataType::Bytes { r#"["a","b"]"# } else { "[0,1]" };
        let shape = format!("{dims:?}");
        let body = if binary {
            let json = format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{shape},"parameters":{{"binary_data_size":2}}}}]}}"#);
            let len = json.len();
            ([json.into_bytes(), vec![0, 1]].concat(), Some(len))
        } else {
            (format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{shape},"data":{data}}}]}}"#).into_bytes(), None)
        };
        let e = parse_request(&body.0, body.1).unwrap_err();
        prop_assert!(matches!(e, CodecError::InvalidTensor(_) | CodecError::InvalidBinary(_)), "{:?}", e);
    }

    /// Nesting past serde_json's limit, in tensor data or in the header, is
    /// a JSON error, not a stack overflow.
    #[test]
    fn deep_nesting_is_a_json_error(depth in 100usize..20_000, in_data in any::<bool>(), brace in any::<bool>()) {
        let (open, close) = if brace { (r#"{"a":"#, "}") } else { ("[", "]") };
        let deep = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let body = if in_data {
            format!(r#"{{"inputs":[{{"name":"x","datatype":"FP32","shape":[1],"data":{deep}}}]}}"#)
        } else {
            format!(r#"{{"inputs":[],"parameters":{{"p":{deep}}}}}"#)
        };
        match decode_checked(body.as_bytes(), None) {
            Err(e) => prop_assert!(matches!(e.kind(), "invalid_json" | "invalid_tensor"), "{:?}", e),
            // Under serde_json's limit of 128 a deep parameter is only a
            // value, and deep arrays hold the one element of the shape.
            Ok(_) => prop_assert!(depth < 128 && !(in_data && brace)),
        }
    }
}
