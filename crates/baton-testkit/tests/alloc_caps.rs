//! The memory each decoder of outside bytes allocates, measured by a
//! counting global allocator: the peak of the bytes live on the decoding
//! thread during one call (what it returns included), over what was live
//! before. Each decoder is held to a bound linear in its input, `factor ×
//! input length + slack` ([`Cap`]); docs/fuzzing.md lists them and says
//! where each factor comes from. A shape or size claimed by the input
//! (2^40 elements, a binary size of 2^62) never counts: only bytes that
//! are there do.
//!
//! Inputs are the worst cases known for each decoder (the structure that
//! costs most per byte, repeated), arbitrary bytes, and valid inputs
//! damaged as in the fuzz tests. `PROPTEST_CASES` sets the cases.

#![allow(unsafe_code)] // The counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use baton_core::files::manifest;
use baton_core::files::spec::ModelSpec;
use baton_core::registry::load::warmup::parse_sample;
use baton_core::tensors::tensor::{DataType, split_framed};
use baton_core::tensors::tensor_json::{NullFloats, elements_from_json};
use baton_onnx::proto;
use baton_protocol::decode_request;
use baton_protocol::grpc::codec::decode_infer_request;
use baton_protocol::grpc::convert;
use baton_protocol::grpc::pb::ModelInferRequest;
use baton_testkit::fuzz::{config, damaged, named, seeds, tensor, text_tokens, wire_tokens};
use proptest::prelude::*;
use prost::Message;

/// Counts the bytes live per thread, and their peak, on top of the
/// system allocator.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed to `System` unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The peak bytes live on this thread while `f` runs, over those live
/// before; what `f` returns is dropped after the measurement.
fn peak_of<T>(f: impl FnOnce() -> T) -> usize {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let result = f();
    let peak = PEAK.with(Cell::get) - start;
    drop(result);
    usize::try_from(peak).unwrap_or(0)
}

/// A decoder's bound: at most `factor × input length + slack` bytes.
#[derive(Clone, Copy, Debug)]
struct Cap {
    factor: usize,
    slack: usize,
}

impl Cap {
    /// Asserts that decoding `input` (of `len` bytes) with `decode` stays
    /// within the cap.
    fn check<T>(self, what: &str, len: usize, decode: impl FnOnce() -> T) {
        let peak = peak_of(decode);
        let bound = self.factor * len + self.slack;
        if std::env::var_os("BATON_ALLOC_REPORT").is_some() {
            println!("{what}: {peak} bytes for {len} input bytes ({:.1} per byte)", peak as f64 / len.max(1) as f64);
        }
        assert!(
            std::env::var_os("BATON_ALLOC_REPORT").is_some() || peak <= bound,
            "{what}: {peak} bytes allocated for {len} input bytes, over the cap of {bound} ({self:?})"
        );
    }
}

/// REST requests: serde's values for the header fields read as JSON
/// (`Value`: 32 bytes per one-byte element, doubled by a growing vector),
/// and the decoded tensors (at most 12 bytes per byte of BYTES data).
const REST: Cap = Cap { factor: 40, slack: 16 << 10 };
/// gRPC requests as the server decodes them: at most 64 times the message
/// for prost's structs ([`baton_protocol::grpc::codec`] refuses more), then
/// the tensors packed from typed contents.
const GRPC: Cap = Cap { factor: 80, slack: 80 << 10 };
/// Warmup sample files: a `serde_json::Value` of the file, then the tensors.
const SAMPLE: Cap = Cap { factor: 24, slack: 16 << 10 };
/// JSON tensor data on its own: the tensor's buffer (FP64: 8 bytes per
/// two-byte element; BYTES: a 24-byte vector per three-byte string).
const ELEMENTS: Cap = Cap { factor: 10, slack: 1 << 10 };
/// Framed BYTES: a 24-byte vector per 4-byte length, doubled by growth.
const FRAMING: Cap = Cap { factor: 8, slack: 1 << 10 };
/// MANIFEST: an entry (path, size, digest) per line.
const MANIFEST: Cap = Cap { factor: 8, slack: 16 << 10 };
/// model.toml: the toml crate's document, then the spec.
const SPEC: Cap = Cap { factor: 128, slack: 64 << 10 };
/// ONNX models: one node struct per two-byte node, one `u64` per
/// one-byte varint of a dims or int64_data field.
const ONNX: Cap = Cap { factor: 128, slack: 16 << 10 };
/// safetensors headers: one tensor's description (its name, at most 8
/// dimensions) per entry of at least 40 bytes, doubled by a growing
/// vector; in `__metadata__`, two strings and a share of a B-tree node per
/// 8-byte entry (about 10 bytes per byte). Read into a tree of JSON
/// values, as it was, a header cost 16 to 27 bytes per byte.
const SAFETENSORS: Cap = Cap { factor: 12, slack: 16 << 10 };

/// `piece` repeated to about `len` bytes between `open` and `close`.
fn repeated(open: &str, piece: &str, close: &str, len: usize) -> String {
    let n = len / piece.len().max(1);
    format!("{open}{}{close}", piece.repeat(n).trim_end_matches(','))
}

