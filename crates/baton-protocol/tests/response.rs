//! Output selection and the binary/JSON choice in responses, and decoding
//! both forms on the client side.

mod common;

use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_protocol::{CodecError, Encoded, InferRequest, RequestedOutput, decode_response, encode_response};
use common::{header_and_tail, sample};
use serde_json::{Value, json};

/// The model's outputs, in model order.
fn model_outputs() -> Vec<Tensor> {
    vec![
        Tensor::from_f32("scores", vec![2], &[0.25, 0.75]),
        sample("labels", DataType::Bytes),
        sample("ids", DataType::Int64),
    ]
}

fn request(outputs: Vec<RequestedOutput>, binary_data_output: bool) -> InferRequest {
    InferRequest { outputs, binary_data_output, ..Default::default() }
}

fn encode(request: &InferRequest) -> Encoded {
    encode_response("ranker", 3, None, model_outputs(), request).unwrap()
}

fn names(header: &Value) -> Vec<&str> {
    header["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect()
}

/// Which outputs are binary, checking that binary ones have no `data` and
/// that every `parameters` object carries `binary_data_size`.
fn binary_flags(header: &Value) -> Vec<bool> {
    header["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let binary = o.get("parameters").is_some();
            if binary {
                assert!(o["parameters"]["binary_data_size"].is_u64(), "{o}");
                assert!(o.get("data").is_none(), "{o}");
            } else {
                assert!(o["data"].is_array(), "{o}");
            }
            binary
        })
        .collect()
}

#[test]
fn no_requested_outputs_means_all_in_model_order() {
    let e = encode(&InferRequest::default());
    let (header, tail) = header_and_tail(&e.body, e.header_length);
    assert_eq!(names(&header), ["scores", "labels", "ids"]);
    assert_eq!(binary_flags(&header), [false, false, false]);
    assert!(tail.is_empty() && e.header_length.is_none());
    assert_eq!(header["model_name"], "ranker");
    assert_eq!(header["model_version"], "3");
    assert!(header.get("id").is_none(), "id only when given");
}

#[test]
fn requested_outputs_are_a_subset_in_request_order() {
    let e = encode(&request(vec![RequestedOutput::new("ids"), RequestedOutput::new("scores")], false));
    let (header, _) = header_and_tail(&e.body, e.header_length);
    assert_eq!(names(&header), ["ids", "scores"]);
    assert_eq!(header["outputs"][1], json!({"name":"scores","datatype":"FP32","shape":[2],"data":[0.25,0.75]}));
}

#[test]
fn an_unknown_requested_output_is_named_with_the_model_outputs() {
    let r = request(vec![RequestedOutput::new("scores"), RequestedOutput::new("logits")], false);
    let e = encode_response("ranker", 3, None, model_outputs(), &r).unwrap_err();
    assert_eq!(e.kind(), "unknown_output");
    assert!(e.is_client_error());
    assert_eq!(
        e,
        CodecError::UnknownOutput {
            name: "logits".into(),
            available: vec!["scores".into(), "labels".into(), "ids".into()]
        }
    );
    assert!(e.to_string().contains("'logits'") && e.to_string().contains("\"labels\""), "{e}");
}

#[test]
fn binary_per_output() {
    let r = request(vec![RequestedOutput::with_binary("labels", true), RequestedOutput::new("scores")], false);
    let e = encode(&r);
    let (header, tail) = header_and_tail(&e.body, e.header_length);
    assert_eq!(binary_flags(&header), [true, false]);
    let TensorData::Bytes(items) = &sample("labels", DataType::Bytes).data else { panic!() };
    let size: usize = items.iter().map(|i| 4 + i.len()).sum();
    assert_eq!(header["outputs"][0]["parameters"], json!({ "binary_data_size": size }));
    assert_eq!(tail.len(), size);
    assert_eq!(&tail[..4], 0u32.to_le_bytes(), "first element is the empty string");
}

