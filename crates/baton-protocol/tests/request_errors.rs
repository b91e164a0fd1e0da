//! Every way a request can be wrong, and what the error says about it.

mod common;

use baton_protocol::{CodecError, decode_request};
use common::{bytes_binary, with_binary};

/// Decodes a JSON body that must fail; returns the error.
fn fails(json: &str) -> CodecError {
    decode_request(json.as_bytes(), None).expect_err(json)
}

/// Decodes a body with binary data that must fail.
fn fails_binary(json: &str, binary: &[u8]) -> CodecError {
    let (body, header_length) = with_binary(json, binary);
    decode_request(&body, header_length).expect_err(json)
}

fn says(error: &CodecError, kind: &str, parts: &[&str]) {
    let text = error.to_string();
    assert_eq!(error.kind(), kind, "{text}");
    assert!(error.is_client_error(), "{text}");
    for part in parts {
        assert!(text.contains(part), "expected {part:?} in {text:?}");
    }
}

#[test]
fn invalid_json_reports_line_and_column() {
    says(&fails("{\"inputs\": [\n  {\"name\": }"), "invalid_json", &["invalid JSON", "line 2", "column"]);
    says(&fails(""), "invalid_json", &["EOF", "line 1 column 0"]);
    says(&fails(r#"{"inputs": {}}"#), "invalid_json", &["expected a sequence", "line 1"]);
}

#[test]
fn binary_after_json_without_a_header_length_gets_a_hint() {
    let body = br#"{"inputs":[]}binary"#;
    says(
        &decode_request(body, None).unwrap_err(),
        "invalid_json",
        &["trailing characters", "Inference-Header-Content-Length"],
    );
}

#[test]
fn missing_inputs() {
    says(&fails(r#"{"id":"x"}"#), "invalid_request", &["no 'inputs' array"]);
}

#[test]
fn inputs_without_name_shape_or_datatype() {
    says(
        &fails(r#"{"inputs":[{"datatype":"FP32","shape":[1],"data":[1]}]}"#),
        "invalid_tensor",
        &["input 0 has no 'name'"],
    );
    says(
        &fails(r#"{"inputs":[{"name":"x","shape":[1],"data":[1]}]}"#),
        "invalid_tensor",
        &["input 'x' has no 'datatype'"],
    );
    says(
        &fails(r#"{"inputs":[{"name":"x","datatype":"FP32","data":[1]}]}"#),
        "invalid_tensor",
        &["input 'x' has no 'shape'"],
    );
    says(
        &fails(r#"{"inputs":[{"name":7,"datatype":"FP32","shape":[1],"data":[1]}]}"#),
        "invalid_tensor",
        &["input 0: 'name' must be a string, got 7"],
    );
    says(
        &fails(r#"{"inputs":[{"name":"x","datatype":1,"shape":[1],"data":[1]}]}"#),
        "invalid_tensor",
        &["input 'x': 'datatype' must be a string, got 1"],
    );
    says(
        &fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1.5],"data":[1]}]}"#),
        "invalid_tensor",
        &["input 'x': 'shape' must be an array of integers, got [1.5]"],
    );
}

#[test]
fn unknown_datatype_lists_the_valid_ones() {
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FLOAT32","shape":[1],"data":[1]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': unknown datatype 'FLOAT32'", "BOOL, UINT8", "FP32", "BYTES"]);
}

#[test]
fn negative_and_overflowing_dims() {
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[-1,3],"data":[1,2,3]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': shape [-1, 3] has a negative dimension"]);
    let e =
        fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[4294967296,4294967296,4294967296],"data":[1]}]}"#);
    says(&e, "invalid_tensor", &["input 'x'", "more elements than can be addressed"]);
}

#[test]
fn data_and_binary_data_size_are_exclusive_and_one_is_needed() {
    let both =
        r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1],"parameters":{"binary_data_size":1}}]}"#;
    says(&fails_binary(both, &[1]), "invalid_tensor", &["input 'x' has both 'data' and parameters.binary_data_size"]);
    let neither =
        r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"parameters":{"shared_memory_region":"r"}}]}"#;
    says(&fails(neither), "invalid_tensor", &["input 'x' has neither 'data' nor parameters.binary_data_size"]);
}

#[test]
fn json_element_count_and_element_types() {
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': shape [2, 2] needs 4 elements, 'data' has 3"]);
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1,2],[3,4],[5]]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': shape [2, 2] needs 4 elements, 'data' has 5"]);
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[2],"data":[1,300]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': element 1 (300) is not a valid UINT8"]);
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,null]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': element 1 (null) is not a valid FP32"]);
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":[5]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': element 0 (5) is not a valid BYTES"]);
}

#[test]
fn huge_shapes_with_small_data_fail_cleanly() {
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP64","shape":[1000000000000000],"data":[1]}]}"#);
    says(&e, "invalid_tensor", &["needs 1000000000000000 elements, 'data' has 1"]);
    let e = fails_binary(
        r#"{"inputs":[{"name":"x","datatype":"BYTES","shape":[1000000000000000],"parameters":{"binary_data_size":4}}]}"#,
        &[0; 4],
    );
    says(&e, "invalid_binary", &["holds 1 elements, shape [1000000000000000] needs 1000000000000000"]);
}

#[test]
fn binary_size_must_match_shape_and_element_size() {
    let e = fails_binary(
        r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":12}}]}"#,
        &[0; 12],
    );
    says(&e, "invalid_binary", &["input 'x': shape [2, 2] of FP32 needs 16 bytes, binary_data_size is 12"]);
    let e = fails_binary(
        r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":-8}}]}"#,
        &[0; 8],
    );
    says(&e, "invalid_tensor", &["input 'x': parameters.binary_data_size must be a non-negative integer, got -8"]);
    let e = fails(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"parameters":[1]}]}"#);
    says(&e, "invalid_tensor", &["input 'x': 'parameters' must be an object, got [1]"]);
}

