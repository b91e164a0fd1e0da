//! Parsing a REST request, checking it against the model, then decoding
//! it: what the server learns before any tensor is allocated, and what it
//! refuses there. (gRPC's are in `grpc::convert`'s tests.)

mod common;

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, TensorData};
use baton_protocol::{CodecError, parse_request};
use common::{bytes_binary, with_binary};

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
}

/// A model batching along the first dimension: `x` [-1, 2] FP32 and
/// `s` [-1] BYTES in, `y` [-1] out.
fn signature() -> Signature {
    Signature {
        inputs: vec![spec("x", DataType::Fp32, &[-1, 2]), spec("s", DataType::Bytes, &[-1])],
        outputs: vec![spec("y", DataType::Fp32, &[-1])],
    }
}

fn rest(x_shape: &str, x_data: &str, s_shape: &str) -> String {
    format!(
        r#"{{"inputs":[{{"name":"x","datatype":"FP32","shape":{x_shape},"data":{x_data}}},
            {{"name":"s","datatype":"BYTES","shape":{s_shape},"data":["ab","\u00e9"]}}]}}"#
    )
}

#[test]
fn rest_headers_give_sizes_and_the_check_refuses_before_decoding() {
    let body = rest("[2,2]", "[[1,2],[3,4]]", "[2]");
    let header = parse_request(body.as_bytes(), None).unwrap();
    let sizes: Vec<(&str, usize)> = header.inputs().map(|t| (t.name(), t.tensor_bytes())).collect();
    // BYTES from JSON: two element vectors and at most the data's text.
    let strings = r#"["ab","\u00e9"]"#.len();
    assert_eq!(sizes, [("x", 16), ("s", 2 * size_of::<Vec<u8>>() + strings)]);
    assert_eq!(header.tensor_bytes(), 16 + 2 * size_of::<Vec<u8>>() + strings);
    assert_eq!(header.check(&signature(), 4), Ok(()));
    let request = header.decode().unwrap();
    assert_eq!(request.inputs[1].data, TensorData::Bytes(vec![b"ab".to_vec(), "é".as_bytes().to_vec()]));

    // Batch sizes that disagree, or exceed the limit, and inputs the model
    // does not take, are refused with the core's messages.
    let refused = |body: String, max: usize| parse_request(body.as_bytes(), None).unwrap().check(&signature(), max);
    let e = refused(rest("[1,2]", "[1,2]", "[2]"), 4).unwrap_err();
    assert_eq!(e.kind(), "batch_mismatch");
    assert!(e.to_string().starts_with("input 's': batch size 2 differs from input 'x' (batch size 1)"), "{e}");
    let e = refused(rest("[2,2]", "[1,2,3,4]", "[2]"), 1).unwrap_err();
    assert_eq!(e.to_string(), "input 'x': batch size 2 exceeds the model's max_batch_size 1");
    let e = refused(rest("[2,3]", "[1,2,3,4,5,6]", "[2]"), 4).unwrap_err();
    assert_eq!(e.to_string(), "input 'x': expected shape [-1, 2], got [2, 3]");
    let e = refused(r#"{"inputs":[{"name":"x","datatype":"FP64","shape":[1,2],"data":[1,2]}]}"#.into(), 4);
    assert_eq!(e.unwrap_err().to_string(), "missing input 's': the model takes 'x', 's'; the request sent 'x'");

    // A bad element is found only by decoding, which the check precedes.
    let body = rest("[1,2]", "[1,\"x\"]", "[2]");
    let e = parse_request(body.as_bytes(), None).unwrap().check(&signature(), 4).unwrap_err();
    assert_eq!(e.kind(), "batch_mismatch");
}

#[test]
fn huge_shapes_are_refused_by_parsing_alone() {
    let huge = 1i64 << 40;
    let e = parse_request(rest(&format!("[{huge},2]"), "[1,2]", "[2]").as_bytes(), None).unwrap_err();
    assert_eq!(e.to_string(), format!("input 'x': shape [{huge}, 2] needs {} elements, 'data' has 2", huge * 2));
    let json = format!(
        r#"{{"inputs":[{{"name":"s","datatype":"BYTES","shape":[{huge}],"parameters":{{"binary_data_size":6}}}}]}}"#
    );
    let (body, length) = with_binary(&json, &bytes_binary(&[b"ok"]));
    let e = parse_request(&body, length).unwrap_err();
    assert!(matches!(&e, CodecError::InvalidBinary(m) if m.contains("holds 1 elements")), "{e}");
}

#[test]
fn binary_sizes_are_exact() {
    let json = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}},
        {"name":"s","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}]}"#;
    let mut binary = [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat();
    binary.extend(bytes_binary(&[b"abc"]));
    let (body, length) = with_binary(json, &binary);
    let header = parse_request(&body, length).unwrap();
    assert_eq!(header.tensor_bytes(), 8 + size_of::<Vec<u8>>() + 3);
    assert_eq!(header.check(&signature(), 4), Ok(()));
    assert_eq!(header.decode().unwrap().inputs[1].data, TensorData::Bytes(vec![b"abc".to_vec()]));
}
