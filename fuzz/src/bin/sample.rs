//! AFL++ target: the sample decoder (see baton_fuzz::sample).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::sample(data));
}