#[test]
fn binary_data_output_applies_unless_an_output_says_false() {
    let r = request(
        vec![
            RequestedOutput::new("ids"),
            RequestedOutput::with_binary("scores", false),
            RequestedOutput::with_binary("labels", true),
        ],
        true,
    );
    let e = encode(&r);
    let (header, tail) = header_and_tail(&e.body, e.header_length);
    assert_eq!(binary_flags(&header), [true, false, true]);
    let TensorData::Raw(ids) = &sample("ids", DataType::Int64).data else { panic!() };
    assert_eq!(&tail[..48], &ids[..], "binary data in output order: ids first");

    let all = encode(&request(vec![], true));
    let (header, tail) = header_and_tail(&all.body, all.header_length);
    assert_eq!(binary_flags(&header), [true, true, true]);
    assert_eq!(&tail[..8], [0.25f32.to_le_bytes(), 0.75f32.to_le_bytes()].concat());
}

#[test]
fn every_parameters_object_carries_binary_data_size() {
    let choices = [None, Some(false), Some(true)];
    for request_level in [false, true] {
        for a in choices {
            for b in choices {
                let r = request(
                    vec![
                        RequestedOutput { name: "scores".into(), binary_data: a },
                        RequestedOutput { name: "ids".into(), binary_data: b },
                    ],
                    request_level,
                );
                let e = encode(&r);
                let (header, tail) = header_and_tail(&e.body, e.header_length);
                let flags = binary_flags(&header);
                assert_eq!(flags, [a.unwrap_or(request_level), b.unwrap_or(request_level)]);
                assert_eq!(e.header_length.is_some(), flags.contains(&true));
                let sizes: u64 = header["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|o| o["parameters"]["binary_data_size"].as_u64())
                    .sum();
                assert_eq!(sizes as usize, tail.len());
            }
        }
    }
}

#[test]
fn decode_response_reads_json_binary_and_mixed_bodies() {
    let expected = |names: &[&str]| -> Vec<Tensor> {
        names.iter().map(|n| model_outputs().into_iter().find(|t| t.name == *n).unwrap()).collect()
    };
    for (binary_data_output, wanted) in [
        (false, vec![]),
        (true, vec![]),
        (false, vec![RequestedOutput::with_binary("ids", true), RequestedOutput::new("labels")]),
        (true, vec![RequestedOutput::new("labels"), RequestedOutput::with_binary("scores", false)]),
    ] {
        let order: Vec<&str> = if wanted.is_empty() {
            vec!["scores", "labels", "ids"]
        } else {
            wanted.iter().map(|o| o.name.as_str()).collect()
        };
        let expect = expected(&order);
        let r = request(wanted.clone(), binary_data_output);
        let e = encode_response("ranker", 3, Some("req-9"), model_outputs(), &r).unwrap();
        let decoded = decode_response(&e.body, e.header_length).unwrap();
        assert_eq!(decoded.model_name, "ranker");
        assert_eq!(decoded.model_version, "3");
        assert_eq!(decoded.id.as_deref(), Some("req-9"));
        assert_eq!(decoded.outputs, expect);
    }
}

#[test]
fn decode_response_accepts_nested_data_and_checks_binary_framing() {
    let body = br#"{"model_name":"m","model_version":"1","outputs":[
        {"name":"y","datatype":"INT32","shape":[2,2],"data":[[1,2],[3,4]]}]}"#;
    let r = decode_response(body, None).unwrap();
    assert_eq!(r.outputs[0].data, TensorData::Raw([1i32, 2, 3, 4].iter().flat_map(|v| v.to_le_bytes()).collect()));

    let json = r#"{"model_name":"m","outputs":[{"name":"y","datatype":"UINT8","shape":[2],"parameters":{"binary_data_size":2}}]}"#;
    let mut body = json.as_bytes().to_vec();
    body.extend([1, 2, 3]);
    let e = decode_response(&body, Some(json.len())).unwrap_err();
    assert_eq!(e.kind(), "invalid_binary");
    assert!(e.to_string().contains("after the last binary output 'y'"), "{e}");
    let e = decode_response(&body[..json.len() + 1], Some(json.len())).unwrap_err();
    assert!(e.to_string().contains("output 'y': binary_data_size is 2 but only 1 bytes"), "{e}");
}
