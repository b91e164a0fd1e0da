//! Every datatype through JSON and binary, in requests and responses.

mod common;

use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_protocol::{InferRequest, RequestedOutput, decode_request, decode_response, encode_request, encode_response};
use common::{bytes_binary, every_datatype, with_binary};

/// JSON text cannot carry bytes that are not UTF-8, so the JSON samples are
/// all UTF-8; binary samples add a non-UTF-8 element.
fn binary_samples() -> Vec<Tensor> {
    let mut tensors = every_datatype();
    tensors.push(Tensor {
        name: "raw_bytes".into(),
        datatype: DataType::Bytes,
        shape: vec![2],
        data: TensorData::Bytes(vec![vec![0xff, 0xfe, 0x00], vec![0x80; 300]]),
    });
    tensors
}

#[test]
fn every_datatype_round_trips_through_a_json_request() {
    let inputs = every_datatype();
    let encoded = encode_request(&inputs, false, &[], Some("json"));
    assert_eq!(encoded.header_length, None);
    let request = decode_request(&encoded.body, encoded.header_length).unwrap();
    assert_eq!(request.id.as_deref(), Some("json"));
    assert!(!request.binary_data_output);
    assert_eq!(request.inputs, inputs);
}

#[test]
fn every_datatype_round_trips_through_a_binary_request() {
    let inputs = binary_samples();
    let outputs = [RequestedOutput::new("a"), RequestedOutput::with_binary("b", false)];
    let encoded = encode_request(&inputs, true, &outputs, None);
    assert!(encoded.header_length.is_some());
    let request = decode_request(&encoded.body, encoded.header_length).unwrap();
    assert_eq!(request.id, None);
    assert!(request.binary_data_output);
    assert_eq!(request.outputs, outputs);
    assert_eq!(request.inputs, inputs);
}

#[test]
fn every_datatype_round_trips_through_json_and_binary_responses() {
    for (tensors, binary) in [(every_datatype(), false), (binary_samples(), true)] {
        let request = InferRequest { binary_data_output: binary, ..Default::default() };
        let encoded = encode_response("m", 12, Some("id-1"), tensors.clone(), &request).unwrap();
        assert_eq!(encoded.header_length.is_some(), binary);
        let response = decode_response(&encoded.body, encoded.header_length).unwrap();
        assert_eq!(response.model_name, "m");
        assert_eq!(response.model_version, "12");
        assert_eq!(response.id.as_deref(), Some("id-1"));
        assert_eq!(response.outputs, tensors, "binary: {binary}");
    }
}

#[test]
fn random_fp32_and_fp64_values_survive_json_exactly() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let f32s: Vec<f32> = (0..20_000).map(|_| f32::from_bits(next() as u32)).filter(|v| v.is_finite()).collect();
    let f64s: Vec<f64> = (0..20_000).map(|_| f64::from_bits(next())).filter(|v| v.is_finite()).collect();
    let a = Tensor::from_f32("a", vec![f32s.len() as i64], &f32s);
    let b = Tensor {
        name: "b".into(),
        datatype: DataType::Fp64,
        shape: vec![f64s.len() as i64],
        data: TensorData::Raw(f64s.iter().flat_map(|v| v.to_le_bytes()).collect()),
    };
    let encoded = encode_request(&[a.clone(), b.clone()], false, &[], None);
    let decoded = decode_request(&encoded.body, None).unwrap();
    assert_eq!(decoded.inputs, vec![a, b]);
}

#[test]
fn nested_and_flat_json_are_the_same_tensor() {
    let flat = br#"{"inputs":[{"name":"x","datatype":"INT16","shape":[2,2,2],"data":[1,2,3,4,5,6,7,8]}]}"#;
    let nested =
        br#"{"inputs":[{"name":"x","datatype":"INT16","shape":[2,2,2],"data":[[[1,2],[3,4]],[[5,6],[7,8]]]}]}"#;
    let half = br#"{"inputs":[{"name":"x","datatype":"INT16","shape":[2,2,2],"data":[[1,2,3,4],[5,6,7,8]]}]}"#;
    let a = decode_request(flat, None).unwrap();
    assert_eq!(a, decode_request(nested, None).unwrap());
    assert_eq!(a, decode_request(half, None).unwrap());
    let values: Vec<u8> = (1i16..=8).flat_map(i16::to_le_bytes).collect();
    assert_eq!(a.inputs[0].data, TensorData::Raw(values));
}

