//! The decoders AFL++ fuzzes, one function per target, each asserting
//! what holds for any input: a value or an error of a known kind. A panic
//! (an assertion too) aborts the process, which AFL++ records as a crash.
//!
//! REST inputs carry their `Inference-Header-Content-Length` in front: a
//! first byte with its low bit clear means none; set, the next two bytes
//! (little-endian) are the length. `baton_testkit::fuzz::seeds::rest_input`
//! writes that form for the starting corpus.

use baton_core::tensors::tensor::split_framed;

/// The kinds a request decoder returns: client errors only.
const REQUEST_KINDS: [&str; 4] = ["invalid_json", "invalid_request", "invalid_tensor", "invalid_binary"];

fn known(kind: &str) {
    assert!(REQUEST_KINDS.contains(&kind), "unexpected error kind {kind}");
}

/// Decoded tensors took no more than parsing reserved for them.
fn within_reservation(tensors: &[baton_core::tensors::tensor::Tensor], reserved: usize) {
    let used: usize = tensors.iter().map(|t| t.data_bytes()).sum();
    assert!(used <= reserved, "decoding took {used} bytes, {reserved} were reserved");
}

/// REST requests: parse, reserve, decode; the reservation covers what
/// decoding allocates. The binary tail is split as framed BYTES too.
pub fn rest(data: &[u8]) {
    let (header_length, body) = match data {
        [flag, a, b, body @ ..] if flag & 1 == 1 => (Some(usize::from(u16::from_le_bytes([*a, *b]))), body),
        [_, body @ ..] => (None, body),
        [] => return,
    };
    let _ = split_framed(body.get(header_length.unwrap_or(0)..).unwrap_or_default());
    let header = match baton_protocol::parse_request(body, header_length) {
        Ok(header) => header,
        Err(e) => return known(e.kind()),
    };
    let reserved = header.tensor_bytes();
    match header.decode() {
        Ok(request) => within_reservation(&request.inputs, reserved),
        Err(e) => known(e.kind()),
    }
}

/// gRPC requests: decoded as the server does (checked on the wire, then
/// prost), then parse, reserve, decode.
pub fn grpc(data: &[u8]) {
    use baton_protocol::grpc::convert::parse_request;
    let Ok(request) = baton_protocol::grpc::codec::decode_infer_request(data) else { return };
    let parsed = match parse_request(request) {
        Ok(parsed) => parsed,
        Err(e) => return known(e.kind()),
    };
    let reserved = parsed.tensor_bytes();
    match parsed.decode() {
        Ok(decoded) => within_reservation(&decoded.inputs, reserved),
        Err(e) => known(e.kind()),
    }
}

/// ONNX models: the reader, the check for nested external data, the
/// rewrite that stages weights, and each initializer's bytes.
pub fn onnx(data: &[u8]) {
    use baton_onnx::proto::{self, ProtoError, RawData};
    let check = |e: &ProtoError| assert!(!matches!(e, ProtoError::Read { .. }), "{e}");
    match proto::parse(data) {
        Ok(model) => {
            let mut scratch = Vec::new();
            let dir = std::path::Path::new("/nonexistent-baton-fuzz");
            for init in &model.initializers {
                if let Err(e) = proto::initializer_bytes(init, RawData::InBytes(data), dir, &mut scratch) {
                    check(&e);
                }
            }
        }
        Err(e) => check(&e),
    }
    if let Err(e) = proto::nested_external_data(data) {
        check(&e);
    }
    let lengths = |_: &str| Some(1u64 << 20);
    if let Ok(Some(rewritten)) = proto::externalize(data, "staged.bin", 16, 4096, Some(&lengths)) {
        let _ = proto::parse(&rewritten.model);
    }
}

/// MANIFEST files.
pub fn manifest(data: &[u8]) {
    if let Err(e) = baton_core::files::manifest::parse(&String::from_utf8_lossy(data)) {
        assert!(matches!(e.kind(), "manifest_incomplete" | "manifest_malformed"), "{e}");
    }
}

/// `model.toml` files.
pub fn spec(data: &[u8]) {
    if let Err(e) = baton_core::files::spec::ModelSpec::parse(&String::from_utf8_lossy(data)) {
        assert!(!e.is_empty());
    }
}

/// Warmup sample files.
pub fn sample(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match baton_core::registry::load::warmup::parse_sample("warmup/x.json".into(), &text) {
        Ok(sample) => sample.inputs.iter().for_each(|t| assert_eq!(t.check_consistent(), Ok(()))),
        Err(e) => assert_eq!(e.kind(), "bad_sample"),
    }
}