#[test]
fn binary_bool_elements_must_be_zero_or_one() {
    let e = fails_binary(
        r#"{"inputs":[{"name":"flags","datatype":"BOOL","shape":[3],"parameters":{"binary_data_size":3}}]}"#,
        &[1, 0, 2],
    );
    says(&e, "invalid_binary", &["input 'flags': BOOL element 2 is 2"]);
}

#[test]
fn binary_bytes_count_and_framing() {
    let json = r#"{"inputs":[{"name":"s","datatype":"BYTES","shape":[3],"parameters":{"binary_data_size":11}}]}"#;
    let two = bytes_binary(&[b"abc", b""]);
    assert_eq!(two.len(), 11);
    says(
        &fails_binary(json, &two),
        "invalid_binary",
        &["input 's': binary BYTES data holds 2 elements, shape [3] needs 3"],
    );
    let json = r#"{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":6}}]}"#;
    says(
        &fails_binary(json, &bytes_binary(&[b"abcd"])[..6]),
        "invalid_binary",
        &["input 's': binary BYTES element 0 says it has 4 bytes but only 2 remain"],
    );
    let json = r#"{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":2}}]}"#;
    says(
        &fails_binary(json, &[1, 0]),
        "invalid_binary",
        &["input 's': binary BYTES data ends inside the 4-byte length prefix"],
    );
}

#[test]
fn header_length_beyond_the_body() {
    let body = br#"{"inputs":[]}"#;
    let e = decode_request(body, Some(100)).unwrap_err();
    says(&e, "invalid_binary", &["Inference-Header-Content-Length is 100 but the body has only 13 bytes"]);
}

#[test]
fn leftover_and_missing_binary_data() {
    let json = r#"{"inputs":[{"name":"a","datatype":"UINT8","shape":[2],"parameters":{"binary_data_size":2}},
        {"name":"b","datatype":"UINT8","shape":[1],"data":[1]}]}"#;
    says(
        &fails_binary(json, &[1, 2, 3]),
        "invalid_binary",
        &["1 bytes of binary data are left over after the last binary input 'a'", "add up to 2 but 3 bytes follow"],
    );
    says(
        &fails_binary(json, &[1]),
        "invalid_binary",
        &["input 'a': binary_data_size is 2 but only 1 bytes of binary data remain"],
    );
    let e = decode_request(json.as_bytes(), None).unwrap_err();
    says(&e, "invalid_binary", &["input 'a'", "no Inference-Header-Content-Length was given"]);
}

#[test]
fn header_length_without_binary_inputs_leaves_bytes_over() {
    let json = r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1]}]}"#;
    let e = fails_binary(json, &[9, 9, 9, 9]);
    says(&e, "invalid_binary", &["leaves 4 bytes of binary data, but no input has parameters.binary_data_size"]);
}

#[test]
fn duplicate_names() {
    let e = fails(
        r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1]},{"name":"x","datatype":"UINT8","shape":[1],"data":[2]}]}"#,
    );
    says(&e, "invalid_request", &["input 'x' appears more than once"]);
    let e = fails(r#"{"inputs":[],"outputs":[{"name":"y"},{"name":"y"}]}"#);
    says(&e, "invalid_request", &["output 'y' is requested more than once"]);
}

#[test]
fn request_fields_of_the_wrong_type() {
    says(&fails(r#"{"id":5,"inputs":[]}"#), "invalid_request", &["'id' must be a string, got 5"]);
    says(
        &fails(r#"{"inputs":[],"parameters":"fast"}"#),
        "invalid_request",
        &["request 'parameters' must be an object"],
    );
    says(
        &fails(r#"{"inputs":[],"parameters":{"binary_data_output":"yes"}}"#),
        "invalid_request",
        &["parameters.binary_data_output must be true or false, got \"yes\""],
    );
    says(&fails(r#"{"inputs":[],"outputs":[{}]}"#), "invalid_request", &["requested output 0 has no 'name'"]);
    says(
        &fails(r#"{"inputs":[],"outputs":[{"name":"y","parameters":{"binary_data":1}}]}"#),
        "invalid_request",
        &["requested output 'y': parameters.binary_data must be true or false, got 1"],
    );
}

#[test]
fn any_json_string_is_an_id() {
    for id in ["", "日本", "with \"quotes\"", "\u{1F600}"] {
        let json = serde_json::json!({"id": id, "inputs": []}).to_string();
        assert_eq!(decode_request(json.as_bytes(), None).unwrap().id.as_deref(), Some(id));
    }
}

#[test]
fn json_errors_inside_tensor_data_point_into_the_body() {
    // Found only when the data is decoded (the header parse skims it), yet
    // reported where a whole-body parse would report them.
    for body in [
        "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP64\",\"shape\":[2],\"data\":[1, 1e400]}]}",
        "{\"inputs\":[\n  {\"name\":\"x\",\"datatype\":\"FP64\",\n   \"shape\":[3],\"data\":[1,\n 2, 1e400]}]}",
        "{\"inputs\":[{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[1],\n \"data\":[\"\\ud800\"]}]}",
    ] {
        let whole = serde_json::from_str::<serde_json::Value>(body).unwrap_err().to_string();
        let e = fails(body);
        says(&e, "invalid_json", &[&whole]);
    }
}
