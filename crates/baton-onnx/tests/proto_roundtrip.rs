//! Round trip: models written by baton-testkit's encoder, read back by `baton_onnx::proto`.

use std::path::Path;

use baton_onnx::mlp::{Mlp, OnnxOptions, encode_mlp};
use baton_onnx::proto::{self, InitData, Initializer, ProtoError, RawData, ValueInfo, elem};

/// [`proto::initializer_bytes`] of a whole model file.
fn bytes_of(init: &Initializer, model: &[u8], dir: &Path) -> Result<Vec<u8>, ProtoError> {
    let mut scratch = Vec::new();
    proto::initializer_bytes(init, RawData::InBytes(model), dir, &mut scratch).map(<[u8]>::to_vec)
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn expected_inits(mlp: &Mlp) -> Vec<(String, Vec<i64>, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, layer) in mlp.layers.iter().enumerate() {
        let (inp, o) = (mlp.sizes[i] as i64, mlp.sizes[i + 1] as i64);
        out.push((format!("fc{i}.weight"), vec![inp, o], le_bytes(&layer.weight)));
        out.push((format!("fc{i}.bias"), vec![o], le_bytes(&layer.bias)));
    }
    out
}

#[test]
fn inline_raw_data_round_trips() {
    let mlp = Mlp::new(&[16, 32, 8, 1], 42);
    let opts = OnnxOptions { input_name: "features".into(), output_name: "score".into(), ..Default::default() };
    let (bytes, ext) = encode_mlp(&mlp, &opts);
    assert!(ext.is_none());
    let model = proto::parse(&bytes).unwrap();
    assert_eq!(model.ir_version, 8);
    let io = |name: &str, w: i64| ValueInfo { name: name.into(), elem_type: elem::FLOAT, dims: Some(vec![-1, w]) };
    assert_eq!(model.graph_inputs, vec![io("features", 16)]);
    assert_eq!(model.graph_outputs, vec![io("score", 1)]);
    let want = expected_inits(&mlp);
    assert_eq!(model.initializers.len(), want.len());
    for (init, (name, dims, data)) in model.initializers.iter().zip(&want) {
        assert_eq!((&init.name, &init.dims, init.data_type), (name, dims, elem::FLOAT));
        assert!(matches!(init.data, InitData::Raw(_)), "{name}: {:?}", init.data);
        let got = bytes_of(init, &bytes, Path::new("/nonexistent")).unwrap();
        assert_eq!(&got[..], &data[..], "{name}");
    }
    // Read without its payloads, then each payload from the file: the same.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let skeleton = proto::read_skeleton(&file, &path).unwrap();
    assert_eq!(proto::parse(&skeleton).unwrap(), model);
    let mut scratch = Vec::new();
    for (init, (name, _, data)) in model.initializers.iter().zip(&want) {
        let got = proto::initializer_bytes(init, RawData::InFile(&file), dir.path(), &mut scratch).unwrap();
        assert_eq!(got, &data[..], "{name}");
    }
}

#[test]
fn external_data_round_trips() {
    let mlp = Mlp::new(&[12, 20, 3], 7);
    let opts = OnnxOptions { external_data: Some("model.onnx.data".into()), ..Default::default() };
    let (bytes, ext) = encode_mlp(&mlp, &opts);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.onnx"), &bytes).unwrap();
    std::fs::write(dir.path().join("model.onnx.data"), ext.unwrap()).unwrap();

    let bytes = std::fs::read(dir.path().join("model.onnx")).unwrap();
    let model = proto::parse(&bytes).unwrap();
    assert_eq!(model.graph_inputs[0].name, "input");
    assert_eq!(model.graph_outputs[0].name, "output");
    assert_eq!(model.graph_outputs[0].dims, Some(vec![-1, 3]));
    let want = expected_inits(&mlp);
    assert_eq!(model.initializers.len(), want.len());
    let mut offset = 0u64;
    for (init, (name, dims, data)) in model.initializers.iter().zip(&want) {
        assert_eq!((&init.name, &init.dims), (name, dims));
        let len = data.len() as u64;
        let location = "model.onnx.data".to_string();
        let ext = InitData::External { location, offset, length: Some(len) };
        assert_eq!(init.data, ext, "{name}");
        offset += len;
        let got = bytes_of(init, &bytes, dir.path()).unwrap();
        assert_eq!(&got[..], &data[..], "{name}");
    }

    // A short external file is reported, naming the tensor.
    let data_path = dir.path().join("model.onnx.data");
    let full = std::fs::read(&data_path).unwrap();
    std::fs::write(&data_path, &full[..full.len() - 4]).unwrap();
    let last = model.initializers.last().unwrap();
    let err = bytes_of(last, &bytes, dir.path()).unwrap_err();
    assert!(err.to_string().contains("fc1.bias"), "{err}");
    // A missing file is an I/O error.
    std::fs::remove_file(&data_path).unwrap();
    let err = bytes_of(last, &bytes, dir.path()).unwrap_err();
    assert!(matches!(err, ProtoError::Io { .. }), "{err}");
}

#[test]
fn every_truncation_errors_or_parses() {
    let mlp = Mlp::new(&[4, 6, 2], 3);
    for opts in [OnnxOptions::default(), OnnxOptions { external_data: Some("w.bin".into()), ..Default::default() }] {
        let (bytes, _) = encode_mlp(&mlp, &opts);
        for n in 0..bytes.len() {
            let prefix = &bytes[..n];
            if let Ok(model) = proto::parse(prefix) {
                for init in &model.initializers {
                    let _ = bytes_of(init, prefix, Path::new("/nonexistent"));
                }
            }
        }
        assert!(proto::parse(&bytes).is_ok());
    }
}
