//! Writes the model repository the client-compatibility tests serve, and
//! prints what those tests expect, as JSON, on stdout.
//!
//! `cargo run -p baton-testkit --example compat_repo -- DIR`
//!
//! - `mlp`: an MLP [16, 32, 4], versions 1 and 2 (different weights).
//! - `identity_<type>`: `output = Identity(input)`, `[-1, 3]`, one model per
//!   datatype baton supports, to carry every datatype through real clients.

use baton_core::tensors::tensor::DataType;
use baton_onnx::mlp::{Mlp, encode_identity, sample_input};
use baton_onnx::proto::elem;
use baton_testkit::repo::{TestRepo, mlp_toml};

const SIZES: [usize; 3] = [16, 32, 4];
const BATCH: usize = 2;

fn onnx_type(d: DataType) -> i32 {
    match d {
        DataType::Bool => elem::BOOL,
        DataType::Uint8 => elem::UINT8,
        DataType::Uint16 => elem::UINT16,
        DataType::Uint32 => elem::UINT32,
        DataType::Uint64 => elem::UINT64,
        DataType::Int8 => elem::INT8,
        DataType::Int16 => elem::INT16,
        DataType::Int32 => elem::INT32,
        DataType::Int64 => elem::INT64,
        DataType::Fp16 => elem::FLOAT16,
        DataType::Fp32 => elem::FLOAT,
        DataType::Fp64 => elem::DOUBLE,
        DataType::Bytes => elem::STRING,
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: compat_repo DIR");
    std::fs::create_dir_all(&dir).expect("creating the repository");
    let repo = TestRepo::at(std::path::Path::new(&dir));

    let input = sample_input(SIZES[0], BATCH, 42);
    let mut expected = serde_json::Map::new();
    for version in [1u64, 2] {
        let mlp = Mlp::new(&SIZES, version);
        if version == 1 {
            repo.add_model("mlp", &mlp_toml(&mlp, "max_batch_size = 8"));
        }
        repo.publish_mlp("mlp", version, &mlp);
        expected.insert(version.to_string(), mlp.forward(&input, BATCH).into());
    }

    let mut identity = serde_json::Map::new();
    for datatype in DataType::ALL {
        let name = format!("identity_{}", datatype.as_str().to_lowercase());
        let toml = format!(
            "backend = \"onnx\"\nmax_batch_size = 8\n\
             inputs = [{{ name = \"input\", datatype = \"{d}\", shape = [-1, 3] }}]\n\
             outputs = [{{ name = \"output\", datatype = \"{d}\", shape = [-1, 3] }}]\n",
            d = datatype.as_str()
        );
        repo.add_model(&name, &toml);
        repo.write_files(&name, 1, &[("model.onnx", &encode_identity(onnx_type(datatype), 3))]);
        repo.seal(&name, 1);
        identity.insert(datatype.as_str().to_owned(), name.into());
    }

    let out = serde_json::json!({
        "mlp": { "model": "mlp", "width": SIZES[0], "outputs": SIZES[2], "batch": BATCH, "input": input, "expected": expected },
        "identity": identity,
    });
    println!("{out}");
}
