//! Every baton datatype through ONNX Runtime and back: one `Identity` model
//! per type, written by a small protobuf encoder below. Also weights of
//! types other than FP32, including ones baton has no datatype for.
//!
//! These tests need the ONNX Runtime library: run
//! `scripts/fetch-onnxruntime.sh` (or set `ORT_DYLIB_PATH`).

use std::path::Path;

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::Backend;
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_onnx::OnnxBackend;

fn backend() -> OnnxBackend {
    if let Err(e) = baton_onnx::init() {
        panic!("ONNX Runtime is required for these tests [{}]: {}", e.kind, e.message);
    }
    OnnxBackend::new().expect("backend after a successful init")
}

/// Just enough protobuf to write ONNX models.
#[derive(Default)]
struct Proto(Vec<u8>);

impl Proto {
    fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    fn int(mut self, field: u64, v: i64) -> Self {
        self.varint(field << 3);
        self.varint(v as u64);
        self
    }

    fn bytes(mut self, field: u64, b: &[u8]) -> Self {
        self.varint(field << 3 | 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    fn str(self, field: u64, s: &str) -> Self {
        self.bytes(field, s.as_bytes())
    }

    fn msg(self, field: u64, m: Proto) -> Self {
        self.bytes(field, &m.0)
    }
}

/// ONNX TensorProto.DataType of a baton datatype.
fn onnx_type(d: DataType) -> i64 {
    match d {
        DataType::Fp32 => 1,
        DataType::Uint8 => 2,
        DataType::Int8 => 3,
        DataType::Uint16 => 4,
        DataType::Int16 => 5,
        DataType::Int32 => 6,
        DataType::Int64 => 7,
        DataType::Bytes => 8,
        DataType::Bool => 9,
        DataType::Fp16 => 10,
        DataType::Fp64 => 11,
        DataType::Uint32 => 12,
        DataType::Uint64 => 13,
    }
}

const BFLOAT16: i64 = 16;

/// ValueInfoProto of a `[n, width]` tensor with a symbolic first dimension.
fn value_info(name: &str, elem_type: i64, width: i64) -> Proto {
    let shape = Proto::default().msg(1, Proto::default().str(2, "n")).msg(1, Proto::default().int(1, width));
    let tensor_type = Proto::default().int(1, elem_type).msg(2, shape);
    Proto::default().str(1, name).msg(2, Proto::default().msg(1, tensor_type))
}

/// A model `y = Identity(x)` of `[n, width]` tensors of `elem_type`, with
/// extra (unused) initializers.
fn identity_model(elem_type: i64, width: i64, initializers: Vec<Proto>) -> Vec<u8> {
    let node = Proto::default().str(1, "x").str(2, "y").str(3, "identity").str(4, "Identity");
    let mut graph = Proto::default().msg(1, node).str(2, "identity");
    for init in initializers {
        graph = graph.msg(5, init);
    }
    graph = graph.msg(11, value_info("x", elem_type, width)).msg(12, value_info("y", elem_type, width));
    let opset = Proto::default().str(1, "").int(2, 13);
    Proto::default().int(1, 8).str(2, "baton-onnx-tests").msg(7, graph).msg(8, opset).0
}

/// Sample data of `count` elements of every fixed-size type, with edge values.
fn sample(d: DataType, count: usize) -> TensorData {
    let pick = |values: &[Vec<u8>]| -> TensorData {
        TensorData::Raw(values.iter().cycle().take(count).flatten().copied().collect())
    };
    match d {
        DataType::Bool => pick(&[vec![1], vec![0], vec![1]]),
        DataType::Uint8 => pick(&[vec![0], vec![255], vec![7]]),
        DataType::Int8 => pick(&[(-128i8).to_le_bytes().to_vec(), vec![127], vec![0xff]]),
        DataType::Uint16 => pick(&[u16::MAX.to_le_bytes().to_vec(), 0x1234u16.to_le_bytes().to_vec()]),
        DataType::Int16 => pick(&[i16::MIN.to_le_bytes().to_vec(), (-2i16).to_le_bytes().to_vec()]),
        DataType::Uint32 => pick(&[u32::MAX.to_le_bytes().to_vec(), 0x0102_0304u32.to_le_bytes().to_vec()]),
        DataType::Int32 => pick(&[i32::MIN.to_le_bytes().to_vec(), (-5i32).to_le_bytes().to_vec()]),
        DataType::Uint64 => pick(&[u64::MAX.to_le_bytes().to_vec(), 0x0102_0304_0506_0708u64.to_le_bytes().to_vec()]),
        DataType::Int64 => pick(&[i64::MIN.to_le_bytes().to_vec(), (-9i64).to_le_bytes().to_vec()]),
        // 1.0, -2.0, 65504 (max), smallest subnormal, +inf, NaN.
        DataType::Fp16 => pick(&[
            vec![0x00, 0x3c],
            vec![0x00, 0xc0],
            vec![0xff, 0x7b],
            vec![0x01, 0x00],
            vec![0x00, 0x7c],
            vec![0x00, 0x7e],
        ]),
        DataType::Fp32 => pick(&[
            1.5f32.to_le_bytes().to_vec(),
            f32::MIN_POSITIVE.to_le_bytes().to_vec(),
            (-0.0f32).to_le_bytes().to_vec(),
            f32::INFINITY.to_le_bytes().to_vec(),
        ]),
        DataType::Fp64 => pick(&[
            std::f64::consts::PI.to_le_bytes().to_vec(),
            f64::MAX.to_le_bytes().to_vec(),
            f64::NEG_INFINITY.to_le_bytes().to_vec(),
        ]),
        DataType::Bytes => {
            let items = ["", "hello", "grüße", "🦀", "a b\tc", "x"];
            TensorData::Bytes(items.iter().cycle().take(count).map(|s| s.as_bytes().to_vec()).collect())
        }
    }
}

fn write_model(dir: &Path, bytes: &[u8]) {
    std::fs::write(dir.join("model.onnx"), bytes).unwrap();
}

/// Seals `dir` as a version (writes its MANIFEST) and verifies it, as the
/// load transaction does before the backend sees a version.
fn sealed(dir: &Path) -> Verified {
    baton_core::files::manifest::write(dir).expect("writing MANIFEST");
    baton_core::files::manifest::verify(dir).expect("verifying the version")
}

fn one_session() -> ModelSpec {
    ModelSpec::parse("[engine]\nsessions = 1").unwrap()
}

#[test]
fn every_datatype_round_trips_through_identity() {
    let backend = backend();
    for datatype in DataType::ALL {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), &identity_model(onnx_type(datatype), 3, vec![]));
        let model = backend
            .load(&sealed(dir.path()), &one_session())
            .unwrap_or_else(|e| panic!("{datatype}: load failed [{}]: {}", e.kind, e.message));
        let sig = model.signature();
        assert_eq!((sig.inputs[0].datatype, &sig.inputs[0].shape[..]), (datatype, &[-1, 3][..]), "{datatype}");
        assert_eq!((sig.outputs[0].datatype, &sig.outputs[0].shape[..]), (datatype, &[-1, 3][..]), "{datatype}");
        for batch in [0usize, 1, 2] {
            let input =
                Tensor { name: "x".into(), datatype, shape: vec![batch as i64, 3], data: sample(datatype, batch * 3) };
            let out = model
                .infer(std::slice::from_ref(&input))
                .unwrap_or_else(|e| panic!("{datatype}: inference failed [{}]: {}", e.kind, e.message));
            assert_eq!(out.len(), 1);
            // Run on a borrowed input with the output lent from the
            // engine's buffer, as a worker runs: the same answer.
            let mut lent = Vec::new();
            model
                .run_borrowed(None, &[input.view()], &mut |output| lent.push(output.to_tensor()))
                .unwrap_or_else(|e| panic!("{datatype}: borrowed run failed [{}]: {}", e.kind, e.message));
            assert_eq!(lent, out, "{datatype} batch {batch}, borrowed");
            let want = Tensor { name: "y".into(), ..input };
            assert_eq!(out[0], want, "{datatype} batch {batch}");
        }
    }
}

