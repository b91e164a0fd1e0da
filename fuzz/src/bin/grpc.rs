//! AFL++ target: the grpc decoder (see baton_fuzz::grpc).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::grpc(data));
}