#[test]
fn mixed_json_and_binary_inputs_take_binary_data_in_order() {
    let json = r#"{"inputs":[
        {"name":"a","datatype":"FP32","shape":[2],"data":[1.5,2.5]},
        {"name":"b","datatype":"UINT16","shape":[3],"parameters":{"binary_data_size":6}},
        {"name":"c","datatype":"BOOL","shape":[2],"data":[true,false],"parameters":{"ignored":"yes"}},
        {"name":"d","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":15}},
        {"name":"e","datatype":"INT8","shape":[0],"parameters":{"binary_data_size":0}}]}"#;
    let mut binary: Vec<u8> = [7u16, 8, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    binary.extend(bytes_binary(&[b"hi", b"there"]));
    let (body, header_length) = with_binary(json, &binary);
    let request = decode_request(&body, header_length).unwrap();
    let names: Vec<&str> = request.inputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d", "e"]);
    assert_eq!(request.inputs[0], Tensor::from_f32("a", vec![2], &[1.5, 2.5]));
    assert_eq!(request.inputs[1].data, TensorData::Raw(vec![7, 0, 8, 0, 9, 0]));
    assert_eq!(request.inputs[2].data, TensorData::Raw(vec![1, 0]));
    assert_eq!(request.inputs[3].data, TensorData::Bytes(vec![b"hi".to_vec(), b"there".to_vec()]));
    assert_eq!(request.inputs[4].data, TensorData::Raw(vec![]));
}

#[test]
fn a_header_length_equal_to_the_body_is_a_plain_json_body() {
    let body = br#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[3]}]}"#;
    let request = decode_request(body, Some(body.len())).unwrap();
    assert_eq!(request.inputs[0].data, TensorData::Raw(vec![3]));
}

#[test]
fn scalars_and_empty_tensors() {
    let scalar =
        Tensor { name: "s".into(), datatype: DataType::Int64, shape: vec![], data: TensorData::Raw(vec![5; 8]) };
    let empty =
        Tensor { name: "e".into(), datatype: DataType::Bytes, shape: vec![0, 4], data: TensorData::Bytes(vec![]) };
    for binary in [false, true] {
        let encoded = encode_request(&[scalar.clone(), empty.clone()], binary, &[], None);
        let request = decode_request(&encoded.body, encoded.header_length).unwrap();
        assert_eq!(request.inputs, vec![scalar.clone(), empty.clone()]);
    }
}

#[test]
fn non_finite_floats_are_null_in_json_and_exact_in_binary() {
    let values = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
    let out = vec![Tensor::from_f32("y", vec![4], &values)];
    let json = encode_response("m", 1, None, out.clone(), &InferRequest::default()).unwrap();
    let text = String::from_utf8(json.body.clone()).unwrap();
    assert!(text.contains(r#""data":[null,null,null,1.0]"#), "{text}");
    let decoded = decode_response(&json.body, None).unwrap().outputs[0].to_f32().unwrap();
    assert!(decoded[..3].iter().all(|v| v.is_nan()) && decoded[3] == 1.0, "{decoded:?}");

    let request = InferRequest { binary_data_output: true, ..Default::default() };
    let binary = encode_response("m", 1, None, out.clone(), &request).unwrap();
    assert_eq!(decode_response(&binary.body, binary.header_length).unwrap().outputs, out);

    let nulls = br#"{"model_name":"m","outputs":[
        {"name":"h","datatype":"FP16","shape":[1],"data":[null]},
        {"name":"d","datatype":"FP64","shape":[1],"data":[[null]]}]}"#;
    let decoded = decode_response(nulls, None).unwrap();
    let TensorData::Raw(h) = &decoded.outputs[0].data else { panic!("raw") };
    assert_eq!(h[1] & 0x7c, 0x7c, "FP16 NaN exponent");
    let TensorData::Raw(d) = &decoded.outputs[1].data else { panic!("raw") };
    assert!(f64::from_le_bytes(d[..8].try_into().unwrap()).is_nan());
}