#[test]
fn nonzero_bools_read_as_true() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &identity_model(onnx_type(DataType::Bool), 3, vec![]));
    let model = backend.load(&sealed(dir.path()), &one_session()).unwrap();
    let input = Tensor {
        name: "x".into(),
        datatype: DataType::Bool,
        shape: vec![1, 3],
        data: TensorData::Raw(vec![0, 2, 255]),
    };
    let out = model.infer(&[input]).unwrap();
    assert_eq!(out[0].data, TensorData::Raw(vec![0, 1, 1]));
}

#[test]
fn types_baton_cannot_serve_are_unsupported_datatype() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &identity_model(BFLOAT16, 2, vec![]));
    let e = backend.load(&sealed(dir.path()), &one_session()).err().expect("bfloat16 has no baton datatype");
    assert_eq!(e.kind, "unsupported_datatype", "{}", e.message);
    assert!(e.message.contains("'x'"), "{}", e.message);
}

fn initializer(name: &str, data_type: i64, dims: &[i64]) -> Proto {
    let mut t = Proto::default();
    for &d in dims {
        t = t.int(1, d);
    }
    t.int(2, data_type).str(8, name)
}

#[test]
fn weights_of_every_kind_are_visited() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let int8: Vec<u8> = [-1i8, 2, -3, 4].iter().map(|v| *v as u8).collect();
    let fp16 = [0x00u8, 0x3c, 0x00, 0xc0, 0x00, 0x00];
    let int64s = [-7i64, 1 << 40];
    let mut int64_inline = initializer("w_i64", 7, &[2]);
    for v in int64s {
        int64_inline = int64_inline.int(7, v); // int64_data, unpacked
    }
    let inits = vec![
        initializer("w_i8", 3, &[2, 2]).bytes(9, &int8),
        initializer("w_f16", 10, &[3]).bytes(9, &fp16),
        int64_inline,
        initializer("w_str", 8, &[2]).bytes(6, b"ab").bytes(6, b"cd"),
        initializer("w_bf16", BFLOAT16, &[2]).bytes(9, &[0x80, 0x3f, 0x00, 0x40]),
        initializer("w_f64", 11, &[1]).bytes(9, &2.5f64.to_le_bytes()),
    ];
    write_model(dir.path(), &identity_model(onnx_type(DataType::Fp32), 2, inits));
    let model =
        backend.load(&sealed(dir.path()), &one_session()).unwrap_or_else(|e| panic!("[{}] {}", e.kind, e.message));
    let mut seen = Vec::new();
    model
        .visit_weights(&mut |w| {
            seen.push((w.name.to_string(), w.datatype, w.shape.to_vec(), w.data.to_vec()));
            Ok(())
        })
        .unwrap();
    let i64_bytes: Vec<u8> = int64s.iter().flat_map(|v| v.to_le_bytes()).collect();
    let want = vec![
        ("w_i8".to_string(), Some(DataType::Int8), vec![2, 2], int8),
        ("w_f16".to_string(), Some(DataType::Fp16), vec![3], fp16.to_vec()),
        ("w_i64".to_string(), Some(DataType::Int64), vec![2], i64_bytes),
        ("w_str".to_string(), None, vec![2], vec![]),
        ("w_bf16".to_string(), None, vec![2], vec![]),
        ("w_f64".to_string(), Some(DataType::Fp64), vec![1], 2.5f64.to_le_bytes().to_vec()),
    ];
    assert_eq!(seen, want);
}

#[test]
fn a_weight_whose_data_does_not_fit_its_dims_is_a_read_error() {
    // ORT never loads such a model, so this goes through a model that does
    // load, whose file is then replaced. The first visit sees the bytes the
    // sessions were built from; later ones read the file again.
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &identity_model(onnx_type(DataType::Fp32), 2, vec![]));
    let model = backend.load(&sealed(dir.path()), &one_session()).unwrap();
    model.visit_weights(&mut |_| Ok(())).unwrap();
    let bad = initializer("w", 1, &[4]).bytes(9, &[0; 12]);
    write_model(dir.path(), &identity_model(onnx_type(DataType::Fp32), 2, vec![bad]));
    let e = model.visit_weights(&mut |_| Ok(())).unwrap_err();
    assert!(matches!(e, baton_core::run::backend::WeightsError::Read(ref m) if m.contains("'w'")), "{e}");
    std::fs::write(dir.path().join("model.onnx"), b"garbage").unwrap();
    let e = model.visit_weights(&mut |_| Ok(())).unwrap_err();
    assert!(matches!(e, baton_core::run::backend::WeightsError::Read(_)), "{e}");
}
