//! AFL++ target: the spec decoder (see baton_fuzz::spec).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::spec(data));
}
