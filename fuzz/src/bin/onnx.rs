//! AFL++ target: the onnx decoder (see baton_fuzz::onnx).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::onnx(data));
}