fn rest(body: &[u8], header_length: Option<usize>) {
    REST.check("REST request", body.len(), || decode_request(body, header_length));
}

fn grpc(bytes: &[u8]) {
    GRPC.check("gRPC request", bytes.len(), || {
        decode_infer_request(bytes).ok().map(|r| convert::parse_request(r).and_then(convert::Parsed::decode))
    });
}

fn onnx(bytes: &[u8]) {
    ONNX.check("ONNX model", bytes.len(), || {
        let model = proto::parse(bytes).ok()?;
        let mut scratch = Vec::new();
        for init in &model.initializers {
            let dir = std::path::Path::new("/nonexistent-baton-fuzz");
            let _ = proto::initializer_bytes(init, proto::RawData::InBytes(bytes), dir, &mut scratch);
        }
        Some((model, proto::nested_external_data(bytes)))
    });
}

/// The worst inputs known for each decoder, at several sizes.
#[test]
fn worst_cases_stay_within_their_caps() {
    for len in [1 << 10, 256 << 10] {
        let inputs = |piece: &str| repeated(r#"{"inputs":["#, piece, "]}", len);
        rest(inputs("{},").as_bytes(), None);
        rest(repeated(r#"{"inputs":[],"outputs":["#, "{},", "]}", len).as_bytes(), None);
        rest(repeated(r#"{"inputs":[],"parameters":{"p":["#, "0,", "]}}", len).as_bytes(), None);
        let keys: String = (0..len / 8).map(|i| format!(r#""{i:x}":0,"#)).collect();
        rest(format!(r#"{{"inputs":[],"parameters":{{{}}}}}"#, keys.trim_end_matches(',')).as_bytes(), None);
        let n = len / 2;
        let shape =
            format!(r#"{{"inputs":[{{"name":"x","datatype":"BOOL","shape":[{}],"data":0}}]}}"#, vec!["1"; n].join(","));
        rest(shape.as_bytes(), None);
        for (datatype, element) in [("FP64", "0,"), ("BYTES", r#""","#), ("BOOL", "true,")] {
            let data = repeated("[", element, "]", len);
            let count = data.matches(',').count() + 1;
            let body =
                format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[{count}],"data":{data}}}]}}"#);
            rest(body.as_bytes(), None);
            ELEMENTS.check("JSON elements", data.len(), || {
                elements_from_json(&data, DataType::parse(datatype).unwrap(), count, NullFloats::Reject)
            });
        }
        // Binary BYTES of empty elements: 4 bytes each.
        let framed = vec![0u8; len / 4 * 4];
        let header = format!(
            r#"{{"inputs":[{{"name":"s","datatype":"BYTES","shape":[{}],"parameters":{{"binary_data_size":{}}}}}]}}"#,
            framed.len() / 4,
            framed.len()
        );
        rest(&[header.as_bytes(), &framed].concat(), Some(header.len()));
        FRAMING.check("framed BYTES", framed.len(), || split_framed(&framed));

        // gRPC: empty repeated messages and byte strings.
        for field in [0x2au8, 0x32, 0x3a, 0x22] {
            grpc(&[field, 0].repeat(len / 2));
        }
        let strings = ModelInferRequest {
            inputs: vec![Default::default()],
            raw_input_contents: vec![Vec::new(); len / 2],
            ..Default::default()
        };
        grpc(&strings.encode_to_vec());

        // Sample files, manifests and specs of many small entries.
        let sample = repeated(r#"{"inputs":["#, r#"{"name":"","datatype":"BOOL","shape":[],"data":true},"#, "]}", len);
        SAMPLE.check("warmup sample", sample.len(), || parse_sample("warmup/x.json".into(), &sample));
        let sample = format!(
            r#"{{"inputs":[{{"name":"x","datatype":"FP64","shape":[1],"data":{}}}]}}"#,
            repeated("[", "[],", "]", len)
        );
        SAMPLE.check("warmup sample", sample.len(), || parse_sample("warmup/x.json".into(), &sample));
        let line = format!("{}  0  a\n", "0".repeat(64));
        let text = format!("baton-manifest 1\n{}end {}\n", line.repeat(len / line.len()), len / line.len());
        MANIFEST.check("MANIFEST", text.len(), || manifest::parse(&text));
        for spec in [repeated("[engine]\nx = [", "0,", "]\n", len), repeated("[engine]\nx = [", "{},", "]\n", len)] {
            SPEC.check("model.toml", spec.len(), || ModelSpec::parse(&spec));
        }
        let spec = repeated("inputs = [", r#"{name="",datatype="BOOL",shape=[]},"#, "]\n", len);
        SPEC.check("model.toml", spec.len(), || ModelSpec::parse(&spec));

        // ONNX: empty nodes, empty dims, one-byte varints of int64_data.
        let graph = |body: Vec<u8>| [vec![0x3a], encode_len(body.len()), body].concat();
        onnx(&graph([0x0a, 0].repeat(len / 2)));
        onnx(&graph([0x2a, 0].repeat(len / 2)));
        let dims = [0x08, 0].repeat(len / 2);
        onnx(&graph([vec![0x2a], encode_len(dims.len()), dims].concat()));
        let int64s = [vec![0x10, 7, 0x3a], encode_len(len), vec![1; len]].concat();
        onnx(&graph([vec![0x2a], encode_len(int64s.len()), int64s].concat()));

        // safetensors: a shape of zeros, many empty tensors, metadata.
        safetensors(&repeated(r#"{"w":{"dtype":"F32","data_offsets":[0,0],"shape":["#, "0,", "]}}", len));
        let tensors: String =
            (0..len / 48).map(|i| format!(r#""{i:x}":{{"dtype":"F32","shape":[],"data_offsets":[0,0]}},"#)).collect();
        safetensors(&format!("{{{}}}", tensors.trim_end_matches(',')));
        let empty: String =
            (0..len / 48).map(|i| format!(r#""{i:x}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}},"#)).collect();
        safetensors(&format!("{{{}}}", empty.trim_end_matches(',')));
        let entries: String = (0..len / 8).map(|i| format!(r#""{i:x}":"","#)).collect();
        safetensors(&format!(r#"{{"__metadata__":{{{}}}}}"#, entries.trim_end_matches(',')));
        safetensors(&repeated("[", "[],", "]", len));
    }
}

fn safetensors(json: &str) {
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    SAFETENSORS
        .check("safetensors header", file.len(), || baton_onnx::safetensors::Header::parse(&file, file.len() as u64));
}

fn encode_len(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(n as u64, &mut out);
    out
}

/// Shapes and sizes claimed far past the data allocate nothing for the claim.
#[test]
fn claims_are_never_allocated() {
    for dims in ["[1099511627776]", "[4611686018427387904]", "[1048576, 1048576]", "[9223372036854775807, 2]"] {
        for datatype in ["FP32", "BYTES", "BOOL"] {
            let body = format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{dims},"data":[1,2]}}]}}"#);
            rest(body.as_bytes(), None);
            let json = format!(
                r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{dims},"parameters":{{"binary_data_size":4611686018427387904}}}}]}}"#
            );
            rest(&[json.as_bytes(), &[0; 8]].concat(), Some(json.len()));
            let sample =
                format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{dims},"data":[1,2]}}]}}"#);
            SAMPLE.check("warmup sample", sample.len(), || parse_sample("warmup/x.json".into(), &sample));
        }
    }
    for count in [1usize << 40, 1 << 62, usize::MAX] {
        ELEMENTS.check("JSON elements", 5, || elements_from_json("[1,2]", DataType::Fp64, count, NullFloats::Reject));
        ELEMENTS.check("JSON elements", 9, || {
            elements_from_json(r#"["a","b"]"#, DataType::Bytes, count, NullFloats::Reject)
        });
    }
    // gRPC: a shape of 2^40 elements over two, raw and typed; a length
    // prefix of 2^62 bytes.
    use baton_protocol::grpc::pb::InferTensorContents;
    use baton_protocol::grpc::pb::model_infer_request::InferInputTensor;
    for raw in [false, true] {
        let input = InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1 << 20, 1 << 20],
            contents: (!raw).then(|| InferTensorContents { fp32_contents: vec![1.0, 2.0], ..Default::default() }),
            ..Default::default()
        };
        let raw_input_contents = if raw { vec![vec![0; 8]] } else { Vec::new() };
        grpc(&ModelInferRequest { inputs: vec![input], raw_input_contents, ..Default::default() }.encode_to_vec());
    }
    grpc(&[0x3a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    // ONNX: an initializer of 2^62 elements with no data, a length of 2^62.
    onnx(&[0x3a, 0x0e, 0x2a, 0x0c, 0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x10, 0x01]);
    onnx(&[0x3a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
}

proptest! {
    #![proptest_config(config(128))]

    /// Valid and damaged requests, sample files, manifests, specs and
    /// models stay within their caps too.
    #[test]
    fn fuzzed_inputs_stay_within_their_caps(
        tensors in prop::collection::vec(tensor(true), 0..4),
        text in damaged(vec![seeds::rest()[1].0.clone()], text_tokens(), 4),
        binary in damaged(vec![seeds::rest()[2].0.clone()], text_tokens(), 4),
        wire in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let encoded = baton_protocol::encode_request(&named(tensors), true, &[], None);
        rest(&encoded.body, encoded.header_length);
        rest(&text, None);
        let header_length = seeds::rest()[2].1.filter(|&n| n <= binary.len());
        rest(&binary, header_length);
        grpc(&wire);
        onnx(&wire);
        let text = String::from_utf8_lossy(&text);
        safetensors(&text);
        SAMPLE.check("warmup sample", text.len(), || parse_sample("warmup/x.json".into(), &text));
        MANIFEST.check("MANIFEST", text.len(), || manifest::parse(&text));
        SPEC.check("model.toml", text.len(), || ModelSpec::parse(&text));
    }

    #[test]
    fn damaged_messages_and_models_stay_within_their_caps(bytes in damaged([seeds::grpc(), seeds::onnx()].concat(), wire_tokens(), 4)) {
        grpc(&bytes);
        onnx(&bytes);
    }
}
